"""The caller's terminal, shared between the command's relays and a prompt.

While a prompt asks on the terminal (:func:`stockade.approvers.tty`), the relays of
:mod:`stockade.runtime._pty` must neither read the keys (they are the prompt's) nor
write the command's output over it: :func:`hold` pauses every relay of the process, in
both directions, until the prompt is done. The command's output waits in its pty or
pipe meanwhile (the kernel's buffer, then the command blocks on write), so nothing is
lost.

One process has one terminal: the hold is process-wide, and one prompt at a time holds
it. Several runs may relay at once (threads of one :class:`stockade.Sandbox`): a prompt
pauses them all.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["Relay", "hold", "register"]

_lock = threading.Lock()
_prompt = threading.Lock()
_relays: set[Relay] = set()


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
    """A relay's side of the hold: a wake-up pipe and the paused state.

    The relay's loop calls :meth:`wanted` whenever ``wake_r`` is readable and, once it
    has stopped reading and writing, sets :attr:`acknowledged`. A relay whose loop has
    not started yet (:attr:`running` false) writes nothing, so it acknowledges at once;
    its loop checks :meth:`wanted` before anything else when it starts.
    """

    def __init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._want = False
        self.running = False
        self.acknowledged = threading.Event()

    def wanted(self) -> bool:
        """Drain the wake-up pipe; True while a prompt wants the terminal."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.wake_r, 64):
                pass
        return self._want

    def wake(self) -> None:
        """Wake the relay's loop (a change of state it should look at)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self.wake_w, b"x")

    def _ask(self, want: bool) -> None:
        with _lock:
            self._want = want
            if want and not self.running:
                self.acknowledged.set()
        self.wake()

    def start(self) -> None:
        """Called by the relay's loop as it starts (under the lock: a prompt that asked
        before then was acknowledged, and the loop sees ``wanted()``)."""
        with _lock:
            self.running = True

    def close(self) -> None:
        """Close the pipe (the relay ended)."""
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


@contextlib.contextmanager
def register() -> Iterator[Relay]:
    """Make the calling relay one that a prompt pauses, for the ``with`` block."""
    relay = Relay()
    with _lock:
        _relays.add(relay)
    try:
        yield relay
    finally:
        with _lock:
            _relays.discard(relay)
        relay.acknowledged.set()  # a prompt waiting for it goes on
        relay.close()


@contextlib.contextmanager
def hold(timeout: float = 2.0) -> Iterator[None]:
    """Own the terminal: every relay stops reading and writing until the end."""
    with _prompt:
        with _lock:
            relays = list(_relays)
        for relay in relays:
            relay.acknowledged.clear()
            relay._ask(True)
        deadline = time.monotonic() + timeout
        for relay in relays:
            relay.acknowledged.wait(max(0.0, deadline - time.monotonic()))
        try:
            yield
        finally:
            for relay in relays:
                relay._ask(False)
