"""Starting the sandbox's outermost process and waiting for it: the terminal relay
(:mod:`._pty`), signal forwarding, the wall-clock limit (paused while an ask waits) and
killing the whole tree."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from stockade._exceptions import EXIT_TIMEOUT, SandboxError
from stockade.runtime import _pty
from stockade.runtime._cancel import kill_tree

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Protocol

    from stockade.runtime._request import RunRequest

    class Starter(Protocol):
        """What holds the command until it may run (the bubblewrap handshake, the
        landlock backend's run)."""

        def paused(self) -> float: ...
        def release(self, proc: subprocess.Popen[bytes]) -> None: ...


#: the signals a run forwards to its command
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stdio(request: RunRequest) -> tuple[int | IO[Any] | None, ...]:
    """The sandbox's stdin, stdout and stderr as Popen takes them (None: the caller's),
    before any terminal among them is replaced (:func:`_pty.choose`)."""
    capture = subprocess.PIPE if request.capture_output else None
    return (
        subprocess.PIPE if request.input is not None else request.stdin,
        capture or request.stdout,
        capture or request.stderr,
    )


def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    request: RunRequest,
    timeout: float | None,
    depth: int,
    terminal: _pty.Choice,
    pass_fds: tuple[int, ...],
    start: Starter | None,
    on_started: Callable[[], None],
    sandbox: Any = None,
) -> tuple[int, bool, bytes | None, bytes | None]:
    """Start the sandbox and wait for it; return (code, timed_out, stdout, stderr).

    ``timeout``: the run's wall-clock limit (its plan's). ``terminal`` says which of the
    caller's terminals are relayed (:mod:`._pty`: the sandbox never holds one);
    ``on_started`` is called once the command was let go (work to overlap with it);
    ``sandbox`` is the gVisor run, whose pty runsc makes (:class:`._gvisor.GvisorRun`).
    """
    _pty.check_passed(pass_fds)
    console = sandbox if sandbox is not None and sandbox.console is not None else None
    stdin, stdout, stderr = stdio(request)
    with contextlib.ExitStack() as files:
        if sandbox is not None and console is None:
            # gVisor writes a regular file from an offset of its own: stockade writes the
            # command's output there itself, at the caller's offset (_gvisor.file_relays).
            from stockade.runtime._gvisor import file_relays

            stdout, stderr = files.enter_context(file_relays(stdout, stderr))
        return _spawn_relayed(
            argv,
            env,
            cwd,
            request,
            timeout,
            depth,
            terminal,
            pass_fds,
            start,
            on_started,
            console,
            (stdin, stdout, stderr),
        )


def _spawn_relayed(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    request: RunRequest,
    timeout: float | None,
    depth: int,
    terminal: _pty.Choice,
    pass_fds: tuple[int, ...],
    start: Starter | None,
    on_started: Callable[[], None],
    console: Any,
    stdio: tuple[int | IO[Any] | None, int | IO[Any] | None, int | IO[Any] | None],
) -> tuple[int, bool, bytes | None, bytes | None]:
    """The body of :func:`spawn` once the stdio targets are chosen."""
    with _pty.relay(terminal, *stdio) as relay:
        proc = popen(argv, env, cwd, *relay.stdio, pass_fds)
        with _pipes_closed(proc):
            try:
                return _wait(proc, request, timeout, depth, start, on_started, console, relay)
            except BaseException:
                # Whatever ended the run first (a step after the start failed, a cancel),
                # the sandbox does not outlive it, and it is reaped.
                kill_tree(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
                raise


@contextlib.contextmanager
def _pipes_closed(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Close the pipes Popen made to the sandbox however the run ends: communicate()
    closes them on the way out it expects, not when a kill, a cancel or an error ends
    the run first (their files were then left to the garbage collector)."""
    try:
        yield
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _wait(
    proc: subprocess.Popen[bytes],
    request: RunRequest,
    timeout: float | None,
    depth: int,
    start: Starter | None,
    on_started: Callable[[], None],
    console: Any,
    relay: Any,
) -> tuple[int, bool, bytes | None, bytes | None]:
    """Let the started sandbox go and wait for it (the body of :func:`_spawn_relayed`)."""
    if request.handle is not None:
        request.handle.attach(proc)  # from here on, another thread can kill the tree
    relay.handed()
    paused = start.paused if start is not None else None
    # Forwarding is in place before the command is let go: a SIGTERM that arrives as
    # soon as it runs must reach it, not kill stockade (the default action). One that
    # arrives before goes to the sandbox's outermost process and ends it: the command
    # never runs.
    with _forwarding(proc, request.forward_signals, depth):
        if start is not None:
            start.release(proc)
        on_started()
        if console is not None:
            master = console.receive_console(lambda: proc.poll() is None)
            if master < 0:
                # runsc ended (or hung) before it made the pty: its status and message
                # say why, and the caller reports it as the sandbox's failure.
                kill_tree(proc)
                code = proc.wait()
                return (code if code >= 0 else 128 - code), False, None, None
            relay.add_console(master)
        relay.start()
        try:
            out, err = _communicate(proc, request.input, timeout, paused)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = proc.communicate()
            return EXIT_TIMEOUT, True, out, err
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode, False, out, err


def _communicate(
    proc: subprocess.Popen[bytes],
    data: bytes | None,
    timeout: float | None,
    paused: Callable[[], float] | None,
) -> tuple[bytes | None, bytes | None]:
    """``proc.communicate`` whose timeout stands still while asks wait for an answer
    (a person reading a prompt must not cost the command its time, Codex #6973)."""
    if timeout is None or paused is None:
        return proc.communicate(data, timeout=timeout)
    started = time.monotonic()
    while True:
        left = started + timeout + paused() - time.monotonic()
        try:
            # communicate() may be called again after a timeout; input is sent once.
            return proc.communicate(data, timeout=max(0.0, min(left, 0.5)))
        except subprocess.TimeoutExpired:
            data = None
            if started + timeout + paused() - time.monotonic() <= 0:
                raise


def popen(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    stdin: int | IO[Any] | None,
    stdout: int | IO[Any] | None,
    stderr: int | IO[Any] | None,
    pass_fds: tuple[int, ...],
) -> subprocess.Popen[bytes]:
    """Start the sandbox's outermost process (bwrap, or the launcher without it)."""
    try:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            # Its own session: terminal signals reach stockade, which forwards them, and
            # the sandbox can never get the caller's terminal as its controlling tty.
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc.strerror}") from exc


def _command_pid(proc: subprocess.Popen[bytes], depth: int) -> int:
    """The pid (in our namespace) that should receive forwarded signals.

    bwrap's monitor does not forward signals, so they go to the command itself: ``depth``
    generations below the process we started (2 with a PID namespace: bwrap, its init,
    the command; 1 for bwrap without one; 0 without bwrap).
    """
    pid = proc.pid
    for _ in range(depth):
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            break
        if not children:
            break
        pid = int(children[0])
    return pid


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen[bytes], enabled: bool, depth: int) -> Iterator[None]:
    if not enabled:
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(_command_pid(proc, depth), signum)

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
