"""Unified diffs of an overlay run's changes (the real workspace against the layer)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from stockade.workspace._changes import Change
from stockade.workspace._layer import Layer

#: files larger than this are named, not diffed (a diff of them helps no reviewer)
MAX_DIFF_BYTES = 4 << 20


def _lines(path: str) -> list[str]:
    # Lines end at "\n" only, as git's do: str.splitlines would also break at "\r",
    # "\x1c" or "\u2028", and show one line of the file as two lines of the diff.
    with open(path, "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


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
        old = [] if change.kind == "added" else _target(os.path.join(workspace, old_rel))
        new = [] if change.kind == "deleted" else [f"{change.target}\n"]
        return head + "".join(difflib.unified_diff(old, new, a, b))
    if change.type != "file":
        return head + f"special file {change.kind}\n"
    old_path = None if change.kind == "added" else os.path.join(workspace, old_rel)
    new_path = None if change.kind == "deleted" else os.path.join(layer.upper, change.path)
    if change.binary or _large(old_path) or _large(new_path) or _binary_old(old_path):
        if change.kind == "renamed":
            return head
        return (
            head
            + f"Binary files {a if old_path else '/dev/null'} and {b if new_path else '/dev/null'} differ\n"
        )
    try:
        old = _lines(old_path) if old_path and os.path.isfile(old_path) else []
        new = _lines(new_path) if new_path else []
    except OSError as exc:
        return head + f"cannot read: {exc.strerror}\n"
    text = "".join(
        difflib.unified_diff(
            old, new, a if old_path else "/dev/null", b if new_path else "/dev/null"
        )
    )
    if text and not text.endswith("\n"):
        text += "\n\\ No newline at end of file\n"
    return head + text


def _target(path: str) -> list[str]:
    try:
        return [os.readlink(path) + "\n"]
    except OSError:
        return []


def _large(path: str | None) -> bool:
    try:
        return path is not None and os.path.getsize(path) > MAX_DIFF_BYTES
    except OSError:
        return False


def _binary_old(path: str | None) -> bool:
    from stockade.workspace._changes import is_binary

    return path is not None and os.path.isfile(path) and is_binary(path)


def diff(layer: Layer, changes: Iterable[Change]) -> str:
    """The unified diff of ``changes``, one after another."""
    return "".join(diff_one(layer, c) for c in changes)
