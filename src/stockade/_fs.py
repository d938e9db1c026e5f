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


def replace_file(
    path: str | os.PathLike[str], data: bytes, mode: int = 0o600, *, sync: bool = False
) -> None:
    """Put ``data`` at ``path`` whole, with ``mode`` (exactly: the umask does not cut it).

    The one way stockade replaces a file of its own: ``data`` goes to a temporary name
    beside ``path`` (a file this call creates: never one that exists, nor through a
    symlink), then is renamed over it, so that a reader sees the old file or the new
    one, never part of one, and nobody else's file is ever written. ``sync``: flushed to
    disk before the rename, for a record that must outlive a crash of the machine. The
    temporary file is removed when anything fails (the error is raised).
    """
    import _thread

    head, name = os.path.split(os.fspath(path))
    # Unique per process and thread: a Sandbox's runs may write the same file at once.
    tmp = os.path.join(head, f".{name}.{os.getpid()}-{_thread.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        # Left by a process of this pid that died mid-write: the name goes, never what a
        # link there points at.
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
