"""A sealed memfd: data handed to a child process that nothing can change on the way."""

from __future__ import annotations

import fcntl
import os


def sealed_memfd(name: str, data: bytes) -> int:
    """A close-on-exec memfd holding ``data``, rewound and sealed against every change
    (the caller passes it with ``pass_fds`` and closes it once the child has started)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd
