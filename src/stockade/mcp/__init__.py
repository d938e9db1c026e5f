"""The stockade MCP server (needs the ``mcp`` extra: ``pip install 'stockade[mcp]'``).

``stockade mcp`` serves two tools over stdio: ``run_command`` runs a command in the
sandbox and returns its output with the denials explained, and ``sandbox_policy`` says
what is allowed. Importing this package imports the MCP SDK; the CLI does so only inside
the ``mcp`` verb.
"""

from stockade.mcp._server import build_server as build_server
from stockade.mcp._server import serve as serve

__all__ = ["build_server", "serve"]
