"""The JSON Lines audit sink.

Each event is one JSON object on its own line with at least ``time``, ``run_id``,
``event``, ``layer``, ``verdict`` and ``reason``, and the chain fields ``schema``, ``seq``
and ``prev`` (``final`` on the run's last event; see :mod:`stockade.audit._chain`).
Writes are appended with a single ``os.write`` on an ``O_APPEND`` descriptor so that
lines from concurrent writers (the proxy task and the runtime, or several runs sharing
one file) never interleave.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from stockade._exceptions import SandboxError
from stockade.audit import _chain, _record
from stockade.policy._decision import Decision

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    Event = dict[str, "Any"]
    from typing import Any


#: how many times this process is a child of ``os.fork`` (a log notes its value when made)
_forks = 0


def _forked_child() -> None:
    global _forks
    _forks += 1


# Cheaper per event than comparing os.getpid() (a system call) on every emit.
os.register_at_fork(after_in_child=_forked_child)


class AuditLog:
    """Append-only JSONL audit log for one run.

    Events are kept in memory too (``events``) so that the API can return them with the
    result; ``on_event`` callbacks see each event as it is written.

    The events of one log form a hash chain: each names the hash of the line before it,
    the first a seed bound to the run id, its start and its policy, and the last one
    (``end=True``, or the ``log_end`` that :meth:`close` adds) seals the run.
    """

    def __init__(self, run_id: str, path: Path | None) -> None:
        self.run_id = run_id
        self.path = path
        self.events: list[Event] = []
        self.denials = 0
        self._listeners: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()
        self._fd = -1
        # The chain: the next event's seq, the hash of the last line written (None before
        # the first event: the seed stands in), whether the run's end has been written.
        self._seq = 0
        self._prev: str | None = None
        self._ended = False
        self._fork_of = ""
        self._final = ""
        # The file as opened: stockade keeps writing to this inode; at the run's end it
        # checks that the path still names it (a swapped file is said so, and recorded).
        self._inode: tuple[int, int] | None = None
        self._spelt = ""
        #: the path with symlinks resolved, as opened (None: in memory only)
        self.real_path: str | None = None
        #: the file's hard links when it was opened (more than 1: another name reaches it)
        self.links = 0
        #: what :meth:`replaced` found when the run's end was written ("" until then)
        self.replaced_detail = ""
        # A forked child (the run server's workers) inherits this object: its events
        # cannot continue a chain the parent goes on writing, so they start their own.
        self._forks = _forks
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
            st = os.fstat(self._fd)
            self._inode = (st.st_dev, st.st_ino)
            self.links = st.st_nlink
            self.real_path = os.path.realpath(path)
            self._spelt = os.path.abspath(path)  # a later chdir does not move it

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
        end: bool = False,
        **fields: Any,
    ) -> Event:
        """Write one event and return it; ``end=True`` makes it the run's last (sealed)."""
        record: Event = {
            "time": time.time(),
            "run_id": self.run_id,
            "event": event,
            "layer": layer,
            "verdict": verdict,
            "reason": reason,
        }
        record.update(fields)
        record.pop("final", None)  # only a seal writes it, as the line's last field
        if self._forks != _forks:
            # Before taking the lock, which the parent may have held at the fork.
            self._forked()
        record["run_id"] = self.run_id  # the chain's key: no field may move it to another
        # Serialised under the lock: the order of the lines is the order of the chain.
        with self._lock:
            if self._prev is None and self._fork_of:
                record["fork_of"] = self._fork_of
            # Set after the caller's fields, which cannot overwrite them.
            record["schema"] = _chain.SCHEMA
            record["seq"] = self._seq
            record["prev"] = self._prev if self._prev is not None else _chain.seed(record)
            if end and self._fd >= 0:
                replaced = self.replaced()
                if replaced:
                    # Written to the file stockade holds, wherever it now is; the run
                    # record keeps it too, where the sandbox cannot reach.
                    self.replaced_detail = record["log_replaced"] = replaced
            line = json.dumps(record, separators=(",", ":"), default=str).encode()
            if end:
                line, record["final"] = _chain.seal(line)
                self._final = record["final"]
                self._ended = True
            if verdict == "deny":
                self.denials += 1
            self.events.append(record)
            if self._fd >= 0:
                try:
                    os.write(self._fd, line + b"\n")
                except OSError as exc:
                    raise SandboxError(
                        f"cannot write audit log {self.path}: {exc.strerror}"
                    ) from exc
            self._prev = _chain.line_hash(line)
            self._seq += 1
        for listener in self._listeners:
            listener(record)
        return record

    def replaced(self) -> str:
        """What the log's path names now, when it is not the file stockade opened
        ("" when it still is, or when there is no file)."""
        if self._inode is None:
            return ""
        try:
            st = os.stat(self._spelt)
        except OSError as exc:
            return f"{self.path} is gone ({exc.strerror}): the file was renamed or removed"
        if (st.st_dev, st.st_ino) != self._inode:
            return (
                f"{self.path} now names another file (inode {st.st_ino}; stockade wrote "
                f"inode {self._inode[1]}): the file was replaced"
            )
        return ""

    def head(self) -> _record.Head | None:
        """Where this log's chain stands: the run record kept at the run's end (None
        for a log kept in memory, or one nothing was written to)."""
        if self._inode is None or self.real_path is None or self._prev is None:
            return None
        return _record.Head(
            run_id=self.run_id,
            path=self.real_path,
            dev=self._inode[0],
            ino=self._inode[1],
            events=self._seq,
            head=self._prev,
            final=self._final,
            replaced=self.replaced_detail,
        )

    def _forked(self) -> None:
        """Begin a chain of this process's own, bound to where the parent's stood."""
        # A lock the parent held at the fork stays held here; this process has no other
        # thread (fork copies only the caller), so a new lock is safe.
        self._lock = threading.Lock()
        self._forks = _forks
        self._fork_of = self._prev or ""
        self.run_id = f"{self.run_id}.{os.getpid()}"
        self._seq, self._prev, self._ended = 0, None, False

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

    def __call__(self, event: str, decision: Decision, fields: dict[str, Any]) -> None:
        """Write ``decision`` as ``event``: an AuditLog is an
        :class:`~stockade.audit._sink.AuditSink`."""
        self.decision(event, decision, **fields)

    def close(self) -> None:
        """Close the file; the in-memory events stay available.

        A file closed before its run's end event (the run stopped on an error) gets a
        sealed ``log_end``, so that it verifies as whole rather than as cut.
        """
        if self._fd >= 0 and self._seq and not self._ended and self._forks == _forks:
            # An unwritable log then verifies as cut, which is what it is; raising here
            # would hide the error that stopped the run.
            with contextlib.suppress(SandboxError):
                self.emit(
                    "log_end",
                    verdict="report",
                    end=True,
                    detail="the log was closed before the run's end event",
                )
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
