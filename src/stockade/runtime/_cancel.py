"""Stopping a run from another thread: the handle behind cancellation and ``popen``.

:func:`~stockade.runtime.execute` runs in the caller's thread and waits there; an asyncio
task awaiting it (``Sandbox.arun``) or a :class:`~stockade.api.SandboxProcess` needs a
way to end the sandbox from outside. A :class:`RunHandle` is given to the run in its
:class:`~stockade.runtime.RunRequest`; the run attaches the sandbox's outermost process
to it as soon as that process exists, and :meth:`RunHandle.kill` kills the whole tree
(bubblewrap, and with it the PID namespace and everything in it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable


class RunHandle:
    """A run's outermost process, as seen from other threads.

    A kill that comes before the process exists is remembered: the process is killed the
    moment it is attached, before its command is let go.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False
        #: called once with the process when it is attached (``popen`` closes the child's
        #: ends of its pipes there)
        self.on_attach: Callable[[subprocess.Popen[bytes]], None] | None = None

    def attach(self, proc: subprocess.Popen[bytes]) -> None:
        """Called by the run right after the sandbox's outermost process started."""
        with self._lock:
            self._proc = proc
            killed = self._killed
        if self.on_attach is not None:
            self.on_attach(proc)
        if killed:
            kill_tree(proc)

    @property
    def killed(self) -> bool:
        """Whether :meth:`kill` was called."""
        return self._killed

    @property
    def pid(self) -> int | None:
        """The pid of the sandbox's outermost process (None before it started)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the sandbox's outermost process group (if it runs)."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    def kill(self) -> None:
        """Kill the sandbox and everything in it (now, or as soon as it starts)."""
        with self._lock:
            self._killed = True
            proc = self._proc
        if proc is not None:
            kill_tree(proc)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the sandbox and everything in it.

    SIGKILL to bwrap makes the kernel deliver its parent-death signal to the sandbox's
    init, and the death of a PID namespace's init kills every process in it. Without the
    container layer the command's own process group is killed too, and under the landlock
    backend every process below the launcher (a child subreaper). The one way a run is
    killed: on a timeout, a failed start, and a cancel from another thread (RunHandle).
    """
    if proc.returncode is not None:
        return  # reaped: its pid (and its group's) may belong to someone else now
    from stockade.runtime._landlock import kill_descendants

    # Without a PID namespace (the landlock backend) a process that left the group is
    # still below the launcher, a child subreaper: kill the whole tree from there.
    kill_descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
