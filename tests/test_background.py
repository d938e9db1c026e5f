"""stockade._background: one reused thread for a run's chores, in this process and in a
fork of it (a run server's worker)."""

from __future__ import annotations

import os
import threading

from stockade import _background


def test_a_chore_runs_on_another_thread_and_its_event_is_set() -> None:
    ran_on: list[int] = []
    done = _background.submit(lambda: ran_on.append(threading.get_ident()))
    assert done.wait(10)
    assert ran_on
    assert ran_on[0] != threading.get_ident()


def test_chores_share_one_thread_and_a_failing_one_does_not_stop_it() -> None:
    """The twin of a chore that raises: the next chore still runs, on the same thread."""
    idents: list[int] = []

    def fail() -> None:
        idents.append(threading.get_ident())
        raise OSError("a chore's own failure")

    assert _background.submit(fail).wait(10)
    assert _background.submit(lambda: idents.append(threading.get_ident())).wait(10)
    assert len(idents) == 2
    assert idents[0] == idents[1]


def test_a_fork_gets_a_thread_of_its_own() -> None:
    """A fork has no thread but the one that forked: a chore submitted there still runs
    (it would wait forever on a queue nobody serves otherwise)."""
    assert _background.submit(lambda: None).wait(10)  # the parent's thread exists
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        ok = _background.submit(lambda: None).wait(5)
        os.write(write_end, b"ran" if ok else b"stuck")
        os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 10) == b"ran"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
