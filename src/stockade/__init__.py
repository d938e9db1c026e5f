"""stockade: a sandbox and egress-control runtime for code that AI agents run.

The public API is loaded lazily so that ``import stockade`` (and so the CLI, which
lives inside this package) stays cheap.
"""

from __future__ import annotations

from stockade._exceptions import (
    Denied,
    PolicyError,
    SandboxError,
    SandboxTimeout,
    StockadeError,
    Unavailable,
)
from stockade._lazy import load
from stockade._version import __version__

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.api import CompletedRun, Sandbox, arun, run
    from stockade.egress.approval import AccessRequest, Answer, Grant, Scope
    from stockade.learning import learn
    from stockade.policy import Policy

__all__ = [
    "AccessRequest",
    "Answer",
    "CompletedRun",
    "Denied",
    "Grant",
    "Policy",
    "PolicyError",
    "Sandbox",
    "SandboxError",
    "SandboxTimeout",
    "Scope",
    "StockadeError",
    "Unavailable",
    "__version__",
    "arun",
    "learn",
    "run",
]

_LAZY = {
    "run": "stockade.api",
    "arun": "stockade.api",
    "Sandbox": "stockade.api",
    "CompletedRun": "stockade.api",
    # a function of the learning package (L3, beside api: it drives the runtime and the
    # probe, which is a client of api, so api cannot import it without a cycle)
    "learn": "stockade.learning",
    "Policy": "stockade.policy",
    "AccessRequest": "stockade.egress.approval",
    "Answer": "stockade.egress.approval",
    "Grant": "stockade.egress.approval",
    "Scope": "stockade.egress.approval",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _LAZY, name, globals())
