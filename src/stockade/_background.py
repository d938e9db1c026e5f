"""One background thread per process for a run's small chores (priming the cgroup lock,
sweeping the scratch directories of killed runs), started once and reused.

``threading.Thread.start`` waits until the new thread has run (and taken the GIL) before
it returns: about half a millisecond on a small machine, paid twice on the path of every
run of a warm process (the API, a Sandbox) when each chore started a thread of its own.
Handing a chore to a thread that already waits costs a queue put.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

_tasks: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]] | None = None
_lock = threading.Lock()


def _serve(tasks: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]]) -> None:
    while True:
        chore, done = tasks.get()
        try:
            chore()
        except BaseException:  # noqa: S110 - a chore's failure is its own (each suppresses what it expects)
            pass
        finally:
            done.set()


def submit(chore: Callable[[], object]) -> threading.Event:
    """Run ``chore`` on the background thread (started on first use); the event is set
    once it has run. A chore's exception is dropped: each handles its own failures."""
    global _tasks
    with _lock:
        if _tasks is None:
            _tasks = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(_tasks,), name="stockade-background", daemon=True
            ).start()
        tasks = _tasks
    done = threading.Event()
    tasks.put((chore, done))
    return done


def _forked() -> None:
    # A fork has no threads but the one that forked: the next submit starts a new one.
    global _tasks, _lock
    _tasks = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)
