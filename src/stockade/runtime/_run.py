"""One sandboxed run, from policy to exit code: plan, then run.

:func:`execute` asks :mod:`._plan` for the run's :class:`~._plan.RunPlan` (every decision,
nothing started: fail closed when a layer cannot be applied), then carries it out, in the
same order every time: open the audit log (refuse if it cannot be written, never run
unaudited; or if the sandbox could write it: see :mod:`._audit_guard`), claim the
protected paths and build the mounts, environment and launcher, prepare the egress proxy
if the egress layer is on, spawn the sandbox (:mod:`._spawn`) and hold it until its
cgroup (:mod:`._cgroup`) and proxy are wired (:mod:`._handshake`), relay the terminal
(:mod:`._pty`), wait (killing the whole tree on timeout), clean up and audit the end.

The runtime prints nothing: a warning for the person goes to the request's ``report``
callback (the CLI prints it) and into :attr:`RunResult.warnings`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stockade import _roots
from stockade._exceptions import EXIT_NOT_FOUND, EXIT_TIMEOUT, Unavailable
from stockade._record import replace
from stockade.audit import AuditLog
from stockade.enforce import bubblewrap, environment
from stockade.policy import Decision, Policy, Reason, Verdict
from stockade.policy._network import grace_in_force
from stockade.policy._tables import SYSTEM_PATHS
from stockade.runtime import _audit_guard, _cgroup, _mounts, _newrepo, _placeholders
from stockade.runtime._handshake import BwrapHandshake, bwrap_started, explain_bwrap_failure
from stockade.runtime._plan import RunPlan, launcher_spec, plan, resolve_command
from stockade.runtime._request import RunRequest, RunResult
from stockade.runtime._scratch import Scratch, scratch
from stockade.runtime._spawn import spawn
from stockade.runtime._state import default_audit_dir as default_audit_dir
from stockade.runtime._state import require_state_dir

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def execute(request: RunRequest) -> RunResult:
    """Run ``request.argv`` in the sandbox described by ``request.policy``.

    Raises:
        Unavailable: a layer the policy asks for cannot be applied on this host.
        SandboxError: the sandbox could not be set up (the audit log says why).
    """
    warnings: list[str] = []

    def report(line: str) -> None:
        warnings.append(line)
        if request.report is not None:
            request.report(line)

    return run(plan(request, report), request, report, warnings)


def run(
    plan: RunPlan,
    request: RunRequest,
    report: Callable[[str], None] | None = None,
    warnings: list[str] | None = None,
) -> RunResult:
    """Carry out ``plan`` (made by :func:`._plan.plan` from ``request``); ``report``:
    where warnings for the person go; ``warnings``: the list they are kept in (the
    result's)."""
    kept: list[str] = [] if warnings is None else warnings
    say = report if report is not None else kept.append
    if plan.cgroup is not None:
        _cgroup.prime(plan.cgroup)
    if plan.state_dir is not None:
        where, what, audit_option = plan.state_dir
        require_state_dir(where, what, audit_option=audit_option)
    if plan.audit_path is not None:
        _audit_guard.refuse_reachable(plan.audit_path, plan.policy, explicit=plan.audit_explicit)
    audit = AuditLog(plan.run_id, plan.audit_path)
    if plan.audit_path is not None:
        _audit_guard.refuse_linked(audit)
    if request.on_event is not None:
        audit.subscribe(request.on_event)
    started = time.monotonic()
    try:
        result = _execute(request, plan, audit, started, say)
        result.warnings = kept
        return result
    finally:
        audit.close()
        _audit_guard.record_head(audit, say)


def _execute(
    request: RunRequest,
    plan: RunPlan,
    audit: AuditLog,
    started: float,
    report: Callable[[str], None],
) -> RunResult:
    policy = plan.policy
    bwrap, runsc, support = plan.bwrap, plan.runsc, plan.cgroup
    caller_env = plan.caller_env
    fs = policy.filesystem
    workspace = fs.workspace
    home, cwd = plan.home, plan.cwd
    layers = policy.layers
    # Timestamps on disk come from the kernel's coarse clock: a margin, not an instant.
    wall_started = time.time() - 1.0
    landlock = plan.landlock
    grace = grace_in_force(policy.network)
    grace_fields: dict[str, Any] = (
        {"grace_until": policy.network.grace_until.isoformat(), "grace_in_force": bool(grace)}
        if policy.network.grace_until is not None
        else {}
    )
    audit.emit(
        "run_start",
        policy_hash=policy.digest(),
        policy_sources=list(policy.sources),
        layers=list(layers.active()),
        argv=list(request.argv),
        workspace=str(workspace),
        cwd=str(cwd),
        **grace_fields,
    )
    if grace:
        # A learnt policy's grace period in force: in the log of every run it covers, so
        # that what it let through is never mistaken for what the policy allows.
        audit.emit(
            "policy_grace",
            layer="egress",
            verdict="report",
            reason="host-not-allowed",
            detail=(
                f"grace period until {grace}: hosts and requests this policy does not admit "
                "are let through and reported (rule grace), not refused"
            ),
            grace_until=grace,
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
    handshake = plan.handshake
    #: the landlock backend's run (None under bubblewrap or gVisor)
    ll: Any = None

    #: what the run claimed and staged on the host, released or adopted at the end
    held = _mounts.Held()
    overlay_layer: Any = None
    returncode = 0
    timed_out = False
    stdout_data: bytes | None = None
    stderr_data: bytes | None = None
    try:
        with scratch(plan.scratch) as tmp:
            egress_plan = None
            own_plan = False
            if needs_proxy:
                egress_plan = request.egress
                if egress_plan is None:
                    from stockade.runtime._egress import EgressPlan

                    egress_plan = EgressPlan(
                        policy,
                        caller_env,
                        lambda: tmp.path,
                        bubblewrap.STOCKADE_DIR if layers.container and not landlock else None,
                        approvals=approval,
                    )
                    own_plan = True
            extra_env = egress_plan.env if egress_plan else None
            if landlock:
                from stockade.runtime._landlock import LandlockRun

                ll = LandlockRun(
                    policy, audit, egress_plan, cgroup=support is not None, support=support
                )
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
            deny, narrowed = plan.deny, plan.narrowed
            trust = _trust_paths(env_plan.env, (*deny.dirs, *deny.files), audit)
            for item in narrowed:
                audit.emit(
                    "layer_note",
                    layer="files",
                    verdict="report",
                    reason="path-protected",
                    detail=item.describe(),
                    path=str(item.root.path),
                )
            terminal = plan.terminal
            use_pty = terminal.interactive
            use_launcher = plan.use_launcher
            container, child_env = _mounts.prepare(
                plan,
                request,
                held,
                audit,
                tmp,
                env_plan.env,
                trust,
                tuple(egress_plan.files) if egress_plan else (),
                ll,
            )
            if held.claim is not None:
                # what a killed run of this workspace left unswept, swept before this one
                _report_swept(
                    held.claim.leftovers,
                    audit,
                    report,
                    "made or changed since a killed run of this workspace began (its "
                    "sandbox could write there; a change of yours since then counts too)",
                )
            if terminal.relayed and "TERM" not in child_env:
                child_env["TERM"] = "xterm"  # it has a terminal: name one
            if plan.overlay:
                overlay_layer = _begin_overlay(
                    policy, container, runsc is not None, audit, request.overlay_layer, plan.scratch
                )
                container = replace(container, overlay=overlay_layer.root)
            if fs.scratch:
                # a learning run: throwaway views over what it may read outside the
                # workspace, recorded and removed at the end (_learnscratch says why)
                from stockade.runtime import _learnscratch

                container = _learnscratch.begin(
                    policy, container, tmp.path, audit, gvisor=runsc is not None
                )
            if resolve_command(request.argv, child_env, cwd) is None:
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

                sandbox = GvisorRun(runsc, tmp.path, audit.run_id)
                if use_pty:
                    # runsc makes the pty and hands it over (GvisorRun.open_console).
                    sandbox.open_console()
                if use_launcher:
                    # ctty off: with a terminal bundle the Sentry makes runsc's pty the
                    # command's controlling terminal itself (TIOCSCTTY on it is ENOTTY).
                    binary, spec = _gvisor_launcher(
                        policy, container, tmp.path, False, gvisor=True, cgroup=support is not None
                    )
                    sandbox.launcher_files(binary, spec)
                    from stockade.enforce.gvisor import LAUNCHER_INSIDE, SPEC_INSIDE

                    command = [LAUNCHER_INSIDE, SPEC_INSIDE, "--", *command]
                sandbox.write_bundle(container, command, child_env)
            elif use_launcher:
                # Without bubblewrap around it the launcher starts on the host: it gets
                # stockade's fixed environment, and the command's rides in its spec.
                direct = bwrap is None or not (layers.container or layers.egress)
                prefix, launcher_fd = _launcher(
                    policy,
                    container,
                    tmp,
                    use_pty,
                    env=child_env if direct else None,
                    ll=ll,
                    observer=request.observer,
                )
                if plan.bwrap_runs:
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
            # The cgroup is made once bwrap is starting (see BwrapHandshake.release): the
            # two overlap, on another core.
            make_cgroup = (
                functools.partial(_cgroup.make, policy, support, audit)
                if support is not None
                else None
            )
            placeholders = (
                functools.partial(held.claim.make, held.protection)
                if held.claim is not None
                and (held.protection.pending_dirs or held.protection.pending_files)
                else None
            )
            if handshake:
                start = BwrapHandshake(
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
                argv = sandbox.argv(
                    start.info_w,
                    start.block_r,
                    share_net=container.share_net,
                    overlay=(workspace, overlay_layer.root) if overlay_layer is not None else None,
                )
                spawn_env = sandbox.env()
                depth = 0  # runsc run forwards signals to the command itself
            elif bwrap is not None and plan.bwrap_runs:
                status_r, status_w = os.pipe()
                # bwrap reads the command's environment from a sealed memfd (--args:
                # --clearenv, then --setenv for each variable), applies it to its own
                # process after it has started and passes it on at exec: never on its
                # argv (readable inside as /proc/1/cmdline), never its own environment.
                args_fd = bubblewrap.environment_fd(child_env)
                argv = bubblewrap.build_argv(
                    container,
                    command,
                    bwrap=bwrap,
                    info_fd=start.info_w if start else None,
                    block_fd=start.block_r if start else None,
                    status_fd=status_w,
                    args_fd=args_fd,
                )
                depth = 2 if container.isolate else 1
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
                returncode, timed_out, stdout_data, stderr_data = spawn(
                    argv,
                    spawn_env,
                    # The host-side start directory; inside, the plan's cwd is the one
                    # (a /tmp path of a session scratch exists only there).
                    cwd if cwd.is_dir() else workspace,
                    request,
                    plan.timeout,
                    depth,
                    terminal,
                    tuple(fds),
                    start,
                    tmp.sweep_in_background,
                    sandbox,
                )
                if sandbox is not None and not timed_out:
                    # runsc's failure to start (or its own failure) is not the command's
                    # status: exit 125 with runsc's message, as for bubblewrap below.
                    sandbox.check_started(returncode)
                if status_r >= 0:
                    os.close(status_w)
                    status_w = -1
                    if not timed_out and not bwrap_started(status_r):
                        explain_bwrap_failure(returncode)
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
                if held.staged is not None:
                    _adopt_repository(held.staged, held.claim, audit, report)
                if overlay_layer is not None:
                    from stockade.runtime import _overlay

                    _overlay.end(overlay_layer, returncode)
                if container.scratch:
                    from stockade.runtime import _learnscratch

                    _learnscratch.end(container, audit)
    finally:
        if held.claim is not None:
            _sweep_repositories(held.claim, not fs.overlay, audit, report)
        left = held.claim.release() if held.claim is not None else []
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
            Decision.deny("limits", Reason.LIMIT_WALL_TIME, detail=f"{plan.timeout:g}s"),
        )
        returncode = EXIT_TIMEOUT
    if layers.container:
        _report_nested_repositories(workspace, wall_started, audit, report)
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
    scratch: Path | None = None,
) -> Any:
    """Refuse (fail closed) or make (or reopen) the run's overlay layer; see
    :mod:`._overlay`."""
    from stockade.runtime import _overlay

    refused = _overlay.refusal(
        policy,
        gvisor=gvisor,
        launcher_binds=plan.isolate and plan.launcher_binds,
        scratch=scratch,
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


def _launcher(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: Scratch,
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

    # Inside the container the scratch directory is not bound: a contained run without
    # egress needs none made.
    spec = launcher_spec(policy, plan, scratch.planned if plan.isolate else scratch.path, ctty)
    if env is not None:
        spec = replace(spec, environment=tuple(env.items()))
    if ll is not None:
        spec = ll.launcher_spec(spec, scratch.path)
    if observer is not None:
        if spec.guard:
            # One user-notification listener per launcher: the guard's decides.
            raise Unavailable(
                "learn mode's observer beside the connect guard (Landlock ABI < 4)",
                "learn with the bubblewrap backend, or on a kernel with Landlock ABI 4",
            )
        spec = replace(spec, observer_fd=observer.child_fd, observer_bpf=observer.program)
    return launcher.prepare(spec)


def _gvisor_launcher(
    policy: Policy,
    plan: bubblewrap.ContainerPlan,
    scratch: Path,
    ctty: bool,
    *,
    gvisor: bool,
    cgroup: bool = True,
) -> tuple[Path, bytes]:
    """The launcher binary and its serialised spec, for a sandbox that takes no fds
    (gVisor): both are files of the bundle's rootfs. ``cgroup``: whether a cgroup can hold the
    run's memory."""
    from stockade.enforce import launcher

    spec = launcher_spec(policy, plan, scratch, ctty, gvisor=gvisor, cgroup=cgroup)
    return launcher.build_launcher(), launcher.serialize(spec)


def _adopt_repository(
    staged: _newrepo.Staged,
    claim: _placeholders.Claim | None,
    audit: AuditLog,
    report: Callable[[str], None],
) -> None:
    """Adopt the repository a run made in a workspace that had none (see _newrepo);
    ``report`` the entries dropped from it."""
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
        report(_dropped_warning(f"the repository the sandbox made at {staged.target}", dropped))


def _dropped_warning(which: str, dropped: list[str]) -> str:
    return (
        f"stockade: warning: {which} had {len(dropped)} entr"
        f"{'y' if len(dropped) == 1 else 'ies'} that would run code on the host; they were "
        f"dropped: {', '.join(dropped[:5])}" + (" ..." if len(dropped) > 5 else "")
    )


def _sweep_repositories(
    claim: _placeholders.Claim, workspace: bool, audit: AuditLog, report: Callable[[str], None]
) -> None:
    """Sanitize the repositories the sandbox made or changed below the workspace or a
    write grant (:func:`stockade.runtime._newrepo.sweep`), and say what was dropped."""
    try:
        found = claim.sweep_repositories(workspace=workspace)
    except OSError as exc:
        report(f"stockade: warning: the repositories below the workspace were not checked: {exc}")
        return
    _report_swept(found, audit, report)


def _report_swept(
    found: list[tuple[Path, list[str]]],
    audit: AuditLog,
    report: Callable[[str], None],
    why: str = "made or changed by the sandbox",
) -> None:
    """Log each repository a sweep sanitized, and say what it dropped (and ``why`` the
    repository was swept)."""
    for repository, dropped in found:
        audit.emit(
            "git_repository_sanitized",
            layer="container",
            verdict="report",
            reason="path-protected",
            path=str(repository),
            dropped=dropped,
        )
        if dropped:
            which = f"the repository at {repository}, {why},"
            report(_dropped_warning(which, dropped))


def _report_nested_repositories(
    workspace: Path, since: float, audit: AuditLog, report: Callable[[str], None]
) -> None:
    """Warn (``report``) about a repository the sandbox nested into the workspace's own
    (see :mod:`stockade.enforce.gitlinks`): git on the host would run its configuration."""
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
        report(f"stockade: warning: {detail}")


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
        if any(_roots.within(path, p) for p in SYSTEM_PATHS):
            continue
        if any(_roots.within(path, d) for d in denied):
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
