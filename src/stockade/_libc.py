"""The C library, for the few system calls Python 3.11's ``os`` lacks."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc() -> ctypes.CDLL:
    """libc with ``errno`` kept for :func:`ctypes.get_errno`; loaded once per process (so
    that a forked child that uses it only makes system calls)."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long  # syscall(2) returns a long
    return lib
