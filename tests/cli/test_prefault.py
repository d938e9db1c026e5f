"""The run server's page copying (cli/_prefault.py) against the real kernel: what a fork
wrote is found in /proc/self/pagemap, copied pages no longer fault, and a record that is
missing, damaged or not this process's is ignored."""

from __future__ import annotations

import mmap
import os
import resource
from collections.abc import Callable
from pathlib import Path

from stockade.cli import _prefault
from tests.conftest import require

PAGE = _prefault.PAGE
PAGES = 256


def _in_child(body: Callable[[], str]) -> str:
    """``body()`` run in a fork of this process (the case the server is in); its text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.write(write, body().encode())
        finally:
            os._exit(0)
    os.close(write)
    out = b""
    while chunk := os.read(read, 65536):
        out += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return out.decode()


def _area() -> tuple[mmap.mmap, int]:
    """Private anonymous memory, every page written (present, so shared after a fork)."""
    area = mmap.mmap(-1, PAGES * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for page in range(PAGES):
        area[page * PAGE] = 1
    import ctypes

    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    return area, address


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_the_pages_a_fork_wrote_are_found_and_no_others() -> None:
    area, address = _area()

    def child() -> str:
        for page in (3, 10, 11, 12):
            area[page * PAGE + 5] = 7
        ranges = _prefault.touched([(address, address + PAGES * PAGE)])
        return " ".join(f"{(start - address) // PAGE}+{length // PAGE}" for start, length in ranges)

    found = _in_child(child)
    assert found == "3+1 10+3"


def test_copied_pages_do_not_fault_and_the_others_still_do() -> None:
    area, address = _area()

    def child() -> str:
        mapped = [(address, address + PAGES * PAGE)]
        copied = _prefault.populate([(address, PAGES // 2 * PAGE)], mapped, lambda: False)
        half = PAGES // 2 * PAGE
        ones = bytes([2]) * (PAGES // 2)
        # One byte in each page, written by a single C call (an extended slice): no
        # interpreter allocation between the two counts faults of its own. The same
        # steps done once first on memory of the child's own, so that what they
        # allocate (in pages still shared with the parent) is copied before counting.
        scratch = bytearray(PAGES)
        scratch[1::2] = ones
        _faults()
        before = _faults()
        area[1:half:PAGE] = ones
        copied_faults = _faults() - before
        before = _faults()
        area[half + 1 :: PAGE] = ones
        return f"{copied} {copied_faults} {_faults() - before}"

    copied, copied_faults, other_faults = map(int, _in_child(child).split())
    require(copied != 0, f"MADV_POPULATE_WRITE is not available ({os.uname().release})")
    assert copied == PAGES // 2
    # The twin: the same writes to pages that were not copied each fault once.
    assert copied_faults <= 8  # the interpreter's own few
    assert other_faults >= PAGES // 2
    # The content is the server's, untouched by the copy.
    assert area[0] == 1


def test_copying_stops_when_a_caller_waits() -> None:
    area, address = _area()

    def child() -> str:
        ranges = [(address + page * PAGE, PAGE) for page in range(0, PAGES, 2)]
        mapped = [(address, address + PAGES * PAGE)]
        return str(_prefault.populate(ranges, mapped, lambda: True))

    assert _in_child(child) == "0"
    del area


def test_a_record_reads_back_for_its_server_only_and_a_damaged_one_is_ignored(
    tmp_path: Path,
) -> None:
    record = tmp_path / "key.pages"
    ours, theirs = _prefault.token(), _prefault.token()
    ranges = [(0x7F0000000000, 3 * PAGE), (0x7F0000010000, PAGE)]
    _prefault.save(str(record), ours, ranges)
    assert _prefault.load(str(record), ours) == ranges
    # Another server's addresses are laid out anew (ASLR): its record is not used.
    assert _prefault.load(str(record), theirs) == []
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    record.write_bytes(ours + b"\x00" * 17)  # not whole ranges
    assert _prefault.load(str(record), ours) == []
    record.write_bytes(ours + b"\x00" * _prefault._MAX_RECORD)
    assert _prefault.load(str(record), ours) == []
    link = tmp_path / "link.pages"
    good = tmp_path / "good.pages"
    _prefault.save(str(good), ours, ranges)
    link.symlink_to(good)
    assert _prefault.load(str(link), ours) == []  # a record is never read through a link
    assert _prefault.load(str(tmp_path / "missing.pages"), ours) == []


def test_ranges_outside_this_process_are_not_touched() -> None:
    """What the record names beyond the process's own private writable mappings (not
    mapped, unaligned, or more than MAX_PAGES) is left alone: nothing is copied."""
    area, address = _area()
    mapped = [(address, address + PAGES * PAGE)]
    assert _prefault.populate([(address + PAGES * PAGE, PAGE)], mapped, lambda: False) == 0
    assert _prefault.populate([(address + 1, PAGE)], mapped, lambda: False) == 0
    huge = [(address, (_prefault.MAX_PAGES + 1) * PAGE)]
    assert _prefault.populate(huge, [(address, address + huge[0][1])], lambda: False) == 0
    # A range that runs past its mapping is cut at the mapping's end.
    assert _prefault.populate([(address, 2 * PAGES * PAGE)], mapped, lambda: False) in (0, PAGES)
    del area


def test_this_processes_regions_are_private_and_writable() -> None:
    area, address = _area()
    regions = _prefault.regions()
    assert any(low <= address < high for low, high in regions)
    assert regions == sorted(regions)
    del area
