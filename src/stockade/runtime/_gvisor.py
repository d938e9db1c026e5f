"""The gVisor backend's part of one run: the bundle on disk, the argv, the clean-up.

:mod:`stockade.enforce.gvisor` builds the documents (pure); this module writes them into
the run's private scratch directory and removes what runsc leaves after an abnormal end.
The orchestration (handshake, proxy, cgroup, wait) is :mod:`._run`'s, the same as for
bubblewrap: the entry process speaks bubblewrap's info-fd/block-fd protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from stockade.enforce import gvisor
from stockade.enforce.bubblewrap import ContainerPlan

#: runsc's own environment: nothing of the caller's (the child's is in the bundle)
_RUNSC_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


class GvisorRun:
    """The on-disk state of one gVisor sandbox under ``scratch/gvisor``."""

    def __init__(self, runsc: gvisor.Runsc, scratch: Path, run_id: str) -> None:
        self.runsc = runsc
        self.base = scratch / "gvisor"
        self.bundle = self.base / "bundle"
        self.state = self.base / "state"
        self.container_id = f"stockade-{run_id}"
        for path in (self.base, self.bundle, self.bundle / "rootfs", self.state):
            path.mkdir(mode=0o700)

    def launcher_files(self, binary: Path, spec: bytes) -> tuple[tuple[Path, str], ...]:
        """Write the launcher's spec to a file (runsc passes no descriptors in); return
        the ``(host, inside)`` binds of the launcher and its spec."""
        spec_path = self.base / "launcher.spec"
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(spec)
        return ((binary, gvisor.LAUNCHER_INSIDE), (spec_path, gvisor.SPEC_INSIDE))

    def write_bundle(
        self, plan: ContainerPlan, args: Sequence[str], env: Mapping[str, str]
    ) -> None:
        """``config.json`` and the rootfs's merged-/usr symlinks."""
        for name, target in gvisor.rootfs_symlinks(plan.system_paths):
            (self.bundle / "rootfs" / name).symlink_to(target)
        doc = gvisor.build_bundle(plan, args, env)
        fd = os.open(
            self.bundle / "config.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)

    def argv(self, info_fd: int, block_fd: int) -> list[str]:
        """The outermost argv: the entry script, then ``runsc run``."""
        runsc = gvisor.runsc_argv(self.runsc, str(self.state), str(self.bundle), self.container_id)
        return gvisor.entry_argv(
            sys.executable, os.getuid(), os.getgid(), os.getpid(), info_fd, block_fd, runsc
        )

    @staticmethod
    def env() -> dict[str, str]:
        """runsc's own environment."""
        return dict(_RUNSC_ENV)

    def cleanup(self) -> None:
        """``runsc delete --force`` when runsc left its container's state behind (it was
        killed): its sandbox and gofer processes go with it. Best effort: the
        parent-death signal already took them when ``runsc run`` died."""
        try:
            leftover = any(self.state.iterdir())
        except OSError:
            return
        if not leftover:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [
                    str(self.runsc.path),
                    f"--root={self.state}",
                    "delete",
                    "--force",
                    self.container_id,
                ],
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
                check=False,
            )
