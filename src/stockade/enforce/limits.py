"""The ``limits`` layer: a cgroup of the sandbox's own when one can be made, rlimits always.

rlimits are set by the inner launcher for every run: file size, data (memory), CPU
seconds, and the number of processes (counted per user namespace, so per sandbox).
They have two gaps: ``RLIMIT_NPROC`` does not apply to the real root user, and memory
limits are per process. A cgroup closes both: ``pids.max`` counts every task of the
sandbox, and the memory limit covers all of them together, with OOM kills confined to
the sandbox. stockade makes one when it can:

* cgroup v2, where our cgroup is delegated to us (``cgroup.subtree_control`` writable,
  ``pids`` and ``memory`` available);
* cgroup v1 ``pids`` and ``memory`` hierarchies that we may write (typically as root).

What it does NOT stop: disk use inside the workspace beyond the per-file size limit
(there is no quota), and per-user kernel objects (inotify instances, pipe buffers).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from stockade._process import alive
from stockade._record import field, record

CGROUP_ROOT = Path("/sys/fs/cgroup")


@record
class CgroupSupport:
    """Where this process may create cgroups: one directory per controller (v1) or one (v2)."""

    version: int
    #: controller name -> the directory to create children in
    parents: dict[str, Path]

    def describe(self) -> str:
        """One line for ``stockade doctor``."""
        where = ", ".join(f"{name} in {path}" for name, path in self.parents.items())
        return f"cgroup v{self.version}: {where}"


def _own_cgroups() -> str:
    """/proc/self/cgroup, or "" when it cannot be read."""
    try:
        with open("/proc/self/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


def _own_paths(text: str) -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(","):
            out[name] = parts[2]
    return out


#: what detect() found, by the /proc/self/cgroup it was found for (a warm process runs
#: many sandboxes; only a place that was usable is remembered, so that one that becomes
#: usable later is found, and one that stops being usable fails Cgroup.create, which the
#: run reports)
_found: dict[str, CgroupSupport] = {}


def detect() -> CgroupSupport | None:
    """The cgroup support of this process, or None when it can make no cgroup."""
    text = _own_cgroups()
    known = _found.get(text)
    if known is not None:
        return known
    found = _detect(_own_paths(text))
    if found is not None:
        _found.clear()
        _found[text] = found
    return found


def _detect(own: dict[str, str]) -> CgroupSupport | None:
    # v2: the unified hierarchy, mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified.
    if "" in own:
        for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
            base = mount / own[""].lstrip("/")
            try:
                controllers = (base / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if (
                {"pids", "memory"} <= set(controllers)
                and os.access(base, os.W_OK)
                and os.access(base / "cgroup.subtree_control", os.W_OK)
            ):
                return CgroupSupport(2, {"pids": base, "memory": base})
    parents: dict[str, Path] = {}
    for name in ("pids", "memory"):
        if name not in own:
            continue
        base = CGROUP_ROOT / name / own[name].lstrip("/")
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            parents[name] = base
    if parents:
        return CgroupSupport(1, parents)
    return None


def prime_attach(support: CgroupSupport) -> None:
    """Start paying, in the background, the first cost of moving a process between cgroups.

    Every move takes the kernel's global ``cgroup_threadgroup_rwsem``, a per-CPU rwsem
    whose writer waits for an RCU grace period (about 10 ms here) unless another writer
    held it within the last grace period or so (cgroup v2's ``favordynmods`` exists for
    this). Moving this process into the cgroup it is already in changes nothing but takes
    that lock; done on the background thread (stockade._background) while the run is
    being planned, it makes the sandbox's own move a few milliseconds later cost about
    0.1 ms instead of 10. Failure (no write
    access to our own cgroup) only means no head start.
    """
    from stockade import _background

    # The parents detect() found are the cgroups this process is in (one per v1
    # controller, or the v2 one): any of them will do.
    procs = next(iter(support.parents.values())) / "cgroup.procs"

    def move_self() -> None:
        with contextlib.suppress(OSError):
            procs.write_text(str(os.getpid()))

    _background.submit(move_self)


def cgroup_name(run_id: str) -> str:
    """The cgroup name of a run: it carries the pid of the stockade process that owns it."""
    return f"stockade-{os.getpid()}-{run_id}"


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    return len(parts) == 3 and parts[1].isdigit() and alive(int(parts[1]))


def _sweep(support: CgroupSupport) -> None:
    """Remove cgroups that runs killed mid-way left behind.

    Only a cgroup whose owning stockade process is gone is touched (a concurrent run's
    fresh, still empty cgroup must survive), and only an empty one can be removed.
    """
    for base in set(support.parents.values()):
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                if (
                    entry.name.startswith("stockade-")
                    and entry.is_dir(follow_symlinks=False)
                    and not _owner_alive(entry.name)
                ):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)


@record(frozen=False)
class Cgroup:
    """The cgroup(s) of one sandbox: created with limits, joined by its first process."""

    support: CgroupSupport
    name: str
    dirs: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, support: CgroupSupport, name: str, *, pids: int, memory: int) -> Cgroup:
        """Make the cgroup and write its limits.

        Raises OSError when the kernel refuses; the caller falls back to rlimits alone
        and says so in the audit log.
        """
        group = cls(support, name)
        _sweep(support)
        try:
            if support.version == 2:
                base = support.parents["pids"]
                # The v2 "no internal processes" rule: controllers can only be enabled
                # for children, so the sandbox gets a leaf of its own.
                (base / "cgroup.subtree_control").write_text("+pids +memory")
                path = base / name
                path.mkdir()
                group.dirs.append(path)
                (path / "pids.max").write_text(str(pids))
                (path / "memory.max").write_text(str(memory))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                for controller, base in support.parents.items():
                    path = base / name
                    path.mkdir()
                    group.dirs.append(path)
                    if controller == "pids":
                        (path / "pids.max").write_text(str(pids))
                    else:
                        (path / "memory.limit_in_bytes").write_text(str(memory))
        except OSError:
            group.remove()
            raise
        return group

    def add(self, pid: int) -> None:
        """Move ``pid`` (the sandbox's first process) in; its children are born inside."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        """Every process still in the cgroup."""
        out: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError):
                out |= {int(p) for p in (path / "cgroup.procs").read_text().split()}
        return out

    def kill(self) -> None:
        """Kill everything in the cgroup (cgroup.kill on v2, SIGKILL to each pid on v1)."""
        if self.support.version == 2 and self.dirs:
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
        for _ in range(3):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)

    def oom_killed(self) -> bool:
        """Whether the memory limit killed something in this sandbox."""
        for path in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                if self.support.version == 2:
                    for line in (path / "memory.events").read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and int(value) > 0:
                            return True
                elif (path / "memory.failcnt").exists():
                    text = (path / "memory.oom_control").read_text()
                    for line in text.splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and int(value) > 0:
                            return True
        return False

    def remove(self, *, kill: bool = True) -> None:
        """Remove the directories, killing what is left first when ``kill``.

        A cgroup with tasks cannot be removed: without ``kill`` (the container layer is
        off, so processes may outlive the run by the user's choice) it stays until empty
        and a later run sweeps it.
        """
        for path in reversed(self.dirs):
            for attempt in range(200 if kill else 1):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if not kill:
                        break
                    self.kill()
                    # The last processes are usually gone within a millisecond.
                    time.sleep(0.001 if attempt < 50 else 0.01)
        self.dirs.clear()
