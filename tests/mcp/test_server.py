"""The MCP server over real stdio, driven by the SDK's own client.

Each test spawns ``python -m stockade mcp --workspace TMP`` and talks JSON-RPC to it
with ``ClientSession`` + ``stdio_client``; the commands run in the real sandbox.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

from mcp import ClientSession, StdioServerParameters

Session = Callable[[ClientSession], Awaitable[None]]


def serve(tmp_path: Path, body: Session, *extra: str, env: dict[str, str] | None = None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "stockade", "mcp", "--workspace", str(ws), *extra],
        env={"XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})},
        cwd=str(ws),
    )

    async def main() -> None:
        with anyio.fail_after(60):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await body(session)

    anyio.run(main)


def structured(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    value = result.structured_content
    assert isinstance(value, dict)
    return value


def text_of(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def test_tools_are_listed(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"run_command", "request_network_access", "sandbox_policy"}
        assert tools["sandbox_policy"].annotations is not None
        assert tools["sandbox_policy"].annotations.read_only_hint is True

    serve(tmp_path, body)


def test_argv_and_shell_commands_run_in_the_workspace(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        out = structured(await session.call_tool("run_command", {"command": ["pwd"]}))
        assert out["exit_code"] == 0
        assert out["stdout"].strip() == str((tmp_path / "ws").resolve())
        out = structured(
            await session.call_tool(
                "run_command", {"command": "echo made > f.txt && cat f.txt; exit 3"}
            )
        )
        assert out["exit_code"] == 3
        assert out["stdout"] == "made\n"
        assert (tmp_path / "ws" / "f.txt").read_text() == "made\n"
        # stdin is a pipe with the given text, never the server's JSON-RPC stream
        out = structured(
            await session.call_tool("run_command", {"command": ["cat"], "stdin": "hello"})
        )
        assert out["stdout"] == "hello"
        out = structured(await session.call_tool("run_command", {"command": ["cat"]}))
        assert out["stdout"] == ""
        out = structured(await session.call_tool("run_command", {"command": ["no-such-cmd-x"]}))
        assert out["exit_code"] == 127

    serve(tmp_path, body)


def test_subdirectory_cwd_and_outside_cwd_refused(tmp_path: Path) -> None:
    (tmp_path / "ws" / "sub").mkdir(parents=True)

    async def body(session: ClientSession) -> None:
        out = structured(await session.call_tool("run_command", {"command": ["pwd"], "cwd": "sub"}))
        assert out["stdout"].strip().endswith("/ws/sub")
        for bad in ("..", "/etc", "sub/../../"):
            result = await session.call_tool("run_command", {"command": ["pwd"], "cwd": bad})
            assert result.is_error
            assert "outside the workspace" in text_of(result)

    serve(tmp_path, body)


def test_withheld_credential_is_a_denial_with_a_hint(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        out = structured(
            await session.call_tool(
                "run_command", {"command": 'echo "token=${STOCKADE_TEST_TOKEN:-unset}"'}
            )
        )
        assert out["stdout"] == "token=unset\n"
        denial = next(d for d in out["denials"] if d["target"] == "STOCKADE_TEST_TOKEN")
        assert denial["layer"] == "secrets"
        assert denial["reason"] == "credential-env"
        assert "ask the user" in denial["hint"]
        assert "allow_secret = true" in denial["hint"]

    serve(tmp_path, body, env={"STOCKADE_TEST_TOKEN": "s3cret-value"})
    # The run was audited where `stockade log` looks.
    logs = list((tmp_path / "state" / "stockade" / "runs").glob("*-mcp-*.jsonl"))
    assert len(logs) == 1
    events = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert any(e["reason"] == "credential-env" for e in events)
    assert "s3cret-value" not in logs[0].read_text()


def test_denied_connection_shows_up_with_a_hint(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[network]\nallow = ["example.test"]\n')
    fetch = (
        "import urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen('http://evil.test/', timeout=10)\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
    )

    async def body(session: ClientSession) -> None:
        out = structured(
            await session.call_tool("run_command", {"command": ["python3", "-c", fetch]})
        )
        assert out["stdout"].startswith("refused:")
        denial = next(d for d in out["denials"] if d["layer"] == "egress")
        assert denial["reason"] == "host-not-allowed"
        assert "evil.test" in denial["target"]
        assert denial["hint"] == "host evil.test is not in network.allow; ask the user to add it"

    serve(tmp_path, body, "--policy", str(policy))


def test_timeout_kills_and_reports(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        out = structured(
            await session.call_tool("run_command", {"command": ["sleep", "30"], "timeout": 1})
        )
        assert out["exit_code"] == 124
        assert out["timed_out"] is True
        assert any(d["reason"] == "limit-wall-time" for d in out["denials"])
        result = await session.call_tool("run_command", {"command": ["true"], "timeout": 0})
        assert result.is_error

    serve(tmp_path, body)


def test_sandbox_policy_explains(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[network]\nallow = ["example.test"]\n[layers]\ninspect = false\n')

    async def body(session: ClientSession) -> None:
        out = structured(await session.call_tool("sandbox_policy", {}))
        assert out["workspace"] == str((tmp_path / "ws").resolve())
        assert out["network_allow"] == ["example.test"]
        assert "inspect" in out["layers_off"]
        assert "ask the user" in out["summary"]

    serve(tmp_path, body, "--policy", str(policy))


def test_bad_policy_fails_before_serving(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "ws").mkdir()
    bad = tmp_path / "bad.toml"
    bad.write_text('[network]\nallow = ["*"]\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stockade",
            "mcp",
            "--workspace",
            str(tmp_path / "ws"),
            "--policy",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 125
    assert result.stdout == ""
    assert "network.allow[0]" in result.stderr


def test_the_built_in_policy_reports_refused_network_attempts(tmp_path: Path) -> None:
    # No policy at all: nothing is allowed, and each attempt is still a denial with a hint
    # (issue 24 item 5), not an empty list beside a "could not resolve host".
    fetch = (
        "import socket\n"
        "try:\n"
        "    socket.getaddrinfo('refused.test', 443)\n"
        "except OSError as exc:\n"
        "    print('refused:', type(exc).__name__)\n"
    )

    async def body(session: ClientSession) -> None:
        out = structured(
            await session.call_tool("run_command", {"command": ["python3", "-c", fetch]})
        )
        assert out["stdout"] == "refused: gaierror\n"
        denial = next(d for d in out["denials"] if d["layer"] == "egress")
        assert denial["reason"] == "host-not-allowed"
        assert denial["target"] == "refused.test"
        assert "ask the user" in denial["hint"]

    serve(tmp_path, body, env={"XDG_CONFIG_HOME": str(tmp_path / "no-config")})


def test_server_version_and_command_not_found_in_the_result(tmp_path: Path) -> None:
    # Issue 24 item 10: the version is the package's, and "command not found" is in the
    # tool result's stderr (the model reads that), not only in the server's own stderr.
    from stockade._version import __version__

    ws = tmp_path / "ws"
    ws.mkdir()
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "stockade", "mcp", "--workspace", str(ws)],
        env={"XDG_STATE_HOME": str(tmp_path / "state")},
        cwd=str(ws),
    )

    async def main() -> None:
        with anyio.fail_after(60):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.version == __version__
                out = structured(
                    await session.call_tool("run_command", {"command": ["no-such-cmd-x"]})
                )
                assert out["exit_code"] == 127
                assert "no-such-cmd-x: command not found" in out["stderr"]
                # The twin: a command that exists has no such line.
                out = structured(await session.call_tool("run_command", {"command": ["true"]}))
                assert out["stderr"] == ""

    anyio.run(main)


def test_the_policy_file_named_in_hints(tmp_path: Path, monkeypatch: Any) -> None:
    from stockade.mcp._server import policy_file
    from stockade.policy import load_policy

    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "conf"))
    # No policy anywhere: where the user policy would be, under XDG_CONFIG_HOME.
    built_in = load_policy(None, workspace=ws)
    assert policy_file(built_in) == str(tmp_path / "conf" / "stockade" / "policy.toml")
    given = tmp_path / "agent.toml"
    given.write_text("version = 1\n")
    assert policy_file(load_policy(given, workspace=ws)) == str(given)
