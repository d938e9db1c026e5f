"""Run records: where each run's audit chain ended, kept out of the sandbox's reach.

A hash chain proves order, not authorship: whoever can write a log can write a whole new
consistent one. So at the end of every run that writes a log, stockade records the run's
*head* in its own state (``$XDG_STATE_HOME/stockade/records/<run_id>.json``, never a
place the sandbox can write: the runtime refuses the run otherwise): the hash of the last
line it wrote, how many events it wrote, the file's path and inode, and whether the path
still named that file at the end. ``stockade log --verify`` checks a log against these
records (:func:`stockade.audit._verify.authorship`): a log that was forged, cut, extended
or swapped no longer ends where its record says.

One small JSON file per run, written to a temporary name and renamed into place, so a
reader sees a whole record or none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from stockade import _roots
from stockade._fs import replace_file
from stockade._record import asdict, record

#: the format of a record file (its ``version`` field)
VERSION = 1


def records_dir() -> Path:
    """Where run records live: ``$XDG_STATE_HOME/stockade/records`` (in stockade's state,
    a trust root: read-only inside every sandbox)."""
    return _roots.state_dir() / "records"


@record
class Head:
    """Where one run's chain ended, as the writer saw it."""

    run_id: str
    #: the log's path, symlinks resolved, when it was opened
    path: str
    #: the device and inode of the file stockade wrote
    dev: int
    ino: int
    #: how many events of this run were written, and the hash of the last line
    events: int
    head: str
    #: the last event's seal (``final``), or "" when the run ended unsealed
    final: str = ""
    #: set when the path no longer named the file stockade wrote at the end: what it saw
    replaced: str = ""


def write_record(head: Head, directory: Path | None = None) -> Path:
    """Record ``head`` (one file per run id); return the record's path."""
    if not head.run_id or "/" in head.run_id or head.run_id.startswith("."):
        raise ValueError(f"run id {head.run_id!r} cannot name a record file")
    where = directory if directory is not None else records_dir()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = where / f"{head.run_id}.json"
    data = json.dumps({"version": VERSION, **asdict(head)}, separators=(",", ":")).encode()
    # No sync: every run would pay for it, and a record lost or torn by a crash reads
    # as none ("authorship cannot be checked"), never as a match.
    replace_file(path, data + b"\n")
    return path


def _parse(data: bytes) -> Head | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return None
    try:
        head = Head(
            run_id=value["run_id"],
            path=value["path"],
            dev=value["dev"],
            ino=value["ino"],
            events=value["events"],
            head=value["head"],
            final=value.get("final", ""),
            replaced=value.get("replaced", ""),
        )
    except (KeyError, TypeError):
        return None
    texts = (head.run_id, head.path, head.head, head.final, head.replaced)
    numbers = (head.dev, head.ino, head.events)
    if not all(isinstance(t, str) for t in texts) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers
    ):
        return None
    return head


def load_records(directory: Path | None = None) -> dict[str, Head]:
    """Every readable record, by run id (none when the directory does not exist).

    A file that is not a record (a foreign or torn one) is skipped: a log whose record
    is unreadable is reported as one without a record, which is what it is.
    """
    where = directory if directory is not None else records_dir()
    found: dict[str, Head] = {}
    try:
        entries = list(os.scandir(where))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        try:
            with open(entry.path, "rb") as fh:
                head = _parse(fh.read(64 * 1024))
        except OSError:
            continue
        if head is not None and entry.name == f"{head.run_id}.json":
            found[head.run_id] = head
    return found
