"""The landlock backend: a run without new namespaces, for hosts that refuse them.

``[container] backend = "landlock"`` (or ``--backend landlock``; never chosen silently:
``backend = "auto"`` picks it only with ``allow_degraded = true``) runs the command as a
child of the inner launcher on the host, confined by what an unprivileged process can
apply to itself:

* ``files``: Landlock on the real files, the same grants as under bubblewrap. A
  protected path inside a writable root cannot be carved out of a Landlock grant (rules
  only add), so the grant is split instead (:func:`write_grants`): every entry of a
  directory that holds a protected path gets its own rule, the protected ones and the
  directories above them none (they stay readable). The cost, said in the run's log:
  nothing new can be created directly in those directories (the workspace's top, its
  ``.git``). stockade's own trust roots (configuration, state, cache, data, its code:
  :func:`stockade._roots.trust_roots`) are split out the same way when a writable root
  holds them, and the interception CA's directory out of every read grant.
* ``egress``: Landlock's TCP connect rule (ABI 4, Linux 6.7) lets ``connect()`` reach
  the proxy's port only; below ABI 4 the connect guard does instead
  (:mod:`stockade.enforce.netguard`: seccomp user notification, stockade performing
  each ``connect()`` on the command's behalf, to the proxy's address alone; io_uring
  refused; exit 125 when it cannot be set up), and the seccomp filter
  (``no_netns``) refuses every inet socket but TCP (no UDP, raw, ICMP, SCTP or MPTCP)
  and ``MSG_FASTOPEN`` (a connect without ``connect()``). The proxy listens on a
  loopback port of the host; clients reach it through the proxy variables. There is no
  namespace in which to capture a client that ignores them: it gets EACCES. The
  connect rule names a port, not an address: a server on another host listening on the
  proxy's port (random per run) is reachable directly, which the model says (the guard
  checks the address too).
* ``container``: the launcher stays the command's parent as a child subreaper and kills
  what is left of the tree when the command ends; stockade kills the tree on timeout
  (:func:`kill_descendants`). There is no PID, mount, IPC or UTS namespace: host
  processes are visible (Landlock's scope refuses signalling them, ABI 6), named host
  unix sockets are reachable, HOME and TMPDIR are scratch directories of the run, not
  tmpfs mounts.
* ``syscalls``, ``secrets``, ``limits``: the same filter (plus the socket rules above),
  environment allow-list and rlimits; a cgroup only where one is delegated, and no
  ``RLIMIT_NPROC`` (without a user namespace it would count every process of the user).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from stockade._exceptions import Unavailable
from stockade._record import replace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.audit import AuditLog
    from stockade.policy import Policy
    from stockade.runtime._placeholders import Claim

__all__ = [
    "ABI_MAX_ENV",
    "FALLBACK_HINT",
    "MIN_NET_ABI",
    "LandlockRun",
    "choose_backend",
    "for_landlock",
    "kill_descendants",
    "needs_guard",
    "open_proxy_listener",
    "require",
    "write_grants",
]

#: Landlock's TCP rules arrived with ABI 4 (Linux 6.7).
MIN_NET_ABI = 4

#: what a refusal for want of user namespaces offers, after the fix
FALLBACK_HINT = (
    "or run without namespaces, confined by Landlock and seccomp alone and accepting what "
    "that loses ('stockade doctor' lists it, docs/security-model.md): --backend landlock, "
    'or [container] backend = "auto" with allow_degraded = true'
)

#: the launcher refuses more rules than this (MAX_PATHS in _launcher.c)
_MAX_RULES = 1000

#: host devices the command may open for writing: what bubblewrap's minimal /dev holds
#: but the pty devices, plus /dev/shm (shared with the host: POSIX semaphores of
#: multiprocessing need it). Never the whole of /dev: the host's disks are there,
#: writable by their owner, and /dev/pts holds the user's other terminals (read from one
#: and its keystrokes are stolen). The run's own pty is inherited open, and /dev/tty
#: names it; a pty of the command's own (script, tmux) is not available here.
DEVICES: tuple[str, ...] = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/shm",
)


#: the highest Landlock ABI the landlock backend may use, read from stockade's own
#: environment on the host (never the command's, never a policy's): it can only lower
#: what the kernel offers, to run as on an older kernel (the tests of the connect guard
#: use it on a kernel with ABI 7). docs/security-model.md documents it.
ABI_MAX_ENV = "STOCKADE_LANDLOCK_ABI_MAX"


def abi_cap() -> int | None:
    """The cap of :data:`ABI_MAX_ENV`, None when unset.

    Raises:
        Unavailable: it is set to something other than a number above 0.
    """
    text = os.environ.get(ABI_MAX_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise Unavailable(
            f"a Landlock ABI cap: {ABI_MAX_ENV}={text!r} is not a number above 0",
            f"unset {ABI_MAX_ENV}, or give the highest ABI to use (1..)",
        )
    return value


def usable_abi() -> int:
    """The Landlock ABI the landlock backend uses: the kernel's, lowered to the cap."""
    from stockade.runtime import _host

    abi = _host.landlock_abi()
    cap = abi_cap()
    return abi if cap is None else min(abi, cap)


def needs_guard(*, egress: bool) -> bool:
    """Whether the egress layer needs the connect guard here: Landlock lacks TCP rules."""
    return egress and usable_abi() < MIN_NET_ABI


def require(*, files: bool, egress: bool) -> None:
    """Refuse a landlock run this kernel cannot confine (fail closed).

    Raises:
        Unavailable: no Landlock at all while a layer needs it, or, while the egress
            layer is on, neither network rules (ABI < 4) nor what the connect guard
            that replaces them needs (seccomp user notification, ``pidfd_getfd``).
    """
    abi = usable_abi()
    if (files or egress) and abi < 1:
        raise Unavailable(
            "Landlock (the landlock backend has nothing else to confine files and network)",
            "use a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm=",
        )
    if egress and abi < MIN_NET_ABI:
        from stockade.enforce import netguard

        ok, why = netguard.available()
        if not ok:
            raise Unavailable(
                f"Landlock network rules (ABI {MIN_NET_ABI}, Linux 6.7; this kernel has ABI "
                f"{abi}) or the connect guard that replaces them ({why}): without a network "
                "namespace one of them must keep connections to the proxy",
                "upgrade the kernel, or use the bubblewrap backend where user namespaces work",
            )


def _within(path: Path, root: Path) -> bool:
    # On the strings: Path.parents costs ~50 us a test, and a split grant makes hundreds.
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def _ancestors(paths: Iterable[str]) -> set[str]:
    """Every directory strictly above one of ``paths`` (normalised absolute paths)."""
    out: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in out:
            out.add(parent)
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    return out


def write_grants(
    roots: Iterable[Path], keep: Iterable[Path]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Path, ...]]:
    """Landlock write rules for ``roots`` that leave every path of ``keep`` read-only.

    Returns ``(write, read, split)``: the paths to grant every right, the directories
    that only get read (each directory above a kept path, under a root), and those
    split directories (where nothing new can be created). A root without a kept path
    below it is granted whole. Symbolic links are never granted (the launcher's
    ``O_PATH`` open would follow them out of the root).

    Raises:
        Unavailable: the split would need more rules than the launcher takes.
    """
    # On strings, with the directories above a kept path collected once (this runs on
    # every run, the warm server's too): a directory is split exactly when it is one.
    kept = {os.path.abspath(p) for p in keep}
    above = _ancestors(kept)
    write: list[str] = []
    read: list[str] = []
    split: list[Path] = []

    def grant(directory: str) -> None:
        if directory in kept:
            read.append(directory)  # a kept directory: read-only, whole
            return
        if directory not in above:
            write.append(directory)
            return
        read.append(directory)
        split.append(Path(directory))
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = entry.path
            if path in kept:
                continue  # read through the directory's read rule
            if entry.is_symlink():
                continue
            if path in above:
                grant(path)
            else:
                write.append(path)

    for given in roots:
        root = os.path.abspath(given)
        if not os.path.isdir(root):
            if not any(_within(Path(root), Path(k)) for k in kept):
                write.append(root)
            continue
        if any(_within(Path(root), Path(k)) and root != k for k in kept):
            read.append(root)  # the whole root lies inside a kept directory
            continue
        grant(root)
    if len(write) + len(read) > _MAX_RULES:
        raise Unavailable(
            f"a Landlock rule per entry of {', '.join(map(str, split[:3]))} "
            f"({len(write) + len(read)} rules, at most {_MAX_RULES})",
            "move the files at the top of the workspace into fewer directories, "
            "or use the bubblewrap backend",
        )
    return tuple(write), tuple(read), tuple(split)


def read_grants(
    roots: Iterable[str], hide: Iterable[str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Landlock read rules for ``roots`` that leave every path of ``hide`` unreadable.

    Returns ``(read, list_only)``: paths to grant read and execute, and the directories
    above a hidden path, which may only be listed (their other entries are granted one
    by one). Without a mount namespace nothing can be masked: this is how the secret
    files under /etc (shadow, sudoers, the ssh host keys) stay out of reach of a run as
    root. Symbolic links are not granted (their targets are judged on their own).
    """
    # On strings, with the set of directories above a hidden path made once: this runs
    # on every run (the warm server's too), over /etc's ~150 entries.
    hidden = {os.path.normpath(p) for p in hide if os.path.lexists(p)}
    above = _ancestors(hidden)
    read: list[str] = []
    listed: list[str] = []

    def grant(directory: str) -> None:
        if directory not in above:
            read.append(directory)
            return
        listed.append(directory)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            path = entry.path
            if path in hidden or entry.is_symlink():
                continue
            if path in above:
                grant(path)  # a directory that holds a hidden path: split it too
            else:
                read.append(path)

    for root in roots:
        path = os.path.normpath(root)
        if any(_within(Path(path), Path(h)) for h in hidden):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            grant(path)
        else:
            read.append(root)
    return tuple(read), tuple(listed)


def open_proxy_listener() -> socket.socket:
    """A TCP socket listening on an ephemeral loopback port of the host, for the proxy.

    Any process of the host can connect to it (there is no namespace to give the
    sandbox a socket of its own); the sandbox's Landlock rule lets it reach this port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _has_capabilities() -> bool:
    """Whether this process holds any capability (effective, permitted or ambient)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return True  # unknown: try to drop them (the launcher fails closed if it cannot)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapPrm", "CapAmb") and int(value.strip() or "0", 16):
            return True
    return False


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from ``/proc``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def kill_descendants(pid: int, rounds: int = 50) -> None:
    """SIGKILL every process below ``pid``, again until none is left (or ``rounds``).

    The launcher of a landlock run is a child subreaper: an orphan of the tree is its
    child, so each walk from it finds the whole tree. A process being killed forks no
    more; one forked just before is found on the next walk.
    """
    for _ in range(rounds):
        pids = descendants(pid)
        if not pids:
            return
        for child in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)


def launcher_extras(
    *,
    files: bool,
    egress: bool,
    container: bool,
    proxy_port: int | None,
    write: Sequence[str],
    read: Sequence[str],
    guard: bool = False,
) -> dict[str, object]:
    """The :class:`~stockade.enforce.launcher.LauncherSpec` fields of a landlock run.

    With the files layer off, Landlock still carries the network rule (the egress
    layer's), with ``/`` granted whole: the files layer's grants are then not applied.
    With ``guard`` (ABI < 4) the connect guard carries the network rule instead, and
    the Landlock domain remains for its ptrace restriction.
    """
    net = egress and not guard
    out: dict[str, object] = {
        "handle_net": net,
        "connect_ports": (proxy_port,) if net and proxy_port else (),
        "reaper": container,
        "landlock": files or egress,
    }
    if files:
        out["read_paths"] = tuple(read)
        out["write_paths"] = tuple(write)
    else:
        out["read_paths"] = ()
        out["write_paths"] = ("/",)
        out["scope"] = False
    return out


def choose_backend(policy: Policy, report: Callable[[str], None] | None = None) -> Policy:
    """Resolve ``[container] backend = "auto"``: bubblewrap where user namespaces work,
    the landlock backend only with ``allow_degraded = true`` (and a warning to
    ``report``, which the CLI prints).

    Raises:
        Unavailable: no user namespaces and ``allow_degraded`` is false (the hint names
            the landlock backend and what it loses).
    """
    from stockade.policy._model import ContainerPolicy
    from stockade.runtime import _host

    container = policy.container
    check = _host.userns_check()
    if check.ok:
        return replace(policy, container=replace(container, backend="bubblewrap"))
    if not container.allow_degraded:
        raise Unavailable(f"user namespaces ({check.detail})", f"{check.fix}; {FALLBACK_HINT}")
    if report is not None:
        report(
            f"stockade: warning: no user namespaces here ({check.detail}); "
            'backend "auto" with allow_degraded runs under the landlock backend, without '
            "namespaces ('stockade doctor' lists what that loses)"
        )
    return replace(policy, container=ContainerPolicy(backend="landlock", allow_degraded=True))


def for_landlock(policy: Policy) -> Policy:
    """``policy`` as the landlock backend carries it: no transparent capture (there is no
    namespace to capture in; clients reach the proxy through its variables)."""
    network = policy.network
    if network.transparent:
        policy = replace(policy, network=replace(network, transparent=False))
    return policy


class LandlockRun:
    """One run under the landlock backend: its proxy listener, protected-path grants and
    launcher spec. Made by :func:`stockade.runtime._run.execute`, closed by it."""

    def __init__(
        self,
        policy: Policy,
        audit: AuditLog,
        egress_plan: Any,
        cgroup: bool = False,
        support: Any = None,
    ) -> None:
        self.policy = policy
        #: where the run's cgroup is made (``limits.detect()``), for :meth:`start`'s prime
        self.support = support
        #: makes the run's cgroup (set by the runtime when one can be made): the
        #: launcher is then held (``hold_fd``) until it is inside
        self.make_cgroup: Callable[[], Any] | None = None
        self.cgroup: Any = None
        self.hold_r, self.hold_w = os.pipe() if cgroup else (-1, -1)
        self.audit = audit
        self.egress_plan = egress_plan
        layers = policy.layers
        self.reaper = layers.container
        self.listener: socket.socket | None = None
        self.port: int | None = None
        self.proxy: Any = None
        self.write: tuple[str, ...] = (
            str(policy.filesystem.workspace),
            *map(str, policy.filesystem.write),
        )
        self.read: tuple[str, ...] = ()
        self.masked: tuple[str, ...] = ()
        self.env: dict[str, str] | None = None
        #: the connect guard (Landlock ABI < 4, the egress layer on), else None
        self.guard: Any = None
        if egress_plan is not None:
            from stockade.egress import proxy_environment

            self.listener = open_proxy_listener()
            self.port = int(self.listener.getsockname()[1])
            if needs_guard(egress=layers.egress):
                from stockade.enforce.netguard import ConnectGuard

                self.guard = ConnectGuard((("127.0.0.1", self.port),))
            self.env = {
                **egress_plan.env,
                **proxy_environment(f"http://127.0.0.1:{self.port}"),
            }
        audit.emit(
            "layer_note",
            layer="container",
            verdict="report",
            reason="process-contained",
            detail="landlock backend: no namespaces (host processes visible, named host unix "
            "sockets reachable, HOME and TMPDIR are scratch directories); "
            + (
                "egress off: the host's network"
                if not layers.egress
                else f"egress: connect() only to the proxy at 127.0.0.1:{self.port} (the "
                "connect guard: Landlock has no network rules below ABI 4, stockade performs "
                "each connect() itself), TCP only and no io_uring (seccomp), no transparent "
                "capture"
                if self.guard is not None
                else f"egress: connect() only to the proxy's port {self.port} (Landlock), TCP only "
                "(seccomp), no transparent capture"
            ),
        )

    def protect(self, workspace: Path, caller_env: Mapping[str, str]) -> Claim | None:
        """Make the protected paths' placeholders and split the write grants around
        them and around stockade's own directories (files layer); the claim to release
        at the end, or None with the files layer off."""
        if not self.policy.layers.files:
            return None
        from stockade import _roots
        from stockade.runtime._placeholders import Claim
        from stockade.runtime._state import default_audit_dir

        fs = self.policy.filesystem
        roots = _roots.trust_roots(caller_env)
        #: held out of every read grant too (the CA's private key)
        self.masked = tuple(str(r.path) for r in roots if r.mode == "mask")
        claim = Claim(default_audit_dir().parent, workspace, self.audit.run_id)
        # Listed, never made: bubblewrap needs a placeholder to bind over a protected
        # path that does not exist, Landlock does not. A missing path kept out of the
        # grant splits its directory, where then nothing new can be created, so the
        # path cannot appear; and the run makes and removes no file in the workspace.
        protection = claim.protect(workspace, fs.protect, defer=True, writable=fs.write)
        try:
            write, read, split = write_grants(
                (workspace, *fs.write), (*protection.existing, *(r.path for r in roots))
            )
        except BaseException:
            claim.release()
            raise
        self.write, self.read = write, read
        for directory in split:
            self.audit.emit(
                "layer_note",
                layer="files",
                verdict="report",
                reason="path-protected",
                detail=f"{directory} holds protected paths: without a mount namespace "
                "Landlock keeps them read-only by granting each other entry on its own, "
                "so nothing new can be created directly in it",
                path=str(directory),
            )
        return claim

    def launcher_spec(self, spec: Any, scratch: Path) -> Any:
        """``spec`` (built as for a run without the container) for this backend."""
        from stockade.enforce import seccomp

        layers = self.policy.layers
        extras = launcher_extras(
            files=layers.files,
            egress=layers.egress,
            container=layers.container,
            proxy_port=self.port,
            # The scratch HOME and TMPDIR only: the rest of the run's scratch directory
            # is stockade's (the trust bundle the proxy's clients are given).
            write=(*self.write, str(scratch / "home"), str(scratch / "tmp"), *DEVICES),
            read=(),
            guard=self.guard is not None,
        )
        if layers.files:
            from stockade.policy._tables import SYSTEM_SECRETS

            read, listed = read_grants(
                (*(p for p in spec.read_paths if p not in self.write), *self.read),
                (*SYSTEM_SECRETS, *self.masked),
            )
            extras["read_paths"], extras["list_paths"] = read, listed
        bpf = None
        if layers.syscalls or layers.egress:
            bpf = seccomp.build_filter(
                no_netns=layers.egress,
                net_only=not layers.syscalls,
                guard=self.guard is not None,
            )
        if self.guard is not None:
            extras["observer_fd"] = self.guard.child_fd
            extras["observer_bpf"] = self.guard.program
            extras["guard"] = True
        # Scopes came with ABI 6: below it (or the cap) the model says what is lost.
        extras["scope"] = bool(extras.get("scope", spec.scope)) and usable_abi() >= 6
        return replace(
            spec,
            abi_max=abi_cap(),
            hold_fd=self.hold_r if self.hold_r >= 0 else None,
            seccomp_bpf=bpf,
            seccomp_expected=bpf is not None,
            # Root (or a process with capabilities) gives them up; an unprivileged one
            # has none to give, and may not empty its bounding set (EPERM).
            drop_caps=_has_capabilities(),
            mounts=(),
            **extras,
        )

    def child_fds(self) -> tuple[int, ...]:
        """The descriptors the launcher inherits: its hold and the guard's socket."""
        fds = (self.hold_r,) if self.hold_r >= 0 else ()
        return fds + ((self.guard.child_fd,) if self.guard is not None else ())

    def paused(self) -> float:
        """Seconds the command's wall clock stood still for asks (see RunGate)."""
        gate = self.proxy.gate if self.proxy is not None else None
        return gate.paused_seconds() if gate is not None else 0.0

    def release(self, proc: Any) -> None:
        """Put the launcher in the run's cgroup, then let it go (the ``_Start`` role).

        On any failure the launcher is killed before the command ever starts.
        """
        if self.hold_r < 0:
            return
        os.close(self.hold_r)
        self.hold_r = -1
        try:
            if self.make_cgroup is not None:
                self.cgroup = self.make_cgroup()
            if self.cgroup is not None:
                self.cgroup.add(proc.pid)
        except BaseException:
            kill_descendants(proc.pid)
            proc.kill()
            proc.wait()
            raise
        os.write(self.hold_w, b"1")
        os.close(self.hold_w)
        self.hold_w = -1

    def start(self, argv: Sequence[str]) -> None:
        """Serve the proxy on the host listener and start the connect guard's
        supervisor (before the command starts)."""
        if self.support is not None and self.hold_r >= 0:
            # The launcher waits, held, until it is moved into the run's cgroup, and the
            # first move after a quiet spell waits for an RCU grace period (~10 ms, see
            # limits.prime_attach). The runtime's prime, at the run's start, is long
            # expired by now: prime again, so that the grace period passes while the
            # proxy starts and the launcher is spawned, not while the launcher waits.
            from stockade.runtime import _cgroup

            _cgroup.prime(self.support)
        if self.guard is not None:
            self.guard.start()
        if self.listener is None or self.egress_plan is None:
            return
        self.proxy = self.egress_plan.proxy(self.audit, argv)
        listener, self.listener = self.listener, None
        self.proxy.serve_listener(listener)

    def close(self) -> None:
        """Stop the proxy (its listener closes with it: the sandbox has no way out); empty
        and remove the cgroup (killing what is left when the container layer, the
        reaper, is on)."""
        for fd in (self.hold_r, self.hold_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.hold_r = self.hold_w = -1
        if self.guard is not None:
            self._close_guard()
        if self.cgroup is not None:
            if self.cgroup.oom_killed():
                from stockade.policy import Decision, Reason

                self.audit.decision(
                    "denied",
                    Decision.deny(
                        "limits", Reason.LIMIT_MEMORY, detail="out of memory in the run's cgroup"
                    ),
                )
            self.cgroup.remove(kill=self.reaper)
            self.cgroup = None
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _close_guard(self) -> None:
        """Stop the connect guard and log what it did (and why it failed, if it did)."""
        guard, self.guard = self.guard, None
        guard.stop()
        if guard.error is not None:
            import sys

            # The launcher's verification names the guard; this says why it failed.
            print(f"stockade: {guard.error}", file=sys.stderr)
        self.audit.emit(
            "layer_note",
            layer="egress",
            verdict="report",
            reason="unsupported-protocol",
            detail=f"connect guard: {guard.performed} connect() performed for the command, "
            f"{guard.refused} refused"
            + (f" ({', '.join(guard.examples)})" if guard.examples else "")
            + (f"; {guard.error}" if guard.error else ""),
        )


def _sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _unshare_newuser_errno() -> int:
    """Try ``unshare(CLONE_NEWUSER)`` in a forked child: 0 when it works, else its errno.

    The child is thrown away, so this process keeps its namespaces; trying is the only
    way to see a seccomp filter (a container's, a pod's profile) that refuses it.
    """
    import ctypes

    from stockade._libc import libc

    clone_newuser = 0x10000000
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            if libc().unshare(clone_newuser) != 0:
                code = ctypes.get_errno() or 255
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 255


def userns_restrictions() -> list[tuple[str, str]]:
    """The configurations of this host that refuse (unprivileged) user namespaces, each
    as ``(what applies, what fixes it)``; empty when none does."""
    out: list[tuple[str, str]] = []
    unprivileged = os.geteuid() != 0
    if _sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1" and unprivileged:
        out.append(
            (
                "AppArmor restricts unprivileged user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns=1, Ubuntu 23.10+)",
                "install an AppArmor profile for bwrap that allows them: /etc/apparmor.d/bwrap "
                "with 'abi <abi/4.0>, include <tunables/global> profile bwrap /usr/bin/bwrap "
                "flags=(unconfined) { userns, }', then 'sudo apparmor_parser -r "
                "/etc/apparmor.d/bwrap' (or sudo sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0)",
            )
        )
    if _sysctl("/proc/sys/user/max_user_namespaces") == "0":
        out.append(
            (
                "user namespaces are switched off (user.max_user_namespaces=0)",
                "sudo sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)",
            )
        )
    if _sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0" and unprivileged:
        out.append(
            (
                "unprivileged user namespaces are switched off "
                "(kernel.unprivileged_userns_clone=0, Debian)",
                "sudo sysctl -w kernel.unprivileged_userns_clone=1",
            )
        )
    if not out:
        err = _unshare_newuser_errno()
        if err:
            import errno as errno_names

            name = errno_names.errorcode.get(err, str(err))
            seccomp = "Seccomp:\t2" in (_sysctl("/proc/self/status") or "")
            out.append(
                (
                    f"unshare(CLONE_NEWUSER) fails with {name}"
                    + (
                        " under a seccomp filter (a container runtime's or a pod's profile)"
                        if seccomp
                        else ""
                    ),
                    "run the container with a seccomp profile that allows unshare and clone "
                    "with CLONE_NEWUSER (Kubernetes: securityContext.seccompProfile of type "
                    "Localhost, or Unconfined; Docker/Podman: --security-opt seccomp=PROFILE)"
                    if seccomp
                    else "check the host's security modules and sysctls",
                )
            )
    return out
