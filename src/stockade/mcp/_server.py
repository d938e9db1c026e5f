"""The stockade MCP server: ``run_command`` and ``sandbox_policy`` over stdio.

The policy is loaded once, when the server starts, from the user's files or the
``--policy`` the MCP client configuration names: it is host-side and never a tool
argument, so the model cannot widen its own sandbox. Every run is audited to one JSONL
file per server process under the state directory, where ``stockade log`` finds it.

stdout carries JSON-RPC and nothing else: the SDK logs to stderr, and a command never
inherits the server's stdin or stdout (its input is a pipe, its output is captured).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from stockade._exceptions import StockadeError
from stockade.mcp._explain import describe_policy, explain_denial
from stockade.policy import Policy

#: The most output returned per stream; the tail is kept, where errors usually are.
MAX_OUTPUT = 100_000
#: Timeout of a command when the model gives none, and the most it may ask for.
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 3600.0

INSTRUCTIONS = """\
Commands run inside a stockade sandbox: a private file system with the workspace
read-write, no credentials in the environment, and network access only to the hosts the
user allowed. When a result lists denials, each has a hint; follow it, and never try to
work around the sandbox. Call sandbox_policy to see what is allowed."""


def _tail(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_OUTPUT:
        return text, False
    return "[... output truncated ...]\n" + text[-MAX_OUTPUT:], True


def _resolve_cwd(workspace: Path, cwd: str) -> Path:
    """``cwd`` (relative to the workspace, or absolute) if it lies inside the workspace."""
    path = Path(cwd)
    resolved = (path if path.is_absolute() else workspace / path).resolve()
    if resolved != workspace and workspace not in resolved.parents:
        raise ToolError(
            f"cwd {cwd!r} is outside the workspace {workspace}; give a directory inside it"
        )
    if not resolved.is_dir():
        raise ToolError(f"cwd {cwd!r} is not a directory in the workspace {workspace}")
    return resolved


def build_server(policy: Policy, *, audit: Path | None = None) -> MCPServer:
    """An :class:`MCPServer` whose tools run commands under ``policy``.

    Args:
        policy: the loaded, validated policy every command runs under.
        audit: the JSONL file events are appended to (None: in memory only).
    """
    from stockade.api import run

    workspace = policy.filesystem.workspace
    server = MCPServer("stockade", instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(
        annotations=ToolAnnotations(
            title="Run a command in the sandbox",
            read_only_hint=False,
            destructive_hint=True,
            open_world_hint=True,
        )
    )
    def run_command(
        command: list[str] | str,
        cwd: str = ".",
        timeout: float = DEFAULT_TIMEOUT,
        stdin: str = "",
    ) -> dict[str, Any]:
        """Run a command inside the stockade sandbox and return its output and denials.

        Args:
            command: an argv list such as ["pytest", "-q"], or a shell string run with sh -c.
            cwd: working directory, relative to the workspace (or absolute inside it).
            timeout: seconds before the command and everything it started are killed.
            stdin: text given to the command on standard input.

        Returns exit_code (124 on timeout, 127 when the command is not found), stdout,
        stderr, and denials: what the sandbox refused, each with a hint on what to do.
        """
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv or not argv[0]:
            raise ToolError("command is empty; give an argv list or a shell string")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds")
        where = _resolve_cwd(workspace, cwd)
        try:
            result = run(
                argv,
                policy=policy,
                cwd=where,
                timeout=timeout,
                capture_output=True,
                text=True,
                # Always a pipe: the server's own stdin is the JSON-RPC stream.
                input=stdin,
                audit=audit,
            )
        except StockadeError as exc:
            raise ToolError(f"the sandbox could not run the command: {exc}") from exc
        stdout, cut_out = _tail(result.stdout or "")
        stderr, cut_err = _tail(result.stderr or "")
        return {
            "exit_code": result.returncode,
            "timed_out": result.timed_out,
            "stdout": stdout,
            "stderr": stderr,
            "truncated": cut_out or cut_err,
            # A withheld credential is no denial of the command's, but the agent needs
            # to hear of it: its hint says to ask the user, never to work around it.
            "denials": [
                explain_denial(e)
                for e in result.events
                if e.get("verdict") == "deny" or e.get("event") == "env_dropped"
            ],
            "run_id": result.run_id,
        }

    @server.tool(
        annotations=ToolAnnotations(
            title="Explain the sandbox policy", read_only_hint=True, open_world_hint=False
        )
    )
    def sandbox_policy() -> dict[str, Any]:
        """What commands in the sandbox may read, write and reach, and which layers are on."""
        return describe_policy(policy)

    return server


def serve(policy_path: Path | None = None, workspace: Path | None = None) -> None:
    """Load the policy and serve over stdio until the client disconnects.

    Raises:
        PolicyError: the policy is invalid (reported before any JSON-RPC is spoken).
    """
    from stockade.policy import load_policy
    from stockade.runtime._run import default_audit_dir

    policy = load_policy(policy_path, workspace=workspace)
    audit = default_audit_dir() / f"{time.strftime('%Y%m%dT%H%M%S')}-mcp-{os.getpid()}.jsonl"
    build_server(policy, audit=audit).run("stdio")
