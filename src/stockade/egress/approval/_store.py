"""``approved.toml``: the "always" answers, machine-written beside the user policy.

Never the hand-written ``policy.toml`` (stockade has no TOML writer that keeps comments,
and a person's file is theirs), never a file the sandbox can write, never from a
workspace policy. The loader merges it into the user level's ``network.allow`` and
``network.deny`` (:func:`stockade.policy._load.load_approved`).

Writes take ``fcntl.flock`` on ``approved.toml.lock``, read and validate the file, add,
write a temporary file, ``fsync`` it and ``os.replace`` it over the old one: a reader sees
the old file or the new one, and two writers never lose each other's entries. Strings are
written with :func:`json.dumps`, whose output is a valid TOML basic string.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from stockade._exceptions import PolicyError
from stockade._fs import replace_file
from stockade._roots import sandbox_writable
from stockade.policy._hosts import parse_pattern
from stockade.policy._load import approved_path, read_approved

__all__ = ["ApprovedStore", "refusal"]

_HEADER = (
    '# Written by stockade when you answered "always". Edit or delete entries freely;\n'
    "# `stockade approvals list` lists them and `stockade approvals revoke HOST` removes one.\n"
)


def refusal(path: Path, writable: Sequence[Path]) -> str | None:
    """Why ``path`` may not hold approvals (None: it may): it lies under a root the
    sandbox can write, the workspace first, or in a run's scratch directory
    (:func:`stockade._roots.sandbox_writable`, the check the audit log gets too)."""
    return sandbox_writable(path, writable)


class ApprovedStore:
    """The approvals file at ``path`` (default: beside the user policy)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else approved_path()

    def entries(self) -> list[dict[str, object]]:
        """Every entry, in file order: ``{"action", "pattern", "added", ...}``."""
        return read_approved(self.path)

    def digest(self) -> str | None:
        """The sha256 of the file as it is now (None: there is none)."""
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(
            self.path.with_name(self.path.name + ".lock"),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def add(
        self,
        items: Iterable[tuple[str, str]],
        *,
        answered_by: str = "",
        run: str = "",
        argv: Sequence[str] = (),
    ) -> tuple[str | None, str | None]:
        """Append ``(action, pattern)`` entries; return the sha256 before and after."""
        items = list(items)
        for action, pattern in items:
            if action not in ("allow", "deny"):
                raise PolicyError(f"approved.toml: action {action!r} is not allow or deny")
            parse_pattern(pattern)
        with self._locked():
            before = self.digest()
            entries = self.entries()  # validates what is there: a broken file is refused
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for action, pattern in items:
                if any(e["action"] == action and e["pattern"] == pattern for e in entries):
                    continue
                entry: dict[str, object] = {"action": action, "pattern": pattern, "added": stamp}
                if run:
                    entry["run"] = run
                if argv:
                    entry["argv"] = list(argv)
                if answered_by:
                    entry["answered_by"] = answered_by
                entries.append(entry)
            self._write(entries)
            return before, self.digest()

    def remove(self, hosts: Iterable[str]) -> list[str]:
        """Remove the entries for ``hosts`` (a pattern, or a host on any port); return
        the patterns removed."""
        wanted = list(hosts)
        with self._locked():
            entries = self.entries()
            keep, gone = [], []
            for entry in entries:
                pattern = str(entry["pattern"])
                host = pattern.rsplit(":", 1)[0] if pattern.count(":") == 1 else pattern
                if pattern in wanted or host in wanted:
                    gone.append(pattern)
                else:
                    keep.append(entry)
            if gone:
                self._write(keep)
            return gone

    def _write(self, entries: list[dict[str, object]]) -> None:
        lines = [_HEADER]
        for entry in entries:
            lines.append(f"\n[[{entry['action']}]]\n")
            for key in ("pattern", "added", "run", "argv", "answered_by"):
                if key not in entry:
                    continue
                value = entry[key]
                # "added" is a TOML datetime, unquoted; the rest are JSON strings/arrays.
                text = str(value) if key == "added" else json.dumps(value, ensure_ascii=True)
                lines.append(f"{key} = {text}\n")
        replace_file(self.path, "".join(lines).encode(), sync=True)
