"""``stockade mcp``: serve the sandbox to an MCP client over stdio.

stdout is the JSON-RPC channel, so this verb prints nothing there itself; errors go to
stderr. The MCP SDK is imported here, not at CLI start-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stockade._exceptions import Unavailable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``mcp``."""
    parser.add_argument(
        "--policy", type=Path, metavar="FILE", help="policy file (default: the search order of run)"
    )
    parser.add_argument(
        "--workspace", type=Path, metavar="DIR", help="read-write root of every command"
    )
    parser.add_argument(
        "--overlay",
        action="store_true",
        help="the session's writes go to one overlay layer (tools workspace_changes, "
        "workspace_diff, workspace_checkpoint, workspace_rollback, workspace_discard); "
        "the user applies it with 'stockade apply RUN'",
    )


def execute(args: argparse.Namespace) -> int:
    """Serve until the client closes stdin; exit 125 if the policy or the SDK is missing."""
    try:
        from stockade.mcp import serve
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        raise Unavailable(
            "the MCP SDK (module mcp)", "install the extra: pip install 'stockade[mcp]'"
        ) from None
    serve(args.policy, args.workspace, overlay=args.overlay)
    return 0
