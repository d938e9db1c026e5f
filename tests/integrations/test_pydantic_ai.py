"""pydantic-ai on stockade: an Agent run with FunctionModel whose tool runs commands through
``ctx.workspace`` (StockadeWorkspace), and pydantic-ai's own workspace conformance suite."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import World
from tests.integrations.conftest import AgentWorld

pytest.importorskip("pydantic_ai.workspaces", reason="the pydantic-ai extra is not installed")

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite, _commands

import stockade
from stockade.integrations.pydantic_ai import (
    StockadeWorkspace,
    StockadeWorkspaceBackend,
)

pytestmark = pytest.mark.usefixtures("kernel")


def scripted(commands: list[str]) -> tuple[FunctionModel, list[str]]:
    """A FunctionModel that calls the ``shell`` tool once per command, then answers; and
    the list that collects what the model was shown as tool results."""
    shown: list[str] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts if isinstance(messages[-1], ModelRequest) else ():
            if isinstance(part, ToolReturnPart):
                shown.append(str(part.content))
        step = len(shown)
        if step < len(commands):
            return ModelResponse(
                parts=[ToolCallPart("shell", {"command": commands[step]}, tool_call_id=f"t{step}")]
            )
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond), shown


def agent_for(
    aw: AgentWorld, model: FunctionModel
) -> tuple[Agent[None, str], StockadeWorkspace[None]]:
    workspace: StockadeWorkspace[None] = StockadeWorkspace(
        aw.workspace, policy=aw.policy, caller_env=aw.world.env
    )
    agent: Agent[None, str] = Agent(model, capabilities=[workspace])

    @agent.tool
    async def shell(ctx: RunContext[None], command: str) -> str:
        """Run a shell command in the workspace."""
        r = await ctx.workspace.run(command, shell=True, timeout=60)
        return f"exit {r.exit_code}\n{r.stdout}{r.stderr}"

    return agent, workspace


def test_agent_allowed_action_works(agent_world: AgentWorld) -> None:
    model, shown = scripted([agent_world.allowed_command()])
    agent, workspace = agent_for(agent_world, model)
    try:
        # asyncio.run, not run_sync: run_sync leaves its event loop open for the process.
        result = asyncio.run(agent.run("go"))
    finally:
        workspace.close()
    assert result.output == "done"
    assert len(shown) == 1
    assert shown[0].startswith("exit 0\n")
    assert "fine-from-ok" in shown[0]
    assert (agent_world.workspace / "made.txt").read_text() == "made\n"


def test_agent_attack_is_refused(agent_world: AgentWorld) -> None:
    model, shown = scripted([agent_world.attack_command()])
    agent, workspace = agent_for(agent_world, model)
    try:
        asyncio.run(agent.run("go"))
    finally:
        workspace.close()
    assert "attempted" in shown[0]
    assert agent_world.canary not in shown[0]
    assert "evil.test is not in network.allow; ask the user to add it" in shown[0]
    agent_world.assert_world_after_attack()


def test_workspace_file_api_goes_through_the_sandbox(agent_world: AgentWorld) -> None:
    """pydantic-ai's Workspace derives file operations through the backend's shell, so the
    sandbox's protected paths hold for them too."""
    from pydantic_ai.workspaces import Workspace

    async def main() -> None:
        with stockade.Sandbox(
            agent_world.policy, workspace=agent_world.workspace, env=agent_world.world.env
        ) as sb:
            ws = Workspace(StockadeWorkspaceBackend(sb))
            await ws.write_bytes("notes/a.txt", b"hello")
            assert await ws.read_bytes("notes/a.txt") == b"hello"
            with pytest.raises(OSError):
                await ws.write_bytes(".git/hooks/pre-commit", b"#!/bin/sh\n")

    asyncio.run(main())
    assert (agent_world.workspace / "notes" / "a.txt").read_bytes() == b"hello"
    agent_world.assert_world_after_attack()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TestStockadeConformance(WorkspaceBackendSuite):
    """pydantic-ai's conformance suite for workspace backends, on a stockade sandbox."""

    @pytest.fixture
    def backend(self, world: World) -> Iterator[StockadeWorkspaceBackend]:
        with stockade.Sandbox(workspace=world.workspace, env=world.env, tmp="session") as sb:
            yield StockadeWorkspaceBackend(sb)

    @pytest.fixture
    def has_real_posix_shell(self) -> bool:
        return True

    @pytest.fixture
    def attach_backend(self, backend: StockadeWorkspaceBackend) -> Any:
        sandbox = backend._sandbox

        def attach(ref: Any) -> StockadeWorkspaceBackend:
            assert ref == backend.ref
            return StockadeWorkspaceBackend(sandbox)

        return attach

    # Two rules of the suite ask for what stockade refuses by design; each is replaced by
    # a test of what stockade does instead, checked on the host's process table.

    async def test_a_backend_attached_by_ref_reaches_a_detached_process(  # type: ignore[override]
        self, backend: StockadeWorkspaceBackend
    ) -> None:
        """Refused by design: nothing a command starts outlives its run (the PID namespace
        ends with it), detached into its own session or not."""
        token = f"stockade-detached-{os.getpid()}-{id(backend)}"
        result = await _commands(backend).run(
            [
                "sh",
                "-c",
                'setsid python3 -c "import time; time.sleep(300)" "$1" '
                "</dev/null >/dev/null 2>&1 & sleep 0.5",
                "sh",
                token,
            ]
        )
        assert result.exit_code == 0
        await asyncio.sleep(0.5)
        assert _host_processes(token) == []

    async def test_cancellation_stops_foreground_work(  # type: ignore[override]
        self, backend: StockadeWorkspaceBackend
    ) -> None:
        """The suite records a pid, which names a process of the next run in that run's own
        PID namespace; the same rule is checked on the host's process table instead."""
        token = f"stockade-foreground-{os.getpid()}-{id(backend)}"
        task = asyncio.create_task(
            _commands(backend).run(["python3", "-c", "import time; time.sleep(3600)", token])
        )
        for _ in range(600):
            if _host_processes(token):
                break
            await asyncio.sleep(0.05)
        assert _host_processes(token), "the command never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _host_processes(token) == []

    @pytest.fixture
    def filesystem_honors_shell_permissions(self) -> bool:
        # As root (CI) a chmod 000 file stays readable: the shell's view is root's.
        return os.geteuid() != 0


def _host_processes(token: str) -> list[int]:
    """Pids of host processes whose command line holds ``token``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if token.encode() in cmdline and b"time.sleep" in cmdline:
            found.append(int(entry))
    return found
