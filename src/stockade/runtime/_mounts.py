"""The run's mount plan made real on the host: the protected paths' placeholders
claimed under the workspace's lock, a missing ``.git`` staged as the run's own
directory, the workspace's unix sockets masked, and the one
:class:`~stockade.enforce.bubblewrap.ContainerPlan` built from the run's plan and them
(with the container, or the netns-only form without it)."""

from __future__ import annotations

import os
from pathlib import Path

from stockade._exceptions import Unavailable
from stockade._record import replace
from stockade._roots import within
from stockade.enforce import bubblewrap, paths
from stockade.runtime import _host, _newrepo, _placeholders
from stockade.runtime._state import default_audit_dir

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.audit import AuditLog
    from stockade.runtime._plan import RunPlan
    from stockade.runtime._request import RunRequest
    from stockade.runtime._scratch import Scratch


class Held:
    """What a run holds on the host until its end: the placeholder claim (released by
    the executor, whatever happens), the staged repository (adopted) and the protection
    whose pending placeholders the handshake makes."""

    def __init__(self) -> None:
        self.claim: Any = None
        self.staged: _newrepo.Staged | None = None
        self.protection = paths.Protection((), (), ())


def prepare(
    plan: RunPlan,
    request: RunRequest,
    held: Held,
    audit: AuditLog,
    tmp: Scratch,
    env: dict[str, str],
    trust: tuple[Path, ...],
    files: tuple[tuple[Path, str], ...],
    ll: Any,
) -> tuple[bubblewrap.ContainerPlan, dict[str, str]]:
    """The mount plan and the command's environment for ``plan``'s run (``env``: built
    for it; ``trust``: the trust stores kept readable; ``files``: the egress layer's
    files to bind; ``ll``: the landlock backend's run). What is claimed or staged is in
    ``held`` as soon as it is, so that the executor releases it on any failure after.

    Raises:
        Unavailable: without the container layer, a deny match or a narrowed trust root
            that only the container can hold.
    """
    policy = plan.policy
    fs = policy.filesystem
    layers = policy.layers
    workspace, home, cwd = fs.workspace, plan.home, plan.cwd
    deny, toolchains, narrowed = plan.deny, plan.toolchains, plan.narrowed
    runsc, handshake, use_launcher = plan.runsc, plan.handshake, plan.use_launcher
    if plan.contained:
        held.claim = claim = _placeholders.Claim(
            default_audit_dir().parent, workspace, audit.run_id
        )
        launcher_binds = layers.files and use_launcher and runsc is None and _host.mount_api()
        # When the launcher binds, the placeholders are first needed once the
        # sandbox is let go: with a handshake, they are made while bubblewrap
        # starts (BwrapHandshake.release).
        writable_ws = os.access(workspace, os.W_OK)
        defer = launcher_binds and handshake and writable_ws
        held.protection = protection = claim.protect(
            workspace,
            fs.protect,
            defer=defer,
            writable=fs.write,
            # gVisor holds an empty directory with a tmpfs, cheaper there than a bind
            absent_dirs=runsc is not None,
        )
        guard = paths.guard_trust_roots(narrowed)
        # No repository yet: .git is the run's own directory inside, adopted
        # (sanitized) when the run is over, so `git init` works (_newrepo).
        # An overlay run adopts nothing behind the review: its .git stays protected.
        held.staged = staged = (
            _newrepo.stage(workspace, tmp.path) if writable_ws and not fs.overlay else None
        )
        if staged is not None:
            claim.record_placeholder(staged.target)
            held.protection = protection = _without(protection, staged.target)
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
        container = bubblewrap.ContainerPlan(
            workspace=workspace,
            home=home,
            read=(*fs.read, *trust),
            write=fs.write,
            toolchains=toolchains,
            masked_files=(*deny.files, *sockets),
            masked_dirs=(*deny.dirs, *guard.masked),
            protected=(*protection.existing, *guard.protected),
            pinned=tuple(
                sorted(set(protection.pinned) | set(guard.pinned), key=lambda p: len(p.parts))
            ),
            # The launcher binds in a mount namespace of its own: bwrap's init
            # keeps the old one, which Landlock keeps out of reach (_launcher.c).
            launcher_binds=launcher_binds,
            share_net=not layers.egress,
            cwd=cwd,
            files=files,
            staged=((staged.inner, staged.target),) if staged is not None else (),
            tmp=request.tmp,
        )
        return container, env
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
            held.claim = ll.protect(workspace, plan.caller_env)
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
        (tmp.path / "home").mkdir()
        (tmp.path / "tmp").mkdir()
        child_env = dict(env)
        child_env["HOME"] = str(tmp.path / "home")
        child_env["TMPDIR"] = str(request.tmp or tmp.path / "tmp")
        container = bubblewrap.ContainerPlan(
            workspace=workspace,
            home=home,
            toolchains=toolchains,
            isolate=False,
            cwd=cwd,
            read=trust,
            files=files,
            tmp=request.tmp,
        )
    return container, child_env


def _without(protection: paths.Protection, top: Path) -> paths.Protection:
    """``protection`` less everything at or below ``top`` (a staged ``.git``: inside it
    is the run's own directory, not the host's)."""

    def keep(items: tuple[Path, ...]) -> tuple[Path, ...]:
        # By string (absolute, normalised paths): Path.parents made a Path per level of
        # every protected path, about half a millisecond of each run.
        return tuple(p for p in items if not within(p, top))

    return replace(
        protection,
        existing=keep(protection.existing),
        pinned=keep(protection.pinned),
        pending_dirs=keep(protection.pending_dirs),
        pending_files=keep(protection.pending_files),
    )
