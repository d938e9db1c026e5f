"""The caller's terminal kept out of the sandbox: what the command's 0, 1 and 2 are, and
the relay between them and the caller's terminals.

The sandbox never holds a descriptor of a terminal of the caller's (DESIGN §6). One that
did could draw over a prompt of stockade's (a "press r" of its own, answered by the
person), read the keys meant for it, or push input with TIOCSTI where the kernel lets
it. So each of the command's 0, 1 and 2 that would be a terminal of the caller's gets a
pty (under gVisor, a pipe) of stockade's own instead, and a thread of stockade's copies
between the two; a prompt pauses that copy in both directions (:func:`._terminal.hold`).
Other descriptors never go in: the sandbox's outermost process starts with
``close_fds`` and only stockade's own pipes, and :func:`check_passed` refuses a terminal
among them.

What the command gets (bubblewrap, or the launcher alone), for each of the caller's 0, 1
and 2 that is a terminal (``tty``) or not (``-``: a pipe, a file, /dev/null, passed in as
it is, so a pipe on stdin still feeds the command)::

    0    1    2     the command's 0 / 1 / 2                 the relay
    tty  tty  tty   pty / pty / pty (controlling terminal)  keys -> pty, pty -> terminal
    tty  tty  -     pty / pty / the caller's 2              keys -> pty, pty -> terminal
    tty  -    tty   pty / the caller's 1 / pty              keys -> pty, pty -> terminal (2)
    tty  -    -     pty / the caller's 1 / the caller's 2   keys -> pty, its echo -> terminal
    -    tty  tty   the caller's 0 / pty / pty              pty -> terminal; no key is read
    -    tty  -     the caller's 0 / pty / the caller's 2   pty -> terminal (1)
    -    -    tty   the caller's 0 / the caller's 1 / pty   pty -> terminal (2)
    -    -    -     the caller's 0 / 1 / 2                  none

With a terminal on 0 the caller's terminal is raw while the command runs and its pty is
cooked (as ``ssh -t`` and ``script`` do): Ctrl-C is a byte that the pty turns into the
command's SIGINT, and the pty is the command's controlling terminal (``/dev/tty``).
Without one the caller's terminal is left as it is and nothing reads it (Ctrl-C is
stockade's SIGINT, forwarded to the command); the pty is then no controlling terminal
(``/dev/tty`` inside fails with ENXIO, as the program would find with no terminal to
ask on) and does no output processing, so the command's bytes reach the terminal as
they would directly. A 1 and a 2 on two different terminals get a pty each. A terminal
on 0 that is not to be relayed (``allow_pty`` off: the Python API, which mirrors
:func:`subprocess.run` and never takes the caller's keys) is replaced by /dev/null.

Under gVisor a terminal on 0 makes a terminal bundle: runsc's own pty is the command's
0, 1 and 2 (as ``docker run -t``), relayed to the caller's 1. Without one, each
terminal of 1 and 2 is replaced by a pipe: gVisor hands the command its stdio as plain
host files, so inside they were never terminals. runsc's own stdio is never a terminal
either: its messages come through a pipe to the caller's 2.

When no pty or pipe can be had (the kernel's limits), the run is refused with exit 125:
never run with the terminal held.

What is relayed to a terminal passes :class:`._escapes.TerminalFilter`: the sequences
that would set the clipboard, move files, or make the terminal type an answer into the
host shell's input are dropped; everything a program draws with goes through.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time

from stockade._exceptions import SandboxError
from stockade._record import record
from stockade.runtime import _terminal
from stockade.runtime._escapes import TerminalFilter

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import IO, Any

    Target = int | IO[Any] | None

__all__ = ["Choice", "Relay", "check_passed", "choose", "relay"]

#: How long the relay goes on copying once the command ended, at most: a pty whose other
#: end a process left behind (no container layer) holds open would never end.
_DRAIN_S = 2.0


@record
class Choice:
    """Which of the command's 0, 1 and 2 would be a terminal of the caller's (made from
    ``isatty`` alone: nothing is opened)."""

    #: the caller's descriptor behind each of 0, 1 and 2 when it is a terminal, else -1
    terminals: tuple[int, int, int]
    #: stdin is a terminal relayed through a pty that is the command's controlling one
    interactive: bool
    #: the gVisor backend (its terminal is runsc's pty, its stdio plain host files)
    gvisor: bool = False

    @property
    def relayed(self) -> bool:
        """Whether any of 0, 1 and 2 is a terminal (and so gets a relay)."""
        return any(fd >= 0 for fd in self.terminals)

    @property
    def null_stdin(self) -> bool:
        """A terminal on 0 that is not relayed: the command reads /dev/null."""
        return self.terminals[0] >= 0 and not self.interactive


def _fd(target: Target, inherited: int) -> int:
    """The descriptor behind a Popen stdio argument (-1: a pipe or /dev/null of Popen's)."""
    if target is None:
        return inherited
    if isinstance(target, int):
        return target  # subprocess.PIPE, STDOUT and DEVNULL are negative
    try:
        return target.fileno()
    except (AttributeError, OSError, ValueError):
        return -1


def _isatty(fd: int) -> bool:
    try:
        return fd >= 0 and os.isatty(fd)
    except OSError:
        return False


def choose(
    stdin: Target, stdout: Target, stderr: Target, *, allow_pty: bool, gvisor: bool = False
) -> Choice:
    """How the command's 0, 1 and 2 meet the caller's terminals, for these Popen stdio
    arguments (``None``: the caller's own 0, 1, 2). ``allow_pty``: a terminal on 0 is
    relayed through a pty (else /dev/null is read)."""
    fds = (_fd(stdin, 0), _fd(stdout, 1), _fd(stderr, 2))
    t0, t1, t2 = (fd if _isatty(fd) else -1 for fd in fds)
    return Choice((t0, t1, t2), interactive=allow_pty and t0 >= 0, gvisor=gvisor)


def check_passed(fds: tuple[int, ...]) -> None:
    """Refuse to pass a terminal into the sandbox beside its stdio (stockade passes only
    pipes and files of its own: this holds that rule where the descriptors leave)."""
    for fd in fds:
        if _isatty(fd):
            raise SandboxError(
                f"descriptor {fd} to be passed into the sandbox is a terminal; the "
                "command did not run (the sandbox never holds the caller's terminal)"
            )


def _refuse(what: str, exc: OSError) -> SandboxError:
    return SandboxError(
        f"cannot keep the caller's terminal out of the sandbox: no {what} to relay it "
        f"({exc.strerror or exc}); the command did not run. Redirect its stdin, stdout "
        "and stderr away from the terminal (< /dev/null > FILE 2>&1), or free ptys "
        "(/proc/sys/kernel/pty/max)"
    )


class _Channel:
    """One copy between the sandbox's side (a pty master or a pipe's read end) and the
    caller's terminal."""

    def __init__(self, sink: int, *, keys: int = -1, size: int = -1, pty: bool = False) -> None:
        #: what the relay reads (-1 until runsc sends its console; -1 again once closed)
        self.source = -1
        #: the end the sandbox gets (a pty's slave, a pipe's write end; -1 once handed)
        self.child = -1
        #: the caller's descriptor the output goes to (-1: dropped)
        self.sink = sink
        #: the caller's terminal whose keys go to the pty (-1: none)
        self.keys = keys
        #: the caller's terminal whose window size the pty follows (-1: none)
        self.size = size
        self.pty = pty
        #: keys read but not yet taken by the pty
        self.pending = bytearray()
        self.winsize = b""
        #: ``sink`` is a descriptor of the relay's own (closed at the end)
        self.own_sink = False
        #: every sink is a person's terminal: what the output may ask of it (:mod:`._escapes`)
        self.filter = TerminalFilter()


class Relay:
    """The command's stdio with every terminal of the caller's replaced, and the thread
    that relays them. Use :func:`relay`; :attr:`stdio` is what Popen gets."""

    def __init__(self, choice: Choice, stdin: Target, stdout: Target, stderr: Target) -> None:
        self.choice = choice
        self.stdio: tuple[Target, Target, Target] = (stdin, stdout, stderr)
        self.channels: list[_Channel] = []
        self._console: _Channel | None = None
        self._saved: Any = None
        self._winch: Any = None
        self._thread: threading.Thread | None = None
        self._ending = False
        self._hold: _terminal.Relay | None = None
        self._holder: Any = None

    # -- before the command starts ---------------------------------------------------

    def open(self) -> None:
        """Make the ptys and pipes and register with the prompt's hold (before the
        command starts: a prompt that comes before the copy starts finds it paused).

        Raises:
            SandboxError: no pty or pipe could be made (the run is refused).
        """
        choice = self.choice
        if not choice.relayed:
            return
        self._holder = _terminal.register()
        self._hold = self._holder.__enter__()
        stdin, stdout, stderr = self.stdio
        targets: list[Target] = [stdin, stdout, stderr]
        if choice.null_stdin:
            targets[0] = subprocess.DEVNULL
        if choice.gvisor:
            self._open_gvisor(targets)
        else:
            self._open_ptys(targets)
        self.stdio = (targets[0], targets[1], targets[2])

    def _terminal_groups(self, which: tuple[int, ...]) -> list[list[int]]:
        """The indices of ``which`` that are terminals, one list per terminal device."""
        groups: dict[int, list[int]] = {}
        for k in which:
            fd = self.choice.terminals[k]
            if fd < 0:
                continue
            try:
                device = os.fstat(fd).st_rdev
            except OSError:
                device = -1 - k
            groups.setdefault(device, []).append(k)
        return list(groups.values())

    def _open_ptys(self, targets: list[Target]) -> None:
        import termios

        terminals = self.choice.terminals
        which = (0, 1, 2) if self.choice.interactive else (1, 2)
        for group in self._terminal_groups(which):
            outs = [k for k in group if k != 0]
            if outs:
                channel = _Channel(terminals[outs[0]], pty=True)
            else:
                sink, own = _writable(terminals[0])
                channel = _Channel(sink, pty=True)
                channel.own_sink = own
            if 0 in group:
                channel.keys = channel.size = terminals[0]
            else:
                channel.size = terminals[outs[0]]
            self.channels.append(channel)
            try:
                channel.source, channel.child = os.openpty()
            except OSError as exc:
                raise _refuse("pty", exc) from None
            if channel.keys < 0:
                # Nothing types into it: its output goes to the terminal byte for byte,
                # which does its own output processing (newline to CR LF) once.
                with contextlib.suppress(OSError, termios.error):
                    attrs = termios.tcgetattr(channel.size)
                    attrs[1] &= ~termios.OPOST
                    termios.tcsetattr(channel.child, termios.TCSANOW, attrs)
            _nonblocking(channel.source)
            _copy_size(channel, channel.child)
            for k in group:
                targets[k] = channel.child

    def _open_gvisor(self, targets: list[Target]) -> None:
        terminals = self.choice.terminals
        if self.choice.interactive:
            # runsc makes the pty; its master comes over the console socket once the
            # sandbox exists (add_console). Its output goes to the caller's 1.
            out = _fd(targets[1], 1)
            sink, own = (out, False) if out >= 0 else _writable(terminals[0])
            console = _Channel(sink, keys=terminals[0], size=terminals[0], pty=True)
            console.own_sink = own
            self._console = console
            self.channels.append(console)
            # runsc's own messages (its stdout and stderr) go to the caller's 2.
            err: Target = targets[2]
            if err is None or err == subprocess.STDOUT:
                err = 2
            if terminals[2] >= 0:
                err = self._pipe(terminals[2])
            targets[:] = [subprocess.DEVNULL, err, err]
            return
        for group in self._terminal_groups((1, 2)):
            end = self._pipe(terminals[group[0]])
            for k in group:
                targets[k] = end

    def _pipe(self, sink: int) -> int:
        channel = _Channel(sink)
        self.channels.append(channel)
        try:
            channel.source, channel.child = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            raise _refuse("pipe", exc) from None
        _nonblocking(channel.source)
        return channel.child

    def handed(self) -> None:
        """The sandbox's process has its ends: close stockade's copies of them (so that
        the relay sees the end of its output when the sandbox ends)."""
        for channel in self.channels:
            if channel.child >= 0:
                os.close(channel.child)
                channel.child = -1

    def add_console(self, master: int) -> None:
        """The pty master runsc sent (gVisor's terminal bundle)."""
        assert self._console is not None
        self._console.source = master
        _nonblocking(master)
        _copy_size(self._console, master)

    # -- while the command runs ------------------------------------------------------

    def start(self) -> None:
        """Start relaying: the keys' terminal raw, window-size changes followed."""
        if not self.channels:
            return
        import signal
        import termios
        import tty

        keys = self.choice.terminals[0] if self.choice.interactive else -1
        if keys >= 0:
            with contextlib.suppress(OSError, termios.error):
                self._saved = termios.tcgetattr(keys)
                # TCSANOW, not the default TCSAFLUSH: keep what the user typed ahead.
                tty.setraw(keys, termios.TCSANOW)
        if threading.current_thread() is threading.main_thread():

            def resize(_signum: int, _frame: object) -> None:
                for channel in self.channels:
                    if channel.pty and channel.source >= 0:
                        _copy_size(channel, channel.source)

            self._winch = signal.signal(signal.SIGWINCH, resize)
        self._thread = threading.Thread(target=self._loop, name="stockade-relay", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        hold = self._hold
        assert hold is not None
        hold.start()
        sel = selectors.DefaultSelector()
        sel.register(hold.wake_r, selectors.EVENT_READ)
        paused = False
        drain_until = 0.0
        try:
            while True:
                want = hold.wanted()
                if want and not paused:
                    # A prompt takes the terminal: stop relaying both ways until it is
                    # done (its keys are not the command's, and the command's output
                    # must not draw over it or answer it).
                    self._listen(sel, False)
                    paused = True
                    hold.acknowledged.set()
                elif not want and paused:
                    paused = False
                if not paused:
                    self._listen(sel, True)
                    if self._ending and not any(c.source >= 0 for c in self.channels):
                        break
                draining = self._ending and not paused
                if draining and not drain_until:
                    drain_until = time.monotonic() + _DRAIN_S
                events = sel.select(0.05 if draining else 0.5)
                if paused:
                    continue  # the command's end waits for the prompt's
                if draining and (not events or time.monotonic() > drain_until):
                    # The command ended and nothing more came for a moment (or something
                    # it left behind outside a container keeps writing: not forever).
                    break
                if self._winch is None:
                    for channel in self.channels:  # not the main thread: no SIGWINCH
                        if channel.pty and channel.source >= 0:
                            _copy_size(channel, channel.source)
                for key, mask in events:
                    if key.fd != hold.wake_r:
                        self._event(sel, key.data, key.fd, mask)
        except Exception:  # never leave the command blocked on a full pty
            for channel in self.channels:
                self._close_source(sel, channel)
            raise
        finally:
            sel.close()

    def _listen(self, sel: selectors.BaseSelector, on: bool) -> None:
        """Register what the relay reads (and the ptys that have keys waiting), or
        unregister all of it (``on`` false: a prompt holds the terminal)."""
        for channel in self.channels:
            for fd, mask in (
                (
                    channel.source,
                    selectors.EVENT_READ | (selectors.EVENT_WRITE if channel.pending else 0),
                ),
                (channel.keys if channel.source >= 0 else -1, selectors.EVENT_READ),
            ):
                if fd < 0:
                    continue
                registered = sel.get_map().get(fd)
                if not on:
                    if registered is not None:
                        sel.unregister(fd)
                elif registered is None:
                    sel.register(fd, mask, channel)
                elif registered.events != mask:
                    sel.modify(fd, mask, channel)

    def _event(self, sel: selectors.BaseSelector, channel: _Channel, fd: int, mask: int) -> None:
        if fd == channel.source:
            if mask & selectors.EVENT_WRITE:
                self._give_keys(channel)
            if mask & selectors.EVENT_READ:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    return
                except OSError:
                    data = b""  # EIO: every holder of the pty's other end is gone
                if not data:
                    self._close_source(sel, channel)
                elif channel.sink >= 0:
                    try:
                        _write_all(channel.sink, channel.filter.feed(data))
                    except OSError:
                        channel.sink = -1  # the caller's terminal went away
        else:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(fd)
                channel.keys = -1
                return
            channel.pending += data
            self._give_keys(channel)

    @staticmethod
    def _give_keys(channel: _Channel) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            try:
                written = os.write(channel.source, channel.pending)
            except OSError:
                written = len(channel.pending)  # the pty is closing: the keys are moot
            del channel.pending[:written]

    @staticmethod
    def _close_source(sel: selectors.BaseSelector, channel: _Channel) -> None:
        for fd in (channel.source, channel.keys):
            if fd >= 0 and fd in sel.get_map():
                sel.unregister(fd)
        if channel.source >= 0:
            with contextlib.suppress(OSError):
                os.close(channel.source)
        channel.source = channel.keys = -1

    # -- the end -----------------------------------------------------------------------

    def finish(self) -> None:
        """The command ended: copy what is left of its output (after a prompt that is
        showing), then stop; the caller's terminal as it was."""
        if self._thread is not None:
            self._ending = True
            if self._hold is not None:
                self._hold.wake()
            self._thread.join()
            self._thread = None
        self.close()

    def close(self) -> None:
        """Put back the terminal's mode and the SIGWINCH handler; close every end."""
        if self._saved is not None:
            import termios

            with contextlib.suppress(OSError, termios.error):
                termios.tcsetattr(self.choice.terminals[0], termios.TCSAFLUSH, self._saved)
            self._saved = None
        if self._winch is not None:
            import signal

            signal.signal(signal.SIGWINCH, self._winch)
            self._winch = None
        for channel in self.channels:
            for fd in (
                channel.source,
                channel.child,
                channel.sink if channel.own_sink else -1,
            ):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            channel.source = channel.child = -1
        self.channels = []
        if self._holder is not None:
            self._holder.__exit__(None, None, None)
            self._holder = self._hold = None


@contextlib.contextmanager
def relay(choice: Choice, stdin: Target, stdout: Target, stderr: Target) -> Iterator[Relay]:
    """A :class:`Relay` for one run, opened (its :attr:`~Relay.stdio` is what Popen gets);
    finished and closed at the end of the block."""
    r = Relay(choice, stdin, stdout, stderr)
    try:
        r.open()
        yield r
    finally:
        r.finish()


def _writable(fd: int) -> tuple[int, bool]:
    """A descriptor that writes to the terminal behind ``fd`` (a stdin opened read-only
    is opened again); (-1, False) when there is none. The bool: the descriptor is new."""
    import fcntl

    try:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY:
            return fd, False
        return os.open(os.ttyname(fd), os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC), True
    except OSError:
        return -1, False


def _nonblocking(fd: int) -> None:
    os.set_blocking(fd, False)


def _copy_size(channel: _Channel, target: int) -> None:
    """Give ``target`` (a pty end) the window size of the channel's terminal, when it
    changed."""
    if channel.size < 0 or not channel.pty:
        return
    import fcntl
    import termios

    with contextlib.suppress(OSError):
        size = fcntl.ioctl(channel.size, termios.TIOCGWINSZ, b"\0" * 8)
        if size != channel.winsize:
            fcntl.ioctl(target, termios.TIOCSWINSZ, size)
            channel.winsize = size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)
            continue
        view = view[written:]
