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
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """Where this process may create cgroups: one directory per controller (v1) or one (v2)."""

    version: int
    #: controller name -> the directory to create children in
    parents: dict[str, Path]

    def describe(self) -> str:
        """One line for ``stockade doctor``."""
        where = ", ".join(f"{name} in {path}" for name, path in self.parents.items())
        return f"cgroup v{self.version}: {where}"


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(","):
            out[name] = parts[2]
    return out


def detect() -> CgroupSupport | None:
    """The cgroup support of this process, or None when it can make no cgroup."""
    own = _own_paths()
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


#: A left-behind cgroup younger than this is not swept: it may be a concurrent run's,
#: created and not yet joined by its first process (still empty).
SWEEP_MIN_AGE_S = 60.0


def _sweep(support: CgroupSupport) -> None:
    """Remove cgroups that earlier runs left behind when killed (only empty, old ones go)."""
    cutoff = time.time() - SWEEP_MIN_AGE_S
    for base in set(support.parents.values()):
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                if entry.name.startswith("stockade-") and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.rmdir(entry.path)


@dataclass
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

    def remove(self) -> None:
        """Kill what is left and remove the directories (a cgroup with tasks cannot go)."""
        for path in reversed(self.dirs):
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.01)
        self.dirs.clear()
