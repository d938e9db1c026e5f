"""The caller's terminal, shared between the command's relay and a prompt.

While a prompt asks on the terminal (:func:`stockade.approvers.tty`), the relay of
:func:`stockade.runtime._run._spawn_pty` must neither read the keys (they are the
prompt's) nor write the command's output over it: :func:`hold` pauses it, in both
directions, until the prompt is done. The command's output waits in its pty meanwhile
(the kernel's buffer, then the command blocks on write), so nothing is lost.

One process has one terminal: the hold is process-wide, and one prompt at a time holds it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["Relay", "hold", "register"]

_lock = threading.Lock()
_prompt = threading.Lock()
_relay: Relay | None = None


def terminal_path(device: str | None = None) -> str:
    """The terminal a prompt uses: ``device``, else standard input's when it is one,
    else the controlling terminal (``/dev/tty``)."""
    if device is not None:
        return device
    with contextlib.suppress(OSError):
        if os.isatty(0):
            return os.ttyname(0)
    return "/dev/tty"


def terminal_opens(device: str | None = None) -> bool:
    """True when :func:`terminal_path` opens as a terminal (cheap: no prompt machinery)."""
    try:
        fd = os.open(terminal_path(device), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


class Relay:
    """A relay's side of the hold: a wake-up pipe and the paused state."""

    def __init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.paused = False
        self._want = False
        self.acknowledged = threading.Event()
        self.resumed = threading.Event()

    def wanted(self) -> bool:
        """Drain the wake-up pipe; True while a prompt wants the terminal."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.wake_r, 64):
                pass
        return self._want

    def _ask(self, want: bool) -> None:
        self._want = want
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.wake_w, b"x")

    def close(self) -> None:
        """Close the pipe (the relay ended)."""
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def register() -> Iterator[Relay]:
    """Make the calling relay the one a prompt pauses, for the ``with`` block."""
    global _relay
    relay = Relay()
    with _lock:
        _relay = relay
    try:
        yield relay
    finally:
        with _lock:
            if _relay is relay:
                _relay = None
        relay.acknowledged.set()  # a prompt waiting for it goes on
        relay.close()


@contextlib.contextmanager
def hold(timeout: float = 2.0) -> Iterator[None]:
    """Own the terminal: the relay (if any) stops reading and writing until the end."""
    with _prompt:
        with _lock:
            relay = _relay
        if relay is None:
            yield
            return
        relay.acknowledged.clear()
        relay._ask(True)
        relay.acknowledged.wait(timeout)
        try:
            yield
        finally:
            relay._ask(False)
