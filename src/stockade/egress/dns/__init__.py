"""stockade's resolver inside the sandbox: the wire codec, the synthetic-address pool and
the server that answers from the policy (see :mod:`stockade.egress.dns._server`).

:class:`DnsServer` (asyncio) is loaded on first use: the pool is needed to plan a run,
the server only once the sandbox sends a query.
"""

from __future__ import annotations

from stockade.egress.dns._pool import POOL, AddressPool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.egress.dns._server import DnsServer as DnsServer

__all__ = ["POOL", "AddressPool", "DnsServer"]


def __getattr__(name: str) -> Any:
    if name != "DnsServer":
        raise AttributeError(f"module 'stockade.egress.dns' has no attribute {name!r}")
    from stockade.egress.dns._server import DnsServer

    globals()[name] = DnsServer
    return DnsServer
