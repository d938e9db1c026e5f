"""The compiled front end starts a run server on first use (docs/server.md).

With no server listening, ``stockade run`` through the front end starts one in the
background (``stockade server run`` in a session of its own) and runs the command in
Python meanwhile; the runs after it are served. ``STOCKADE_SERVER=manual`` and ``=0``
start nothing. A server directory that is not the user's alone is left alone. One
server per installation and user (a lock held for its life), and a server whose socket
is gone exits. A caller whose resource limits the server cannot give is declined.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.cli import _client
from tests.conftest import World, _nobody_python, as_nobody, require

pytestmark = pytest.mark.usefixtures("kernel")

#: how long a test waits for a server to come up or go (a deadline, not a measurement)
WAIT_S = 30.0


@pytest.fixture(scope="module")
def frontend() -> str:
    from stockade.cli import _frontend

    return str(_frontend.build_frontend())


@pytest.fixture
def world(world: World, frontend: str) -> Iterator[World]:
    """The shared world, run through the compiled front end; any server it started is
    stopped at the end."""
    world.command = [frontend]
    try:
        yield world
    finally:
        subprocess.run(
            [frontend, "server", "stop"], env=world.env, capture_output=True, check=False
        )


def server_file(world: World, suffix: str) -> Path:
    return Path(_client.socket_path(world.env)).with_suffix(suffix)


def events(world: World, kind: str) -> list[dict[str, object]]:
    log = server_file(world, ".jsonl")
    if not log.exists():
        return []
    found = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in found if e["event"] == kind]


def wait_for(what: str, check: object) -> None:
    assert callable(check)
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT_S:g}s")
        time.sleep(0.05)


def running(world: World) -> bool:
    return world.stockade("server", "status").returncode == 0


def test_the_first_run_starts_a_server_and_the_next_is_served(world: World) -> None:
    assert not server_file(world, ".sock").exists()
    first = world.stockade("run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo first; exit 3")
    assert (first.returncode, first.stdout) == (3, "first\n"), first.stderr
    assert world.canary not in first.stdout + first.stderr
    wait_for("the auto-started server listens", lambda: running(world))
    # Kept out of the sandbox's reach like every server: the user's own 0700 directory.
    directory = server_file(world, ".sock").parent
    st = directory.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert [e["auto"] for e in events(world, "server_start")] == [True]
    assert not events(world, "server_run")  # the first run was not served
    # Its warm-up planned a run, as a worker would (from "/", bwrap would be refused).
    assert "warm-up plan failed" not in server_file(world, ".log").read_text()
    second = world.stockade("run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo next; exit 4")
    assert (second.returncode, second.stdout) == (4, "next\n"), second.stderr
    assert world.canary not in second.stdout + second.stderr
    runs = events(world, "server_run")
    served = [r["argv"] for r in runs]
    assert served == [["run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo next; exit 4"]]


@pytest.mark.parametrize("mode", ["manual", "0"])
def test_opting_out_starts_nothing(world: World, mode: str) -> None:
    env = dict(world.env, STOCKADE_SERVER=mode)
    proc = world.stockade("run", "--", "sh", "-c", "echo ran; exit 5", env=env)
    assert (proc.returncode, proc.stdout) == (5, "ran\n"), proc.stderr
    # The front end makes the directory, the lock and the log before it starts a server,
    # before the run goes on: none of them means none was started.
    assert not server_file(world, ".sock").parent.exists()
    # The twin: without the variable, the same run starts one.
    proc = world.stockade("run", "--", "sh", "-c", "echo ran; exit 5")
    assert proc.returncode == 5, proc.stderr
    assert server_file(world, ".log").exists()
    wait_for("the auto-started server listens", lambda: running(world))


def test_a_server_directory_others_can_enter_is_left_alone(world: World) -> None:
    directory = server_file(world, ".sock").parent
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    proc = world.stockade("run", "--", "sh", "-c", "echo ran")
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr
    assert sorted(p.name for p in directory.iterdir()) == []
    # The twin: the same directory, the user's alone, gets a server.
    directory.chmod(0o700)
    proc = world.stockade("run", "--", "sh", "-c", "echo ran")
    assert proc.returncode == 0, proc.stderr
    wait_for("the auto-started server listens", lambda: running(world))


def test_one_server_per_installation_and_user(world: World) -> None:
    """A second server exits while one holds the lock (two front ends starting one at
    once, or a hand-started one): it never takes over the other's socket."""
    lock_path = server_file(world, ".lock")
    lock_path.parent.mkdir(parents=True, mode=0o700)
    held = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        second = world.stockade("server", "run", timeout=WAIT_S)
        assert second.returncode == 125
        assert "already running (or starting)" in second.stderr
        assert not server_file(world, ".sock").exists()
    finally:
        os.close(held)
    # The twin: with the lock free, it starts.
    assert world.stockade("server", "start").returncode == 0
    assert running(world)


def test_a_server_whose_socket_is_removed_exits(world: World) -> None:
    assert world.stockade("server", "start").returncode == 0
    pid = int(world.stockade("server", "status").stdout.split("pid ")[1].split(",")[0])
    server_file(world, ".sock").unlink()
    wait_for("the server exits", lambda: not Path(f"/proc/{pid}").exists())
    assert events(world, "server_stop")[-1]["reason"] == "its socket was removed"
    # The lock went with it: the next run starts a server again.
    assert world.stockade("run", "--", "true").returncode == 0
    wait_for("a new server listens", lambda: running(world))


def test_a_caller_with_higher_limits_is_declined_and_keeps_them(world: World) -> None:
    """A server (auto-started by a caller under a ``ulimit``) cannot raise a limit for an
    unprivileged caller: that caller runs in-process, with its own limits."""
    from stockade.cli import _frontend

    require(os.geteuid() == 0, "acting as uid 65534 needs root")
    python = _nobody_python(from_any_process=True)
    require(python is not None, "no Python >= 3.11 executable by uid 65534")
    assert python is not None
    bin_dir = world.root / "bin"
    bin_dir.mkdir()
    shutil.copy(_frontend.build_frontend(python), bin_dir / "stockade")
    (bin_dir / "stockade").chmod(0o755)
    front = [str(bin_dir / "stockade")]
    low = ["prlimit", "--nofile=256:512", "--"]

    def logged(kind: str) -> list[dict[str, object]]:
        found = []
        for log in (world.root / "state" / "stockade" / "server").glob("*.jsonl"):
            found += [json.loads(line) for line in log.read_text().splitlines()]
        return [e for e in found if e["event"] == kind]

    world.env["STOCKADE_SERVER"] = "manual"
    start = as_nobody(world, "server", "start", command=[*low, *front])
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        script = "ulimit -Hn; echo done"
        served = as_nobody(world, "run", "--", "sh", "-c", script, command=[*low, *front])
        assert served.stdout == "512\ndone\n", served.stderr
        assert len(logged("server_run")) == 1
        world.env["STOCKADE_DEBUG"] = "1"
        higher = as_nobody(world, "run", "--", "sh", "-c", script, command=front)
        assert higher.stdout.splitlines()[1:] == ["done"], higher.stderr
        assert higher.stdout.splitlines()[0] != "512"
        assert "exceeds the server's" in higher.stderr
        assert len(logged("server_run")) == 1
        assert "resource limit" in str(logged("server_declined")[-1]["detail"])
    finally:
        as_nobody(world, "server", "stop", command=front)


def test_an_unprivileged_users_first_run_starts_their_server(world: World) -> None:
    """As uid 65534, through a front end an administrator installed: the server is the
    user's own, in their own 0700 directory, and serves their next run."""
    from stockade.cli import _frontend

    require(os.geteuid() == 0, "acting as uid 65534 needs root")
    python = _nobody_python(from_any_process=True)
    require(python is not None, "no Python >= 3.11 executable by uid 65534")
    assert python is not None
    bin_dir = world.root / "bin"
    bin_dir.mkdir()
    shutil.copy(_frontend.build_frontend(python), bin_dir / "stockade")
    (bin_dir / "stockade").chmod(0o755)
    front = [str(bin_dir / "stockade")]
    directory = world.root / "state" / "stockade" / "server"
    try:
        first = as_nobody(world, "run", "--", "sh", "-c", "id -u; exit 7", command=front)
        assert (first.returncode, first.stdout) == (7, "65534\n"), first.stderr
        wait_for(
            "the auto-started server listens",
            lambda: as_nobody(world, "server", "status", command=front).returncode == 0,
        )
        st = directory.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o700)
        second = as_nobody(world, "run", "--", "sh", "-c", "id -u; exit 8", command=front)
        assert (second.returncode, second.stdout) == (8, "65534\n"), second.stderr
        logged = []
        for log in directory.glob("*.jsonl"):
            logged += [json.loads(line) for line in log.read_text().splitlines()]
        assert [e["auto"] for e in logged if e["event"] == "server_start"] == [True]
        assert [e["argv"][-1] for e in logged if e["event"] == "server_run"] == ["id -u; exit 8"]
    finally:
        as_nobody(world, "server", "stop", command=front)


def test_the_server_takes_nothing_of_the_first_callers_signal_state(world: World) -> None:
    """A first caller that ignores SIGCHLD (and SIGTERM) starts a server that does not:
    the runs it serves for the next callers report their commands' real exit codes, and
    ``server stop`` stops it."""
    import signal

    code = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    first = subprocess.run(
        [sys.executable, "-c", code, *world.command, "run", "--", "sh", "-c", "exit 3"],
        cwd=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert first.returncode == 3, first.stderr
    wait_for("the auto-started server listens", lambda: running(world))
    pid = int(world.stockade("server", "status").stdout.split("pid ")[1].split(",")[0])
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    ignored = int(fields["SigIgn"].strip(), 16)
    assert not ignored & (1 << (signal.SIGCHLD - 1))
    assert not ignored & (1 << (signal.SIGUSR1 - 1))
    served = world.stockade("run", "--", "sh", "-c", "exit 5")
    assert served.returncode == 5, served.stderr
    # A caller's ignored signals reach its own command only: not this caller's.
    show = "grep SigIgn /proc/self/status"
    plain = world.stockade("run", "--", "sh", "-c", show)
    assert not int(plain.stdout.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)), plain.stderr
    # The twin: a caller that ignores SIGUSR1 hands that to its served command.
    twin = subprocess.run(
        [sys.executable, "-c", code, *world.command, "run", "--", "sh", "-c", show],
        cwd=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert int(twin.stdout.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)), twin.stderr
    assert len(events(world, "server_run")) == 3
    assert world.stockade("server", "stop").returncode == 0
    wait_for("the server exits", lambda: not Path(f"/proc/{pid}").exists())
