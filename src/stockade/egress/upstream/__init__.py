"""The operator's upstream proxy: a transport under the decisions, nothing more.

Corporate networks let nothing out except through their proxy. With
``[network.upstream]`` set, every connection the egress proxy has already decided,
resolved and classified is opened through that proxy instead of dialled directly:

* :func:`resolve_upstream` — the policy's table made usable once at start (``proxy =
  "env"`` read from stockade's own environment, credentials from ``auth_file``);
* :class:`Transport` — the one seam where a vetted destination is opened: a direct
  dial, a ``CONNECT`` tunnel through the upstream, or (for plain HTTP) a connection to
  the upstream that carries the request in absolute-form;
* :class:`UpstreamRefused` / :class:`UpstreamUnreachable` — why a destination could not
  be opened; never followed by a direct dial;
* :func:`probe` — what ``stockade doctor`` asks the upstream.

:func:`resolve_upstream` (a run plans with it) is cheap to import; the transport and the
probe (asyncio) are loaded on first use.
"""

from __future__ import annotations

from stockade._lazy import load
from stockade.egress.upstream._config import PROXY_VARIABLES as PROXY_VARIABLES
from stockade.egress.upstream._config import Upstream as Upstream
from stockade.egress.upstream._config import read_auth_file as read_auth_file
from stockade.egress.upstream._config import resolve_upstream as resolve_upstream

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.egress.upstream._probe import probe as probe
    from stockade.egress.upstream._probe import reach as reach
    from stockade.egress.upstream._transport import UNRESOLVED as UNRESOLVED
    from stockade.egress.upstream._transport import Route as Route
    from stockade.egress.upstream._transport import Transport as Transport
    from stockade.egress.upstream._transport import UpstreamRefused as UpstreamRefused
    from stockade.egress.upstream._transport import UpstreamUnreachable as UpstreamUnreachable
    from stockade.egress.upstream._transport import answer_status as answer_status
    from stockade.egress.upstream._transport import dial as dial

__all__ = [
    "PROXY_VARIABLES",
    "UNRESOLVED",
    "Route",
    "Transport",
    "Upstream",
    "UpstreamRefused",
    "UpstreamUnreachable",
    "answer_status",
    "dial",
    "probe",
    "reach",
    "read_auth_file",
    "resolve_upstream",
]

_LAZY = {
    "probe": "stockade.egress.upstream._probe",
    "reach": "stockade.egress.upstream._probe",
    "UNRESOLVED": "stockade.egress.upstream._transport",
    "Route": "stockade.egress.upstream._transport",
    "Transport": "stockade.egress.upstream._transport",
    "UpstreamRefused": "stockade.egress.upstream._transport",
    "UpstreamUnreachable": "stockade.egress.upstream._transport",
    "answer_status": "stockade.egress.upstream._transport",
    "dial": "stockade.egress.upstream._transport",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _LAZY, name, globals())
