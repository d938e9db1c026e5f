"""Paths below a directory of the workspace (or a layer), reached without following a link.

Apply writes through these descriptors and diff reads through them: a symlink on the way
(a cloned repository's ``dir -> ~/.ssh``) must neither receive a file nor show one.
"""

from __future__ import annotations

import os
import stat
from pathlib import PurePosixPath

__all__ = ["DIR_FLAGS", "Refused", "open_parent"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """A path that cannot be reached without a link (or whose directory is gone)."""


def open_parent(
    root_fd: int,
    rel: str,
    *,
    create: bool,
    upper: str,
    skip: int = 0,
) -> tuple[int, str]:
    """An fd of ``rel``'s parent directory (making missing ones when ``create``), opened
    component by component without following any symlink; and ``rel``'s last name.

    With ``skip``, ``root_fd`` is already the directory of ``rel``'s first ``skip``
    components."""
    parts = PurePosixPath(rel).parts
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            if i < skip:
                continue
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Refused(f"its directory {'/'.join(parts[: i + 1])} is gone") from None
                mode = stat.S_IMODE(os.lstat(os.path.join(upper, *parts[: i + 1])).st_mode)
                os.mkdir(part, mode & 0o1777, dir_fd=fd)
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (40, 20):  # ELOOP, ENOTDIR: a symlink or a file on the way
                    raise Refused(
                        f"{'/'.join(parts[: i + 1])} is not a directory (a symlink?): "
                        "nothing is applied through a link"
                    ) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]
