"""A run's plan: every decision about one run, made before anything of it starts.

:func:`plan` reads the policy, the request and the host (which tools exist, which
kernel features answer, which paths match the deny globs, which terminals the caller
holds) and returns a frozen :class:`RunPlan`. It starts no process of its own, opens no
socket and writes no file: the run's scratch directory is *named* here (its paths are
part of the plan) and made by the executor (:mod:`._run`) when first needed. The host
facts it needs come from the cached probes that ``stockade doctor`` also uses (for
``backend = "auto"``, bubblewrap's user-namespace check; under gVisor, ``runsc
--version``): each runs at most once per process, so a plan built twice starts nothing
the second time. ``stockade check --plan`` prints what :meth:`RunPlan.describe` says.

What the plan cannot hold is what only exists once the run has begun: the audit log
(opened by the executor, refused if it has other links), the protected paths'
placeholders (claimed under the workspace's lock, which another run may change until
then), the egress proxy's CA and resolver files, the overlay layer. The executor makes
those in that order and builds the mount plan and the launcher's spec from the plan and
them (:func:`launcher_spec` is the one constructor of the spec).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stockade import _roots
from stockade._exceptions import SandboxError, Unavailable
from stockade._record import record
from stockade.enforce import bubblewrap, environment, paths
from stockade.policy import Policy
from stockade.policy._tables import SYSTEM_PATHS
from stockade.runtime import _cgroup, _host, _pty, _scratch
from stockade.runtime._spawn import stdio
from stockade.runtime._state import default_audit_dir

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade._roots import Narrowed
    from stockade.enforce.gvisor import Runsc
    from stockade.enforce.limits import CgroupSupport
    from stockade.runtime._request import RunRequest

#: the port the egress proxy listens on inside every sandbox's network namespace
#: (runtime/_egress.py serves it; the plan names it without importing the proxy)
PROXY_PORT = 3128
#: the resolver's port inside the namespace (egress/_netns.py's DNS_PORT)
DNS_PORT = 53


@record
class EgressOutline:
    """What the egress proxy of a run will serve, and where it will listen."""

    #: where the command reaches the proxy (inside its network namespace, or a host
    #: port for the landlock backend)
    proxy: str
    #: stockade's resolver answers the sandbox's name lookups (``network.transparent``)
    resolver: bool
    #: ports whose connections are captured and decided like a CONNECT
    capture_ports: tuple[int, ...]
    allow: tuple[str, ...]
    deny: tuple[str, ...]
    #: requests to some hosts are inspected (rules, bound secrets, labels)
    inspected: bool
    #: the operator's upstream proxy, as the policy names it (None: direct)
    upstream: str | None
    #: off-list hosts may be asked about (an approver or live grants)
    asks: bool


@record
class RunPlan:
    """Every decision about one run, made before it starts (see the module docstring)."""

    argv: tuple[str, ...]
    #: the effective policy (``backend = "auto"`` resolved, the landlock backend's form)
    policy: Policy
    #: "bubblewrap", "gvisor" or "landlock"
    backend: str
    #: the bwrap to run (None: no bubblewrap, e.g. every layer that needs it is off)
    bwrap: str | None
    #: the runsc to run (:class:`stockade.enforce.gvisor.Runsc`, gVisor only)
    runsc: Runsc | None
    run_id: str
    #: the audit log's file (None: events in memory only)
    audit_path: Path | None
    #: the caller named ``audit_path`` (``--audit``), rather than it being the default
    audit_explicit: bool
    #: the state directory the executor makes first, and what stockade keeps there
    state_dir: tuple[Path, str, bool] | None
    cwd: Path
    home: Path
    #: the run's scratch directory: named, not made
    scratch: Path
    caller_env: Mapping[str, str]
    terminal: _pty.Choice
    #: the inner launcher runs (files, syscalls or limits layer, a pty, or no container)
    use_launcher: bool
    #: bubblewrap (or runsc) holds the command until released (cgroup, proxy)
    handshake: bool
    #: where the run's cgroup can be made (:class:`stockade.enforce.limits.CgroupSupport`)
    cgroup: CgroupSupport | None
    #: the wall-clock limit: the request's or the policy's, whichever is shorter
    timeout: float | None
    #: None: the egress layer is off (the host's network, or none)
    egress: EgressOutline | None
    #: the workspace is an overlay (writes land in a layer, for review)
    overlay: bool
    deny: paths.DenyMatches
    toolchains: tuple[Path, ...]
    #: stockade's own directories a grant would expose, kept read-only (or masked)
    narrowed: tuple[Narrowed, ...]

    @property
    def gvisor(self) -> bool:
        return self.backend == "gvisor"

    @property
    def landlock(self) -> bool:
        return self.backend == "landlock"

    @property
    def contained(self) -> bool:
        """The sandbox has a mount namespace of its own (the container layer, under
        bubblewrap or gVisor)."""
        return self.policy.layers.container and not self.landlock

    @property
    def bwrap_runs(self) -> bool:
        """bubblewrap is the sandbox's outermost process."""
        layers = self.policy.layers
        return self.bwrap is not None and (layers.container or layers.egress)

    def describe(self) -> dict[str, Any]:
        """The plan as plain data (``stockade check --plan --json``); the command's
        environment by name only (its values may be secrets)."""
        layers = self.policy.layers
        limits = self.policy.limits
        fs = self.policy.filesystem
        return {
            "argv": list(self.argv),
            "backend": self.backend,
            "layers": list(layers.active()),
            "tools": {
                "bwrap": self.bwrap if self.bwrap_runs else None,
                "runsc": str(self.runsc.path) if self.runsc is not None else None,
                "launcher": self.use_launcher,
            },
            "audit": str(self.audit_path) if self.audit_path is not None else None,
            "cwd": str(self.cwd),
            "home": str(self.home),
            "scratch": str(self.scratch),
            "container": {
                "isolated": self.contained,
                "workspace": str(fs.workspace),
                "read": [str(p) for p in fs.read],
                "write": [str(p) for p in fs.write],
                "toolchains": [str(p) for p in self.toolchains],
                "masked_files": [str(p) for p in self.deny.files],
                "masked_dirs": [str(p) for p in self.deny.dirs],
                "narrowed": [n.describe() for n in self.narrowed],
                "overlay": self.overlay,
            },
            "limits": {
                "wall_seconds": self.timeout,
                "cgroup": self.cgroup is not None,
                "pids": limits.pids if layers.limits else None,
                "memory": limits.memory if layers.limits else None,
                "file_size": limits.file_size if layers.limits else None,
                "cpu_seconds": (limits.cpu_seconds or None) if layers.limits else None,
            },
            "terminal": {
                "interactive": self.terminal.interactive,
                "relayed": self.terminal.relayed,
            },
            "handshake": self.handshake,
            "egress": (
                None
                if self.egress is None
                else {
                    "proxy": self.egress.proxy,
                    "resolver": self.egress.resolver,
                    "capture_ports": list(self.egress.capture_ports),
                    "allow": list(self.egress.allow),
                    "deny": list(self.egress.deny),
                    "inspected": self.egress.inspected,
                    "upstream": self.egress.upstream,
                    "asks": self.egress.asks,
                }
            ),
        }


def plan(request: RunRequest, report: Callable[[str], None] | None = None) -> RunPlan:
    """Decide everything about ``request``'s run; start nothing (module docstring).
    ``report``: where a warning for the person goes (the CLI prints it).

    Raises:
        Unavailable: a layer the policy asks for cannot be applied on this host.
        SandboxError: the request cannot be run as asked (no command, a bad ``cwd``, a
            host tool inside a writable path, a deny glob that takes too long).
    """
    policy = request.policy
    if not request.argv:
        raise SandboxError("no command given; usage: stockade run [OPTIONS] -- COMMAND [ARGS...]")
    if policy.container.backend == "auto":
        from stockade.runtime._landlock import choose_backend

        policy = choose_backend(policy, report)
    if _landlock_backend(policy):
        from stockade.runtime._landlock import for_landlock

        policy = for_landlock(policy)
    bwrap = _require_layers(policy)
    runsc = None
    if _gvisor(policy):
        from stockade.enforce import gvisor

        # Missing or too old: Unavailable (exit 125), never a fallback to bubblewrap.
        runsc = gvisor.require_runsc()
    _refuse_writable_tools(policy, bwrap, runsc.path if runsc is not None else None)
    run_id = os.urandom(6).hex()  # uuid would cost ~10 ms of imports per run
    layers = policy.layers
    landlock = _landlock_backend(policy)
    audit_path = request.audit_path
    default_audit = audit_path is None and request.audit_to_file
    # Made by the executor before the audit log opens: a read-only HOME gets a message
    # that names the directory and the fix.
    state_dir: tuple[Path, str, bool] | None = None
    if default_audit:
        state_dir = (default_audit_dir(), "its audit logs", True)
        audit_path = default_audit_dir() / f"{_timestamp()}-{run_id}.jsonl"
    elif layers.container:
        state_dir = (default_audit_dir().parent, "the workspaces' placeholder registry", False)
    caller_env = dict(os.environ if request.caller_env is None else request.caller_env)
    fs = policy.filesystem
    home = paths.caller_home(caller_env)
    cwd = _working_dir(request, policy, home)
    support = (
        _cgroup.support(policy) if bwrap is not None or runsc is not None or landlock else None
    )
    # bwrap holds the command (--block-fd, see _handshake) while a cgroup or a proxy is
    # wired. The gVisor entry always speaks the handshake (it makes the namespaces, then
    # waits).
    handshake = not landlock and (support is not None or layers.egress or runsc is not None)
    try:
        deny = paths.expand_deny(fs.deny, fs.workspace, (*fs.read, *fs.write))
    except TimeoutError as exc:
        raise SandboxError(
            f"filesystem.deny: expanding {exc.args[0]!r} took more than "
            f"{paths.DENY_GLOB_BUDGET_S:g}s; make the glob narrower"
        ) from None
    toolchains = paths.toolchain_paths(
        caller_env.get("PATH", ""), home, denied=(*deny.dirs, *deny.files)
    )
    # stockade's own directories (config, state, cache, CA, its code) that a grant would
    # expose: read-only (or masked) inside, whatever the grant.
    narrowed = _roots.narrowed((fs.workspace, *fs.write), visible=(*fs.read, *toolchains))
    # Every terminal of the caller's among the command's 0, 1, 2 is replaced by a pty or
    # pipe of stockade's own (_pty's table); a terminal stdin makes the pty the command's
    # controlling terminal, which the launcher sets up.
    terminal = _pty.choose(*stdio(request), allow_pty=request.allow_pty, gvisor=runsc is not None)
    use_launcher = (
        layers.files
        or layers.syscalls
        or layers.limits
        or terminal.interactive
        or not layers.container
        or landlock
    )
    return RunPlan(
        argv=tuple(request.argv),
        policy=policy,
        backend=policy.container.backend,
        bwrap=bwrap,
        runsc=runsc,
        run_id=run_id,
        audit_path=audit_path,
        audit_explicit=request.audit_path is not None,
        state_dir=state_dir,
        cwd=cwd,
        home=home,
        scratch=_scratch.choose(),
        caller_env=caller_env,
        terminal=terminal,
        use_launcher=use_launcher,
        handshake=handshake,
        cgroup=support,
        timeout=_wall_timeout(request.timeout, policy),
        egress=_egress_outline(policy, landlock, request.approval is not None)
        if layers.egress
        else None,
        overlay=fs.overlay or request.overlay_layer is not None,
        deny=deny,
        toolchains=tuple(toolchains),
        narrowed=tuple(narrowed),
    )


def _timestamp() -> str:
    import time

    return time.strftime("%Y%m%dT%H%M%S")


def _egress_outline(policy: Policy, landlock: bool, asks: bool) -> EgressOutline:
    """What the proxy will serve (the policy's rules; the executor's proxy is built from
    the same policy by ``egress.build_proxy``)."""
    from stockade.policy._inspect import wants_inspection
    from stockade.policy._network import EgressRules

    network = policy.network
    capture: tuple[int, ...] = ()
    if network.transparent:
        reserved = {PROXY_PORT, DNS_PORT}
        capture = tuple(
            p for p in EgressRules.from_policy(network).capture_ports() if p not in reserved
        )
    upstream = network.upstream
    return EgressOutline(
        proxy="a host port named in the proxy variables"
        if landlock
        else f"127.0.0.1:{PROXY_PORT} in the sandbox's network namespace",
        resolver=network.transparent,
        capture_ports=capture,
        allow=tuple(network.allow),
        deny=tuple(network.deny),
        inspected=wants_inspection(policy),
        upstream=getattr(upstream, "proxy", None) or None,
        asks=asks,
    )


def _wall_timeout(requested: float | None, policy: Policy) -> float | None:
    """The shorter of the request's timeout and the policy's ``limits.wall_seconds``."""
    limits = policy.limits
    candidates = [t for t in (requested,) if t]
    if policy.layers.limits and limits.wall_seconds:
        candidates.append(limits.wall_seconds)
    return min(candidates) if candidates else None


def _gvisor(policy: Policy) -> bool:
    """Whether this run's container is gVisor's (the policy or ``--backend`` chose it)."""
    return policy.container.backend == "gvisor"


def _landlock_backend(policy: Policy) -> bool:
    """Whether this run has no namespaces (``[container] backend = "landlock"``)."""
    return policy.container.backend == "landlock"


def _require_layers(policy: Policy) -> str | None:
    """Check every requested layer can be applied; return the bwrap path when needed."""
    layers = policy.layers
    bwrap = None
    if _gvisor(policy):
        if not layers.container:
            # gVisor is the container; without it there would be no kernel of its own,
            # which the policy asked for: refuse rather than run on the host kernel.
            raise Unavailable(
                '[container] backend = "gvisor" with the container layer off',
                "keep the container layer on, or choose --backend bubblewrap",
            )
    elif _landlock_backend(policy):
        from stockade.runtime import _landlock

        _landlock.require(files=layers.files, egress=layers.egress)
    elif layers.container or layers.egress:
        # Whether user namespaces work is learnt from bwrap's status fd on the real run
        # (a failed set-up never starts the command); probing first would cost a run.
        bwrap = _host.require_bwrap()
    if layers.files or layers.syscalls:
        try:
            from stockade.enforce import launcher  # noqa: F401
        except ImportError:
            raise Unavailable(
                "the inner launcher (files and syscalls layers)",
                "this build has no launcher; run with --disable files --disable syscalls",
            ) from None
    if layers.files and not _gvisor(policy):
        # Under gVisor there is no Landlock (ENOSYS): the mount plan is the files layer.
        _host.require_landlock()
    if layers.syscalls and not _host.seccomp_available():
        raise Unavailable(
            "seccomp (syscalls layer)",
            "use a kernel with CONFIG_SECCOMP_FILTER, or run with --disable syscalls",
        )
    return bwrap


def _refuse_writable_tools(policy: Policy, *tools: str | Path | None) -> None:
    """Refuse to start a host-side tool (bwrap, runsc) that lies where this run's
    sandbox can write: found on a PATH that holds the workspace's ``.venv/bin`` or
    ``node_modules/.bin``, the next run would execute what this one wrote, on the host."""
    fs = policy.filesystem
    writable = (fs.workspace, *fs.write)
    for tool in tools:
        if tool is None:
            continue
        root = _roots.writable_root(Path(tool), writable)
        if root is not None:
            raise SandboxError(
                f"{tool} lies inside {root}, which the sandbox can write, and runs on the "
                "host; install it system-wide, or name one outside every writable path "
                "(STOCKADE_BWRAP, STOCKADE_RUNSC)"
            )


def _working_dir(request: RunRequest, policy: Policy, home: Path) -> Path:
    """The command's working directory.

    The caller's current directory when inside the workspace, else the workspace; a
    ``cwd`` given explicitly may also be any directory the files layer lets the command
    read (``/``, a ``filesystem.read`` entry, ``/tmp`` of a session scratch).

    Raises:
        SandboxError: an explicit ``cwd`` the command could not read.
    """
    workspace = policy.filesystem.workspace
    if request.cwd is None:
        cwd = Path.cwd().resolve()
        return cwd if cwd == workspace or workspace in cwd.parents else workspace
    cwd = request.cwd.resolve()
    if cwd == workspace or workspace in cwd.parents:
        return cwd
    from stockade.enforce import access

    if access.readable_dir(policy, cwd, home):
        return cwd
    tmp = Path("/tmp")
    if (
        request.tmp is not None
        and policy.layers.container
        and (request.cwd == tmp or tmp in request.cwd.parents)
    ):
        # The session scratch is /tmp inside (under the binds of the workspace and the
        # granted paths); the host directory of the same name is not it.
        if not (request.tmp / request.cwd.relative_to(tmp)).is_dir():
            raise SandboxError(f"cwd {request.cwd}: no such directory in the session's /tmp")
        return request.cwd
    raise SandboxError(
        f"cwd {request.cwd}: not a directory the sandbox can read "
        "(the workspace, filesystem.read or write, or a system path)"
    )


def resolve_command(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str | None:
    """Where ``argv[0]`` will be found, by the child's PATH; None when nowhere."""
    cmd = argv[0]
    if "/" in cmd:
        path = cmd if os.path.isabs(cmd) else str(cwd / cmd)
        return path if os.path.exists(path) else None
    return _host.which(cmd, env.get("PATH", environment.DEFAULT_PATH))


@functools.cache
def seccomp_filter() -> bytes:
    """The syscalls layer's filter: pure and the same for every run of this process."""
    from stockade.enforce import seccomp

    return seccomp.build_filter()


def launcher_spec(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: Path,
    ctty: bool,
    *,
    gvisor: bool = False,
    cgroup: bool = True,
) -> Any:
    """The :class:`~stockade.enforce.launcher.LauncherSpec` for a run of ``policy`` with
    the mount plan ``plan`` and the scratch directory ``scratch`` (its path only)."""
    from stockade.enforce import launcher

    layers = policy.layers
    fs = policy.filesystem
    system = [p for p in SYSTEM_PATHS if os.path.exists(p)]
    if plan.isolate:
        # Inside the container: the binds are the world; Landlock re-checks them on
        # the real inodes, so a mistake in the binds is not an escape.
        scratch_rw = [str(plan.home), "/tmp", "/var/tmp", "/dev/shm"]
        read = [*system, *map(str, plan.toolchains), "/proc", bubblewrap.STOCKADE_DIR]
    else:
        scratch_rw = [str(scratch), *([str(plan.tmp)] if plan.tmp else [])]
        read = [*system, *map(str, plan.toolchains), "/proc"]
    # a learning run's scratch views: writable, each through its own overlay
    views = [str(directory) for directory, _ in plan.scratch]
    write = [str(fs.workspace), *map(str, fs.write), *views, *scratch_rw, "/dev"]
    limits = policy.limits
    rlimits: list[tuple[str, int]] = []
    if layers.limits:
        rlimits += [("fsize", limits.file_size), ("data", limits.memory)]
        if plan.isolate:
            # RLIMIT_NPROC counts per user namespace: with the container's own user
            # namespace it caps this sandbox alone; without it, it would count every
            # process of the user on the host, so it is only set inside the container.
            rlimits.append(("nproc", limits.pids))
        if gvisor and not cgroup:
            # The Sentry does not apply RLIMIT_DATA to mmap (a 300 MiB mapping under a
            # 200 MiB limit succeeds there); RLIMIT_AS it does. Without a cgroup holding
            # the runsc tree's memory, it is the only memory bound under gVisor.
            rlimits.append(("as", limits.memory))
        if limits.cpu_seconds:
            rlimits.append(("cpu", limits.cpu_seconds))
    # What is bound in to be read (the resolver's files, trust stores) is read by Landlock's
    # leave too; in the netns-only form plan.read holds the trust stores alone.
    extra_read = [*map(str, plan.read), *(inside for _, inside in plan.files)]
    return launcher.LauncherSpec(
        read_paths=(*read, *map(str, fs.read), *extra_read),
        write_paths=tuple(write),
        # gVisor has no Landlock (ENOSYS): there the mount plan is the files layer.
        landlock=layers.files and not gvisor,
        scope=layers.files and not gvisor and _host.landlock_abi() >= 6,
        seccomp_bpf=seccomp_filter() if layers.syscalls else None,
        seccomp_expected=layers.syscalls,
        rlimits=tuple(rlimits),
        ctty=ctty,
        # bubblewrap drops every capability (--cap-drop ALL); without it, the launcher
        # does. Under gVisor the spec's capability sets are empty.
        drop_caps=not (layers.container or layers.egress),
        mounts=() if gvisor else tuple(bubblewrap.launcher_mounts(plan)),
        overlay_layer=bubblewrap.OVERLAY_DIR if plan.overlay is not None else None,
    )
