"""A run is planned before anything of it starts (issue 23, item 4).

:func:`stockade.runtime._plan.plan` makes every decision about a run and starts nothing:
no process, no socket, no descriptor, no thread, no scratch directory, no audit log
(counted in /proc/self before and after). Its twin: carrying the same plan out starts
the sandbox and does what the plan says. ``stockade check --plan`` prints the plan that
``stockade run`` then follows (compared with the run's audit log).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from stockade.policy import Policy
from stockade.runtime import RunRequest
from stockade.runtime._plan import plan
from stockade.runtime._run import run
from stockade.runtime._scratch import choose
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")


def _children() -> set[int]:
    """The pids of every child of every thread of this process."""
    out: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/self/task/{task}/children").read_text()
            out |= {int(pid) for pid in text.split()}
    return out


def _descriptors() -> set[tuple[str, str]]:
    """(fd, what it names) for every open descriptor, the listing's own left out."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return out


def _state() -> tuple[object, ...]:
    scratch_base = choose().parent
    return (
        _children(),
        _descriptors(),
        threading.active_count(),
        sorted(os.listdir(scratch_base)),
    )


def _request(world: World, argv: list[str], audit: Path) -> RunRequest:
    file = world.root / "policy.toml"
    file.write_text("")
    policy = Policy.load(file, workspace=world.workspace)
    return RunRequest(
        argv=argv, policy=policy, cwd=world.workspace, audit_path=audit, caller_env=world.env
    )


def test_planning_starts_no_process_and_opens_nothing(world: World) -> None:
    audit = world.root / "audit.jsonl"
    request = _request(world, ["sh", "-c", "exit 7"], audit)
    plan(request)  # the host probes it reads are cached per process (_plan's docstring)
    before = _state()
    planned = plan(request)
    after = _state()
    assert after == before
    assert not planned.scratch.exists()
    assert not audit.exists()
    assert planned.argv == ("sh", "-c", "exit 7")
    assert planned.egress is not None
    assert planned.egress.capture_ports


def test_carrying_out_the_plan_runs_it(world: World) -> None:
    audit = world.root / "audit.jsonl"
    request = _request(world, ["sh", "-c", "pwd; exit 7"], audit)
    planned = plan(request)
    request.capture_output = True
    result = run(planned, request)
    assert result.returncode == 7
    assert result.run_id == planned.run_id
    assert result.stdout is not None
    assert result.stdout.decode().strip() == str(planned.cwd)
    assert result.audit_path == planned.audit_path == audit
    (start,) = [e for e in result.events if e["event"] == "run_start"]
    assert start["layers"] == list(planned.policy.layers.active())
    assert start["cwd"] == str(planned.cwd)
    assert not planned.scratch.exists()  # made for the run (or not at all) and removed


@pytest.mark.parametrize(
    "text", ["", "[layers]\negress = false\nlimits = false\n"], ids=["default", "fewer-layers"]
)
def test_check_plan_is_what_run_does(world: World, text: str) -> None:
    (world.root / "policy.toml").write_text(text)
    policy = ("--policy", str(world.root / "policy.toml"))
    shown = world.stockade("check", *policy, "--json", "--plan", "--", "sh", "-c", "exit 0")
    assert shown.returncode == 0, shown.stderr
    planned = json.loads(shown.stdout)
    audit = world.root / "audit.jsonl"
    ran = world.stockade("run", *policy, "--audit", str(audit), "--", "sh", "-c", "exit 0")
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    (start,) = [e for e in events if e["event"] == "run_start"]
    assert planned["argv"] == start["argv"] == ["sh", "-c", "exit 0"]
    assert planned["layers"] == start["layers"]
    assert planned["cwd"] == start["cwd"]
    assert planned["container"]["workspace"] == start["workspace"]
    # the egress layer's proxy: planned when on, and its events are the run's
    connects = [e for e in events if e["event"] == "net_connect"]
    if "egress" in start["layers"]:
        assert planned["egress"]["proxy"].startswith("127.0.0.1:3128")
    else:
        assert planned["egress"] is None
        assert not connects
    if "limits" not in start["layers"]:
        assert not planned["limits"]["cgroup"]
    human = world.stockade("check", *policy, "--plan", "sh", "-c", "exit 0")
    assert human.returncode == 0, human.stderr
    assert "argv                    sh -c 'exit 0'" in human.stdout
    assert f"cwd                     {start['cwd']}" in human.stdout


def test_the_planned_bubblewrap_is_the_one_that_runs(world: World) -> None:
    """The plan's bwrap, toolchain binds and working directory, read from the running
    bubblewrap's /proc entry (its executable and command line)."""
    shown = world.stockade("check", "--json", "--plan", "--", "sleep", "30")
    assert shown.returncode == 0, shown.stderr
    planned = json.loads(shown.stdout)
    proc = subprocess.Popen(
        [*world.command, "run", "--", "sleep", "30"],
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        bwrap = None
        deadline = time.monotonic() + 30
        while bwrap is None and time.monotonic() < deadline and proc.poll() is None:
            for task in os.listdir(f"/proc/{proc.pid}/task"):
                with contextlib.suppress(OSError):
                    for pid in Path(f"/proc/{proc.pid}/task/{task}/children").read_text().split():
                        if os.readlink(f"/proc/{pid}/exe") == planned["tools"]["bwrap"]:
                            bwrap = pid
            time.sleep(0.05)
        assert bwrap is not None, "no bubblewrap process appeared"
        argv = Path(f"/proc/{bwrap}/cmdline").read_bytes().split(b"\0")[:-1]
        args = [a.decode() for a in argv]
        for path in planned["container"]["toolchains"]:
            at = args.index(path)
            assert args[at - 1] == "--ro-bind"
            assert args[at + 1] == path
        workspace = planned["container"]["workspace"]
        assert ["--bind", workspace, workspace] == args[
            args.index(workspace) - 1 : args.index(workspace) + 2
        ]
        assert args[args.index("--chdir") + 1] == planned["cwd"]
    finally:
        proc.terminate()  # forwarded to the command; stockade cleans up and ends
        proc.wait(timeout=60)
