"""A waiting spare takes its copy-on-write faults in advance (server._copy_in_advance).

A worker is a fork of the warm server; each page a run writes was copied at its first
write, on the caller's path. The spare copies the pages it shares with its parent while
it waits, and stops as soon as a caller waits. Real forks, real page faults (counted by
the kernel in ``ru_minflt``), a real listening socket.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# A parent with a large heap of its own forks a child (as the server forks a spare); the
# child optionally copies in advance, then writes to every object of that heap (as a run
# changes reference counts) and reports how many page faults the writes took.
SCRIPT = r"""
import os, resource, socket, sys
from stockade.cli import server

mode = sys.argv[1]
heap = [[i] for i in range(400_000)]  # some 40 MB of small objects, spread over pages
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\0stockade-test-copy-%d" % os.getpid())
listener.listen(1)
if mode == "waiting":
    caller = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    caller.connect("\0stockade-test-copy-%d" % os.getpid())
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    if mode != "plain":
        server._copy_in_advance(listener)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for cell in heap:
        cell[0] += 1
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    os.write(write_end, str(after - before).encode())
    os._exit(0)
os.close(write_end)
faults = int(os.read(read_end, 100))
os.waitpid(pid, 0)
print(faults, sum(cell[0] for cell in heap[:10]))
"""


def _faults(mode: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    faults, parents_view = proc.stdout.split()
    # The child's writes are its own: the parent's objects are unchanged.
    assert parents_view == str(sum(range(10)))
    return int(faults)


def test_a_spare_copies_its_shared_pages_while_no_caller_waits() -> None:
    plain = _faults("plain")
    advance = _faults("advance")
    # Without it, writing to the heap faults on (nearly) every page of it; after it,
    # the pages are the child's already.
    assert plain > 5_000
    assert advance < plain / 20


def test_a_spare_with_a_caller_waiting_copies_nothing_first() -> None:
    """The twin: a caller waits already, so the spare serves it at once and the faults
    stay on the run's path, as before."""
    assert _faults("waiting") > 5_000


def test_it_copies_only_pages_in_use() -> None:
    """A large mapping the process reserved but never touched stays unallocated."""
    import mmap

    reserved = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(f"\0stockade-test-reserve-{os.getpid()}")
        listener.listen(1)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            from stockade.cli import server

            server._copy_in_advance(listener)
            with open("/proc/self/status") as f:
                rss = next(line for line in f if line.startswith("VmRSS:"))
            os.write(write_end, rss.split()[1].encode())
            os._exit(0)
        os.close(write_end)
        rss_kb = int(os.read(read_end, 100))
        os.waitpid(pid, 0)
        listener.close()
    finally:
        reserved.close()
    # The 256 MB reservation was never touched: it is not part of the child's memory.
    assert rss_kb < 200 << 10
