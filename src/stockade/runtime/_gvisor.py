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
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from stockade import _roots
from stockade._exceptions import SandboxError, Unavailable
from stockade._fs import write_new
from stockade.enforce import gvisor
from stockade.enforce.bubblewrap import ContainerPlan


class GvisorRun:
    """The on-disk state of one gVisor sandbox under ``scratch/gvisor``."""

    def __init__(self, runsc: gvisor.Runsc, scratch: Path, run_id: str) -> None:
        #: the entry's binary, built (or its cached copy verified) here, as the run is
        #: planned and before anything of it exists: a build that fails raises, and the
        #: run does not start (gvisor.build_entry)
        self.entry = gvisor.build_entry()
        self.runsc = runsc
        self.base = scratch / "gvisor"
        self.bundle = self.base / "bundle"
        self.state = self.base / "state"
        self.container_id = f"stockade-{run_id}"
        # runsc's own log and the container's pid: how a sandbox that never started is
        # told from the command's own failure (gvisor.start_failure). Host files, in no
        # mount of the sandbox.
        self.log = self.base / "runsc.log"
        self.pid_file = self.base / "runsc.pid"
        #: the Sentry's Go panic, if any: a sandbox that died under the command
        self.panic_log = self.base / "runsc.panic"
        #: where the entry says why the kernel refused an overlay workspace's mount
        #: (enforce/_gvisor_entry.c); a host file in no mount of the sandbox
        self.refused = self.base / "entry.refused"
        #: the listening socket runsc hands a terminal bundle's pty to (open_console)
        self.console: socket.socket | None = None
        #: the records of the binds the entry repeats read-only on the host side, so
        #: that runsc may run with directfs (gvisor.host_binds); only with the mount API
        #: that makes them (Linux 5.12), else the gofer opens every file as before
        self.binds = self.base / "binds"
        #: the rootfs's directory of the launcher and its spec (launcher_files), if any
        self.launcher_dir: Path | None = None
        from stockade.runtime._host import mount_api

        self.directfs = mount_api()
        for path in (self.base, self.bundle, self.bundle / "rootfs", self.state):
            path.mkdir(mode=0o700)

    def launcher_files(self, binary: Path, spec: bytes) -> None:
        """Put the launcher and its spec (runsc passes no descriptors in) into the
        bundle's rootfs, at :data:`gvisor.LAUNCHER_INSIDE` and :data:`gvisor.SPEC_INSIDE`.

        The rootfs is read-only inside and already served by the gofer: files there cost
        the Sentry no mount of their own, where each bind costs about 2.5 ms of every
        run (the bundle had two for these). The launcher is a hard link to the binary
        :func:`launcher.build_launcher` just checked (the same inode, taken now: a bind
        would have resolved the cache path only when runsc started), or a copy where the
        scratch directory is on another file system.
        """
        inside = self.bundle / "rootfs" / gvisor.ROOTFS_STOCKADE_DIR
        inside.mkdir(mode=0o700)
        target = inside / "launcher"
        try:
            os.link(binary, target)
        except OSError:
            import shutil

            shutil.copyfile(binary, target)
            os.chmod(target, 0o500)
        write_new(inside / "launcher.spec", spec, 0o400)
        self.launcher_dir = inside

    def write_bundle(
        self, plan: ContainerPlan, args: Sequence[str], env: Mapping[str, str]
    ) -> None:
        """``config.json`` and the rootfs's merged-/usr symlinks (a terminal bundle when
        :meth:`open_console` was called first)."""
        for name, target in gvisor.rootfs_symlinks(plan.system_paths):
            (self.bundle / "rootfs" / name).symlink_to(target)
        doc = gvisor.build_bundle(plan, args, env, terminal=self.console is not None)
        if self.directfs:
            # The run's scratch (runsc's state and logs, the rootfs's mount points) stays
            # writable whatever lies above it; the launcher's directory of the rootfs
            # (a hard link to the cached binary), when the run has a launcher, is
            # read-only on the host side as well.
            extra = [("w", str(self.base))]
            if self.launcher_dir is not None:
                extra.append(("r", str(self.launcher_dir)))
            write_new(self.binds, gvisor.host_binds(doc["mounts"], extra), 0o600)
        # dumps: the C encoder in one call (dump streams through the Python one).
        write_new(self.bundle / "config.json", json.dumps(doc).encode(), 0o600)

    def argv(
        self,
        info_fd: int,
        block_fd: int,
        *,
        share_net: bool = False,
        overlay: tuple[Path, Path] | None = None,
    ) -> list[str]:
        """The outermost argv: the entry (:func:`gvisor.build_entry`, built when this run
        was made), then ``runsc run``; ``share_net`` (the egress layer is off) keeps the
        caller's network namespace, so that runsc ``--network=host`` is the host's
        network, as bubblewrap's ``--share-net`` is; ``overlay`` (workspace, layer
        directory): the entry mounts the workspace's overlay host-side, around runsc
        (:func:`gvisor.entry_argv`)."""
        runsc = gvisor.runsc_argv(
            self.runsc,
            str(self.state),
            str(self.bundle),
            self.container_id,
            log=str(self.log),
            pid_file=str(self.pid_file),
            panic_log=str(self.panic_log),
            console_socket=str(self.base / "console") if self.console is not None else None,
            directfs=self.directfs,
        )
        return gvisor.entry_argv(
            str(self.entry),
            os.getuid(),
            os.getgid(),
            os.getpid(),
            info_fd,
            block_fd,
            runsc,
            state=str(self.state),
            container_id=self.container_id,
            share_net=share_net,
            overlay=(str(overlay[0]), str(overlay[1])) if overlay is not None else None,
            refused=str(self.refused),
            binds=str(self.binds) if self.directfs else "",
        )

    # -- the terminal ------------------------------------------------------------------

    def open_console(self) -> None:
        """Listen for the pty of a terminal bundle.

        With ``terminal: true`` and ``--console-socket`` runsc makes a pty, makes it the
        sandbox's controlling terminal (so that a Ctrl-C typed into it is a SIGINT to the
        command's foreground process group, which the Sentry forwards) and sends its
        master here. A pty of stockade's own given as runsc's stdio would reach the
        command as a plain host file: no job control, and TIOCSCTTY fails.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.base / "console"))
            sock.listen(1)
        except OSError:
            sock.close()
            raise
        self.console = sock

    def receive_console(self, alive: Callable[[], bool], timeout: float = 60.0) -> int:
        """The pty master runsc sends (a descriptor of ours), or -1 when runsc ended, or
        took ``timeout`` seconds, without sending one (its status then says why)."""
        assert self.console is not None
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.console], [], [], 0.1)
                if ready:
                    conn, _ = self.console.accept()
                    with conn:
                        conn.settimeout(max(0.1, deadline - time.monotonic()))
                        fds: list[int] = []
                        with contextlib.suppress(OSError):
                            _msg, fds, _flags, _addr = socket.recv_fds(conn, 1024, 4)
                    for extra in fds[1:]:
                        os.close(extra)
                    return fds[0] if fds else -1
                if not alive():
                    return -1
            return -1
        finally:
            self.console.close()

    # -- the end -----------------------------------------------------------------------

    def check_started(self, returncode: int) -> None:
        """Raise :class:`SandboxError` when ``returncode`` is runsc's failure rather than
        the command's (:func:`gvisor.start_failure`): a sandbox that never started is exit
        125 with runsc's message above, as a bubblewrap that could not set up is; a
        command that exits 1 is 1; an overlay the kernel refused to mount is
        :class:`Unavailable` with the kernel's reason (the command did not run)."""
        try:
            refused = self.refused.read_text(errors="replace").strip()
        except OSError:
            refused = ""
        if refused:
            raise Unavailable(
                f"an overlay workspace with the gVisor backend on this host ({refused[:600]})",
                "run it without --overlay, or with --backend bubblewrap; docs/overlay.md "
                "lists what the kernel needs",
            )
        try:
            pid = self.pid_file.read_text()
        except OSError:
            pid = None
        try:
            log = self.log.read_text(errors="replace")
        except OSError:
            log = ""
        try:
            panic = self.panic_log.read_text(errors="replace")
        except OSError:
            panic = ""
        why = gvisor.start_failure(returncode, pid, log, panic)
        if why == "not-started":
            raise SandboxError(
                f"gVisor's runsc could not start the sandbox (exit {returncode}; its message "
                "is above); the command did not run. 'stockade doctor' checks this host"
            )
        if why == "failed" and panic.strip():
            first = panic.strip().splitlines()[0][:200]
            raise SandboxError(
                f"gVisor's Sentry stopped while the command ran ({first}; exit "
                f"{returncode}); the command's own status is unknown"
            )
        if why == "failed":
            raise SandboxError(
                f"gVisor's runsc failed while the command ran (exit {returncode}; its "
                "message is above); the command's own status is unknown"
            )

    @staticmethod
    def env() -> dict[str, str]:
        """runsc's own environment: stockade's fixed host environment, nothing of the
        caller's (the command's is in the bundle)."""
        return _roots.host_environment()

    def cleanup(self) -> None:
        """``runsc delete --force`` when runsc left its container's state behind (it was
        killed): its sandbox and gofer processes go with it. Best effort: the
        parent-death signal already took them when ``runsc run`` died."""
        if self.console is not None:
            self.console.close()
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


def _positioned_file(target: int | IO[Any] | None, default: int) -> int | None:
    """The descriptor ``target`` writes to, when it is a regular file opened without
    O_APPEND (whose offset gVisor does not honour); None for anything else."""
    import fcntl
    import stat

    if target is None:
        fd = default
    elif isinstance(target, int):
        if target < 0:
            return None  # subprocess.PIPE, DEVNULL, STDOUT
        fd = target
    else:
        try:
            fd = target.fileno()
        except (OSError, ValueError, AttributeError):
            return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            return None
    except OSError:
        return None
    return fd


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _copy(read_end: int, fd: int) -> None:
    try:
        while chunk := os.read(read_end, 1 << 16):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
    except OSError:
        pass  # the caller's file is gone or full: the command sees EPIPE from then on
    finally:
        os.close(read_end)


@contextlib.contextmanager
def file_relays(
    stdout: int | IO[Any] | None, stderr: int | IO[Any] | None
) -> Iterator[tuple[int | IO[Any] | None, int | IO[Any] | None]]:
    """Stand a pipe in for a stdout or stderr that is a regular file at an offset.

    runsc gives the Sentry the descriptor, and gVisor writes a host file at an offset of
    its own, starting at 0: ``{ echo before; stockade run --backend gvisor -- echo x; } >
    f`` would lose ``before``. Through a pipe, stockade writes the output itself, at the
    caller's offset, advancing it as any command's output does. Yields the targets to
    give runsc; on exit, waits until the command's output is written.
    """
    threads: list[threading.Thread] = []
    out: list[int | IO[Any] | None] = []
    opened: list[int] = []
    files = [_positioned_file(stdout, 1), _positioned_file(stderr, 2)]
    try:
        for index, (target, fd) in enumerate(zip((stdout, stderr), files, strict=True)):
            if fd is None:
                out.append(target)
                continue
            if index == 1 and files[0] is not None and _same_file(files[0], fd):
                # 2>&1: one pipe for both keeps their order, as one file would.
                out.append(out[0])
                continue
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
            opened.append(write_end)
            thread = threading.Thread(
                target=_copy, args=(read_end, fd), name="stockade-output", daemon=True
            )
            thread.start()
            threads.append(thread)
            out.append(write_end)
        yield out[0], out[1]
    finally:
        # runsc holds its copies while it runs; ours close now, so that the relays end
        # when runsc (and with it every process of the sandbox) has gone.
        for write_end in opened:
            with contextlib.suppress(OSError):
                os.close(write_end)
        for thread in threads:
            thread.join()
