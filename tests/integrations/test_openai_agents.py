"""The OpenAI Agents SDK on stockade: a SandboxAgent run by the SDK's Runner with its own
ScriptedModel, through StockadeSandboxClient; and ShellTool with shell_executor."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.conftest import AgentWorld

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, RunConfig, Runner, ShellTool  # noqa: E402
from agents.run_config import SandboxRunConfig  # noqa: E402
from agents.sandbox import Manifest, SandboxAgent  # noqa: E402
from agents.sandbox.capabilities import Shell  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import stockade  # noqa: E402
from stockade.integrations.openai_agents import (  # noqa: E402
    StockadeSandboxClient,
    shell_executor,
)

pytestmark = pytest.mark.usefixtures("kernel")


def tool_outputs(model: ScriptedModel) -> list[str]:
    """What the model was shown as tool results, call by call."""
    out = []
    for call in model.calls:
        items = call.input if isinstance(call.input, list) else []
        for item in items:
            if isinstance(item, dict) and item.get("type", "").endswith("call_output"):
                output = item.get("output")
                out.append(output if isinstance(output, str) else json.dumps(output))
    return out


def run_sandbox_agent(aw: AgentWorld, commands: list[str]) -> tuple[ScriptedModel, Any]:
    steps: list[Any] = [
        [function_call("exec_command", {"cmd": cmd}, call_id=f"c{i}")]
        for i, cmd in enumerate(commands)
    ]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    client = StockadeSandboxClient(aw.policy, env=aw.world.env)
    agent = SandboxAgent(
        name="builder",
        instructions="work in the workspace",
        capabilities=[Shell()],
        default_manifest=Manifest(root=str(aw.workspace)),
    )
    result = asyncio.run(
        Runner.run(
            agent,
            "go",
            run_config=RunConfig(
                model=model, tracing_disabled=True, sandbox=SandboxRunConfig(client=client)
            ),
        )
    )
    return model, result


def test_sandbox_agent_allowed_action_works(agent_world: AgentWorld) -> None:
    model, result = run_sandbox_agent(agent_world, [agent_world.allowed_command()])
    assert result.final_output == "done"
    shown = tool_outputs(model)
    assert len(shown) == 1
    assert "fine-from-ok" in shown[0]
    assert (agent_world.workspace / "made.txt").read_text() == "made\n"
    assert agent_world.ok.log == ["/fine"]


def test_sandbox_agent_attack_is_refused(agent_world: AgentWorld) -> None:
    model, _ = run_sandbox_agent(agent_world, [agent_world.attack_command()])
    shown = tool_outputs(model)
    assert len(shown) == 1
    assert "attempted" in shown[0]
    assert agent_world.canary not in shown[0]
    # The denial reached the model as the MCP server's hint.
    assert "host-not-allowed" in shown[0]
    assert "evil.test is not in network.allow; ask the user to add it" in shown[0]
    agent_world.assert_world_after_attack()


def test_session_file_api_keeps_to_the_sandbox(agent_world: AgentWorld) -> None:
    """The SDK's host-side file operations (read/write/rm/mkdir) on a stockade session."""
    from agents.sandbox.errors import WorkspaceArchiveWriteError

    ws = agent_world.workspace

    async def main() -> None:
        client = StockadeSandboxClient(agent_world.policy, env=agent_world.world.env)
        session = await client.create(manifest=Manifest(root=str(ws)))
        try:
            await session.write(Path("notes/a.txt"), io.BytesIO(b"hello"))
            assert (ws / "notes" / "a.txt").read_bytes() == b"hello"
            with await session.read(Path("notes/a.txt")) as f:
                assert f.read() == b"hello"
            for target in (".git/hooks/pre-commit", ".claude/settings.json", ".vscode/x.json"):
                with pytest.raises(WorkspaceArchiveWriteError) as caught:
                    await session.write(Path(target), io.BytesIO(b"#!/bin/sh\n"))
                assert "protected" in str(caught.value.__cause__)
            with pytest.raises(WorkspaceArchiveWriteError):
                await session.rm(Path(".git"), recursive=True)
            with pytest.raises(WorkspaceArchiveWriteError):
                await session.mkdir(Path(".claude/agents"), parents=True)
            await session.rm(Path("notes"), recursive=True)
            assert not (ws / "notes").exists()
            r = await session.exec("echo $((2+3))", shell=True)
            assert (r.exit_code, r.stdout) == (0, b"5\n")
        finally:
            await client.delete(session)

    asyncio.run(main())
    agent_world.assert_world_after_attack()
    assert (ws / ".git" / "config").exists()


def test_shell_tool_executor(agent_world: AgentWorld) -> None:
    from openai.types.responses.response_function_shell_tool_call import (
        Action,
        ResponseFunctionShellToolCall,
    )

    # ShellTool is a hosted tool type: the model emits a shell_call item, not a function call.
    call = ResponseFunctionShellToolCall(
        id="s1",
        call_id="s1",
        type="shell_call",
        status="completed",
        action=Action(commands=[agent_world.allowed_command(), agent_world.attack_command()]),
    )
    model = ScriptedModel([[call], [assistant_message("done")]])

    async def main() -> Any:
        with stockade.Sandbox(
            agent_world.policy, workspace=agent_world.workspace, env=agent_world.world.env
        ) as sb:
            agent = Agent(name="sh", tools=[ShellTool(executor=shell_executor(sb))])
            return await Runner.run(
                agent, "go", run_config=RunConfig(model=model, tracing_disabled=True)
            )

    result = asyncio.run(main())
    assert result.final_output == "done"
    shown = "\n".join(tool_outputs(model))
    assert "fine-from-ok" in shown
    assert "attempted" in shown
    assert agent_world.canary not in shown
    assert "host-not-allowed" in shown
    assert (agent_world.workspace / "made.txt").exists()
    agent_world.assert_world_after_attack()
