"""Each layer on its own and all together, through ``stockade run`` on the real kernel.

The container alone, the process status with every layer, and the nested-user-namespace
trick run under ``--backend gvisor`` too (the ``runsc`` fixture, STOCKADE_GVISOR=1): there
the mount plan is the files layer and seccomp alone refuses a user namespace. The files
layer alone is Landlock, which gVisor does not have (bubblewrap only); the pty and the
limits are covered under gVisor by test_gvisor_run.py and tests/attacks (RES).
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import time

import pytest

from tests.conftest import World
from tests.runtime.test_container import BACKENDS, backend_flags

pytestmark = pytest.mark.usefixtures("kernel")

ALL = ("files", "container", "syscalls", "secrets", "egress", "inspect", "limits")


def only(*layers: str) -> tuple[str, ...]:
    args: list[str] = []
    for layer in ALL:
        if layer not in layers:
            args += ["--disable", layer]
    return tuple(args)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, world: World) -> tuple[str, ...]:
    """The test once per container backend: the flags to put after ``run``."""
    return backend_flags(request, world, request.param)


def test_files_alone_stops_reading_home_and_writing_outside(world: World) -> None:
    target = world.root / "outside.txt"
    proc = world.stockade(
        "run",
        *only("files"),
        "--",
        "sh",
        "-c",
        f"cat {world.home}/.ssh/id_ed25519; echo x > {target}; echo y >> {world.home}/.bashrc; echo ok > in.txt",
    )
    assert world.canary not in proc.stdout
    assert not target.exists()
    assert (world.home / ".bashrc").read_text() == "# bashrc\n"
    # The twin: the workspace stays readable and writable.
    assert (world.workspace / "in.txt").read_text() == "ok\n"
    assert "Permission denied" in proc.stderr


def test_files_alone_stops_symlink_and_hardlink_to_canary(world: World) -> None:
    proc = world.stockade(
        "run",
        *only("files"),
        "--",
        "sh",
        "-c",
        f"ln -s {world.home}/.ssh/id_ed25519 k; cat k; ln {world.home}/.ssh/id_ed25519 h; ls",
    )
    assert world.canary not in proc.stdout
    assert not (world.workspace / "h").exists()


def test_container_alone_stops_the_same(world: World, backend: tuple[str, ...]) -> None:
    target = world.root / "outside.txt"
    proc = world.stockade(
        "run",
        *backend,
        *only("container"),
        "--",
        "sh",
        "-c",
        f"cat {world.home}/.ssh/id_ed25519; echo x > {target}; echo ok > in.txt",
    )
    assert world.canary not in proc.stdout
    assert not target.exists()
    assert (world.workspace / "in.txt").read_text() == "ok\n"


def test_all_layers_status_and_namespaces(world: World, backend: tuple[str, ...]) -> None:
    proc = world.stockade(
        "run",
        *backend,
        "--",
        "sh",
        "-c",
        "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; unshare -U true && echo UNSHARE-OK; "
        "unshare -m true && echo MOUNTNS-OK; cat ~/.ssh/id_ed25519; echo ok > in.txt",
    )
    assert "Seccomp:\t2" in proc.stdout, proc.stderr
    if backend:
        # The Sentry's /proc/self/status has no NoNewPrivs line (the launcher checks
        # PR_GET_NO_NEW_PRIVS instead, and the bundle sets noNewPrivileges).
        assert "NoNewPrivs" not in proc.stdout
    else:
        assert "NoNewPrivs:\t1" in proc.stdout
    assert "CapEff:\t0000000000000000" in proc.stdout
    assert "UNSHARE-OK" not in proc.stdout
    assert "MOUNTNS-OK" not in proc.stdout
    assert world.canary not in proc.stdout
    assert (world.workspace / "in.txt").read_text() == "ok\n"


def test_nested_userns_rename_trick_fails(world: World, backend: tuple[str, ...]) -> None:
    """The bypass of isolation.md §9.2: nested userns + pivot_root + rename a carve-out.
    Under gVisor only seccomp refuses the user namespace (the Sentry would make one)."""
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True)
    script = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
r = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
print("unshare", r, ctypes.get_errno())
try:
    os.rename(".git/hooks", ".git/hooks.aside")
    os.makedirs(".git/hooks")
    open(".git/hooks/pre-commit", "w").write("evil")
    print("RENAMED")
except OSError as e:
    print("rename failed", e.errno)
"""
    proc = world.stockade("run", *backend, "--", "python3", "-c", script)
    assert "RENAMED" not in proc.stdout, proc.stdout + proc.stderr
    assert not (world.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert "unshare -1" in proc.stdout


def _pty_run(world: World, script: bytes, *args: str, wait: float = 15) -> bytes:
    """Run ``stockade run ARGS`` on a pty as its terminal; type ``script``; return the screen."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.chdir(world.workspace)
        os.execve(world.command[0], [*world.command, "run", *args], world.env)
    out = b""
    os.write(fd, script)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        else:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    os.close(fd)
    return out


def test_interactive_bash_under_a_pty(world: World) -> None:
    screen = _pty_run(world, b"echo $((6*7))-$((100+1))\nexit 3\n", "--", "bash", "--norc", "-i")
    assert b"42-101" in screen


#: pushes "touch INJECTED" into every terminal the sandbox holds, and says which refused
TIOCSTI_SCRIPT = (
    "import fcntl, termios\n"
    "for fd in (0, 1, 2):\n"
    "    try:\n"
    "        for ch in b'touch INJECTED\\n':\n"
    "            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))\n"
    "        print('pushed', fd)\n"
    "    except OSError as e:\n"
    "        print('refused', fd, e.errno)\n"
)


def test_tiocsti_cannot_reach_the_callers_terminal(world: World) -> None:
    # The sandbox pushes "echo INJECTED" into every terminal it holds; the caller's
    # terminal (the pty this test owns) must never see it typed back as input.
    screen = _pty_run(world, b"", "--", "python3", "-c", TIOCSTI_SCRIPT)
    assert b"refused 0" in screen
    assert not (world.workspace / "INJECTED").exists()


def test_limits_file_size(world: World) -> None:
    (world.workspace / "p.toml").write_text('[limits]\nfile_size = "1MiB"\n')
    world.stockade(
        "run",
        "--policy",
        "p.toml",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=big bs=1M count=4 2>&1; dd if=/dev/zero of=small bs=1K count=4 2>&1",
    )
    assert (world.workspace / "big").stat().st_size <= 1024 * 1024
    assert (world.workspace / "small").stat().st_size == 4096


def test_limits_pids(world: World) -> None:
    (world.workspace / "p.toml").write_text("[limits]\npids = 20\n")
    proc = world.stockade(
        "run",
        "--policy",
        "p.toml",
        "--timeout",
        "20",
        "--",
        "python3",
        "-c",
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('stopped at', n, e.errno)\n",
    )
    assert "stopped at" in proc.stdout, proc.stderr
    n = int(proc.stdout.split()[2])
    assert 5 <= n < 20


def test_setid_bits_refused_plain_modes_work(world: World) -> None:
    proc = world.stockade(
        "run",
        "--",
        "python3",
        "-c",
        "import os, shutil\n"
        "shutil.copy('/bin/sh', 's')\n"
        "for mode in (0o4755, 0o2755):\n"
        "    try:\n"
        "        os.chmod('s', mode); print('set', oct(mode))\n"
        "    except PermissionError:\n"
        "        print('refused', oct(mode))\n"
        "try:\n"
        "    os.close(os.open('t', os.O_CREAT | os.O_WRONLY, 0o4755)); print('created setuid')\n"
        "except PermissionError:\n"
        "    print('refused create')\n"
        "os.chmod('s', 0o700); print('plain chmod', oct(os.stat('s').st_mode & 0o7777))\n",
    )
    assert "refused 0o4755" in proc.stdout, proc.stderr
    assert "refused 0o2755" in proc.stdout
    assert "refused create" in proc.stdout
    assert "plain chmod 0o700" in proc.stdout
    assert not (world.workspace / "s").stat().st_mode & 0o6000
