"""The caller's terminal never reaches the sandbox (DESIGN §6; issue 22, hole 6).

The attack: ``stockade run --ask tty ... </dev/null`` from a terminal gave the sandbox the
caller's terminal as its stdout and stderr (only a terminal on stdin got a relay), so
its "SPOOF ... press r" landed on top of the displayed prompt. Now each of 0, 1 and 2
that is a terminal goes through a relay of stockade's, paused while a prompt asks
(:mod:`stockade.runtime._pty` has the table).

Each test is a real ``stockade run`` whose caller's terminal is a pty pair this test
owns (its controlling terminal, so that ``/dev/tty`` and the prompt find it), under
bubblewrap and gVisor (STOCKADE_GVISOR=1), as root and as uid 65534. What must not
happen is looked for on the host: no process the run started holds a descriptor of that
terminal (``/proc/PID/fd``), and no byte the sandbox wrote reaches it while the prompt
is shown. The twins: the prompt is still answered by the person, output arrives in
order with the exit code, the window size follows, and a pipe on stdin still feeds the
command.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import stat
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.approval.test_cli import PROMPT, setup
from tests.conftest import NOBODY, World, nobody_command, nobody_gvisor, require
from tests.runtime.test_container import BACKENDS, backend_flags

pytestmark = pytest.mark.usefixtures("kernel")

USERS = ("root", "nobody")
#: the end of the real prompt, which the command's imitation has not
SHOWN = b"denied in 120s\r\n  " + PROMPT


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, world: World) -> tuple[str, ...]:
    """The test once per container backend: the flags to put after ``run``."""
    return backend_flags(request, world, request.param)


@pytest.fixture(params=USERS)
def user(request: pytest.FixtureRequest) -> str:
    """The test as the caller (root here) and as uid 65534 (setpriv)."""
    if request.param == "nobody":
        require(os.getuid() == 0, "running stockade as uid 65534 needs root to switch to it")
    return str(request.param)


class Caller:
    """``stockade run ARGS`` started by a caller whose terminal is a pty of this test's.

    ``stdin``: ``"tty"`` (the terminal), ``"null"`` (/dev/null) or bytes (a pipe that
    holds them, then ends); ``stdout``/``stderr``: ``"tty"`` or ``"pipe"`` (read at the
    end: :attr:`piped`); ``stderr`` may also be ``"other"``, a second terminal (its
    screen: :attr:`other_out`). The terminal is the controlling terminal of the caller's
    session, as a login's is; ``extra_fd`` also leaves it open as descriptor 5.
    ``{device}`` in ARGS becomes the terminal's device number; ``exact``: ``command``
    is the whole argv (no ``run``).
    """

    def __init__(
        self,
        world: World,
        *args: str,
        stdin: str | bytes = "null",
        stdout: str = "tty",
        stderr: str = "tty",
        user: str = "root",
        prefix: tuple[str, ...] = (),
        command: list[str] | None = None,
        size: tuple[int, int] = (24, 80),
        extra_fd: bool = False,
        exact: bool = False,
    ) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
        self.device = os.fstat(self.slave).st_rdev
        env = dict(world.env, STOCKADE_SERVER="0", TERM="xterm")
        argv = [*(command or world.command)]
        if user == "nobody":
            argv, env = nobody_command(world, command)
            env.update(STOCKADE_SERVER="0", TERM="xterm")
            os.fchown(self.slave, NOBODY, NOBODY)  # a login's terminal is the user's
        args = tuple(a.replace("{device}", str(self.device)) for a in args)
        argv = [*prefix, *argv, *(() if exact else ("run",)), *args]
        in_r = in_w = -1
        if isinstance(stdin, bytes):
            in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        self.other_master, other_slave = os.openpty()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs at once
            try:
                os.setsid()
                fcntl.ioctl(self.slave, termios.TIOCSCTTY, 0)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2({"tty": self.slave, "null": null}.get(str(stdin), in_r), 0)
                os.dup2(self.slave if stdout == "tty" else out_w, 1)
                os.dup2({"tty": self.slave, "other": other_slave}.get(stderr, out_w), 2)
                if extra_fd:
                    os.dup2(self.slave, 5)
                os.chdir(world.workspace)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid = pid
        os.close(out_w)
        os.close(other_slave)
        self.other_out = b""
        self.out_r = out_r
        if in_r >= 0:
            os.close(in_r)
            assert isinstance(stdin, bytes)
            os.write(in_w, stdin)
            os.close(in_w)
        self.out = b""
        self.piped = b""
        self.status: int | None = None

    def read_until(self, marker: bytes, timeout: float = 60.0) -> bool:
        """Read the terminal until ``marker`` is on it (or the time is up)."""
        deadline = time.monotonic() + timeout
        while marker not in self.out and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.out += os.read(self.master, 65536)
                except OSError:
                    break
        return marker in self.out

    def idle(self, seconds: float) -> None:
        """Read the terminal for ``seconds``."""
        self.read_until(b"\x00never\x00", seconds)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        """What a terminal emulator does: the new size, SIGWINCH to the foreground."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float = 90.0) -> int:
        """Wait for stockade's end (reading the terminal and the pipe); its exit status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.idle(0.2)
            with contextlib.suppress(BlockingIOError):
                os.set_blocking(self.out_r, False)
                while chunk := os.read(self.out_r, 65536):
                    self.piped += chunk
            self._read_other()
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.idle(0.3)
                self._read_other()
                with contextlib.suppress(BlockingIOError):
                    while chunk := os.read(self.out_r, 65536):
                        self.piped += chunk
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"stockade did not end: {self.out[-3000:]!r}")

    def _read_other(self) -> None:
        while select.select([self.other_master], [], [], 0)[0]:
            try:
                chunk = os.read(self.other_master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.other_out += chunk

    def pending_input(self) -> int:
        """Bytes waiting in the terminal's input queue (what TIOCSTI would have pushed)."""
        data = fcntl.ioctl(self.slave, termios.FIONREAD, b"\0\0\0\0")
        return int(struct.unpack("i", data)[0])

    def holders(self) -> list[str]:
        """Every process stockade started (not stockade itself) that holds a descriptor
        of the caller's terminal, as ``pid comm fd``."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
        found = []
        todo = list(children.get(self.pid, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            for fd in fds:
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == self.device:
                        found.append(f"{pid} {comm} fd {fd}")
        return found

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self.master, self.slave, self.out_r, self.other_master):
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def caller(world: World, *args: str, **kwargs: object) -> Iterator[Caller]:
    c = Caller(world, *args, **kwargs)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.close()


def _as(world: World, user: str, backend: tuple[str, ...]) -> dict[str, object]:
    """The Caller arguments that run stockade as ``user`` with ``backend``."""
    if user == "nobody" and "gvisor" in backend:
        return {"user": user, "command": nobody_gvisor(world, world.env["STOCKADE_RUNSC"])}
    return {"user": user}


# --- the attack: drawing over the prompt ---------------------------------------------


def test_spoof_over_the_prompt_waits_for_the_answer(
    world: World, ok_server: int, backend: tuple[str, ...], user: str
) -> None:
    # stdin </dev/null, stdout and stderr the terminal: while the prompt asks about
    # a.test, the command writes a prompt of its own to both. None of it may reach the
    # terminal until the person answered; then it comes, through the relay.
    policy = setup(world)
    script = (
        f"curl -fsS -m 60 http://a.test:{ok_server}/ >/dev/null 2>&1 || echo REFUSED & "
        "while kill -0 $! 2>/dev/null; do "
        "echo 'SPOOF stockade > run wants allowed.test:443, press r'; "
        "echo 'SPOOF-ERR choice, then Enter: ' >&2; sleep 0.1; done; wait; echo END"
    )
    with caller(
        world,
        *backend,
        "--ask",
        "tty",
        "--policy",
        str(policy),
        "--",
        "sh",
        "-c",
        script,
        **_as(world, user, backend),
    ) as c:
        # The prompt's own last lines (the spoof imitates the rest of it).
        assert c.read_until(SHOWN), c.out[-3000:]
        shown = c.out.index(SHOWN) + len(SHOWN)
        c.idle(2.0)
        assert b"SPOOF" not in c.out[shown:], c.out[shown:]
        c.type(b"d\r")
        assert c.read_until(b"END"), c.out[-3000:]
        assert c.wait() == 0, c.out[-3000:]
    after = c.out.split(b"stockade: denied", 1)[1]
    # What it wrote meanwhile was held, not lost: it arrives after the answer.
    assert b"SPOOF stockade" in after
    assert b"SPOOF-ERR" in after
    assert b"REFUSED" in after


def test_prompt_answered_by_the_person_with_stdin_from_dev_null(
    world: World, ok_server: int, backend: tuple[str, ...], user: str
) -> None:
    # The twin: the same run, and the person allows; the command's output comes in order.
    policy = setup(world)
    script = f"echo BEFORE; curl -sS -m 60 http://a.test:{ok_server}/; echo; echo AFTER; exit 4"
    with caller(
        world,
        *backend,
        "--ask",
        "tty",
        "--policy",
        str(policy),
        "--",
        "sh",
        "-c",
        script,
        **_as(world, user, backend),
    ) as c:
        assert c.read_until(PROMPT), c.out[-3000:]
        c.idle(0.6)
        c.type(b"r\r")
        assert c.read_until(b"AFTER"), c.out[-3000:]
        assert c.wait() == 4, c.out[-3000:]
    assert c.out.index(b"BEFORE") < c.out.index(b"stockade: allowed")
    after = c.out.split(b"stockade: allowed", 1)[1]
    assert after.index(b"ok") < after.index(b"AFTER")


# --- no descriptor of the caller's terminal inside -------------------------------------

_HOLD = "echo READY; sleep 4; echo DONE"


@pytest.mark.parametrize("stdin", ["null", "tty"])
def test_no_process_of_the_run_holds_the_callers_terminal(
    world: World, backend: tuple[str, ...], user: str, stdin: str
) -> None:
    # Whatever of 0/1/2 is the terminal, and with the terminal left open on another
    # inherited descriptor (5) as well: no process stockade started (bwrap, its init,
    # the command; runsc, its sandbox and gofer) holds a descriptor of it.
    with caller(
        world,
        *backend,
        "--",
        "sh",
        "-c",
        _HOLD,
        stdin=stdin,
        extra_fd=True,
        **_as(world, user, backend),
    ) as c:
        assert c.read_until(b"READY"), c.out[-3000:]
        time.sleep(0.3)
        held = c.holders()
        assert c.read_until(b"DONE"), c.out[-3000:]
        assert c.wait() == 0, c.out[-3000:]
    assert held == []


def test_fd_5_of_the_caller_is_not_passed_in(world: World, backend: tuple[str, ...]) -> None:
    # The inherited descriptor seen from inside: only 0, 1, 2 (and ls's own).
    with caller(world, *backend, "--", "ls", "/proc/self/fd", extra_fd=True) as c:
        assert c.wait() == 0, c.out[-3000:]
    listed = c.out.split()
    assert b"0" in listed
    assert b"1" in listed
    assert b"5" not in listed


#: reports, for 0, 1 and 2, whether it is the caller's terminal (its device number is
#: argv[1]); tries /dev/tty; pushes "INJ" with TIOCSTI into each
_PROBE = """
import fcntl, os, stat, sys, termios
caller = int(sys.argv[1])
for fd in (0, 1, 2):
    st = os.fstat(fd)
    mine = stat.S_ISCHR(st.st_mode) and st.st_rdev == caller
    print("fd", fd, "CALLER" if mine else "own", flush=True)
try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    print("devtty opened", flush=True)
except OSError as e:
    print("devtty errno", e.errno, flush=True)
for fd in (0, 1, 2):
    try:
        for ch in b"INJ\\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        print("pushed", fd, flush=True)
    except OSError as e:
        print("refused", fd, e.errno, flush=True)
print("PROBED", flush=True)
"""


def test_dev_tty_and_tiocsti_find_no_caller_terminal(
    world: World, backend: tuple[str, ...]
) -> None:
    # stdin </dev/null, stdout and stderr the terminal. The syscalls layer is off, so
    # that TIOCSTI meets the kernel rather than the seccomp filter.
    with caller(
        world, *backend, "--disable", "syscalls", "--", "python3", "-c", _PROBE, "{device}"
    ) as c:
        assert c.read_until(b"PROBED"), c.out[-3000:]
        assert c.wait() == 0, c.out[-3000:]
        pushed = c.pending_input()
    assert b"CALLER" not in c.out
    assert b"fd 1 own" in c.out
    assert b"fd 2 own" in c.out
    assert b"devtty opened" not in c.out  # no controlling terminal: ENXIO
    assert pushed == 0  # nothing reached the caller's terminal's input
    assert b"INJ" not in c.out  # nor its echo


def test_a_pipe_on_stdin_still_feeds_the_command(world: World, backend: tuple[str, ...]) -> None:
    script = "cat; test -t 0 || echo stdin-is-not-a-tty; test -t 1 && echo stdout-is-a-tty; exit 6"
    with caller(world, *backend, "--", "sh", "-c", script, stdin=b"hello from the pipe\n") as c:
        assert c.wait() == 6, c.out[-3000:]
    assert b"hello from the pipe" in c.out
    assert b"stdin-is-not-a-tty" in c.out
    if "gvisor" not in backend:
        # Under gVisor the command's stdio are plain host files: never a terminal inside.
        assert b"stdout-is-a-tty" in c.out


def test_output_in_order_with_its_exit_code(world: World, backend: tuple[str, ...]) -> None:
    script = (
        'i=0; while [ $i -lt 300 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; exit 7'
    )
    with caller(world, *backend, "--", "sh", "-c", script) as c:
        assert c.wait() == 7, c.out[-3000:]
    lines = [line for line in c.out.replace(b"\r", b"").split(b"\n") if line]
    expected = [f"{kind} {i}".encode() for i in range(300) for kind in ("out", "err")]
    assert lines == expected


def test_stdout_on_the_terminal_stderr_to_a_pipe(world: World, backend: tuple[str, ...]) -> None:
    script = "echo to-the-terminal; echo to-the-pipe >&2"
    with caller(world, *backend, "--", "sh", "-c", script, stderr="pipe") as c:
        assert c.wait() == 0, c.out[-3000:]
    assert b"to-the-terminal" in c.out
    assert b"to-the-pipe" not in c.out
    assert b"to-the-pipe" in c.piped


def test_stdout_and_stderr_on_two_terminals(world: World) -> None:
    # Each terminal gets a pty of its own: what goes to 2 stays on the second one.
    script = "echo on-the-first; echo on-the-second >&2; exit 2"
    with caller(world, "--", "sh", "-c", script, stderr="other") as c:
        assert c.wait() == 2, c.out[-3000:]
    assert b"on-the-first" in c.out
    assert b"on-the-second" not in c.out
    assert b"on-the-second" in c.other_out


def test_a_terminal_is_never_passed_beside_the_stdio() -> None:
    # The last check where the descriptors leave: a terminal among them is refused, a
    # pipe is passed.
    from stockade import SandboxError
    from stockade.runtime import _pty

    master, slave = os.openpty()
    r, w = os.pipe()
    try:
        with pytest.raises(SandboxError, match="is a terminal"):
            _pty.check_passed((r, slave))
        _pty.check_passed((r, w))
    finally:
        for fd in (master, slave, r, w):
            os.close(fd)


_SIZE = """
import os, signal, sys, time
print("size", *os.get_terminal_size(1), flush=True)
got = []
signal.signal(signal.SIGWINCH, lambda *_: got.append(1))
print("READY", flush=True)
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
print("resized", *os.get_terminal_size(1), flush=True)
"""


def test_window_size_and_resize_with_stdin_from_dev_null(world: World) -> None:
    # bubblewrap: the command's stdout is a pty, sized as the caller's terminal and
    # resized with it (under gVisor it is no terminal without one on stdin; the terminal
    # bundle's size is test_gvisor_run's).
    with caller(world, "--", "python3", "-c", _SIZE, size=(33, 101)) as c:
        assert c.read_until(b"READY"), c.out[-3000:]
        time.sleep(0.3)
        c.resize(40, 120)
        assert c.read_until(b"resized"), c.out[-3000:]
        assert c.wait() == 0, c.out[-3000:]
    assert b"size 101 33" in c.out
    assert b"resized 120 40" in c.out


# --- no way to keep the terminal out: refused ----------------------------------------


def _without_ptys() -> tuple[str, ...]:
    """A prefix that runs the rest in a mount namespace whose /dev/ptmx is /dev/null: no
    pty can be made there (the caller's terminal, made before, still works)."""
    require(shutil.which("unshare") is not None, "no unshare(1)")
    own = () if os.getuid() == 0 else ("--user", "--map-root-user")
    return (
        "unshare",
        *own,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind /dev/null /dev/ptmx && exec "$@"',
        "sh",
    )


def test_ask_tty_without_a_pty_is_refused(world: World, ok_server: int) -> None:
    policy = setup(world)
    with caller(
        world,
        "--ask",
        "tty",
        "--policy",
        str(policy),
        "--",
        "touch",
        "RAN",
        prefix=_without_ptys(),
    ) as c:
        code = c.wait()
    assert code == 125, c.out[-3000:]
    assert b"cannot keep the caller's terminal out of the sandbox" in c.out
    assert not (world.workspace / "RAN").exists()


def test_without_a_pty_a_run_with_no_terminal_still_runs(world: World, ok_server: int) -> None:
    # The twin: the same namespace, and no terminal among 0, 1, 2: nothing to keep out.
    policy = setup(world)
    with caller(
        world,
        "--ask",
        "tty",
        "--policy",
        str(policy),
        "--",
        "touch",
        "RAN",
        prefix=_without_ptys(),
        stdout="pipe",
        stderr="pipe",
    ) as c:
        code = c.wait()
    assert code == 0, c.piped[-3000:]
    assert (world.workspace / "RAN").exists()


# --- the Python API ------------------------------------------------------------------

_API = """
import sys, stockade
r = stockade.run(
    ["sh", "-c", "ls -l /proc/self/fd/0; test -t 0 || echo stdin-not-a-tty; test -t 1 && echo stdout-a-tty; exit 3"],
    workspace=sys.argv[1],
)
print("returned", r.returncode, flush=True)
"""


def test_api_run_from_a_terminal(world: World) -> None:
    # stockade.run mirrors subprocess.run and takes no keys: a terminal stdin becomes
    # /dev/null, a terminal stdout a relayed pty of its own.
    command = [sys.executable, "-c", _API, str(world.workspace)]
    with caller(world, stdin="tty", command=command, exact=True) as c:
        assert c.wait() == 0, c.out[-3000:]
    assert b"/dev/null" in c.out
    assert b"stdin-not-a-tty" in c.out
    assert b"stdout-a-tty" in c.out
    assert b"returned 3" in c.out
