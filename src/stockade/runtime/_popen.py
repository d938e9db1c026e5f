"""A sandboxed command that keeps running while the caller talks to it (``Sandbox.popen``).

One run is one :func:`~stockade.runtime.execute`, as for ``Sandbox.run``: the same
policy, proxy, grants and approver, the same audit events. It runs in a thread of its
own, with the command's standard streams on pipes whose other ends the caller holds;
a :class:`~stockade.runtime._cancel.RunHandle` lets the caller kill the tree.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

from stockade.runtime._cancel import RunHandle
from stockade.runtime._request import RunResult

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT

#: ``start(handle, stdin, stdout, stderr)`` runs the command (in the worker thread) with
#: those descriptors (None: inherited) and returns its result.
Starter = Callable[[RunHandle, "int | None", "int | None", "int | None"], RunResult]


class SandboxProcess:
    """A command running in a sandbox, like :class:`subprocess.Popen`.

    ``stdin``, ``stdout`` and ``stderr`` are file objects when :data:`PIPE` was asked for
    (text ones with ``text=True``), else None. :meth:`wait` and :meth:`communicate` return
    as Popen's do; :attr:`result` then holds the run's audit events and denials.
    """

    def __init__(
        self,
        argv: Sequence[str],
        start: Starter,
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        text: bool = False,
    ) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        self.result: RunResult | None = None
        self._text = text
        self._handle = RunHandle()
        self._error: BaseException | None = None
        child: list[int] = []  # our copies of the child's ends, closed once it has them
        ours: list[tuple[str, int, str]] = []

        def pipe(spec: int | None, name: str, mode: str) -> int | None:
            if spec == PIPE:
                r, w = os.pipe()
                mine, theirs = (w, r) if mode == "w" else (r, w)
                os.set_inheritable(mine, False)
                child.append(theirs)
                ours.append((name, mine, mode))
                return theirs
            if spec == DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                child.append(fd)
                return fd
            if spec is None:
                return None
            raise ValueError(f"{name}: PIPE, DEVNULL or None (got {spec!r})")

        in_fd = pipe(stdin, "stdin", "w")
        out_fd = pipe(stdout, "stdout", "r")
        err_fd = out_fd if stderr == STDOUT else pipe(stderr, "stderr", "r")
        closed = threading.Lock()

        def close_child(*_: object) -> None:
            with closed:
                while child:
                    with contextlib.suppress(OSError):
                        os.close(child.pop())

        self._started = threading.Event()  # set once bubblewrap runs, or the run ended

        def attached(_proc: object) -> None:
            close_child()
            self._started.set()

        self._handle.on_attach = attached
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        for name, fd, mode in ours:
            f: IO[Any] = os.fdopen(fd, mode + "b", buffering=0 if mode == "w" else -1)
            if text:
                f = io.TextIOWrapper(f, encoding="utf-8", errors="replace", write_through=True)
            setattr(self, name, f)

        def work() -> None:
            try:
                self.result = start(self._handle, in_fd, out_fd, err_fd)
                self.returncode = self.result.returncode
            except BaseException as exc:
                if self._handle.killed and self._handle.pid is not None:
                    # Killed while it started (bubblewrap gone mid-handshake): an end
                    # by SIGKILL, as Popen reports it, not an error of the sandbox's.
                    self.returncode = -9
                else:
                    self._error = exc  # re-raised in the caller's thread
            finally:
                close_child()
                self._started.set()

        self._thread = threading.Thread(target=work, name="stockade-popen", daemon=True)
        self._thread.start()
        self._started.wait()
        error = self._pending_error()
        if error is not None and self._handle.pid is None:
            # The sandbox never started (an unavailable layer, a bad policy): raise here,
            # as Popen raises when it cannot start the program.
            self._close_streams()
            raise error

    def _pending_error(self) -> BaseException | None:
        """What the worker thread raised (set there, so read through a call)."""
        return self._error

    @property
    def pid(self) -> int | None:
        """The pid of the sandbox's outermost process (bubblewrap), on this host."""
        return self._handle.pid

    def poll(self) -> int | None:
        """The exit status once the run is over, else None."""
        if not self._thread.is_alive():
            self._raise()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end; return its status.

        Raises:
            subprocess.TimeoutExpired: ``timeout`` passed first (the command runs on).
        """
        self._thread.join(timeout)
        if self._thread.is_alive():
            assert timeout is not None
            raise subprocess.TimeoutExpired(self.args, timeout)
        self._raise()
        assert self.returncode is not None
        return self.returncode

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def communicate(
        self,
        input: str | bytes | None = None,  # noqa: A002 - the name Popen uses
        timeout: float | None = None,
    ) -> tuple[Any, Any]:
        """Send ``input``, read both streams to their end, wait; as Popen's.

        On ``timeout`` the command is killed (with its whole tree) and
        :class:`subprocess.TimeoutExpired` is raised: unlike Popen's, nothing half-read is
        left for another try.
        """
        out: list[Any] = []
        err: list[Any] = []
        threads = []

        def drain(stream: IO[Any], into: list[Any]) -> None:
            into.append(stream.read())
            stream.close()

        for stream, into in ((self.stdout, out), (self.stderr, err)):
            if stream is not None:
                t = threading.Thread(target=drain, args=(stream, into), daemon=True)
                t.start()
                threads.append(t)
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        for t in threads:
            t.join()
        return (out[0] if out else None), (err[0] if err else None)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the sandbox's outermost process group."""
        self._handle.signal(signum)

    def terminate(self) -> None:
        """SIGTERM to the sandbox: bubblewrap's end takes the whole tree with it."""
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the sandbox and everything in it."""
        self._handle.kill()

    def _close_streams(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdin is not None:
            with contextlib.suppress(OSError):
                self.stdin.close()
        if self._thread.is_alive() and exc and exc[0] is not None:
            self.kill()
        try:
            self.wait()
        finally:
            self._close_streams()

    def __repr__(self) -> str:
        return f"SandboxProcess(args={self.args!r}, returncode={self.returncode})"


class AsyncSandboxProcess:
    """The asyncio twin of :class:`SandboxProcess` (``await Sandbox.apopen(...)``).

    ``stdin`` is an :class:`asyncio.StreamWriter`, ``stdout`` and ``stderr``
    :class:`asyncio.StreamReader` objects (bytes), as for
    :func:`asyncio.create_subprocess_exec`. Cancelling :meth:`wait` or
    :meth:`communicate` kills the tree, waits for it and re-raises.
    """

    def __init__(self, proc: SandboxProcess) -> None:
        self._proc = proc
        self.stdin: Any = None
        self.stdout: Any = None
        self.stderr: Any = None

    @classmethod
    async def start(cls, proc_factory: Callable[[], SandboxProcess]) -> AsyncSandboxProcess:
        """Start the sandbox in a worker thread and connect its pipes to the running loop."""
        import asyncio

        proc = await asyncio.to_thread(proc_factory)
        self = cls(proc)
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            stream = getattr(proc, name)
            if stream is not None:
                reader = asyncio.StreamReader(limit=2**20)
                await loop.connect_read_pipe(
                    lambda r=reader: asyncio.StreamReaderProtocol(r),  # type: ignore[misc]
                    stream,
                )
                setattr(self, name, reader)
        if proc.stdin is not None:
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.streams.FlowControlMixin(), proc.stdin
            )
            self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        return self

    @property
    def pid(self) -> int | None:
        """The pid of the sandbox's outermost process (bubblewrap), on this host."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once :meth:`wait` returned, else None."""
        return self._proc.returncode

    @property
    def result(self) -> RunResult | None:
        """The run's result (events, denials) once it ended."""
        return self._proc.result

    async def wait(self) -> int:
        """Wait for the command to end; return its status."""
        import asyncio

        waiting = asyncio.ensure_future(asyncio.to_thread(self._proc.wait))
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            self._proc.kill()
            await _finish(waiting)
            raise

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:  # noqa: A002
        """Send ``input``, read both streams to their end, wait for the command."""
        import asyncio

        async def feed() -> None:
            if self.stdin is None:
                return
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if input:
                    self.stdin.write(input)
                    await self.stdin.drain()
                self.stdin.close()

        async def read(stream: Any) -> bytes | None:
            return await stream.read() if stream is not None else None

        try:
            _, out, err = await asyncio.gather(feed(), read(self.stdout), read(self.stderr))
        except asyncio.CancelledError:
            self._proc.kill()
            raise
        await self.wait()
        return out, err

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the sandbox's outermost process group."""
        self._proc.send_signal(signum)

    def terminate(self) -> None:
        """SIGTERM to the sandbox: bubblewrap's end takes the whole tree with it."""
        self._proc.terminate()

    def kill(self) -> None:
        """Kill the sandbox and everything in it."""
        self._proc.kill()


async def _finish(task: Any) -> None:
    """Wait for ``task`` to end whatever it raises, through further cancellations."""
    import asyncio

    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "never retrieved" warning
