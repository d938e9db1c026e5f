"""The start-up handshake with bubblewrap (``--info-fd``, ``--block-fd``,
``--json-status-fd``): the command is held until its cgroup, proxy and placeholders are
ready, and a sandbox that failed to start is explained (fail closed)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable

from stockade._exceptions import SandboxError, Unavailable
from stockade.enforce.bubblewrap import read_child_pid
from stockade.policy import Decision, Reason
from stockade.runtime import _host
from stockade.runtime._cancel import kill_tree

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.audit import AuditLog


def bwrap_started(status_r: int) -> bool:
    """Whether bwrap reported starting the command on ``--json-status-fd``."""
    data = b""
    while chunk := os.read(status_r, 65536):
        data += chunk
    return b'"child-pid"' in data


def explain_userns() -> None:
    """Raise :class:`Unavailable` (with the fix and the fallback) when user namespaces
    are what kept bubblewrap from starting; else return."""
    check = _host.userns_check()
    if not check.ok:
        from stockade.runtime._landlock import FALLBACK_HINT

        raise Unavailable(f"user namespaces ({check.detail})", f"{check.fix}; {FALLBACK_HINT}")


def explain_bwrap_failure(returncode: int) -> None:
    """bwrap failed before the command ran: say why, as a refusal (fail closed)."""
    explain_userns()
    raise SandboxError(
        f"bubblewrap could not set up the sandbox (exit {returncode}; its message is above); "
        "the command did not run. 'stockade doctor' checks this host"
    )


class BwrapHandshake:
    """The start-up handshake with bubblewrap (``--info-fd`` and ``--block-fd``).

    The command is held until the sandbox's first process is in its cgroup, the proxy
    listens inside its network namespace and the placeholders of protected paths the
    launcher binds exist.
    """

    def __init__(
        self,
        egress: Any,
        audit: AuditLog,
        make_cgroup: Callable[[], Any] | None,
        contain: bool,
        placeholders: Callable[[], None] | None = None,
        argv: tuple[str, ...] = (),
    ) -> None:
        self.contain = contain
        self.placeholders = placeholders
        self.info_r, self.info_w = os.pipe()
        self.block_r, self.block_w = os.pipe()
        self.make_cgroup = make_cgroup
        self.cgroup: Any = None
        self.audit = audit
        self.proxy = egress.proxy(audit, argv) if egress is not None else None

    def paused(self) -> float:
        """Seconds the command's wall clock stood still for asks (see RunGate)."""
        gate = self.proxy.gate if self.proxy is not None else None
        return gate.paused_seconds() if gate is not None else 0.0

    def child_fds(self) -> tuple[int, int]:
        """The pipe ends bubblewrap inherits."""
        return self.info_w, self.block_r

    def release(self, proc: subprocess.Popen[bytes]) -> None:
        """Wire the proxy into the sandbox's network namespace, then let the command run.

        On any failure the sandbox is killed before its command ever starts.
        """
        os.close(self.info_w)
        os.close(self.block_r)
        self.info_w = self.block_r = -1
        try:
            if self.proxy is not None:
                # Its helper starts while bubblewrap makes the namespace it will enter.
                self.proxy.prepare()
            if self.make_cgroup is not None:
                self.cgroup = self.make_cgroup()
            if self.placeholders is not None:
                # While bubblewrap builds the namespaces: the launcher binds them, after
                # the block fd lets it go.
                try:
                    self.placeholders()
                except OSError as exc:
                    raise SandboxError(
                        f"cannot create the placeholder {exc.filename} of a protected path "
                        f"({exc.strerror}); the command did not run"
                    ) from exc
            try:
                pid = read_child_pid(self.info_r)
            except SandboxError:
                self.info_r = -1
                explain_userns()
                raise
            self.info_r = -1
            if self.cgroup is not None:
                try:
                    self.cgroup.add(pid)
                except OSError as exc:
                    raise SandboxError(
                        f"cannot move the sandbox into its cgroup ({exc.strerror}); "
                        "the command did not run"
                    ) from exc
            if self.proxy is not None:
                self.proxy.attach(pid)
        except BaseException:
            kill_tree(proc)
            proc.wait()  # reaped here: the exception leaves nobody to wait for it
            raise
        # bwrap gone before the command was let go (a cancelled run killed the tree
        # meanwhile): nothing to release, nothing ran; the caller's wait reaps it.
        with contextlib.suppress(BrokenPipeError):
            os.write(self.block_w, b"1")
        os.close(self.block_w)
        self.block_w = -1

    def close(self) -> None:
        """Stop the proxy, empty and remove the cgroup, close what is left of the pipes."""
        for fd in (self.info_r, self.info_w, self.block_r, self.block_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.proxy is not None:
            self.proxy.close()
        if self.cgroup is not None:
            if self.cgroup.oom_killed():
                self.audit.decision(
                    "denied",
                    Decision.deny(
                        "limits",
                        Reason.LIMIT_MEMORY,
                        detail="out of memory in the sandbox's cgroup",
                    ),
                )
            # Reaping what is left is the container layer's job (a PID namespace);
            # with it off, processes outlive the run as they would without a cgroup.
            self.cgroup.remove(kill=self.contain)
