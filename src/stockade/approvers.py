"""Built-in approvers for :func:`stockade.run` and :class:`stockade.Sandbox` (``ask=``).

An approver gets an :class:`~stockade.AccessRequest` and returns an
:class:`~stockade.Answer`, ``True`` (allow for the run), ``False`` or ``None`` (deny);
anything else, or an exception, denies. ::

    from stockade import approvers, Sandbox

    with Sandbox(ask=approvers.tty()) as sb:      # ask on the terminal
        sb.run(["pip", "install", "-e", "."])

:func:`tty` is the terminal prompt of ``stockade run``; :func:`deny`,
:func:`allow_patterns` and :func:`scripted` are for programs and tests.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterable, Mapping

from stockade.egress.approval import AccessRequest, Answer, AnswerLike, Scope
from stockade.policy._hosts import HostPattern, parse_pattern

__all__ = ["Scripted", "allow_patterns", "deny", "scripted", "tty"]

#: Keys read during the first moments of a prompt are dropped: a key pressed for the
#: command just as the prompt appears must not answer it.
SETTLE_S = 0.4


def deny(reason: str = "denied by stockade.approvers.deny()") -> _Deny:
    """An approver that denies every request (and so records each ask)."""
    return _Deny(reason)


class _Deny:
    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.answered_by = "callback:approvers.deny"

    def __call__(self, request: AccessRequest) -> Answer:
        return Answer.deny(self.reason)


def allow_patterns(patterns: Iterable[str], scope: Scope = Scope.RUN) -> _Patterns:
    """Allow a request that one of ``patterns`` (policy host patterns) matches, for
    ``scope``; deny the rest. The grant is the request's exact ``host:port``."""
    parsed = [parse_pattern(p) for p in patterns]
    return _Patterns(parsed, scope)


class _Patterns:
    def __init__(self, patterns: list[HostPattern], scope: Scope) -> None:
        self.patterns = patterns
        self.scope = scope
        self.answered_by = "callback:approvers.allow_patterns"

    def __call__(self, request: AccessRequest) -> Answer:
        for pattern in self.patterns:
            if pattern.matches(request.host, request.port):
                return Answer.allow(self.scope)
        return Answer.deny("no pattern of allow_patterns() matches")


def scripted(answers: Mapping[str, AnswerLike], default: AnswerLike = None) -> Scripted:
    """An approver answering from a table keyed by ``host:port`` or ``host`` (for tests,
    like ``httpx.MockTransport``); ``asked`` lists the requests it saw."""
    return Scripted(dict(answers), default)


class Scripted:
    """See :func:`scripted`."""

    answered_by = "callback:approvers.scripted"

    def __init__(self, answers: dict[str, AnswerLike], default: AnswerLike) -> None:
        self.answers = answers
        self.default = default
        self.asked: list[AccessRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: AccessRequest) -> AnswerLike:
        with self._lock:
            self.asked.append(request)
        for key in (request.target, request.host):
            if key in self.answers:
                return self.answers[key]
        return self.default


#: how much of the command the prompt shows (the rest is cut, with an ellipsis)
_ARGV_SHOWN = 60


def tty(device: str | None = None, *, settle: float = SETTLE_S) -> Tty:
    """Ask on the terminal, as ``stockade run --ask tty`` does.

    ``device`` defaults to the terminal on stdin, else ``/dev/tty``. While the prompt is
    shown the command's terminal relay is paused both ways and the terminal's input is
    flushed, so neither type-ahead nor anything the command writes can answer it; an
    answer is a key and Enter (``a``, which writes ``approved.toml``, a second Enter).
    """
    return Tty(device, settle)


def _safe(text: str) -> str:
    # The host is attacker-chosen: no control or escape sequences reach the terminal.
    return "".join(ch if 0x20 <= ord(ch) < 0x7F else f"\\x{ord(ch):02x}" for ch in text)


class Tty:
    """See :func:`tty`."""

    channel = "tty"

    def __init__(self, device: str | None, settle: float) -> None:
        self.device = device
        self.settle = settle

    def path(self) -> str:
        """The terminal the prompt uses."""
        from stockade.runtime._terminal import terminal_path

        return terminal_path(self.device)

    def available(self) -> bool:
        """True when the terminal opens."""
        from stockade.runtime._terminal import terminal_opens

        return terminal_opens(self.device)

    def answered_by(self) -> str:
        """``tty:<device>``."""
        return f"tty:{self.path()}"

    def __call__(self, request: AccessRequest) -> Answer:
        from stockade.runtime import _terminal

        with _terminal.hold():
            fd = os.open(self.path(), os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            try:
                return self._prompt(fd, request)
            finally:
                os.close(fd)

    def _prompt(self, fd: int, request: AccessRequest) -> Answer:
        import termios
        import tty as tty_

        saved = termios.tcgetattr(fd)
        deadline = time.monotonic() + max(0.0, request.timeout - 0.05)
        try:
            tty_.setraw(fd, termios.TCSANOW)
            # Type-ahead was meant for the command: it never answers a prompt.
            termios.tcflush(fd, termios.TCIFLUSH)
            argv = " ".join(request.argv)
            if len(argv) > _ARGV_SHOWN:
                argv = argv[: _ARGV_SHOWN - 3] + "..."  # cut, and visibly so
            always = f"   [a] always (-> {_safe(request.always_to)})" if request.always_to else ""
            lines = [
                "",
                f"stockade > run {request.run_id} ({_safe(argv)}) wants "
                f"{_safe(request.target)} ({request.scheme}), not on your allow-list",
                f"  [r] allow for this command   [s] allow for this session{always}",
                f"  [d] deny   [D] deny, and ask nothing more this run"
                f"      denied in {request.timeout:.0f}s",
                "  choice, then Enter: ",
            ]
            os.write(fd, "\r\n".join(lines).encode())
            time.sleep(self.settle)
            termios.tcflush(fd, termios.TCIFLUSH)
            choice = self._read_choice(fd, deadline, bool(request.always_to))
        finally:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
        answers = {
            "r": Answer.allow(Scope.RUN),
            "s": Answer.allow(Scope.SESSION),
            "a": Answer.allow(Scope.ALWAYS),
            "d": Answer.deny("denied on the terminal"),
            "D": Answer.deny("denied on the terminal; no more asks this run", stop=True),
        }
        answer = answers[choice]
        said = {
            "r": "allowed for this command",
            "s": "allowed for this session",
            "a": f"allowed always (saved to {_safe(request.always_to or '')})",
            "d": "denied",
            "D": "denied; nothing more is asked this run",
        }[choice]
        os.write(fd, f"\r\n  stockade: {said}\r\n".encode())
        return answer

    def _read_choice(self, fd: int, deadline: float, always: bool) -> str:
        valid = {"r", "s", "d", "D", *(("a",) if always else ())}
        line = ""
        confirming = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.write(fd, b"\r\n  stockade: no answer; denied\r\n")
                raise TimeoutError("no answer on the terminal")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            data = os.read(fd, 256)
            if not data:
                raise EOFError("the terminal closed")
            for byte in data:
                ch = chr(byte)
                if ch in "\r\n":
                    if confirming:
                        return "a"
                    if line in valid and line == "a":
                        confirming = True
                        os.write(fd, b"\r\n  always: press Enter again to confirm: ")
                    elif line in valid:
                        return line
                    else:
                        keys = "r, s, a, d or D" if always else "r, s, d or D"
                        os.write(fd, f"\r\n  type {keys}, then Enter: ".encode())
                    line = ""
                    continue
                if confirming:
                    confirming = False
                    line = "\x00"  # anything but Enter cancels the confirmation
                    continue
                if ch in "\x03\x04":
                    return "d"  # Ctrl-C, Ctrl-D: deny
                if ch in "\x7f\b":
                    if line:
                        line = line[:-1]
                        os.write(fd, b"\b \b")
                elif ch.isalpha() and len(line) < 4:
                    line += ch
                    os.write(fd, ch.encode())
                else:
                    # An escape sequence (a terminal report, say) poisons the line:
                    # only keys typed on purpose answer.
                    line = "\x00"
