"""LangChain v1 and deepagents on stockade: create_agent with ShellToolMiddleware and
StockadeExecutionPolicy, and create_deep_agent with StockadeBackend, each driven by
langchain-core's fake chat model emitting tool calls."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.integrations.conftest import AgentWorld

pytest.importorskip("langchain.agents.middleware", reason="the langchain extra is not installed")

from langchain.agents import create_agent
from langchain.agents.middleware import ShellToolMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from stockade.integrations.langchain import StockadeExecutionPolicy

pytestmark = pytest.mark.usefixtures("kernel")


class FakeToolModel(GenericFakeChatModel):
    """The fake chat model, able to be bound to tools (it emits the scripted calls)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeToolModel:
        return self


def script(tool: str, arg: str, commands: list[str]) -> FakeToolModel:
    messages = [
        AIMessage(content="", tool_calls=[{"name": tool, "args": {arg: c}, "id": f"t{i}"}])
        for i, c in enumerate(commands)
    ]
    return FakeToolModel(messages=iter([*messages, AIMessage(content="done")]))


def shown(result: dict[str, Any]) -> list[str]:
    """What the model was shown as tool results."""
    return [str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)]


def shell_agent(aw: AgentWorld, commands: list[str]) -> list[str]:
    middleware = ShellToolMiddleware(
        aw.workspace,
        execution_policy=StockadeExecutionPolicy(policy=aw.policy, caller_env=aw.world.env),
    )
    agent = create_agent(model=script("shell", "command", commands), middleware=[middleware])
    return shown(agent.invoke({"messages": [{"role": "user", "content": "go"}]}))


def test_shell_middleware_allowed_action_works(agent_world: AgentWorld) -> None:
    # The persistent shell keeps its state between calls: the variable set first is there.
    out = shell_agent(
        agent_world, ["export GREETING=kept", agent_world.allowed_command(), "echo $GREETING"]
    )
    assert len(out) == 3
    assert "fine-from-ok" in out[1]
    assert "kept" in out[2]
    assert (agent_world.workspace / "made.txt").read_text() == "made\n"


def test_shell_middleware_attack_is_refused(agent_world: AgentWorld) -> None:
    out = shell_agent(agent_world, [agent_world.attack_command()])
    assert "attempted" in out[0]
    assert agent_world.canary not in out[0]
    agent_world.assert_world_after_attack()


def test_deep_agent_execute_and_files(agent_world: AgentWorld) -> None:
    pytest.importorskip("deepagents", reason="the deepagents extra is not installed")
    from deepagents import create_deep_agent

    from stockade.integrations.deepagents import StockadeBackend

    with StockadeBackend(
        agent_world.workspace, policy=agent_world.policy, env=agent_world.world.env
    ) as backend:
        model = script(
            "execute",
            "command",
            [
                agent_world.allowed_command(),
                agent_world.attack_command(),
                "echo left > /tmp/left",
                "cat /tmp/left",
            ],
        )
        agent = create_deep_agent(model=model, backend=backend)
        out = shown(agent.invoke({"messages": [{"role": "user", "content": "go"}]}))
        assert "fine-from-ok" in out[0]
        assert "attempted" in out[1]
        assert agent_world.canary not in out[1]
        assert "evil.test is not in network.allow" in out[1]
        assert "left" in out[3]  # the session's /tmp lasts across commands
        # The host-side file API of the backend.
        up = backend.upload_files([("notes.txt", b"n"), (".git/hooks/pre-commit", b"#!/bin/sh\n")])
        assert [u.error for u in up] == [None, "permission_denied"]
        down = backend.download_files(
            ["notes.txt", str(agent_world.world.home / ".ssh/id_ed25519")]
        )
        assert down[0].content == b"n"
        assert down[1].error == "permission_denied"
    assert (agent_world.workspace / "made.txt").exists()
    agent_world.assert_world_after_attack()


def test_the_shells_pipes_are_closed_once_read_to_their_end(agent_world: AgentWorld) -> None:
    # The middleware reads the shell's output to its end and never closes it: left open,
    # its pipe files reached the garbage collector, whose ResourceWarning then failed an
    # unrelated later test. Read to the end, they close.
    import gc
    import time
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        out = shell_agent(agent_world, ["echo still-works"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            gc.collect()
            if not [t for t in threading.enumerate() if t.name == "stockade-shell"]:
                break
            time.sleep(0.05)
        time.sleep(0.2)  # the middleware's readers see the end just after the shell
        gc.collect()
    assert "still-works" in out[0]  # the twin: the shell's output arrives whole
    leaks = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert leaks == []
