"""End to end under the real runsc (``[container] backend = "gvisor"``).

Opt-in: these run only with ``STOCKADE_GVISOR=1`` (then a missing or unusable runsc is a
failure under ``STOCKADE_MUST_WORK=1``, as every kernel test's); ``scripts/setup
--gvisor`` fetches runsc. Serial and few: each sandbox costs ~80 MB and 0.2-0.4 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    NOBODY,
    SECRET_ENV,
    SECRET_FILES,
    World,
    as_nobody,
    nobody_gvisor,
)
from tests.runtime.test_layers import TIOCSTI_SCRIPT

GVISOR = ("--backend", "gvisor")


@pytest.fixture
def gworld(world: World, runsc: str) -> World:
    # The world's HOME is a fake one: name the runsc to use explicitly.
    world.env["STOCKADE_RUNSC"] = runsc
    return world


def test_exit_code_stdout_and_stderr(gworld: World) -> None:
    proc = gworld.stockade("run", *GVISOR, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "out\n"
    assert "err" in proc.stderr


def test_runs_on_a_kernel_of_its_own(gworld: World) -> None:
    proc = gworld.stockade("run", *GVISOR, "--", "cat", "/proc/version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Linux version 4.4.0")  # the Sentry's, not the host's


def test_workspace_writes_reach_the_host_and_home_is_discarded(gworld: World) -> None:
    proc = gworld.stockade(
        "run", *GVISOR, "--", "sh", "-c", "echo w > out.txt; echo h > ~/left.txt; ls -A ~"
    )
    assert proc.returncode == 0, proc.stderr
    assert (gworld.workspace / "out.txt").read_text() == "w\n"
    assert proc.stdout == "left.txt\n"  # HOME started empty
    assert not (gworld.home / "left.txt").exists()


def test_secrets_stay_out(gworld: World) -> None:
    script = "; ".join(f"cat ~/{rel} 2>/dev/null" for rel in SECRET_FILES)
    script += "; cat /etc/shadow; env; true"
    proc = gworld.stockade("run", *GVISOR, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert gworld.canary not in proc.stdout + proc.stderr
    assert "root:" not in proc.stdout  # /etc/shadow is /dev/null inside
    for name in SECRET_ENV:
        assert f"{name}=" not in proc.stdout


def test_system_is_read_only_and_the_twin_writes_tmp(gworld: World) -> None:
    proc = gworld.stockade(
        "run",
        *GVISOR,
        "--",
        "sh",
        "-c",
        "echo x > /etc/stockade-test || echo refused; echo y > /tmp/t && cat /tmp/t",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused\ny\n"
    assert not Path("/etc/stockade-test").exists()


def test_a_truncating_open_below_a_read_only_bind_changes_nothing_on_the_host(
    gworld: World,
) -> None:
    """runsc runs with directfs, and runsc 20240729 then truncates a host file opened
    with O_TRUNC below a read-only bind before it answers EROFS: a tool of a read grant
    the caller owns, the launcher in the rootfs (a hard link to the cached binary). The
    entry binds them read-only on the host side first (gvisor.host_binds), so the host
    kernel refuses the open; the twin truncates a workspace file."""
    tools = gworld.root / "tools"
    tools.mkdir()
    (tools / "tool").write_text("keep\n")
    (gworld.workspace / "scratch.txt").write_text("drop\n")
    policy = gworld.root / "policy.toml"
    policy.write_text(f'version = 1\n[filesystem]\nread = ["{tools}"]\n')
    first = gworld.stockade("run", *GVISOR, "--", "true")  # the launcher built
    assert first.returncode == 0, first.stderr
    cache = Path(gworld.env["XDG_CACHE_HOME"]) / "stockade"
    launchers = {p: p.read_bytes() for p in cache.glob("launcher-*")}
    assert launchers
    assert all(launchers.values())
    trunc = "import os, sys; os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))"
    script = (
        f"python3 -c '{trunc}' {tools}/tool 2>/dev/null || echo tool-refused; "
        f"python3 -c '{trunc}' /.stockade/launcher 2>/dev/null || echo launcher-refused; "
        f"python3 -c '{trunc}' scratch.txt && echo workspace-truncated"
    )
    proc = gworld.stockade("run", "--policy", str(policy), *GVISOR, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["tool-refused", "launcher-refused", "workspace-truncated"]
    assert (tools / "tool").read_text() == "keep\n"
    assert (gworld.workspace / "scratch.txt").read_text() == ""
    assert {p: p.read_bytes() for p in cache.glob("launcher-*")} == launchers


def test_seccomp_and_no_capabilities(gworld: World) -> None:
    proc = gworld.stockade(
        "run", *GVISOR, "--", "grep", "-E", "^(Seccomp|CapEff):", "/proc/self/status"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Seccomp:\t2" in proc.stdout
    assert "CapEff:\t0000000000000000" in proc.stdout


def test_allowed_host_reachable_and_others_not(gworld: World) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        policy = gworld.root / "policy.toml"
        policy.write_text(
            f'version = 1\n[network]\nallow = ["web.test:{port}"]\n'
            f'hosts = {{ "web.test" = "127.0.0.1" }}\n'
        )
        curl = 'curl -sS -m 5 -o /dev/null -w "%{http_code}\\n"'
        script = (
            f"{curl} http://web.test:{port}/; {curl} http://other.test:{port}/; "
            f"{curl} --noproxy '*' http://web.test:{port}/; {curl} --noproxy '*' http://192.0.2.1/"
        )
        proc = gworld.stockade("run", "--policy", str(policy), *GVISOR, "--", "sh", "-c", script)
    finally:
        server.shutdown()
        server.server_close()
    # Explicit proxy, then transparent capture: the allowed host works both ways, the
    # others are refused by the proxy (403), never reached directly.
    assert proc.stdout.split() == ["200", "403", "200", "403"], proc.stderr


def test_no_survivors_after_sigkill_of_stockade(gworld: World) -> None:
    env = dict(gworld.env)
    proc = subprocess.Popen(
        [*gworld.command, "run", *GVISOR, "--", "sh", "-c", "echo started; sleep 300"],
        cwd=gworld.workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"

    def tree(pid: int) -> list[int]:
        out = [pid]
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            out += tree(int(child))
        return out

    pids = [p for p in tree(proc.pid) if p != proc.pid]
    assert pids  # runsc run, its sandbox and gofer
    proc.kill()
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _alive(p)]
    assert not alive, f"processes left after SIGKILL of stockade: {alive}"


def test_runsc_killed_under_the_command_is_that_death_not_a_status_of_its_own(
    gworld: World,
) -> None:
    """``runsc run`` killed while the command runs (the OOM killer, say): the gVisor entry
    dies by the same signal, so the run ends 137. The Python entry before it ended 1
    (its signal.signal(SIGKILL) raised), which passed for the command's own status. The
    twin: test_exit_code_stdout_and_stderr, where the command's 7 passes through."""
    proc = subprocess.Popen(
        [*gworld.command, "run", *GVISOR, "--", "sh", "-c", "echo started; sleep 300"],
        cwd=gworld.workspace,
        env=gworld.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        (entry,) = [
            int(pid)
            for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if "gvisor-entry-" in os.readlink(f"/proc/{pid}/exe")
        ]
        (runsc_run,) = Path(f"/proc/{entry}/task/{entry}/children").read_text().split()
        os.kill(int(runsc_run), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 137, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_wall_time_kill(gworld: World) -> None:
    started = time.monotonic()
    proc = gworld.stockade("run", *GVISOR, "--timeout", "1", "--", "sleep", "30")
    assert proc.returncode == 124
    assert time.monotonic() - started < 10


def test_missing_runsc_is_exit_125_never_bubblewrap(world: World) -> None:
    env = dict(world.env, STOCKADE_RUNSC=str(world.root / "no-runsc"))
    proc = world.stockade("run", *GVISOR, "--", "true", env=env)
    assert proc.returncode == 125
    assert "runsc" in proc.stderr


def test_an_old_runsc_is_refused_with_exit_125(world: World) -> None:
    fake = world.root / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~20221219.0'\n")
    fake.chmod(0o755)
    proc = world.stockade(
        "run", *GVISOR, "--", "true", env=dict(world.env, STOCKADE_RUNSC=str(fake))
    )
    assert proc.returncode == 125
    assert "release-20230227.0" in proc.stderr


# --- a sandbox that never started vs the command's own failure ---------------------------


def _wrapper(world: World, runsc: str, body: str) -> str:
    """A runsc that runs the real one after ``body`` (sh, "$@" is runsc's argv): a real
    executable that breaks the bundle or the start, never a mock of the sandbox."""
    path = world.root / "runsc-wrapper"
    path.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *--version*) exec {runsc} "$@";; esac\n'
        f"{body}\n"
        f'exec {runsc} "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


def test_a_runsc_that_exits_1_before_starting_is_125_not_1(gworld: World, runsc: str) -> None:
    marker = gworld.workspace / "ran"
    fake = _wrapper(gworld, runsc, 'echo "runsc: cannot create sandbox: no" >&2; exit 1')
    proc = gworld.stockade(
        "run", *GVISOR, "--", "touch", str(marker), env=dict(gworld.env, STOCKADE_RUNSC=fake)
    )
    assert proc.returncode == 125, proc.stderr
    assert "runsc: cannot create sandbox: no" in proc.stderr  # runsc's own message
    assert "runsc could not start the sandbox (exit 1" in proc.stderr
    assert not marker.exists()
    # The twin: a command of the real runsc that exits 1 is 1, and 128 (runsc's own
    # failure status) is the command's 128 when runsc started it.
    for code in (1, 128):
        own = gworld.stockade("run", *GVISOR, "--", "sh", "-c", f"exit {code}")
        assert own.returncode == code, own.stderr
        assert "could not start" not in own.stderr


def test_a_bundle_runsc_rejects_is_125_with_its_message(gworld: World, runsc: str) -> None:
    # The real runsc, given a bundle without its rootfs: it fails creating the container.
    # (Moved away, not removed: the launcher's directory in it is a read-only mount of
    # the entry's, gvisor.host_binds.)
    fake = _wrapper(
        gworld,
        runsc,
        'for a; do case "$a" in --bundle=*) mv "${a#--bundle=}/rootfs" "${a#--bundle=}/gone";;'
        " esac; done",
    )
    audit = gworld.root / "audit.jsonl"
    proc = gworld.stockade(
        "run",
        *GVISOR,
        "--audit",
        str(audit),
        "--",
        "true",
        env=dict(gworld.env, STOCKADE_RUNSC=fake),
    )
    assert proc.returncode == 125, proc.stderr
    assert "running container: creating container" in proc.stderr
    assert "the command did not run" in proc.stderr
    # The log ends as a bubblewrap that could not set up ends it: no run_end.
    events = [e.split('"event":"')[1].split('"')[0] for e in audit.read_text().splitlines()]
    assert events[0] == "run_start"
    assert events[-1] == "log_end"
    assert "run_end" not in events


def test_a_command_runsc_cannot_load_is_125(gworld: World, runsc: str) -> None:
    # Created, then refused at start: the container's first program does not exist.
    fake = _wrapper(
        gworld,
        runsc,
        'for a; do case "$a" in --bundle=*) sed -i \'s#"args": \\["[^"]*"#"args": ["/nonexistent"#\' '
        '"${a#--bundle=}/config.json";; esac; done',
    )
    proc = gworld.stockade("run", *GVISOR, "--", "true", env=dict(gworld.env, STOCKADE_RUNSC=fake))
    assert proc.returncode == 125, proc.stderr
    assert "starting container" in proc.stderr
    assert "failed to load /nonexistent" in proc.stderr


# --- the terminal --------------------------------------------------------------------------


def _on_a_pty(
    world: World, *args: str, resize_to: tuple[int, int] | None = None, interrupt: bool = False
) -> tuple[int, bytes]:
    """Run ``stockade run ARGS`` with a pty (24x80 at first) as its terminal. Once the
    command prints READY: resize the terminal (the caller's SIGWINCH, as a terminal
    emulator's) and/or type Ctrl-C. Returns (exit status, screen)."""
    import fcntl
    import pty
    import select
    import signal
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        os.chdir(world.workspace)
        os.execve(world.command[0], [*world.command, "run", *args], world.env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = b""
    acted = False
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            out += chunk
            if not chunk:
                break
        if b"READY" in out and not acted:
            acted = True
            time.sleep(0.3)
            if resize_to is not None:
                rows, cols = resize_to
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.kill(pid, signal.SIGWINCH)
            if interrupt:
                os.write(fd, b"\x03")
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
            with contextlib.suppress(OSError):
                while select.select([fd], [], [], 0.2)[0] and (chunk := os.read(fd, 4096)):
                    out += chunk
            break
    if status is None:
        os.kill(pid, 9)
        _, st = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(st)
    os.close(fd)
    return status, out


def test_pty_exit_code_output_and_window_size(gworld: World) -> None:
    status, screen = _on_a_pty(
        gworld,
        *GVISOR,
        "--",
        "sh",
        "-c",
        "test -t 0 && test -t 1 && echo tty-ok; stty size; exit 5",
    )
    assert status == 5, screen
    assert b"tty-ok" in screen
    assert b"24 80" in screen


def test_pty_resize_reaches_the_command(gworld: World) -> None:
    script = "trap 'stty size; exit 0' WINCH; echo READY; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; exit 9"
    status, screen = _on_a_pty(gworld, *GVISOR, "--", "sh", "-c", script, resize_to=(40, 120))
    assert b"40 120" in screen, screen
    assert status == 0, screen


def test_pty_ctrl_c_interrupts_the_command(gworld: World) -> None:
    status, screen = _on_a_pty(
        gworld,
        *GVISOR,
        "--",
        "sh",
        "-c",
        "echo READY; sleep 20; echo not-interrupted",
        interrupt=True,
    )
    assert status == 130, screen  # SIGINT, 128 + 2
    assert b"not-interrupted" not in screen


def test_pty_twin_without_ctrl_c_runs_to_the_end(gworld: World) -> None:
    status, screen = _on_a_pty(
        gworld, *GVISOR, "--", "sh", "-c", "echo READY; sleep 1; echo finished"
    )
    assert status == 0, screen
    assert b"finished" in screen


def test_pty_tiocsti_cannot_reach_the_callers_terminal(gworld: World) -> None:
    _status, screen = _on_a_pty(gworld, *GVISOR, "--", "python3", "-c", TIOCSTI_SCRIPT)
    assert b"refused 0" in screen or b"pushed 0" in screen, screen
    time.sleep(0.5)
    assert not (gworld.workspace / "INJECTED").exists()


# --- as an unprivileged user ---------------------------------------------------------------


def test_unprivileged_user_end_to_end(world: World, runsc: str) -> None:
    # What a user without root does: a runsc of their own, named by STOCKADE_RUNSC.
    command = nobody_gvisor(world, runsc)
    proc = as_nobody(
        world,
        "run",
        *GVISOR,
        "--",
        "sh",
        "-c",
        "cat /proc/version; echo w > out.txt; cat ~/.ssh/id_ed25519; cat /etc/shadow; exit 3",
        command=command,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("Linux version 4.4.0"), proc.stdout  # the Sentry's
    assert world.canary not in proc.stdout + proc.stderr
    out = world.workspace / "out.txt"
    assert out.read_text() == "w\n"
    if os.getuid() == 0:
        assert out.stat().st_uid == NOBODY  # written as that user on the host


# ---------------------------------------------------------------------------------------
# The egress layer off: the host's network, as under bubblewrap (--share-net). The gVisor
# entry then makes only the user namespace, and runsc --network=host is the caller's
# network; with egress on, the same direct connection (past the proxy variables, which
# the egress layer sets even with nothing allowed) meets an empty namespace.

_DIRECT = (
    "curl -sS -m 5 --noproxy '*' -o /dev/null -w \"%{http_code}\\n\" "
    "http://127.0.0.1:{port}/ || true"
)


def _direct_pair(run: Any, port: int) -> tuple[subprocess.CompletedProcess[str], ...]:
    script = _DIRECT.replace("{port}", str(port))
    off = run("run", *GVISOR, "--disable", "egress", "--", "sh", "-c", script)
    on = run("run", *GVISOR, "--", "sh", "-c", script)
    return off, on


def test_egress_off_is_the_hosts_network(gworld: World, ok_server: int) -> None:
    off, on = _direct_pair(gworld.stockade, ok_server)
    assert (off.returncode, off.stdout) == (0, "200\n"), off.stderr
    # The twin: with the egress layer on, nothing is reached directly.
    assert (on.returncode, on.stdout) == (0, "000\n"), on.stderr


def test_egress_off_is_the_hosts_network_as_an_unprivileged_user(
    world: World, runsc: str, ok_server: int
) -> None:
    command = nobody_gvisor(world, runsc)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return as_nobody(world, *args, command=command)

    off, on = _direct_pair(run, ok_server)
    assert (off.returncode, off.stdout) == (0, "200\n"), off.stderr
    assert (on.returncode, on.stdout) == (0, "000\n"), on.stderr


def test_a_sentry_panic_is_the_sandboxs_failure_not_the_commands_status() -> None:
    from stockade.enforce import gvisor

    panic = "panic: unable to activate mm: createSysmsgThread: failed to get clone\n"
    # Go exits 2 on a panic; a command may exit 2 itself, and then there is no panic.
    assert gvisor.start_failure(2, "123", "", panic) == "failed"
    assert gvisor.start_failure(2, "123", "", "") is None
    assert gvisor.start_failure(0, "123", "", "fatal error: out of memory\n") == "failed"


def _stockade_script(world: World, where: Path) -> Path:
    """An executable that runs this world's stockade command, for a shell to call."""
    import shlex

    script = where / "stockade-cmd"
    script.write_text(f'#!/bin/sh\nexec {shlex.join(world.command)} "$@"\n')
    script.chmod(0o755)
    return script


def _shell(world: World, script: str) -> None:
    subprocess.run(
        ["sh", "-c", script], cwd=world.workspace, env=world.env, check=True, timeout=120
    )


@pytest.mark.parametrize("backend", ["gvisor", "bubblewrap"])
def test_output_to_a_file_lands_at_the_callers_offset(
    gworld: World, tmp_path: Path, backend: str
) -> None:
    # Issue 24 item 4: runsc hands the Sentry the file, and gVisor wrote it from offset 0
    # (the second run overwrote the first, and "before" was lost). bubblewrap is the twin.
    run = f"{_stockade_script(gworld, tmp_path)} run --backend {backend} --"
    out = tmp_path / "out.txt"
    _shell(
        gworld,
        f"{{ echo before; {run} echo first; {run} sh -c 'echo second; echo to-stderr >&2; "
        f"echo third'; echo after; }} > {out} 2>&1",
    )
    text = out.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("stockade:")]
    assert lines == ["before", "first", "second", "to-stderr", "third", "after"], text


def test_output_appended_with_o_append_too(gworld: World, tmp_path: Path) -> None:
    # The file opened with >> (O_APPEND), which gVisor honoured before: still appended.
    path = tmp_path / "log.txt"
    path.write_text("kept\n")
    stockade = _stockade_script(gworld, tmp_path)
    _shell(gworld, f"{stockade} run --backend gvisor -- echo added >> {path}")
    assert path.read_text() == "kept\nadded\n"
