"""What an overlay run changed: its upper layer read against the real workspace.

overlayfs (with ``userxattr``, as it runs in a user namespace) records a run's effect in
the upper directory: a file written or whose metadata changed is copied up whole; a
deleted name is a whiteout (a character device 0/0, or an empty file carrying
``user.overlay.whiteout``); a directory whose lower contents were hidden (removed and
made again) carries ``user.overlay.opaque = "y"``. A copy-up alone is not a change: a
file opened for writing and left as it was, or only touched, is compared by content and
mode and left out.

Renames are recognised afterwards: a deleted file and an added file with the same
content (size, then SHA-256) are one rename. Directory renames come out as the files in
them (overlayfs in a user namespace has no ``redirect_dir``: ``mv`` copies those).
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from stockade._record import asdict, record
from stockade.workspace._layer import Layer

#: change kinds, in the order a listing shows them
KINDS = ("added", "modified", "deleted", "renamed", "mode", "replaced")
_BINARY_PROBE = 8192
_OPAQUE = "user.overlay.opaque"
_WHITEOUT = "user.overlay.whiteout"


@record
class Change:
    """One path the run changed, relative to the workspace (POSIX spelling)."""

    path: str
    #: added | modified | deleted | renamed | mode | replaced (a type change)
    kind: str
    #: file | dir | symlink | other: what the path is now (for deleted: what it was)
    type: str
    size: int | None = None
    old_size: int | None = None
    mode: int | None = None
    old_mode: int | None = None
    #: renamed: where the file was
    old_path: str | None = None
    #: the content is not text (a NUL byte, or not UTF-8, in its first 8 KiB)
    binary: bool = False
    #: symlink: its target
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("mode", "old_mode"):
            if out[key] is not None:
                out[key] = oct(out[key])
        return {k: v for k, v in out.items() if v is not None and v is not False}

    def describe(self) -> str:
        """One line for a terminal."""
        what = {"added": "A", "modified": "M", "deleted": "D", "renamed": "R", "mode": "m"}
        tag = what.get(self.kind, "T")
        extra = []
        if self.kind == "renamed":
            extra.append(f"from {self.old_path}")
        if self.mode is not None and self.old_mode is not None and self.mode != self.old_mode:
            extra.append(f"mode {oct(self.old_mode)} -> {oct(self.mode)}")
        if self.kind == "replaced":
            extra.append("type changed")
        if self.type == "symlink" and self.target is not None:
            extra.append(f"-> {self.target}")
        if self.binary:
            extra.append("binary")
        if self.size is not None and self.type == "file":
            extra.append(
                _size(self.size)
                if self.old_size is None
                else f"{_size(self.old_size)} -> {_size(self.size)}"
            )
        suffix = "/" if self.type == "dir" else ""
        tail = f"  ({', '.join(extra)})" if extra else ""
        return f"{tag} {self.path}{suffix}{tail}"


def _size(n: int) -> str:
    return (
        f"{n} B"
        if n < 1024
        else f"{n / 1024:.1f} KiB"
        if n < 1 << 20
        else f"{n / (1 << 20):.1f} MiB"
    )


def _type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _xattr(path: str, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None


def is_whiteout(path: str, st: os.stat_result) -> bool:
    """Whether the upper entry at ``path`` hides the lower name (a deletion)."""
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and _xattr(path, _WHITEOUT) is not None


def is_opaque(path: str) -> bool:
    """Whether the upper directory at ``path`` hides everything below it in the lower."""
    return _xattr(path, _OPAQUE) == b"y"


def file_digest(path: str) -> str:
    """SHA-256 of a file's content (not following a final symlink)."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


#: Whether scan reads each file's head to flag binary files (``Change.binary``); apply
#: does not need the flag, and 10,000 reads are a good part of a scan's time.
_SNIFF: contextvars.ContextVar[bool] = contextvars.ContextVar("stockade_scan_sniff", default=True)


def is_binary(path: str) -> bool:
    """Whether the file's first 8 KiB hold a NUL byte or are not UTF-8."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_BINARY_PROBE)
    except OSError:
        return False
    return looks_binary(head)


def looks_binary(data: bytes) -> bool:
    """Whether ``data``'s first 8 KiB hold a NUL byte or are not UTF-8."""
    head = data[:_BINARY_PROBE]
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the probe's end is still text.
        return exc.start < len(head) - 3
    return False


def _same_content(a: str, sa: os.stat_result, b: str, sb: os.stat_result) -> bool:
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(a) == os.readlink(b)
    if sa.st_size != sb.st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _entry(
    kind: str, rel: str, full: str, st: os.stat_result, lower: os.stat_result | None
) -> Change:
    t = _type(st.st_mode)
    return Change(
        path=rel,
        kind=kind,
        type=t,
        size=st.st_size if t == "file" else None,
        old_size=lower.st_size
        if lower is not None and kind != "added" and stat.S_ISREG(lower.st_mode)
        else None,
        mode=stat.S_IMODE(st.st_mode),
        old_mode=stat.S_IMODE(lower.st_mode) if lower is not None and kind != "added" else None,
        binary=t == "file" and _SNIFF.get() and is_binary(full),
        target=os.readlink(full) if t == "symlink" else None,
    )


def _deleted(rel: str, full: str, st: os.stat_result) -> Change:
    t = _type(st.st_mode)
    return Change(
        path=rel,
        kind="deleted",
        type=t,
        old_size=st.st_size if t == "file" else None,
        old_mode=stat.S_IMODE(st.st_mode),
        binary=t == "file" and _SNIFF.get() and is_binary(full),
    )


def _lower_tree(lower: str, rel: str, out: list[Change]) -> None:
    """Every entry below the lower directory ``lower`` (at ``rel``), as deleted."""
    try:
        entries = sorted(os.scandir(lower), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        sub = f"{rel}/{entry.name}"
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            _lower_tree(entry.path, sub, out)
        out.append(_deleted(sub, entry.path, st))


def scan(layer: Layer, workspace: Path | None = None, *, sniff: bool = True) -> list[Change]:
    """The changes in ``layer`` against ``workspace`` (default: the layer's own), sorted
    by path; renames paired up. ``sniff=False`` leaves ``binary`` False (no file read
    for it)."""
    root = str(workspace if workspace is not None else layer.workspace)
    out: list[Change] = []
    token = _SNIFF.set(sniff)
    try:
        _scan_dir(str(layer.upper), root, "", out)
    finally:
        _SNIFF.reset(token)
    return _pair_renames(out, str(layer.upper), root)


def _scan_dir(upper: str, lower: str | None, rel: str, out: list[Change]) -> None:
    opaque = rel != "" and is_opaque(upper)
    try:
        entries = sorted(os.scandir(upper), key=lambda e: e.name)
    except OSError:
        return
    seen = set()
    for entry in entries:
        name = entry.name
        seen.add(name)
        sub = f"{rel}/{name}" if rel else name
        st = entry.stat(follow_symlinks=False)
        lower_path = os.path.join(lower, name) if lower is not None else None
        lst = None if lower_path is None or opaque else _lstat(lower_path)
        if is_whiteout(entry.path, st):
            if lst is not None and lower_path is not None:
                if stat.S_ISDIR(lst.st_mode):
                    _lower_tree(lower_path, sub, out)
                out.append(_deleted(sub, lower_path, lst))
            continue
        if stat.S_ISDIR(st.st_mode):
            if lst is None:
                out.append(_entry("added", sub, entry.path, st, None))
                _scan_dir(entry.path, None, sub, out)
            elif not stat.S_ISDIR(lst.st_mode):
                out.append(_entry("replaced", sub, entry.path, st, lst))
                _scan_dir(entry.path, None, sub, out)
            else:
                if stat.S_IMODE(st.st_mode) != stat.S_IMODE(lst.st_mode):
                    out.append(_entry("mode", sub, entry.path, st, lst))
                # An opaque directory hides the lower one's entries: the ones not made
                # again in the upper are deleted.
                if is_opaque(entry.path) and lower_path is not None:
                    _opaque_deletions(entry.path, lower_path, sub, out)
                    _scan_dir(entry.path, None, sub, out)
                else:
                    _scan_dir(entry.path, lower_path, sub, out)
            continue
        if lst is None:
            out.append(_entry("added", sub, entry.path, st, None))
        elif stat.S_ISDIR(lst.st_mode) or _type(lst.st_mode) != _type(st.st_mode):
            if stat.S_ISDIR(lst.st_mode) and lower_path is not None:
                _lower_tree(lower_path, sub, out)
            out.append(_entry("replaced", sub, entry.path, st, lst))
        elif lower_path is not None and not _same_content(entry.path, st, lower_path, lst):
            out.append(_entry("modified", sub, entry.path, st, lst))
        elif stat.S_IMODE(st.st_mode) != stat.S_IMODE(lst.st_mode):
            out.append(_entry("mode", sub, entry.path, st, lst))


def _opaque_deletions(upper: str, lower: str, rel: str, out: list[Change]) -> None:
    try:
        names = {e.name for e in os.scandir(upper)}
        lower_entries = sorted(os.scandir(lower), key=lambda e: e.name)
    except OSError:
        return
    for entry in lower_entries:
        sub = f"{rel}/{entry.name}"
        st = entry.stat(follow_symlinks=False)
        if entry.name in names:
            up = os.path.join(upper, entry.name)
            ust = os.lstat(up)
            if stat.S_ISDIR(ust.st_mode) and stat.S_ISDIR(st.st_mode):
                _opaque_deletions(up, entry.path, sub, out)
            continue
        if stat.S_ISDIR(st.st_mode):
            _lower_tree(entry.path, sub, out)
        out.append(_deleted(sub, entry.path, st))


def _pair_renames(changes: list[Change], upper: str, lower: str) -> list[Change]:
    deleted = [c for c in changes if c.kind == "deleted" and c.type == "file"]
    added = [c for c in changes if c.kind == "added" and c.type == "file"]
    if not deleted or not added:
        return sorted(changes, key=lambda c: c.path)
    by_size: dict[int, list[Change]] = {}
    for c in deleted:
        by_size.setdefault(c.old_size or 0, []).append(c)
    digests: dict[str, str] = {}

    def digest(path: str) -> str:
        if path not in digests:
            digests[path] = file_digest(path)
        return digests[path]

    drop: set[str] = set()
    renamed: dict[str, Change] = {}
    for a in added:
        for d in by_size.get(a.size or 0, []):
            if d.path in drop:
                continue
            if digest(os.path.join(upper, a.path)) == digest(os.path.join(lower, d.path)):
                drop.add(d.path)
                renamed[a.path] = Change(
                    path=a.path,
                    kind="renamed",
                    type="file",
                    size=a.size,
                    old_size=d.old_size,
                    mode=a.mode,
                    old_mode=d.old_mode,
                    old_path=d.path,
                    binary=a.binary,
                )
                break
    out = [renamed.get(c.path, c) for c in changes if not (c.kind == "deleted" and c.path in drop)]
    return sorted(out, key=lambda c: c.path)
