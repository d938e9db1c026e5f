"""The stockade MCP server (needs the ``mcp`` extra: ``pip install 'stockade[mcp]'``).

``stockade mcp`` serves two tools over stdio: ``run_command`` runs a command in the
sandbox and returns its output with the denials explained, and ``sandbox_policy`` says
what is allowed. The MCP SDK is imported only when :func:`serve` or :func:`build_server`
is first used, so ``stockade._denials`` (the hints, used by ``stockade log`` and the adapters) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.mcp._server import build_server, serve

__all__ = ["build_server", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stockade.mcp import _server

        return getattr(_server, name)
    raise AttributeError(f"module 'stockade.mcp' has no attribute {name!r}")
