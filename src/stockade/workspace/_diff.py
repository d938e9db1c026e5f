"""Unified diffs of an overlay run's changes (the real workspace against the layer)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from stockade.workspace._at import DIR_FLAGS, Refused, open_parent
from stockade.workspace._changes import Change, looks_binary
from stockade.workspace._layer import Layer

#: files larger than this are named, not diffed (a diff of them helps no reviewer)
MAX_DIFF_BYTES = 4 << 20


def _lines(data: bytes) -> list[str]:
    # Lines end at "\n" only, as git's do: str.splitlines would also break at "\r",
    # "\x1c" or "\u2028", and show one line of the file as two lines of the diff.
    # A last line without one carries git's marker as part of itself, so that "b" and
    # "b\n" differ and the diff says why.
    lines = [line + "\n" for line in data.decode("utf-8", "replace").split("\n")]
    if lines[-1] == "\n":
        return lines[:-1]
    lines[-1] = lines[-1][:-1] + "\n\\ No newline at end of file\n"
    return lines


def _parent_fd(root: str, rel: str) -> tuple[int, str] | None:
    """A descriptor of ``rel``'s directory below ``root`` and ``rel``'s last name
    (:func:`._at.open_parent`: no link followed on the way); None when one is a link,
    missing or not a directory."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return None
    try:
        root_fd = os.open(root, DIR_FLAGS)
    except OSError:
        return None
    try:
        return open_parent(root_fd, "/".join(parts), create=False, upper="")
    except (Refused, OSError):
        return None
    finally:
        os.close(root_fd)


def _read(root: str, rel: str) -> bytes | None:
    """The content of the regular file ``rel`` below ``root`` (at most one byte over
    :data:`MAX_DIFF_BYTES`), reached without following any symlink; None for anything
    else (a link, a FIFO, a device, gone).

    The old side of a diff is the real workspace, where a cloned repository may hold
    ``key -> ~/.ssh/id_ed25519``: a run that replaces that link with a file must get a
    diff of the link's target text, never of the file it points to, which would print a
    host secret to the reviewer (or, through the MCP server, to the agent).
    """
    found = _parent_fd(root, rel)
    if found is None:
        return None
    dirfd, name = found
    try:
        # O_NONBLOCK: a FIFO in the tree must not hang the review (it is refused below)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    finally:
        os.close(dirfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = MAX_DIFF_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _link(root: str, rel: str) -> str | None:
    """The target of the symlink ``rel`` below ``root`` (no link followed on the way)."""
    found = _parent_fd(root, rel)
    if found is None:
        return None
    dirfd, name = found
    try:
        return os.readlink(name, dir_fd=dirfd)
    except OSError:
        return None
    finally:
        os.close(dirfd)


def selected(changes: Iterable[Change], paths: Iterable[str]) -> list[Change]:
    """The changes at or below any of ``paths`` (workspace-relative); all when empty."""
    wanted = [p.strip("/") for p in paths]
    wanted = [p for p in wanted if p not in ("", ".")] if wanted else []
    if not wanted:
        return list(changes)

    def hit(path: str | None) -> bool:
        return path is not None and any(path == w or path.startswith(w + "/") for w in wanted)

    return [c for c in changes if hit(c.path) or hit(c.old_path)]


def diff_one(layer: Layer, change: Change) -> str:
    """The unified diff of one change ("Binary files ... differ" for binary content)."""
    import difflib

    workspace = str(layer.workspace)
    old_rel = change.old_path or change.path
    a, b = f"a/{old_rel}", f"b/{change.path}"
    head = f"diff --stockade {a} {b}\n"
    if change.old_mode is not None and change.mode is not None and change.old_mode != change.mode:
        head += f"old mode {change.old_mode:o}\nnew mode {change.mode:o}\n"
    if change.kind == "renamed":
        head += f"rename from {change.old_path}\nrename to {change.path}\n"
    if change.type == "dir":
        return head if change.kind in ("mode",) else head + f"{change.kind} directory\n"
    if change.type == "symlink":
        target = None if change.kind == "added" else _link(workspace, old_rel)
        old = [] if target is None else [f"{target}\n"]
        new = [] if change.kind == "deleted" else [f"{change.target}\n"]
        return head + "".join(difflib.unified_diff(old, new, a, b))
    if change.type != "file":
        return head + f"special file {change.kind}\n"
    # Both sides read without following a link: the old one is the real workspace (a
    # link there shows as its target text, as git shows one), the new one the layer.
    old_data: bytes | None = None
    if change.kind != "added":
        old_data = _read(workspace, old_rel)
        if old_data is None:
            target = _link(workspace, old_rel)
            old_data = None if target is None else target.encode()
    new_data = None if change.kind == "deleted" else _read(str(layer.upper), change.path)
    if change.kind != "deleted" and new_data is None:
        return head + "cannot read: not a regular file in the layer\n"
    old_name = a if change.kind != "added" else "/dev/null"
    new_name = b if change.kind != "deleted" else "/dev/null"
    sides = [d for d in (old_data, new_data) if d is not None]
    if change.binary or any(len(d) > MAX_DIFF_BYTES or looks_binary(d) for d in sides):
        if change.kind == "renamed":
            return head
        return head + f"Binary files {old_name} and {new_name} differ\n"
    old = _lines(old_data) if old_data is not None else []
    new = _lines(new_data) if new_data is not None else []
    return head + "".join(difflib.unified_diff(old, new, old_name, new_name))


def diff(layer: Layer, changes: Iterable[Change]) -> str:
    """The unified diff of ``changes``, one after another."""
    return "".join(diff_one(layer, c) for c in changes)
