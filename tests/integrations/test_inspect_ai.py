"""Inspect AI on stockade: real evals with the ``mockllm/model`` model whose scripted tool
calls run Inspect's own ``bash()`` and ``python()`` tools in the ``stockade`` sandbox
provider (found through the ``inspect_ai`` entry point), and Inspect's sandbox
conformance suite (``inspect_ai.util._sandbox.self_check``) run against the provider."""

from __future__ import annotations

import os
import random
import string
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SECRET_ENV, World
from tests.integrations.conftest import AgentWorld

pytest.importorskip(
    "inspect_ai.util._sandbox.self_check", reason="the inspect extra is not installed"
)

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import SandboxEnvironment, SandboxEnvironmentSpec, sandbox
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

# Inspect's conformance checks, collected here as tests of the sandbox_env fixture below.
from inspect_ai.util._sandbox.self_check import *  # noqa: F403
from inspect_ai.util._sandbox.self_check import Raises

import stockade
from stockade.integrations.inspect_ai import StockadeSandboxConfig, StockadeSandboxEnvironment

pytestmark = [pytest.mark.usefixtures("kernel"), pytest.mark.anyio]

# Inspect 0.3.285 leaves the receive end of each sample's hook-event stream unclosed
# (inspect_ai/hooks/_hooks.py, start_sample_event_emitter: the loop ends at EndOfStream
# without closing it); anyio warns when it is collected. Nothing of stockade's.
inspect_leak = pytest.mark.filterwarnings(
    "ignore:Unclosed <MemoryObjectReceiveStream:ResourceWarning"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def caller(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The eval's process environment is the world's: HOME with the canaries, and the
    secret variables (the provider's caller environment is the process's own)."""
    for name in ("HOME", *SECRET_ENV):
        monkeypatch.setenv(name, world.env[name])
    return world


# -- real evals: mockllm's scripted tool calls through bash() and python() -----------------


def scripted(*outputs: ModelOutput) -> Any:
    """mockllm/model answering with ``outputs`` in turn. Each carries its usage: otherwise
    mockllm counts tokens with tiktoken, whose first use downloads an encoding."""
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return get_model("mockllm/model", custom_outputs=list(outputs))


def tool_call(i: int, tool: str, args: dict[str, str]) -> ModelOutput:
    return ModelOutput.for_tool_call("mockllm/model", tool, args, tool_call_id=f"t{i}")


def answer() -> ModelOutput:
    return ModelOutput.from_content("mockllm/model", "done")


def run_eval(
    calls: list[tuple[str, dict[str, str]]],
    spec: Any,
    log_dir: Path,
    *,
    setup: Solver | None = None,
) -> tuple[EvalLog, list[ChatMessageTool]]:
    """One sample whose model calls ``calls`` (tool, arguments) in turn, then answers."""
    model = scripted(*(tool_call(i, tool, args) for i, (tool, args) in enumerate(calls)), answer())
    solvers = [*([setup] if setup else []), use_tools([bash(timeout=60), python(timeout=60)])]
    task = Task(
        dataset=[Sample(input="go")],
        solver=[*solvers, generate()],
        sandbox=spec,
    )
    [log] = inspect_eval(
        task, model=model, log_dir=str(log_dir), display="none", log_realtime=False
    )
    assert log.status == "success", log.error
    assert log.samples is not None
    tools = [m for m in log.samples[0].messages if isinstance(m, ChatMessageTool)]
    assert len(tools) == len(calls)
    return log, tools


def shown(message: ChatMessageTool) -> str:
    """What the model was shown for one tool call (its output or its error)."""
    return message.text + (message.error.message if message.error else "")


@solver
def record_workspace(into: list[Path]) -> Solver:
    """Notes the sample's workspace (to look at the world once the eval is over)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        into.append(sandbox().as_type(StockadeSandboxEnvironment).workspace)
        return state

    return solve


@solver
def attack_host_files(results: list[str]) -> Solver:
    """Host-side file operations Inspect offers a solver: a hook into the sample's repo,
    the canary under HOME, a file the policy denies. Each must raise, never touch the
    host's file, and say why."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        env = sandbox()
        made = await env.exec(["git", "init", "-q", "."])
        assert made.success, made.stderr
        for attempt in (
            env.write_file(".git/hooks/pre-commit", "#!/bin/sh\ncurl evil.test\n"),
            env.read_file(os.path.expanduser("~/.ssh/id_ed25519")),
            env.read_file("/etc/shadow"),
        ):
            try:
                await attempt
                results.append("not refused")
            except OSError as exc:
                results.append(f"{type(exc).__name__}: {exc}")
        workspace = env.as_type(StockadeSandboxEnvironment).workspace
        results.append(f"hook on the host: {(workspace / '.git/hooks/pre-commit').exists()}")
        return state

    return solve


@inspect_leak
def test_eval_allowed_actions_work(agent_world: AgentWorld, caller: World, tmp_path: Path) -> None:
    """bash() writes a workspace file and reaches the pinned ok.test; python() prints back;
    /tmp lasts across the sample's calls: all of it is what the model is shown."""
    workspaces: list[Path] = []
    marker = "".join(random.choices(string.ascii_lowercase, k=12))
    _, tools = run_eval(
        [
            ("bash", {"command": agent_world.allowed_command()}),
            ("python", {"code": f"print(open('made.txt').read().strip(), '{marker}')"}),
            ("bash", {"command": f"echo {marker} > /tmp/kept"}),
            ("bash", {"command": "cat /tmp/kept; pwd"}),
        ],
        ("stockade", str(agent_world.policy)),
        tmp_path / "logs",
        setup=record_workspace(workspaces),
    )
    assert "fine-from-ok" in shown(tools[0])
    assert f"made {marker}" in shown(tools[1])
    assert marker in shown(tools[3])
    [workspace] = workspaces
    assert str(workspace) in shown(tools[3])  # commands start in the sample's workspace
    assert agent_world.ok.log == ["/fine"]
    assert not workspace.exists()  # removed with the sample


@inspect_leak
def test_eval_attack_is_refused(agent_world: AgentWorld, caller: World, tmp_path: Path) -> None:
    """The same eval's attack: the canary under HOME, evil.test (pinned to loopback but not
    allowed), a Python connect to it, and a hook written through the file API."""
    refusals: list[str] = []
    evil = f"http://evil.test:{agent_world.evil.port}"
    _, tools = run_eval(
        [
            ("bash", {"command": agent_world.attack_command()}),
            (
                "python",
                {
                    "code": (
                        "import urllib.request\n"
                        "try:\n"
                        f"    urllib.request.urlopen('{evil}/py', timeout=20)\n"
                        "except Exception as e:\n"
                        "    print('blocked:', type(e).__name__)\n"
                    )
                },
            ),
        ],
        SandboxEnvironmentSpec("stockade", StockadeSandboxConfig(policy=str(agent_world.policy))),
        tmp_path / "logs",
        setup=attack_host_files(refusals),
    )
    first = shown(tools[0])
    assert "attempted" in first
    assert agent_world.canary not in first
    assert "evil.test is not in network.allow" in first
    assert "blocked:" in shown(tools[1])
    assert agent_world.evil.log == []
    [hook, secret, shadow, on_host] = refusals
    assert on_host == "hook on the host: False"
    assert hook.startswith("PermissionError")
    assert "path-protected" in hook
    # The world's HOME lives under /tmp, and the sandbox's /tmp is the sample's own: the
    # sandbox has no such file (a HOME elsewhere is refused as path-not-granted).
    assert secret.startswith(("FileNotFoundError", "PermissionError")), secret
    assert agent_world.canary not in secret
    assert shadow.startswith("PermissionError")
    assert "path-denied" in shadow


@inspect_leak
def test_eval_user_other_than_ours_is_refused(
    agent_world: AgentWorld, caller: World, tmp_path: Path
) -> None:
    """bash(user="nobody"): stockade runs as the eval's own user or not at all. The
    sample fails with the reason (the eval's author asked for it, not the model), and the
    command never ran: the allowed server saw nothing."""
    command = f"curl -sS -m 20 http://ok.test:{agent_world.ok.port}/ran-as-nobody"
    task = Task(
        dataset=[Sample(input="go")],
        solver=[use_tools([bash(user="nobody")]), generate()],
        sandbox=("stockade", str(agent_world.policy)),
    )
    model = scripted(tool_call(0, "bash", {"command": command}), answer())
    [log] = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "error"
    assert log.error is not None
    assert "cannot run as user 'nobody'" in log.error.message
    assert agent_world.ok.log == []


@inspect_leak
def test_eval_bad_policy_fails_the_task_before_any_sample(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[network]\nallow = 3\n")
    task = Task(dataset=[Sample(input="go")], solver=[generate()], sandbox=("stockade", str(bad)))
    with pytest.raises(stockade.PolicyError, match=r"network\.allow"):
        inspect_eval(task, model=scripted(answer()), log_dir=str(tmp_path / "logs"), display="none")


def test_the_provider_is_registered_by_entry_point_and_config_round_trips() -> None:
    assert registry_find_sandboxenv("stockade") is StockadeSandboxEnvironment
    config = StockadeSandboxConfig(policy="agent.toml", allow_hosts=("ok.test",))
    spec = SandboxEnvironmentSpec("stockade", config)
    again = SandboxEnvironmentSpec.model_validate(spec.model_dump())
    assert again.config == config


# -- Inspect's conformance suite ---------------------------------------------------------


@pytest.fixture
async def sandbox_env(caller: World) -> AsyncIterator[SandboxEnvironment]:
    """A sample's sandbox with the default policy, as Inspect's runner makes one."""
    envs = await StockadeSandboxEnvironment.sample_init("self_check", None, {})
    try:
        yield envs["default"]
    finally:
        await StockadeSandboxEnvironment.sample_cleanup("self_check", None, envs, False)


# One check of the suite asks for what stockade refuses by design; it is replaced by a
# test of what stockade does instead (same name, so the suite's version is not collected).


async def test_exec_as_user(sandbox_env: SandboxEnvironment) -> None:
    """Refused by design: the suite adds a user (``adduser`` as root) and runs commands as
    it. stockade runs every command as the eval's own user: another user raises
    ``SandboxUserUnsupportedError`` before anything runs; our own name (or uid) runs as
    us; and the sandbox cannot add a user to the host (its /etc is read-only)."""
    import pwd

    from inspect_ai.util import SandboxUserUnsupportedError

    me = pwd.getpwuid(os.geteuid())
    other = "nobody" if me.pw_name != "nobody" else "root"
    with Raises(SandboxUserUnsupportedError) as refused:
        await sandbox_env.exec(["touch", "ran-as-other"], user=other)
    assert refused.value is not None
    assert f"cannot run as user {other!r}" in str(refused.value)
    assert not (await sandbox_env.exec(["test", "-e", "ran-as-other"])).success

    for user in (me.pw_name, str(me.pw_uid)):
        result = await sandbox_env.exec(["id", "-u"], user=user)
        assert result.success, result.stderr
        assert result.stdout.strip() == str(me.pw_uid)

    username = "inspect-ai-test-exec-as-user"
    added = await sandbox_env.exec(
        ["adduser", "--comment", "self_check.py", "--disabled-password", username],
        user=me.pw_name,
        timeout=30,
    )
    assert not added.success
    with pytest.raises(KeyError):
        pwd.getpwnam(username)


def test_stockade_itself_never_imports_inspect() -> None:
    """The provider is imported by Inspect's entry point only: stockade's CLI, API and
    integrations package leave inspect_ai unloaded (the CLI has a start-up budget)."""
    import subprocess
    import sys

    probe = (
        "import sys, stockade, stockade.api, stockade.cli, stockade.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'inspect_ai'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
