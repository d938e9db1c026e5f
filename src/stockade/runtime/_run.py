"""One sandboxed run, from policy to exit code.

The order matters and is the same every time: check that every layer the policy asks
for can be applied (refuse otherwise: fail closed), open the audit log (refuse if it
cannot be written, never run unaudited; or if the sandbox could write it: see
:mod:`._audit_guard`), plan the mounts, environment and launcher,
start the egress proxy if the policy allows any host, spawn bubblewrap, relay the
terminal, wait (killing the whole tree on timeout), clean up and audit the end.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from stockade import _roots
from stockade._exceptions import (
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    SandboxError,
    Unavailable,
)
from stockade._fs import remove_tree
from stockade._process import alive
from stockade._record import field, record, replace
from stockade.audit import AuditLog
from stockade.enforce import bubblewrap, environment, paths
from stockade.policy import Decision, Policy, Reason, Verdict
from stockade.policy._tables import SYSTEM_PATHS
from stockade.runtime import _audit_guard, _host, _newrepo, _placeholders, _pty

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    Event = dict[str, "Any"]
    from typing import IO, Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_audit_dir() -> Path:
    """``$XDG_STATE_HOME/stockade/runs`` (``~/.local/state`` when unset or relative): in
    stockade's state, the trust root every sandbox gets read-only."""
    return _roots.state_dir() / "runs"


def require_state_dir(path: Path, what: str, *, audit_option: bool = False) -> None:
    """Make stockade's state directory ``path`` (where it keeps ``what``), or raise a
    :class:`SandboxError` that names it and the fix (``XDG_STATE_HOME``)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        either = " (or pass --audit FILE)" if audit_option else ""
        raise SandboxError(
            f"cannot create {path}, where stockade keeps {what}: {exc.strerror}; set "
            f"XDG_STATE_HOME to a writable directory{either}"
        ) from None


@record(frozen=False)
class RunRequest:
    """What to run and how; the policy is already loaded and validated."""

    argv: Sequence[str]
    policy: Policy
    cwd: Path | None = None
    #: append events here; None means one new file per run under the state directory
    audit_path: Path | None = None
    #: keep events in memory only (the API may ask for that); never for the CLI
    audit_to_file: bool = True
    timeout: float | None = None
    stdin: int | IO[Any] | None = None
    stdout: int | IO[Any] | None = None
    stderr: int | IO[Any] | None = None
    input: bytes | None = None
    capture_output: bool = False
    #: a terminal on stdin is relayed through a pty of the command's own (interactive);
    #: False: it is replaced by /dev/null. A terminal on stdout or stderr is relayed
    #: either way: the sandbox never holds the caller's terminal (:mod:`._pty`)
    allow_pty: bool = True
    #: forward SIGINT/SIGTERM/SIGHUP received by this process to the command
    forward_signals: bool = False
    caller_env: Mapping[str, str] | None = None
    on_event: Callable[[Event], None] | None = None
    #: the egress preparation shared by the runs of one Sandbox (None: made per run)
    egress: Any = None
    #: the approval broker (:class:`~stockade.egress.approval.ApprovalBroker`): asks and
    #: live changes; None: the policy is all there is
    approval: Any = None
    #: a :class:`~stockade.runtime._cancel.RunHandle`: the sandbox's outermost process is
    #: attached to it once started, so another thread can kill the tree (cancellation,
    #: ``Sandbox.popen``)
    handle: Any = None
    #: a host directory bound at /tmp (``Sandbox(tmp="session")``); None: a fresh tmpfs
    tmp: Path | None = None
    #: an overlay workspace's existing layer (:class:`stockade.workspace.Layer`) to mount
    #: again, as the runs of one overlay Sandbox share one; None: a new one per run
    overlay_layer: Any = None
    #: the learn mode's file observer (:class:`stockade.enforce.observe.SyscallObserver`):
    #: the launcher hands it a seccomp listener; None: nothing is observed
    observer: Any = None


@record(frozen=False)
class RunResult:
    """The outcome of one run."""

    argv: list[str]
    returncode: int
    run_id: str
    stdout: bytes | None = None
    stderr: bytes | None = None
    events: list[Event] = field(default_factory=list)
    audit_path: Path | None = None
    timed_out: bool = False
    duration: float = 0.0
    #: an overlay run's layer directory (``stockade changes RUN_ID`` reads it)
    layer: Path | None = None

    @property
    def denials(self) -> list[Event]:
        """The events whose verdict is ``deny``."""
        return [e for e in self.events if e.get("verdict") == "deny"]

    @property
    def changes(self) -> list[Any]:
        """An overlay run's changes (:class:`stockade.workspace.Change`); [] otherwise."""
        if self.layer is None:
            return []
        from stockade.workspace import Layer, scan

        return scan(Layer(self.layer))


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


def _resolve_command(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str | None:
    """Where ``argv[0]`` will be found, by the child's PATH; None when nowhere."""
    cmd = argv[0]
    if "/" in cmd:
        path = cmd if os.path.isabs(cmd) else str(cwd / cmd)
        return path if os.path.exists(path) else None
    return _host.which(cmd, env.get("PATH", environment.DEFAULT_PATH))


def _sweep_leftovers() -> None:
    """Remove the scratch directories of stockade processes that are gone."""
    base = _temp_base()
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith("stockade-")]
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) != 3 or not parts[1].isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        if alive(int(parts[1])):
            continue  # its owner still runs (or it is another user's)
        import shutil

        shutil.rmtree(entry.path, ignore_errors=True)


def _temp_base() -> Path:
    """Where scratch directories go: ``$TMPDIR``, else /tmp (tempfile costs ~10 ms)."""
    return _roots.scratch_base()


class _Scratch:
    """A private scratch directory for one run, named after this process, made when first
    asked for: a contained run without egress needs none (and a mkdir and rmdir in /tmp
    cost about a millisecond on a slow disk).

    What a run killed with SIGKILL leaves behind is removed by the next run, once the
    process named in it is gone (placeholders: see :mod:`._placeholders`).
    """

    def __init__(self) -> None:
        self._path: Path | None = None
        self._sweeper: Any = None

    def sweep_in_background(self) -> None:
        """Sweep the scratch directories of killed runs in a thread, once.

        Called once the command runs: the run's own thread then mostly waits for it
        without the GIL, where a sweeping thread started earlier would take turns with
        its planning (each of whose system calls may wait for the GIL a while).
        """
        if self._sweeper is None:
            import threading

            self._sweeper = threading.Thread(
                target=_sweep_leftovers, name="stockade-sweep", daemon=True
            )
            self._sweeper.start()

    @property
    def path(self) -> Path:
        if self._path is None:
            base = _temp_base()
            while True:
                path = base / f"stockade-{os.getpid()}-{os.urandom(4).hex()}"
                try:
                    path.mkdir(mode=0o700)
                    break
                except FileExistsError:
                    continue
            self._path = path
        return self._path

    def remove(self) -> None:
        """Remove the directory (if it was made); finish the sweep (or make it now)."""
        if self._path is not None:
            remove_tree(self._path)
            self._path = None
        if self._sweeper is None:
            _sweep_leftovers()  # the command never started
        else:
            self._sweeper.join()


@contextlib.contextmanager
def _scratch() -> Iterator[_Scratch]:
    """A :class:`_Scratch` for one run, removed (if it was made) at the end, when the
    scratch directories of killed runs have been swept too."""
    scratch = _Scratch()
    try:
        yield scratch
    finally:
        scratch.remove()


def execute(request: RunRequest) -> RunResult:
    """Run ``request.argv`` in the sandbox described by ``request.policy``.

    Raises:
        Unavailable: a layer the policy asks for cannot be applied on this host.
        SandboxError: the sandbox could not be set up (the audit log says why).
    """
    policy = request.policy
    if not request.argv:
        raise SandboxError("no command given; usage: stockade run [OPTIONS] -- COMMAND [ARGS...]")
    if policy.container.backend == "auto":
        from stockade.runtime._landlock import choose_backend

        policy = choose_backend(policy)
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
    audit_path = request.audit_path
    default_audit = audit_path is None and request.audit_to_file
    # Checked before the audit log opens: a run refused here has nothing to record, and
    # a read-only HOME gets a message that names the directory and the fix.
    if default_audit:
        require_state_dir(default_audit_dir(), "its audit logs", audit_option=True)
    elif policy.layers.container:
        require_state_dir(default_audit_dir().parent, "the workspaces' placeholder registry")
    if default_audit:
        audit_path = default_audit_dir() / f"{time.strftime('%Y%m%dT%H%M%S')}-{run_id}.jsonl"
    if audit_path is not None:
        _audit_guard.refuse_reachable(audit_path, policy, explicit=request.audit_path is not None)
    audit = AuditLog(run_id, audit_path)
    if audit_path is not None:
        _audit_guard.refuse_linked(audit)
    if request.on_event is not None:
        audit.subscribe(request.on_event)
    started = time.monotonic()
    try:
        return _execute(request, policy, bwrap, audit, started, runsc)
    finally:
        audit.close()
        _audit_guard.record_head(audit)


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


def _execute(
    request: RunRequest,
    policy: Policy,
    bwrap: str | None,
    audit: AuditLog,
    started: float,
    runsc: Any = None,
) -> RunResult:
    caller_env = dict(os.environ if request.caller_env is None else request.caller_env)
    fs = policy.filesystem
    workspace = fs.workspace
    home = paths.caller_home(caller_env)
    cwd = _working_dir(request, policy, home)
    layers = policy.layers
    # Timestamps on disk come from the kernel's coarse clock: a margin, not an instant.
    wall_started = time.time() - 1.0
    landlock = _landlock_backend(policy)
    support = (
        _cgroup_support(policy) if bwrap is not None or runsc is not None or landlock else None
    )
    audit.emit(
        "run_start",
        policy_hash=policy.digest(),
        policy_sources=list(policy.sources),
        layers=list(layers.active()),
        argv=list(request.argv),
        workspace=str(workspace),
        cwd=str(cwd),
    )
    for warning in policy.warnings:
        audit.emit(
            "policy_warning",
            layer="egress",
            verdict="report",
            reason="host-not-allowed",
            detail=warning,
        )
    for note in policy.notes:
        audit.emit(
            "policy_note", layer="files", verdict="report", reason="path-resolved", detail=note
        )

    # The proxy runs whenever the egress layer is on, even with nothing allowed: its
    # resolver and capture listeners answer (and refuse) every attempt, so that each one
    # is a decision in the audit log (a dns_query or net_connect deny) rather than a
    # silent "could not resolve host" in an empty namespace. An approver or live grants
    # need it too: the proxy is where an off-list connection waits for its answer.
    approval = request.approval
    needs_proxy = layers.egress
    # bwrap holds the command (--block-fd, see _Start) while a cgroup or a proxy is wired.
    # The gVisor entry always speaks the handshake (it makes the namespaces, then waits).
    handshake = not landlock and (support is not None or needs_proxy or runsc is not None)
    #: the landlock backend's run (None under bubblewrap or gVisor)
    ll: Any = None

    protection = paths.Protection((), (), ())
    claim: _placeholders.Claim | None = None
    staged: _newrepo.Staged | None = None
    overlay_layer: Any = None
    returncode = 0
    timed_out = False
    stdout_data: bytes | None = None
    stderr_data: bytes | None = None
    try:
        with _scratch() as scratch:
            egress_plan = None
            own_plan = False
            if needs_proxy:
                egress_plan = request.egress
                if egress_plan is None:
                    from stockade.runtime._egress import EgressPlan

                    egress_plan = EgressPlan(
                        policy,
                        caller_env,
                        scratch.path,
                        bubblewrap.STOCKADE_DIR if layers.container and not landlock else None,
                        approvals=approval,
                    )
                    own_plan = True
            extra_env = egress_plan.env if egress_plan else None
            if landlock:
                from stockade.runtime._landlock import LandlockRun

                ll = LandlockRun(policy, audit, egress_plan, cgroup=support is not None)
                extra_env = ll.env
            env_plan = environment.build_environment(
                caller_env,
                policy.env,
                home=str(home),
                enabled=layers.secrets,
                extra=extra_env,
            )
            for name in env_plan.withheld_credentials:
                # The policy working, not something the command tried: in the log, but
                # not a denial (the stderr summary speaks only of those).
                audit.decision(
                    "env_dropped",
                    Decision(Verdict.REPORT, "secrets", Reason.CREDENTIAL_ENV, detail=name),
                    name=name,
                )
            try:
                deny = paths.expand_deny(fs.deny, workspace, (*fs.read, *fs.write))
            except TimeoutError as exc:
                raise SandboxError(
                    f"filesystem.deny: expanding {exc.args[0]!r} took more than "
                    f"{paths.DENY_GLOB_BUDGET_S:g}s; make the glob narrower"
                ) from None
            toolchains = paths.toolchain_paths(
                caller_env.get("PATH", ""), home, denied=(*deny.dirs, *deny.files)
            )
            trust = _trust_paths(env_plan.env, (*deny.dirs, *deny.files), audit)
            # stockade's own directories (config, state, cache, CA, its code) that a
            # grant would expose: read-only (or masked) inside, whatever the grant.
            narrowed = _roots.narrowed((workspace, *fs.write), visible=(*fs.read, *toolchains))
            for item in narrowed:
                audit.emit(
                    "layer_note",
                    layer="files",
                    verdict="report",
                    reason="path-protected",
                    detail=item.describe(),
                    path=str(item.root.path),
                )
            # Every terminal of the caller's among the command's 0, 1, 2 is replaced by a
            # pty or pipe of stockade's own (_pty's table); a terminal stdin makes the pty
            # the command's controlling terminal, which the launcher sets up.
            terminal = _pty.choose(
                *_stdio(request), allow_pty=request.allow_pty, gvisor=runsc is not None
            )
            use_pty = terminal.interactive
            use_launcher = (
                layers.files
                or layers.syscalls
                or layers.limits
                or use_pty
                or not layers.container
                or landlock
            )
            if layers.container and not landlock:
                claim = _placeholders.Claim(default_audit_dir().parent, workspace, audit.run_id)
                launcher_binds = (
                    layers.files and use_launcher and runsc is None and _host.mount_api()
                )
                # When the launcher binds, the placeholders are first needed once the
                # sandbox is let go: with a handshake, they are made while bubblewrap
                # starts (_Start.release).
                writable_ws = os.access(workspace, os.W_OK)
                defer = launcher_binds and handshake and writable_ws
                protection = claim.protect(workspace, fs.protect, defer=defer, writable=fs.write)
                guard = paths.guard_trust_roots(narrowed)
                # No repository yet: .git is the run's own directory inside, adopted
                # (sanitized) when the run is over, so `git init` works (_newrepo).
                # An overlay run adopts nothing behind the review: its .git stays protected.
                staged = (
                    _newrepo.stage(workspace, scratch.path)
                    if writable_ws and not fs.overlay
                    else None
                )
                if staged is not None:
                    claim.record_placeholder(staged.target)
                    protection = _without(protection, staged.target)
                sockets, complete = paths.workspace_sockets(workspace)
                for sock in sockets:
                    audit.emit(
                        "denied",
                        layer="container",
                        verdict="deny",
                        reason="path-denied",
                        detail=f"unix socket {sock} in the workspace is masked",
                        path=str(sock),
                    )
                if not complete:
                    audit.emit(
                        "layer_note",
                        layer="container",
                        verdict="report",
                        reason="path-denied",
                        detail=f"the search for unix sockets in the workspace stopped after "
                        f"{paths.SOCKET_SCAN_BUDGET_S:g}s; sockets deeper down are not masked",
                    )
                plan = bubblewrap.ContainerPlan(
                    workspace=workspace,
                    home=home,
                    read=(*fs.read, *trust),
                    write=fs.write,
                    toolchains=toolchains,
                    masked_files=(*deny.files, *sockets),
                    masked_dirs=(*deny.dirs, *guard.masked),
                    protected=(*protection.existing, *guard.protected),
                    pinned=tuple(
                        sorted(
                            set(protection.pinned) | set(guard.pinned), key=lambda p: len(p.parts)
                        )
                    ),
                    # The launcher binds in a mount namespace of its own: bwrap's init
                    # keeps the old one, which Landlock keeps out of reach (_launcher.c).
                    launcher_binds=launcher_binds,
                    share_net=not layers.egress,
                    cwd=cwd,
                    files=tuple(egress_plan.files) if egress_plan else (),
                    staged=((staged.inner, staged.target),) if staged is not None else (),
                    tmp=request.tmp,
                )
                child_env = env_plan.env
            else:
                if narrowed and (ll is None or not layers.files):
                    # Without a mount namespace nothing can hold them read-only but a split
                    # Landlock grant (the landlock backend's, files layer on). Refuse
                    # rather than let the sandbox rewrite stockade.
                    raise Unavailable(
                        f"keeping {narrowed[0].describe()} without the container layer",
                        "keep the container layer on, or narrow the grant",
                    )
                if deny.files or deny.dirs:
                    # Landlock only grants; hiding a path inside a granted area needs the
                    # container's masks. Refuse rather than expose a denied file.
                    raise Unavailable(
                        f"filesystem.deny without the container layer (matches {(*deny.files, *deny.dirs)[0]})",
                        "keep the container layer on, or remove the deny entries that match",
                    )
                if ll is not None:
                    # No mount namespace: Landlock keeps the protected paths (files layer).
                    claim = ll.protect(workspace, caller_env)
                else:
                    audit.emit(
                        "layer_note",
                        layer="container",
                        verdict="report",
                        reason="path-protected",
                        detail="protected paths (.git/hooks, .claude/, ...) need the container layer; they are writable in this run",
                    )
                # Without the container the command sees the host's file system; it
                # gets scratch HOME and TMPDIR so that well-behaved tools stay inside
                # what the files layer grants.
                (scratch.path / "home").mkdir()
                (scratch.path / "tmp").mkdir()
                child_env = dict(env_plan.env)
                child_env["HOME"] = str(scratch.path / "home")
                child_env["TMPDIR"] = str(request.tmp or scratch.path / "tmp")
                plan = bubblewrap.ContainerPlan(
                    workspace=workspace,
                    home=home,
                    toolchains=toolchains,
                    isolate=False,
                    cwd=cwd,
                    read=trust,
                    files=tuple(egress_plan.files) if egress_plan else (),
                    tmp=request.tmp,
                )
            if terminal.relayed and "TERM" not in child_env:
                child_env["TERM"] = "xterm"  # it has a terminal: name one
            if fs.overlay or request.overlay_layer is not None:
                overlay_layer = _begin_overlay(
                    policy, plan, runsc is not None, audit, request.overlay_layer
                )
                plan = replace(plan, overlay=overlay_layer.root)
            if _resolve_command(request.argv, child_env, cwd) is None:
                audit.emit(
                    "run_end",
                    returncode=EXIT_NOT_FOUND,
                    duration=time.monotonic() - started,
                    reason="command-not-found",
                    end=True,
                )
                message = f"stockade: {request.argv[0]}: command not found\n"
                not_found_err = _report_not_found(request, message)
                return RunResult(
                    list(request.argv),
                    EXIT_NOT_FOUND,
                    audit.run_id,
                    stdout=b"" if request.capture_output else None,
                    stderr=not_found_err,
                    events=audit.events,
                    audit_path=audit.path,
                    duration=time.monotonic() - started,
                )
            command = list(request.argv)
            launcher_fd = exe_fd = -1
            sandbox: Any = None
            if runsc is not None:
                from stockade.runtime._gvisor import GvisorRun

                sandbox = GvisorRun(runsc, scratch.path, audit.run_id)
                if use_pty:
                    # runsc makes the pty and hands it over (GvisorRun.open_console).
                    sandbox.open_console()
                if use_launcher:
                    # ctty off: with a terminal bundle the Sentry makes runsc's pty the
                    # command's controlling terminal itself (TIOCSCTTY on it is ENOTTY).
                    binary, spec = _launcher_spec(
                        policy, plan, scratch, False, gvisor=True, cgroup=support is not None
                    )
                    plan = replace(plan, files=(*plan.files, *sandbox.launcher_files(binary, spec)))
                    from stockade.enforce.gvisor import LAUNCHER_INSIDE, SPEC_INSIDE

                    command = [LAUNCHER_INSIDE, SPEC_INSIDE, "--", *command]
                sandbox.write_bundle(plan, command, child_env)
            elif use_launcher:
                # Without bubblewrap around it the launcher starts on the host: it gets
                # stockade's fixed environment, and the command's rides in its spec.
                direct = bwrap is None or not (layers.container or layers.egress)
                prefix, launcher_fd = _launcher(
                    policy,
                    plan,
                    scratch,
                    use_pty,
                    env=child_env if direct else None,
                    ll=ll,
                    observer=request.observer,
                )
                if bwrap is not None and (layers.container or layers.egress):
                    # bwrap execs the launcher through a descriptor (its /proc/self/fd
                    # link), not through a bind of the binary: one mount less, and
                    # bubblewrap 0.8 parses the whole mount table for each.
                    exe_fd = os.open(prefix[0], os.O_RDONLY | os.O_CLOEXEC)
                    prefix = [f"/proc/self/fd/{exe_fd}", *prefix[1:]]
                command = [*prefix, *command]
            if request.observer is not None and (sandbox is not None or not use_launcher):
                raise Unavailable(
                    "observing files in a learning run without stockade's launcher",
                    "learn with the bubblewrap or landlock backend and the files layer on",
                )
            start: Any = None
            # The cgroup is made once bwrap is starting (see _Start.release): the
            # two overlap, on another core.
            make_cgroup = (
                functools.partial(_make_cgroup, policy, support, audit)
                if support is not None
                else None
            )
            placeholders = (
                functools.partial(claim.make, protection)
                if claim is not None and (protection.pending_dirs or protection.pending_files)
                else None
            )
            if handshake:
                start = _Start(
                    egress_plan,
                    audit,
                    make_cgroup,
                    layers.container,
                    placeholders,
                    argv=tuple(request.argv),
                )
            elif ll is not None:
                # No bubblewrap to hold the command: the launcher holds itself until it
                # is in the cgroup (LandlockRun.release).
                ll.make_cgroup = make_cgroup
                start = ll
            status_r = status_w = -1
            args_fd = -1
            # What stockade starts on the host starts from an environment it built
            # (DESIGN §6): the command's environment is handed over inside.
            spawn_env = _roots.host_environment()
            if sandbox is not None and start is not None:
                # Egress off: the host's network, as bubblewrap's --share-net gives.
                argv = sandbox.argv(start.info_w, start.block_r, share_net=plan.share_net)
                spawn_env = sandbox.env()
                depth = 0  # runsc run forwards signals to the command itself
            elif bwrap is not None and (layers.container or layers.egress):
                status_r, status_w = os.pipe()
                # bwrap reads the command's environment from a sealed memfd (--args:
                # --clearenv, then --setenv for each variable), applies it to its own
                # process after it has started and passes it on at exec: never on its
                # argv (readable inside as /proc/1/cmdline), never its own environment.
                args_fd = bubblewrap.environment_fd(child_env)
                argv = bubblewrap.build_argv(
                    plan,
                    command,
                    bwrap=bwrap,
                    info_fd=start.info_w if start else None,
                    block_fd=start.block_r if start else None,
                    status_fd=status_w,
                    args_fd=args_fd,
                )
                depth = 2 if plan.isolate else 1
            elif use_launcher:
                # The landlock backend's launcher stays the command's parent (the reaper).
                argv, depth = command, 1 if ll is not None and ll.reaper else 0
            else:
                # Every layer that would confine the command is off: it is the command.
                argv, depth = command, 0
                spawn_env = child_env
            if ll is not None:
                ll.start(request.argv)
            fds = [
                fd
                for fd in (
                    launcher_fd,
                    exe_fd,
                    status_w,
                    args_fd,
                    *(start.child_fds() if start else ()),
                    *((request.observer.child_fd,) if request.observer is not None else ()),
                )
                if fd >= 0
            ]
            if request.observer is not None:
                request.observer.start()
            try:
                returncode, timed_out, stdout_data, stderr_data = _spawn(
                    argv,
                    spawn_env,
                    # The host-side start directory; inside, the plan's cwd is the one
                    # (a /tmp path of a session scratch exists only there).
                    cwd if cwd.is_dir() else workspace,
                    request,
                    depth,
                    terminal,
                    tuple(fds),
                    start,
                    scratch.sweep_in_background,
                    sandbox,
                )
                if sandbox is not None and not timed_out:
                    # runsc's failure to start (or its own failure) is not the command's
                    # status: exit 125 with runsc's message, as for bubblewrap below.
                    sandbox.check_started(returncode)
                if status_r >= 0:
                    os.close(status_w)
                    status_w = -1
                    if not timed_out and not _bwrap_started(status_r):
                        _explain_bwrap_failure(returncode)
            finally:
                for fd in (launcher_fd, exe_fd, status_r, status_w, args_fd):
                    if fd >= 0:
                        os.close(fd)
                if start is not None:
                    start.close()
                if sandbox is not None:
                    sandbox.cleanup()
                if ll is not None:
                    ll.close()
                if own_plan and egress_plan is not None:
                    egress_plan.close()
                if staged is not None:
                    _adopt_repository(staged, claim, audit)
                if overlay_layer is not None:
                    from stockade.runtime import _overlay

                    _overlay.end(overlay_layer, returncode)
    finally:
        left = claim.release() if claim is not None else []
        for path in left:
            audit.decision(
                "denied",
                Decision.deny("files", Reason.PATH_PROTECTED, detail=str(path)),
                path=str(path),
            )
    duration = time.monotonic() - started
    if timed_out:
        audit.decision(
            "denied",
            Decision.deny("limits", Reason.LIMIT_WALL_TIME, detail=f"{request.timeout:g}s"),
        )
        returncode = EXIT_TIMEOUT
    if layers.container:
        _report_nested_repositories(workspace, wall_started, audit)
    audit.emit("run_end", returncode=returncode, duration=round(duration, 6), end=True)
    return RunResult(
        list(request.argv),
        returncode,
        audit.run_id,
        stdout=stdout_data,
        stderr=stderr_data,
        events=audit.events,
        audit_path=audit.path,
        timed_out=timed_out,
        duration=duration,
        layer=overlay_layer.root if overlay_layer is not None else None,
    )


def _begin_overlay(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    gvisor: bool,
    audit: AuditLog,
    existing: Any = None,
) -> Any:
    """Refuse (fail closed) or make (or reopen) the run's overlay layer; see
    :mod:`._overlay`."""
    from stockade.runtime import _overlay

    refused = _overlay.refusal(
        policy, gvisor=gvisor, launcher_binds=plan.isolate and plan.launcher_binds
    )
    if refused is not None:
        raise refused
    layer = _overlay.begin(audit.run_id, policy.filesystem.workspace, existing)
    audit.emit(
        "overlay_layer",
        layer="files",
        verdict="report",
        reason="path-protected",
        detail="the workspace is an overlay: writes land in the layer, for review",
        path=str(layer.root),
    )
    return layer


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


def _stdio(request: RunRequest) -> tuple[int | IO[Any] | None, ...]:
    """The sandbox's stdin, stdout and stderr as Popen takes them (None: the caller's),
    before any terminal among them is replaced (:func:`_pty.choose`)."""
    capture = subprocess.PIPE if request.capture_output else None
    return (
        subprocess.PIPE if request.input is not None else request.stdin,
        capture or request.stdout,
        capture or request.stderr,
    )


@functools.cache
def _seccomp_filter() -> bytes:
    """The syscalls layer's filter: pure and the same for every run of this process."""
    from stockade.enforce import seccomp

    return seccomp.build_filter()


def _launcher(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: _Scratch,
    ctty: bool,
    *,
    env: Mapping[str, str] | None = None,
    ll: Any = None,
    observer: Any = None,
) -> tuple[list[str], int]:
    """Build the inner launcher's spec for this run; return its argv prefix and spec fd.
    ``env``: the command's environment, carried in the spec (the launcher starts on the
    host with stockade's own). ``ll``: the landlock backend's run, which rewrites the
    spec (:class:`._landlock.LandlockRun`)."""
    from stockade.enforce import launcher

    spec = _launcher_plan(policy, plan, scratch, ctty)
    if env is not None:
        spec = replace(spec, environment=tuple(env.items()))
    if ll is not None:
        spec = ll.launcher_spec(spec, scratch.path)
    if observer is not None:
        spec = replace(spec, observer_fd=observer.child_fd, observer_bpf=observer.program)
    return launcher.prepare(spec)


def _launcher_spec(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: _Scratch,
    ctty: bool,
    *,
    gvisor: bool,
    cgroup: bool = True,
) -> tuple[Path, bytes]:
    """The launcher binary and its serialised spec, for a sandbox that takes no fds
    (gVisor): the spec is bound in as a file. ``cgroup``: whether a cgroup can hold the
    run's memory."""
    from stockade.enforce import launcher

    spec = _launcher_plan(policy, plan, scratch, ctty, gvisor=gvisor, cgroup=cgroup)
    return launcher.build_launcher(), launcher.serialize(spec)


def _launcher_plan(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: _Scratch,
    ctty: bool,
    *,
    gvisor: bool = False,
    cgroup: bool = True,
) -> Any:
    """The :class:`~stockade.enforce.launcher.LauncherSpec` for this run."""
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
        scratch_rw = [str(scratch.path), *([str(plan.tmp)] if plan.tmp else [])]
        read = [*system, *map(str, plan.toolchains), "/proc"]
    write = [str(fs.workspace), *map(str, fs.write), *scratch_rw, "/dev"]
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
        seccomp_bpf=_seccomp_filter() if layers.syscalls else None,
        seccomp_expected=layers.syscalls,
        rlimits=tuple(rlimits),
        ctty=ctty,
        # bubblewrap drops every capability (--cap-drop ALL); without it, the launcher
        # does. Under gVisor the spec's capability sets are empty.
        drop_caps=not (layers.container or layers.egress),
        mounts=() if gvisor else tuple(bubblewrap.launcher_mounts(plan)),
        overlay_layer=bubblewrap.OVERLAY_DIR if plan.overlay is not None else None,
    )


def _without(protection: paths.Protection, top: Path) -> paths.Protection:
    """``protection`` less everything at or below ``top`` (a staged ``.git``: inside it
    is the run's own directory, not the host's)."""

    def keep(items: tuple[Path, ...]) -> tuple[Path, ...]:
        return tuple(p for p in items if not (p == top or top in p.parents))

    return replace(
        protection,
        existing=keep(protection.existing),
        pinned=keep(protection.pinned),
        pending_dirs=keep(protection.pending_dirs),
        pending_files=keep(protection.pending_files),
    )


def _adopt_repository(
    staged: _newrepo.Staged, claim: _placeholders.Claim | None, audit: AuditLog
) -> None:
    """Adopt the repository a run made in a workspace that had none (see _newrepo)."""
    try:
        adopted, dropped = _newrepo.adopt(staged)
    except OSError as exc:
        audit.emit(
            "layer_note",
            layer="files",
            verdict="report",
            reason="path-protected",
            detail=f"the repository the sandbox made could not be adopted: {exc}",
            path=str(staged.target),
        )
        return
    kept = None
    if adopted and claim is not None:
        claim.forget_placeholder(staged.target)
    elif not adopted and _newrepo.made_any(staged):
        # Another run of the workspace adopted its repository first: this one is kept
        # in stockade's state, never lost, and never put where the host's git runs it.
        kept = _newrepo.keep_aside(staged, audit.run_id)
    if adopted or kept is not None:
        what = (
            f"adopted into {staged.target}"
            if adopted
            else f"kept at {kept} (another run of the workspace made {staged.target} first)"
        )
        audit.emit(
            "git_repository_adopted",
            layer="files",
            verdict="report",
            reason="path-protected",
            detail=f"a repository the sandbox made was sanitized and {what}"
            + (f"; dropped: {', '.join(dropped)}" if dropped else ""),
            path=str(staged.target),
            dropped=dropped,
        )
    if dropped:
        print(
            f"stockade: warning: the repository the sandbox made at {staged.target} had "
            f"{len(dropped)} entr{'y' if len(dropped) == 1 else 'ies'} that would run code "
            f"on the host; they were dropped: {', '.join(dropped[:5])}"
            + (" ..." if len(dropped) > 5 else ""),
            file=sys.stderr,
        )


def _report_nested_repositories(workspace: Path, since: float, audit: AuditLog) -> None:
    """Warn about a repository the sandbox nested into the workspace's own (see
    :mod:`stockade.enforce.gitlinks`): git on the host would run its configuration."""
    from stockade.enforce import gitlinks

    try:
        found = gitlinks.nested_repositories(workspace, since)
    except OSError:
        return
    for checkout in found:
        where = checkout.relative_to(workspace) if checkout.is_relative_to(workspace) else checkout
        detail = (
            f"the sandbox nested a repository at {where} into the workspace's index: "
            "git on the host (git status at the top) runs its configuration and hooks; "
            f"check {where}/.git before running git here"
        )
        audit.emit(
            "git_nested_repository",
            layer="container",
            verdict="report",
            reason="path-protected",
            detail=detail,
            path=str(checkout),
        )
        print(f"stockade: warning: {detail}", file=sys.stderr)


def _trust_paths(
    env: Mapping[str, str], denied: Sequence[Path], audit: AuditLog
) -> tuple[Path, ...]:
    """The trust stores the child's variables name, to keep readable inside (read-only).

    They hold public certificates; one under a ``filesystem.deny`` entry stays hidden
    all the same (deny wins), and the log says so. Those under the system paths are
    readable already.
    """
    out = []
    for path in environment.trust_paths(env):
        if any(path.is_relative_to(p) for p in SYSTEM_PATHS):
            continue
        if any(path == d or d in path.parents for d in denied):
            audit.emit(
                "policy_note",
                layer="files",
                verdict="report",
                reason="path-denied",
                detail=f"trust store {path} is under filesystem.deny; it stays hidden",
            )
            continue
        out.append(path)
    return tuple(out)


def _report_not_found(request: RunRequest, message: str) -> bytes | None:
    """Say "command not found" where the command's stderr would have gone: into the
    captured output (an API or MCP caller reads it there, not in the server's log), the
    caller's stderr target, or stockade's own stderr; the captured bytes, if captured."""
    target = request.stderr
    if request.capture_output or target == subprocess.PIPE:
        return message.encode()
    if target == subprocess.DEVNULL:
        return None
    try:
        if target is not None:
            if not isinstance(target, int):
                target.flush()
                target = target.fileno()
            os.write(target, message.encode())
            return None
    except (OSError, ValueError, AttributeError):
        pass
    sys.stderr.write(message)
    return None


def _wall_timeout(request: RunRequest) -> float | None:
    limits = request.policy.limits
    candidates = [t for t in (request.timeout,) if t]
    if request.policy.layers.limits and limits.wall_seconds:
        candidates.append(limits.wall_seconds)
    return min(candidates) if candidates else None


def _spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    request: RunRequest,
    depth: int,
    terminal: _pty.Choice,
    pass_fds: tuple[int, ...],
    start: _Start | None,
    on_started: Callable[[], None],
    sandbox: Any = None,
) -> tuple[int, bool, bytes | None, bytes | None]:
    """Start the sandbox and wait for it; return (code, timed_out, stdout, stderr).

    ``terminal`` says which of the caller's terminals are relayed (:mod:`._pty`: the
    sandbox never holds one); ``on_started`` is called once the command was let go (work
    to overlap with it); ``sandbox`` is the gVisor run, whose pty runsc makes
    (:class:`._gvisor.GvisorRun`).
    """
    timeout = _wall_timeout(request)
    if timeout is not None:
        request.timeout = timeout
    _pty.check_passed(pass_fds)
    console = sandbox if sandbox is not None and sandbox.console is not None else None
    stdin, stdout, stderr = _stdio(request)
    with contextlib.ExitStack() as files:
        if sandbox is not None and console is None:
            # gVisor writes a regular file from an offset of its own: stockade writes the
            # command's output there itself, at the caller's offset (_gvisor.file_relays).
            from stockade.runtime._gvisor import file_relays

            stdout, stderr = files.enter_context(file_relays(stdout, stderr))
        return _spawn_relayed(
            argv,
            env,
            cwd,
            request,
            timeout,
            depth,
            terminal,
            pass_fds,
            start,
            on_started,
            console,
            (stdin, stdout, stderr),
        )


def _spawn_relayed(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    request: RunRequest,
    timeout: float | None,
    depth: int,
    terminal: _pty.Choice,
    pass_fds: tuple[int, ...],
    start: _Start | None,
    on_started: Callable[[], None],
    console: Any,
    stdio: tuple[int | IO[Any] | None, int | IO[Any] | None, int | IO[Any] | None],
) -> tuple[int, bool, bytes | None, bytes | None]:
    """The body of :func:`_spawn` once the stdio targets are chosen."""
    with _pty.relay(terminal, *stdio) as relay:
        proc = _popen(argv, env, cwd, *relay.stdio, pass_fds)
        if request.handle is not None:
            request.handle.attach(proc)  # from here on, another thread can kill the tree
        relay.handed()
        paused = start.paused if start is not None else None
        # Forwarding is in place before the command is let go: a SIGTERM that arrives as
        # soon as it runs must reach it, not kill stockade (the default action). One that
        # arrives before goes to the sandbox's outermost process and ends it: the command
        # never runs.
        with _forwarding(proc, request.forward_signals, depth):
            if start is not None:
                start.release(proc)
            on_started()
            if console is not None:
                master = console.receive_console(lambda: proc.poll() is None)
                if master < 0:
                    # runsc ended (or hung) before it made the pty: its status and message
                    # say why, and the caller reports it as the sandbox's failure.
                    _kill_tree(proc)
                    code = proc.wait()
                    return (code if code >= 0 else 128 - code), False, None, None
                relay.add_console(master)
            relay.start()
            try:
                out, err = _communicate(proc, request.input, timeout, paused)
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                out, err = proc.communicate()
                return EXIT_TIMEOUT, True, out, err
            except BaseException:
                _kill_tree(proc)
                raise
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode, False, out, err


def _communicate(
    proc: subprocess.Popen[bytes],
    data: bytes | None,
    timeout: float | None,
    paused: Callable[[], float] | None,
) -> tuple[bytes | None, bytes | None]:
    """``proc.communicate`` whose timeout stands still while asks wait for an answer
    (a person reading a prompt must not cost the command its time, Codex #6973)."""
    if timeout is None or paused is None:
        return proc.communicate(data, timeout=timeout)
    started = time.monotonic()
    while True:
        left = started + timeout + paused() - time.monotonic()
        try:
            # communicate() may be called again after a timeout; input is sent once.
            return proc.communicate(data, timeout=max(0.0, min(left, 0.5)))
        except subprocess.TimeoutExpired:
            data = None
            if started + timeout + paused() - time.monotonic() <= 0:
                raise


def _popen(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    stdin: int | IO[Any] | None,
    stdout: int | IO[Any] | None,
    stderr: int | IO[Any] | None,
    pass_fds: tuple[int, ...],
) -> subprocess.Popen[bytes]:
    """Start the sandbox's outermost process (bwrap, or the launcher without it)."""
    try:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            # Its own session: terminal signals reach stockade, which forwards them, and
            # the sandbox can never get the caller's terminal as its controlling tty.
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc.strerror}") from exc


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the sandbox and everything in it.

    SIGKILL to bwrap makes the kernel deliver its parent-death signal to the sandbox's
    init, and the death of a PID namespace's init kills every process in it. Without the
    container layer the command's own process group is killed too.
    """
    from stockade.runtime._landlock import kill_descendants

    # Without a PID namespace (the landlock backend) a process that left the group is
    # still below the launcher, a child subreaper: kill the whole tree from there.
    kill_descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _command_pid(proc: subprocess.Popen[bytes], depth: int) -> int:
    """The pid (in our namespace) that should receive forwarded signals.

    bwrap's monitor does not forward signals, so they go to the command itself: ``depth``
    generations below the process we started (2 with a PID namespace: bwrap, its init,
    the command; 1 for bwrap without one; 0 without bwrap).
    """
    pid = proc.pid
    for _ in range(depth):
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            break
        if not children:
            break
        pid = int(children[0])
    return pid


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen[bytes], enabled: bool, depth: int) -> Iterator[None]:
    if not enabled:
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(_command_pid(proc, depth), signum)

    previous = {sig: signal.signal(sig, forward) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _bwrap_started(status_r: int) -> bool:
    """Whether bwrap reported starting the command on ``--json-status-fd``."""
    data = b""
    while chunk := os.read(status_r, 65536):
        data += chunk
    return b'"child-pid"' in data


def _explain_userns() -> None:
    """Raise :class:`Unavailable` (with the fix and the fallback) when user namespaces
    are what kept bubblewrap from starting; else return."""
    check = _host.userns_check()
    if not check.ok:
        from stockade.runtime._landlock import FALLBACK_HINT

        raise Unavailable(f"user namespaces ({check.detail})", f"{check.fix}; {FALLBACK_HINT}")


def _explain_bwrap_failure(returncode: int) -> None:
    """bwrap failed before the command ran: say why, as a refusal (fail closed)."""
    _explain_userns()
    raise SandboxError(
        f"bubblewrap could not set up the sandbox (exit {returncode}; its message is above); "
        "the command did not run. 'stockade doctor' checks this host"
    )


def _cgroup_support(policy: Policy) -> Any:
    """Where this run's cgroup can be made (None: nowhere, or the layer is off).

    When there is a place, the kernel's first-move cost starts being paid in the
    background now, while the run is planned (:func:`limits.prime_attach`).
    """
    if not policy.layers.limits:
        return None
    from stockade.enforce import limits

    support = limits.detect()
    if support is not None:
        limits.prime_attach(support)
    return support


def _make_cgroup(policy: Policy, support: Any, audit: AuditLog) -> Any:
    """A cgroup for this run in ``support``, else None (noted in the audit log)."""
    from stockade.enforce import limits

    try:
        pids = policy.limits.pids
        if _gvisor(policy):
            from stockade.enforce import gvisor

            # The cgroup holds the runsc tree, whose host tasks are not the command's:
            # inside, the Sentry enforces RLIMIT_NPROC = pids itself (gvisor.host_pids).
            pids = gvisor.host_pids(pids)
        return limits.Cgroup.create(
            support,
            limits.cgroup_name(audit.run_id),
            pids=pids,
            memory=policy.limits.memory,
        )
    except OSError as exc:
        audit.emit(
            "layer_note",
            layer="limits",
            verdict="report",
            reason="limit-pids",
            detail=f"no cgroup ({exc.strerror}); per-process rlimits only",
        )
        return None


def read_child_pid(info_fd: int) -> int:
    """Read bubblewrap's ``--info-fd`` document and return the sandbox's pid.

    Reads until the JSON object is complete rather than until end of file, so that a
    copy of the fd held elsewhere cannot stall the start.
    """
    buf = b""
    info: Any = None
    try:
        while True:
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            buf += chunk
            with contextlib.suppress(json.JSONDecodeError):
                info = json.loads(buf)
                break
    finally:
        os.close(info_fd)
    pid = info.get("child-pid") if isinstance(info, dict) else None
    if not isinstance(pid, int):
        raise SandboxError("bubblewrap did not report the sandbox's pid on --info-fd")
    return pid


class _Start:
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
                _explain_userns()
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
            _kill_tree(proc)
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
