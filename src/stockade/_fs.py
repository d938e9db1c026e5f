"""File-system helpers shared by the runtime and the workspace layer (stdlib only)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def remove_tree(path: Path) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` without importing shutil (~5 ms): links
    are removed, never followed; what cannot be removed is left (the caller checks)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                os.unlink(full) if os.path.islink(full) else os.rmdir(full)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def write_new(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Write ``data`` to ``path``, a file this call creates with ``mode``: never one that
    exists, nor through a symlink (O_EXCL; FileExistsError otherwise)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
