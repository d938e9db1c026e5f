"""A run server's spare copies, while it waits, the pages a run will write.

Every worker is a fresh fork of the server, and its memory is the server's until it
writes to it: the first write to each page (a reference count changing is a write) is a
copy-on-write fault. A served ``stockade run -- true`` made about 900 of them, some 3 ms
of a run on the project's machine, spread over every step. The set of pages a run writes
is much the same from one run to the next (every spare is a fork of the same server), so
a worker that has run records it (:func:`touched`: the pages of the server's mappings
that are now its own, from ``/proc/self/pagemap``), and the next spares copy those pages
before a caller arrives (:func:`populate`, ``MADV_POPULATE_WRITE``, Linux 5.14): about
1500 pages (6 MB) in 4 ms of the spare's idle time, against 3 ms on the caller's path.
A record names the server that wrote it (:func:`token`): the addresses are that
server's, laid out anew by each start.

This is only about time. The record is a list of address ranges in the server's private
directory; :func:`populate` copies nothing outside the spare's own private writable
mappings, changes no byte of memory, and ignores what it cannot use: a missing, stale or
damaged record, or a kernel without ``MADV_POPULATE_WRITE``, means the faults happen
during the run, as before.
"""

from __future__ import annotations

import array
import bisect
import ctypes
import os
from collections.abc import Callable
from errno import EINVAL

PAGE = os.sysconf("SC_PAGE_SIZE")
#: madvise(2): fault the range in writable, copying shared pages (Linux 5.14)
MADV_POPULATE_WRITE = 23
#: pagemap(5): the page is mapped by this process alone (for a fork: copied, or new)
_EXCLUSIVE = 1 << 56
#: more than this is a record that is not a run's (64 MiB of pages): ignored
MAX_PAGES = 16384
#: a record's size limit, in bytes (the server's token, then two 64-bit words a range)
_MAX_RECORD = 1 << 20
#: the length of a server's token (:func:`token`)
TOKEN_SIZE = 16


def token() -> bytes:
    """A new server's name for its records: another server's memory is laid out anew
    (address space layout randomisation), so its record says nothing about this one's."""
    return os.urandom(TOKEN_SIZE)


Regions = list[tuple[int, int]]


def regions() -> Regions:
    """This process's private writable mappings, as (start, end): the heap, the
    interpreter's arenas and the data of its libraries (not stacks or the vDSO)."""
    out: Regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            perms = fields[1]
            name = fields[5] if len(fields) > 5 else ""
            if perms[:2] != "rw" or perms[3] != "p" or name.startswith(("[stack", "[v")):
                continue
            start, _, end = fields[0].partition("-")
            out.append((int(start, 16), int(end, 16)))
    return out


def touched(mapped: Regions) -> Regions:
    """The pages of ``mapped`` (a fork's mappings when it started) that this process
    now holds alone, as (start, length) ranges: what it wrote since the fork."""
    out: Regions = []
    with open("/proc/self/pagemap", "rb") as pagemap:
        for start, end in mapped:
            pagemap.seek(start // PAGE * 8)
            entries = array.array("Q")
            entries.frombytes(pagemap.read((end - start) // PAGE * 8))
            first = -1
            for index, entry in enumerate(entries):
                if entry & _EXCLUSIVE:
                    if first < 0:
                        first = index
                elif first >= 0:
                    out.append((start + first * PAGE, (index - first) * PAGE))
                    first = -1
            if first >= 0:
                out.append((start + first * PAGE, (len(entries) - first) * PAGE))
    return out


def save(path: str, server: bytes, ranges: Regions) -> None:
    """Record ``ranges`` at ``path`` for the server named ``server`` (its token: the
    addresses are its own, laid out anew by each server's start), replaced whole."""
    from stockade._fs import replace_file

    words = array.array("Q", [word for pair in ranges for word in pair])
    replace_file(path, server + words.tobytes())


def load(path: str, server: bytes) -> Regions:
    """The ranges recorded at ``path`` for the server named ``server``; none when there
    is no usable record (none, damaged, or another server's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        data = os.read(fd, _MAX_RECORD + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_RECORD or not data.startswith(server) or (len(data) - len(server)) % 16:
        return []
    words = array.array("Q")
    words.frombytes(data[len(server) :])
    return list(zip(words[::2], words[1::2], strict=True))


def populate(ranges: Regions, mapped: Regions, waiting: Callable[[], bool]) -> int:
    """Copy the pages of ``ranges`` that lie in ``mapped`` (this process's private
    writable mappings, sorted) into this process, until ``waiting()`` says a caller
    waits (it is asked every few ranges: a caller is never kept waiting for more than a
    fraction of a millisecond); return how many pages were copied. A record of more
    than :data:`MAX_PAGES` is not used."""
    starts = [low for low, _ in mapped]
    wanted: Regions = []
    pages = 0
    for start, length in ranges:
        at = bisect.bisect_right(starts, start) - 1
        if at < 0 or start % PAGE:
            continue
        end = min(start + length, mapped[at][1])
        if start < end:
            wanted.append((start, end - start))
            pages += (end - start) // PAGE
    if not wanted or pages > MAX_PAGES:
        return 0
    from stockade._libc import libc

    madvise = libc().madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    copied = 0
    for index, (start, length) in enumerate(wanted):
        if index % 16 == 0 and waiting():
            break
        # ENOMEM (a range unmapped meanwhile) skips that range; EINVAL (a kernel before
        # 5.14) all of them: those pages fault during the run instead, as before.
        if madvise(start, length, MADV_POPULATE_WRITE) == 0:
            copied += length // PAGE
        elif ctypes.get_errno() == EINVAL:
            break
    return copied
