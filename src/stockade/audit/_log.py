"""The JSON Lines audit sink.

Each event is one JSON object on its own line with at least ``time``, ``run_id``,
``event``, ``layer``, ``verdict`` and ``reason``. Writes are appended with a single
``os.write`` on an ``O_APPEND`` descriptor so that lines from concurrent writers (the
proxy task and the runtime, or several runs sharing one file) never interleave.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from stockade._exceptions import SandboxError
from stockade.policy._decision import Decision

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    Event = dict[str, "Any"]
    from typing import Any


class AuditLog:
    """Append-only JSONL audit log for one run.

    Events are kept in memory too (``events``) so that the API can return them with the
    result; ``on_event`` callbacks see each event as it is written.
    """

    def __init__(self, run_id: str, path: Path | None) -> None:
        self.run_id = run_id
        self.path = path
        self.events: list[Event] = []
        self.denials = 0
        self._listeners: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()
        self._fd = -1
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._fd = os.open(
                    path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
                )
            except OSError as exc:
                # An unwritable audit log refuses the run: stockade never runs unaudited.
                raise SandboxError(
                    f"cannot open audit log {path}: {exc.strerror}; "
                    "choose a writable file with --audit FILE"
                ) from exc

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        """Call ``listener`` with every event written from now on."""
        self._listeners.append(listener)

    def emit(
        self,
        event: str,
        *,
        layer: str = "",
        verdict: str = "allow",
        reason: str = "",
        **fields: Any,
    ) -> Event:
        """Write one event and return it."""
        record: Event = {
            "time": time.time(),
            "run_id": self.run_id,
            "event": event,
            "layer": layer,
            "verdict": verdict,
            "reason": reason,
        }
        record.update(fields)
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if verdict == "deny":
                self.denials += 1
            self.events.append(record)
            if self._fd >= 0:
                try:
                    os.write(self._fd, line)
                except OSError as exc:
                    raise SandboxError(
                        f"cannot write audit log {self.path}: {exc.strerror}"
                    ) from exc
        for listener in self._listeners:
            listener(record)
        return record

    def decision(self, event: str, decision: Decision, **fields: Any) -> Event:
        """Write a :class:`Decision` as one event."""
        if decision.rule:
            fields.setdefault("rule", decision.rule)
        if decision.detail:
            fields.setdefault("detail", decision.detail)
        return self.emit(
            event,
            layer=decision.layer,
            verdict=str(decision.verdict),
            reason=str(decision.reason),
            **fields,
        )

    def close(self) -> None:
        """Close the file; the in-memory events stay available."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: Path) -> Iterator[Event]:
    """Yield the events of a JSONL audit file, skipping lines that are not JSON objects."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                yield value
