"""Verification of the audit log's hash chain (``stockade log --verify``).

Kept apart from the writer (:mod:`stockade.audit._chain`) so that a run does not pay for
what only the reader needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from stockade.audit._chain import HEX_LEN, SCHEMA, line_hash, seed, unseal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from pathlib import Path

    from stockade.audit._record import Head

_HEX = frozenset("0123456789abcdef")


def _is_hash(value: object) -> bool:
    return isinstance(value, str) and len(value) == HEX_LEN and set(value) <= _HEX


@dataclass(frozen=True)
class Problem:
    """The first thing in a log that does not fit: where it is and what is wrong."""

    line: int
    run_id: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        run = f"run {self.run_id}: " if self.run_id is not None else ""
        return f"{where}{run}{self.message}"


@dataclass
class Verdict:
    """What :func:`verify_lines` found: counts, and the problems in line order."""

    runs: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: per run id: how many of its events the file holds, and the hash of the last one
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every run verifies (and there was at least one event)."""
        return not self.problems and self.events > 0


@dataclass
class _Entry:
    line: int
    seq: int
    prev: str
    hash: str
    event: str
    #: None: not sealed; True: ``final`` matches the line; False: it does not
    sealed: bool | None
    seed: str


@dataclass
class _Run:
    run_id: str
    entries: list[_Entry] = field(default_factory=list)

    def restarts(self, first: _Entry) -> bool:
        """Whether ``first`` (seq 0) begins a new chain under this run's id.

        So it does after the run's end (a run server restarted on its log), or when it
        is a valid start with a seed of its own (the previous one was killed before its
        end, which is then reported); a copy of the run's first line is neither.
        """
        if any(e.sealed is not None for e in self.entries):
            return True
        return first.prev == first.seed and all(first.seed != e.seed for e in self.entries)


def _entry(number: int, raw: bytes) -> tuple[str | None, _Entry | str]:
    """Parse one line: its run id and entry, or its run id (if any) and what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text: not an audit event"
    if not text.strip():
        return None, "an empty line (the audit log never writes one)"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None, "not JSON: not an audit event"
    if not isinstance(value, dict):
        return None, "not a JSON object: not an audit event"
    run_id = value.get("run_id")
    if not isinstance(run_id, str):
        return None, "no run_id: not an audit event"
    schema = value.get("schema")
    if schema is None:
        return run_id, "no schema field: written before the log was chained, or edited"
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        return run_id, f"schema {schema!r} is not a version number"
    if schema > SCHEMA:
        return run_id, f"schema {schema} is newer than this stockade reads ({SCHEMA})"
    seq, prev = value.get("seq"), value.get("prev")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return run_id, "no valid seq field"
    if not _is_hash(prev):
        return run_id, "no valid prev field"
    assert isinstance(prev, str)
    sealed: bool | None = None
    if "final" in value:
        parts = unseal(raw)
        final = value["final"]
        sealed = parts is not None and final == parts[1] and line_hash(parts[0]) == final
    return run_id, _Entry(
        number,
        seq,
        prev,
        line_hash(raw),
        str(value.get("event", "?")),
        sealed,
        seed(value) if seq == 0 else "",
    )


def _check(run: _Run) -> Problem | None:
    """The first entry of one run that does not fit its chain, or ``None``."""
    first_line: dict[int, int] = {}
    for e in run.entries:
        first_line.setdefault(e.seq, e.line)
    last: _Entry | None = None
    end: _Entry | None = None

    def problem(line: int, message: str) -> Problem:
        return Problem(line, run.run_id, message)

    for expected, e in enumerate(run.entries):
        if end is not None:
            return problem(e.line, f"an event after the run's end ({end.event}, line {end.line})")
        if e.seq != expected:
            if e.seq < expected:
                return problem(
                    e.line,
                    f"seq {e.seq} comes after seq {expected - 1}: "
                    "events reordered, or a line duplicated or inserted",
                )
            if first_line.get(expected, 0) > e.line:
                return problem(
                    e.line,
                    f"events reordered: seq {e.seq} comes before seq {expected} "
                    f"(line {first_line[expected]})",
                )
            missing = str(expected) if e.seq == expected + 1 else f"{expected}-{e.seq - 1}"
            return problem(e.line, f"events removed: seq {missing} missing before this line")
        if last is None:
            if e.prev != e.seed:
                return problem(
                    e.line,
                    "the run's first event does not match its seed: "
                    "its run_id, time, policy_hash or prev was changed",
                )
        elif e.prev != last.hash:
            return problem(
                last.line,
                f"changed after it was written ({last.event}, seq {last.seq}): "
                f"line {e.line} records another hash for it",
            )
        if e.sealed is False:
            return problem(
                e.line, f"changed after it was written ({e.event}): its final hash does not match"
            )
        if e.sealed:
            end = e
        last = e
    if end is None:
        assert last is not None
        return problem(
            last.line,
            f"no end: the run stops at {last.event} (seq {last.seq}) without run_end; "
            "the log was cut or its end removed, or the run was killed",
        )
    return None


def verify_lines(lines: Iterable[bytes]) -> Verdict:
    """Check every run in ``lines`` (each without its newline) against its chain.

    Runs are told apart by ``run_id``, so interleaved runs verify independently. A run id
    seen again at seq 0 with a seed of its own (a server restarted on the same log)
    begins a new chain.
    """
    verdict = Verdict()
    runs: list[_Run] = []
    current: dict[str, _Run] = {}
    # Lines that are not events of a readable run are problems of their own; they are
    # reported (capped) besides the first problem of each run.
    loose: list[Problem] = []
    for number, raw in enumerate(lines, 1):
        run_id, parsed = _entry(number, raw)
        if isinstance(parsed, str):
            loose.append(Problem(number, run_id, parsed))
            continue
        assert run_id is not None
        verdict.events += 1
        count = verdict.heads.get(run_id, (0, ""))[0]
        verdict.heads[run_id] = (count + 1, parsed.hash)
        run = current.get(run_id)
        if run is None or (parsed.seq == 0 and run.restarts(parsed)):
            run = current[run_id] = _Run(run_id)
            runs.append(run)
        run.entries.append(parsed)
    verdict.runs = len(runs)
    found = [p for p in (_check(run) for run in runs) if p is not None]
    verdict.problems = sorted([*found, *loose], key=lambda p: p.line)
    return verdict


def verify_file(path: Path) -> Verdict:
    """Check the audit log at ``path``; raises ``OSError`` if it cannot be read."""
    torn: list[int] = []

    def lines() -> Iterator[bytes]:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, 1):
                if raw.endswith(b"\n"):
                    yield raw[:-1]
                else:
                    torn.append(number)  # only the last line can lack its newline

    verdict = verify_lines(lines())
    if torn:
        verdict.problems.append(
            Problem(
                torn[0],
                None,
                "an incomplete last line (no newline): the log was cut in the middle of an event",
            )
        )
    if verdict.events == 0 and not verdict.problems:
        verdict.problems.append(Problem(0, None, "no events: the log is empty"))
    return verdict


@dataclass
class Authorship:
    """What :func:`authorship` found: the runs that differ from their records, and the
    runs that have none (whose authorship cannot be checked)."""

    problems: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)

    @property
    def authentic(self) -> bool:
        """Every run of the file ends where its record says, and none is missing."""
        return not self.problems and not self.unrecorded


def authorship(path: Path, verdict: Verdict, records: Mapping[str, Head]) -> Authorship:
    """Check the runs :func:`verify_file` found in ``path`` against the run records.

    A run with a record must hold exactly the recorded number of events and end in the
    recorded head (whatever the file is called now: a copy verifies as well); a run
    stockade recorded writing to this path must be in it. A run with no record proves
    order only, and is listed as such.
    """
    import os

    found = Authorship()
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
        inode = (st.st_dev, st.st_ino)
    except OSError:
        inode = (-1, -1)
    for run_id, (count, last) in verdict.heads.items():
        record = records.get(run_id)
        if record is None:
            found.unrecorded.append(run_id)
            continue
        before = len(found.problems)
        wrote = f"stockade's run record says it wrote {record.events}"
        if count < record.events:
            found.problems.append(
                f"run {run_id}: {count} events, where {wrote}: the log was cut or rewritten"
            )
        elif count > record.events:
            found.problems.append(
                f"run {run_id}: {count} events, where {wrote}: events were added after "
                "stockade's last (the log was extended or forged)"
            )
        elif last != record.head:
            found.problems.append(
                f"run {run_id}: its last event is not the one stockade wrote (the hash "
                "differs from its run record): the log was forged or rewritten"
            )
        if record.replaced and len(found.problems) > before:
            found.problems[-1] += f"; stockade saw at the run's end: {record.replaced}"
    for record in records.values():
        if record.path != real or record.run_id in verdict.heads:
            continue
        if (record.dev, record.ino) == inode:
            message = (
                f"run {record.run_id}: stockade wrote it to this file, which no longer "
                "holds it: the log was cut or rewritten"
            )
        else:
            message = (
                f"run {record.run_id}: stockade wrote it to {record.path} (inode "
                f"{record.ino}); the file there now (inode {inode[1]}) does not hold it: "
                "the log was swapped or replaced"
            )
        if record.replaced:
            message += f"; stockade saw at the run's end: {record.replaced}"
        found.problems.append(message)
    return found
