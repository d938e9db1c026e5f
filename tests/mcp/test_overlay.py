"""``stockade mcp --overlay``: one layer for the session, reviewed through the
workspace_* tools; the real workspace untouched, and no tool that applies."""

from __future__ import annotations

from pathlib import Path

from mcp import ClientSession
from tests.mcp.test_server import serve, structured


def test_overlay_session_tools(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")

    async def body(session: ClientSession) -> None:
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"workspace_changes", "workspace_diff", "workspace_rollback"} <= names
        assert not any("apply" in n for n in names)  # the model does not approve its writes
        out = structured(await session.call_tool("run_command", {"command": "echo one > a.txt"}))
        assert out["exit_code"] == 0
        structured(await session.call_tool("workspace_checkpoint", {"name": "one"}))
        out = structured(
            await session.call_tool("run_command", {"command": "echo two > a.txt; echo n > b"})
        )
        seen = structured(await session.call_tool("run_command", {"command": "cat a.txt"}))
        assert seen["stdout"] == "two\n"  # a command sees what the ones before it wrote
        changes = structured(await session.call_tool("workspace_changes", {}))
        assert {c["path"] for c in changes["changes"]} == {"a.txt", "b"}
        assert "stockade apply" in changes["hint"]
        diff = structured(await session.call_tool("workspace_diff", {"paths": ["a.txt"]}))
        assert "-hello\n+two\n" in diff["diff"]
        structured(await session.call_tool("workspace_rollback", {"name": "one"}))
        seen = structured(await session.call_tool("run_command", {"command": "cat a.txt; ls"}))
        assert seen["stdout"].startswith("one\n")
        assert "\nb\n" not in seen["stdout"]
        structured(await session.call_tool("workspace_discard", {}))
        seen = structured(await session.call_tool("run_command", {"command": "cat a.txt"}))
        assert seen["stdout"] == "hello\n"
        assert (ws / "a.txt").read_text() == "hello\n"  # the real workspace never changed

    serve(tmp_path, body, "--overlay")


def test_without_overlay_there_are_no_workspace_tools(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        names = {t.name for t in (await session.list_tools()).tools}
        assert not any(n.startswith("workspace_") for n in names)
        out = structured(await session.call_tool("run_command", {"command": "echo x > f"}))
        assert out["exit_code"] == 0
        assert (tmp_path / "ws" / "f").read_text() == "x\n"  # the twin: read-write

    serve(tmp_path, body)
