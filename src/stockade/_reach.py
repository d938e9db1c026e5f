"""What a sandbox can write: the one notion behind every file the host trusts later.

stockade keeps files on the host that it (or the user) believes afterwards: the "always"
answers in ``approved.toml``, the audit log, the run records that pin each log's head.
None of them may lie where a sandboxed command can write, or the command could write the
next run's approvals or its own account of what it did. Every such check asks
:func:`sandbox_writable`, so that there is one answer to "can the sandbox write here".

What a sandbox can write, whatever the layers: the workspace, every ``filesystem.write``
path, and the run's scratch directory (``$TMPDIR/stockade-<pid>-<token>``: with the
container layer off the command's HOME and TMPDIR are there). A path is looked at both as
spelt (a symlink inside the workspace can be pointed elsewhere by the sandbox later) and
with every symlink resolved (a link outside that leads inside).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["is_scratch_name", "sandbox_writable", "scratch_base"]


def scratch_base() -> Path:
    """Where runs make their scratch directories: ``$TMPDIR``, else ``/tmp``."""
    return Path(os.environ.get("TMPDIR") or "/tmp")


def is_scratch_name(name: str) -> bool:
    """Whether ``name`` is a run's scratch directory name, ``stockade-<pid>-<token>``."""
    parts = name.split("-")
    return len(parts) == 3 and parts[0] == "stockade" and parts[1].isdigit() and bool(parts[2])


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _scratch_dir(path: Path, bases: Iterable[Path]) -> Path | None:
    """The run scratch directory ``path`` lies in (under one of ``bases``), if any."""
    for base in bases:
        if base in path.parents:
            top = base / path.relative_to(base).parts[0]
            if is_scratch_name(top.name):
                return top
    return None


def sandbox_writable(
    path: Path, roots: Iterable[Path], *, scratch: Path | None = None
) -> str | None:
    """Why a sandbox with the writable ``roots`` (the workspace first, then each
    ``filesystem.write`` path) could write ``path``; ``None`` when it cannot.

    ``scratch``: the directory runs make their scratch directories in (default:
    :func:`scratch_base`); a path inside any run's scratch directory is writable too.
    """
    spelt = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    for root in roots:
        tops = {Path(os.path.abspath(root)), Path(os.path.realpath(root))}
        for top in tops:
            if _inside(spelt, top) or _inside(real, top):
                return f"{path} lies inside {root}, which the sandbox can write"
    base = scratch if scratch is not None else scratch_base()
    bases = {Path(os.path.abspath(base)), Path(os.path.realpath(base))}
    for candidate in (spelt, real):
        scratch_dir = _scratch_dir(candidate, bases)
        if scratch_dir is not None:
            return (
                f"{path} lies inside {scratch_dir}, a run's scratch directory, "
                "which its sandbox can write"
            )
    return None
