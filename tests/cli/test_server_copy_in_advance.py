"""A waiting spare takes the next run's copy-on-write faults in advance.

A worker is a fork of the warm server; each page a run writes was copied at its first
write, on the caller's path. Each worker writes down the pages its run made its own
(server._record_touched), and the next spare copies those while it waits
(server._copy_in_advance), stopping as soon as a caller waits. Real forks, real page
faults (counted by the kernel in ``ru_minflt``), a real listening socket.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A parent with a large heap (as the warm server) forks a "worker" that writes to every
# object of it and records what it touched, then a "spare" that copies in advance (or
# not) and writes to the same objects, reporting the page faults those writes took and
# its resident memory.
SCRIPT = r"""
import mmap, os, resource, socket, sys
from pathlib import Path
from stockade.cli import server

mode, record = sys.argv[1], Path(sys.argv[2])
heap = [[i] for i in range(400_000)]  # some 40 MB of small objects, spread over pages
reserved = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
name = "\0stockade-test-copy-%d" % os.getpid()
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(name)
listener.listen(1)
server._touched = record

def child(body):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, body().encode())
        os._exit(0)
    os.close(write_end)
    out = os.read(read_end, 200).decode()
    os.waitpid(pid, 0)
    return out

def touch():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for cell in heap:
        cell[0] += 1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def worker():
    touch()
    server._record_touched()
    return "recorded"

def spare():
    if mode == "waiting":
        caller = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        caller.connect(name)
    if mode != "plain":
        server._copy_in_advance(listener)
    with open("/proc/self/status") as f:
        rss = next(line for line in f if line.startswith("VmRSS:")).split()[1]
    return f"{touch()} {rss}"

if mode != "unrecorded":
    print(child(worker))
faults, rss_kb = child(spare).split()
print(faults, rss_kb, sum(cell[0] for cell in heap[:10]))
"""


def _spare(mode: str, tmp_path: Path) -> tuple[int, int]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(tmp_path / "touched")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    *_, last = proc.stdout.splitlines()
    faults, rss_kb, parents_view = last.split()
    # The children's writes are their own: the parent's objects are unchanged.
    assert parents_view == str(sum(range(10)))
    return int(faults), int(rss_kb)


def test_a_spare_copies_what_the_last_run_touched(tmp_path: Path) -> None:
    plain, _ = _spare("plain", tmp_path)
    advance, rss_kb = _spare("advance", tmp_path)
    # Without it, writing to the heap faults on (nearly) every page of it; after it,
    # the pages are the spare's already.
    assert plain > 5_000
    assert advance < plain / 20
    # Only what was touched: the parent's 256 MB reservation, never written, is not
    # made resident in the spare.
    assert rss_kb < 200 << 10


def test_a_spare_with_a_caller_waiting_copies_nothing_first(tmp_path: Path) -> None:
    """The twin: a caller waits already, so the spare serves it at once and the faults
    stay on the run's path, as before."""
    assert _spare("waiting", tmp_path)[0] > 5_000


def test_with_no_record_yet_a_spare_copies_nothing(tmp_path: Path) -> None:
    """The server's first spare: no worker has written down what a run touches, so it
    copies nothing rather than the whole heap."""
    assert _spare("unrecorded", tmp_path)[0] > 5_000
