"""Checkpoints of an overlay layer, and rollback to one.

A checkpoint is a copy of the layer's upper directory (``cp -a --reflink=auto``: shared
extents where the file system has them, a plain copy elsewhere), kept twice: a pristine
copy, and a ready one that a rollback renames into place. So the rollback itself is two
renames, whatever the size of the tree; the ready copy is made again afterwards (in a
thread that :func:`rollback` returns, or at the next rollback when it is missing).

Whiteouts (character devices 0/0, which an unprivileged user may make since Linux 5.8)
and the ``user.overlay.*`` xattrs are copied with everything else; the layer is only
ever copied while no run has it mounted.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from stockade.workspace._layer import Layer, LayerError, _remove_tree

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _dir(layer: Layer, name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise LayerError(
            f"checkpoint name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (not first)"
        )
    return layer.root / "checkpoints" / name


def _copy(src: Path, dst: Path) -> None:
    # cp -a keeps modes, owners (as far as this user may), times, hard links, device
    # nodes (the whiteouts) and xattrs (opaque directories); Python's copytree does not.
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    if tmp.exists():
        _remove_tree(tmp)
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", str(src), str(tmp)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        _remove_tree(tmp)
        raise LayerError(f"copying {src} failed: {proc.stderr.strip() or proc.returncode}")
    os.rename(tmp, dst)


def _idle(layer: Layer) -> None:
    if layer.state == "running":
        raise LayerError(f"run {layer.run_id} has the layer mounted; wait for it to end")


def checkpoint(layer: Layer, name: str) -> dict[str, Any]:
    """Record the layer as it is now under ``name`` (replacing one of that name)."""
    _idle(layer)
    where = _dir(layer, name)
    if where.exists():
        _remove_tree(where)
    where.mkdir(parents=True, mode=0o700)
    t = time.perf_counter()
    _copy(layer.upper, where / "upper")
    _copy(layer.upper, where / "ready")
    entry = {"name": name, "created": time.time(), "seconds": round(time.perf_counter() - t, 3)}
    points = dict(layer.meta.get("checkpoints") or {})
    points[name] = entry
    layer.update(checkpoints=points)
    return entry


def checkpoints(layer: Layer) -> list[dict[str, Any]]:
    """The layer's checkpoints, oldest first."""
    points = layer.meta.get("checkpoints") or {}
    return sorted(points.values(), key=lambda e: e.get("created", 0))


def rollback(layer: Layer, name: str) -> threading.Thread:
    """Make the layer what it was at checkpoint ``name``; return the thread that
    restocks the checkpoint's ready copy and removes the discarded upper (join it before
    the process exits, or let the next rollback wait for it)."""
    _idle(layer)
    where = _dir(layer, name)
    if not (where / "upper").is_dir():
        raise LayerError(
            f"run {layer.run_id} has no checkpoint {name!r}; see 'stockade checkpoints'"
        )
    ready = where / "ready"
    if not ready.is_dir():
        _copy(where / "upper", ready)  # the slow path: no ready copy was left
    trash = layer.root / f".discarded-{os.getpid()}-{os.urandom(4).hex()}"
    os.rename(layer.upper, trash)
    try:
        os.rename(ready, layer.upper)
    except BaseException:
        os.rename(trash, layer.upper)
        raise
    layer.update(rolled_back_to=name, rolled_back_at=time.time())

    def restock() -> None:
        _remove_tree(trash)
        if not ready.exists():
            _copy(where / "upper", ready)

    thread = threading.Thread(target=restock, name="stockade-restock", daemon=False)
    thread.start()
    return thread


def delete_checkpoint(layer: Layer, name: str) -> None:
    """Remove checkpoint ``name``."""
    where = _dir(layer, name)
    if where.exists():
        _remove_tree(where)
    points = dict(layer.meta.get("checkpoints") or {})
    points.pop(name, None)
    layer.update(checkpoints=points)
