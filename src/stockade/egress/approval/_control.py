"""The control channel for harnesses: newline-delimited JSON on an inherited socket.

``stockade run --ask control --control-fd N``: N is one end of a socketpair the harness
made. stockade marks it close-on-exec at once and never passes it to the sandbox (so no
process inside holds it: the rule that matters most). Protocol ``stockade-control/1``::

    stockade -> harness  {"type":"hello","protocol":"stockade-control/1","policy_generation":1}
                         {"type":"ask","id":"a1","run_id":"…","host":"…","port":443,
                          "scheme":"https","argv":[…],"waiting":1,"timeout":30,
                          "suggestions":["host:443","host"],"always":false}
                         {"type":"ack","id":"u1","ok":true,"policy_generation":2}
                         {"type":"ack","id":"u1","ok":false,"error":"…"}
                         {"type":"expired","id":"a1"}          (the ask timed out: denied)
    harness -> stockade  {"type":"hello","protocol":"stockade-control/1"}
                         {"type":"answer","id":"a1","decision":"allow"|"deny",
                          "scope":"run"|"session"|"always","pattern":"…","reason":"…"}
                         {"type":"update","id":"u1","allow":[…],"deny":[…],"revoke":[…],
                          "close":true}

Before the harness's hello nothing is asked (denied as ``approval-unavailable``). A line
that is not JSON, too long (64 KiB), of an unknown type or for an unknown ask is ignored
(and acknowledged as an error when it has an id). An answer after its ask expired is
dropped. End of file denies every pending ask and stops asking; the command goes on
under the last rules. Updates are deltas, never a whole policy (they cannot drop a deny).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import threading
from typing import Any

from stockade._exceptions import PolicyError
from stockade.egress.approval._types import AccessRequest, Answer, AnswerLike, Scope, Unanswerable

__all__ = ["PROTOCOL", "ControlChannel"]

logger = logging.getLogger("stockade.egress")

PROTOCOL = "stockade-control/1"
MAX_LINE = 64 * 1024


class ControlChannel:
    """An :class:`~stockade.egress.approval.Asker` over an inherited socket (a thread
    reads it; asks are awaited on the proxy's loop)."""

    channel = "control"

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)  # close-on-exec now: no child may inherit it
        self.fd = fd
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self.broker: Any = None
        self._lock = threading.Lock()
        self._pending: dict[str, concurrent.futures.Future[AnswerLike]] = {}
        self._hello = threading.Event()
        self._eof = threading.Event()
        self._thread: threading.Thread | None = None

    # -- Asker --------------------------------------------------------------------------

    def available(self) -> bool:
        """True after the harness's hello and before the channel's end."""
        return self._hello.is_set() and not self._eof.is_set()

    def answered_by(self) -> str:
        """``control:fd<N>``."""
        return f"control:fd{self.fd}"

    async def ask(self, request: AccessRequest) -> AnswerLike:
        """Send the ask; wait for its answer (the broker's timeout cancels the wait)."""
        import asyncio

        future: concurrent.futures.Future[AnswerLike] = concurrent.futures.Future()
        with self._lock:
            if not self.available():
                raise Unanswerable("the control channel is closed")
            self._pending[request.id] = future
        try:
            self._send(
                {
                    "type": "ask",
                    "id": request.id,
                    "run_id": request.run_id,
                    "host": request.host,
                    "port": request.port,
                    "scheme": request.scheme,
                    "argv": list(request.argv),
                    "waiting": request.waiting,
                    "timeout": request.timeout,
                    "suggestions": list(request.suggestions),
                    "always": request.always_to is not None,
                }
            )
            return await asyncio.wrap_future(future)
        finally:
            with self._lock:
                gone = self._pending.pop(request.id, None)
            if gone is not None and not future.done():
                self._send({"type": "expired", "id": request.id})

    # -- the channel ----------------------------------------------------------------------

    def start(self, broker: Any, wait_hello: float = 10.0) -> bool:
        """Say hello, start reading, and wait for the harness's hello (True when it came)."""
        self.broker = broker
        self._send({"type": "hello", "protocol": PROTOCOL, "policy_generation": broker.generation})
        self._thread = threading.Thread(target=self._read, name="stockade-control", daemon=True)
        self._thread.start()
        return self._hello.wait(wait_hello)

    def close(self) -> None:
        """Stop: pending asks are denied."""
        self._eof.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._fail_pending()
        self.sock.close()

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self._eof.set()

    def _fail_pending(self) -> None:
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(Unanswerable("the control channel closed"))

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._line(line)
                if len(buffer) > MAX_LINE:
                    logger.warning("control: a line over %d bytes was dropped", MAX_LINE)
                    buffer = b""
        except OSError:
            pass
        finally:
            self._eof.set()
            self._fail_pending()

    def _line(self, line: bytes) -> None:
        if len(line) > MAX_LINE or not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("control: a line that is not JSON was ignored")
            return
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "hello":
            if message.get("protocol") == PROTOCOL:
                self._hello.set()
            else:
                self._send({"type": "error", "error": f"protocol must be {PROTOCOL}"})
            return
        if not self._hello.is_set():
            return
        if kind == "answer":
            self._answer(message)
        elif kind == "update":
            self._update(message)
        elif "id" in message:
            self._send({"type": "ack", "id": message["id"], "ok": False, "error": "unknown type"})

    def _answer(self, message: dict[str, Any]) -> None:
        with self._lock:
            future = self._pending.get(str(message.get("id")))
        if future is None or future.done():
            return  # unknown, or expired: dropped
        decision = message.get("decision")
        try:
            scope = Scope(message.get("scope", "run"))
        except ValueError:
            future.set_exception(ValueError(f"scope {message.get('scope')!r}"))
            return
        pattern = message.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            future.set_exception(ValueError("pattern must be a string"))
            return
        if decision == "allow":
            future.set_result(Answer.allow(scope, pattern))
        elif decision == "deny":
            future.set_result(Answer.deny(str(message.get("reason", ""))[:500], scope))
        else:
            future.set_exception(ValueError(f"decision {decision!r} is not allow or deny"))

    def _update(self, message: dict[str, Any]) -> None:
        ident = message.get("id")
        try:
            lists = {k: message.get(k, []) for k in ("allow", "deny", "revoke")}
            for key, value in lists.items():
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise PolicyError(f"{key}: expected a list of host patterns")
            generation = self.broker.update(
                allow=lists["allow"],
                deny=lists["deny"],
                revoke=lists["revoke"],
                close=bool(message.get("close", True)),
                source="control",
            )
        except (PolicyError, ValueError, OSError) as exc:
            self._send({"type": "ack", "id": ident, "ok": False, "error": str(exc)})
            return
        self._send({"type": "ack", "id": ident, "ok": True, "policy_generation": generation})
