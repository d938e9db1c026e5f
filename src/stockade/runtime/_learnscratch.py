"""A learning run's scratch views: the task's writes outside the workspace succeed, in a
throwaway copy-on-write layer, and are recorded; the host's files are never changed.

Why a view and not a grant: learning must let the task do what it really does (a write
refused in learning makes the task fail there, and what it would have done next is never
seen), but a learning run has, by design, no policy for its writes yet. Binding the
host's directory read-write would let the very task being learnt rewrite the user's
configuration; a copy would cost time and space in proportion to the directory. An
overlay costs neither: the launcher mounts one over each directory learning makes
visible (``filesystem.scratch``), with the directory itself (bound read-only) as its
lower layer and a fresh layer in the run's private scratch directory on the host as
its upper; Landlock grants the write right on the view. After the run every entry of
each upper layer is recorded (``scratch_write``: written, made, replaced (a directory
removed and made again) or deleted (overlayfs keeps a whiteout)), then the layer is
removed with the run's scratch.

Refused views fall back to what learning did before (the directory read-only, a write
refused and still observed): fail closed, never a read-write host directory. A view is
refused without the container and files layers or the launcher's mounts, under gVisor
and the landlock backend (no mount namespace), for a directory with a mount point
beneath it (an overlay's lower layer does not cross mounts, so a view would show what
lies under the mount on the host, which the sandbox must not see), and where the
scratch directory's file system keeps no user extended attributes (overlayfs needs
them in a user namespace). Each refusal is a ``layer_note`` naming the reason.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from stockade._fs import remove_tree
from stockade._record import replace
from stockade.enforce.bubblewrap import ContainerPlan
from stockade.policy import Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stockade.audit import AuditLog

__all__ = ["MAX_RECORDED", "begin", "end"]

#: at most this many entries of the layers are recorded per run (then one note says how
#: many more): the audit log of a run that unpacks an archive stays readable
MAX_RECORDED = 5000


def _mount_points() -> list[str]:
    """The host's mount points (this process's mount namespace), decoded."""
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            # mountinfo escapes space, tab, newline and backslash as octal
            out.append(fields[4].encode().decode("unicode_escape"))
    return out


def _refusal(policy: Policy, container: ContainerPlan, gvisor: bool) -> str:
    layers = policy.layers
    if gvisor:
        return "gVisor has no launcher mounts"
    if policy.container.backend == "landlock":
        return "the landlock backend has no mount namespace"
    if not (layers.container and layers.files and container.isolate):
        return "the container and files layers are needed"
    if not container.launcher_binds:
        return "the launcher's mounts need the new mount API (Linux 5.12+)"
    return ""


def _user_xattrs(directory: Path) -> bool:
    """True when ``directory``'s file system keeps user extended attributes (overlayfs
    keeps its whiteouts and opaque marks there in a user namespace)."""
    try:
        os.setxattr(directory, "user.stockade.probe", b"1")
        os.removexattr(directory, "user.stockade.probe")
    except OSError:
        return False
    return True


def begin(
    policy: Policy,
    container: ContainerPlan,
    tmp: Path,
    audit: AuditLog,
    *,
    gvisor: bool,
) -> ContainerPlan:
    """``container`` with a scratch view over each ``filesystem.scratch`` directory that
    can have one (a ``layer_note`` for each that cannot: it stays read-only)."""
    wanted = [Path(d) for d in policy.filesystem.scratch]
    if not wanted:
        return container
    emit = audit.emit
    why = _refusal(policy, container, gvisor)
    if why:
        for directory in wanted:
            emit(
                "layer_note",
                layer="files",
                verdict="report",
                reason="not-applied",
                detail=f"no scratch view over {directory} ({why}): writes there are refused",
                path=str(directory),
            )
        return container
    mounts = _mount_points()
    # What the sandbox sees beneath a view that is not the host's directory itself:
    # its own HOME, /tmp, /proc, /dev and /run, the workspace and write binds, stockade's
    # files. The view's lower layer does not cross these mounts, so it would show what
    # lies under them on the host (a --see of /home would show the real HOME): no view.
    own = [
        container.home, container.workspace, *container.write, *container.toolchains,
        *(Path(p) for p in ("/tmp", "/var/tmp", "/dev", "/proc", "/run", "/sys")),
        *(Path(inside) for _, inside in container.files),
        *(stands_for for _, stands_for in container.staged),
        *(Path(p) for p in container.system_paths),
    ]  # fmt: skip
    base = tmp / "learn-scratch"
    base.mkdir(mode=0o700, exist_ok=True)
    xattrs = _user_xattrs(base)
    views: list[tuple[Path, Path]] = []
    for directory in wanted:
        prefix = str(directory).rstrip("/") + "/"
        inside = [m for m in mounts if m.startswith(prefix)]
        covers = [str(p) for p in own if str(p) == str(directory) or str(p).startswith(prefix)]
        reason = ""
        if not directory.is_dir():
            reason = "not a directory"
        elif os.path.realpath(directory) != str(directory):
            # the checks below read the host's mounts by path: only the real one counts
            reason = "its path goes through a symbolic link (name the real directory)"
        elif covers:
            reason = f"the sandbox's own {covers[0]} is there"
        elif inside:
            reason = f"a mount point lies beneath it ({inside[0]})"
        elif not xattrs:
            reason = f"{base}'s file system keeps no user extended attributes"
        if reason:
            emit(
                "layer_note",
                layer="files",
                verdict="report",
                reason="not-applied",
                detail=f"no scratch view over {directory} ({reason}): writes there are refused",
                path=str(directory),
            )
            continue
        layer = base / str(len(views))
        for part in ("upper", "work"):
            (layer / part).mkdir(mode=0o700, parents=True)
        views.append((directory, layer))
        emit(
            "layer_note",
            layer="files",
            verdict="report",
            reason="path-not-granted",
            detail=f"scratch view over {directory}: the task's writes there land in a "
            "throwaway layer, recorded after the run; the host's files stay as they are",
            path=str(directory),
        )
    return replace(container, scratch=tuple(views)) if views else container


def _opaque(path: str) -> bool:
    """True when overlayfs marked this upper directory opaque (userxattr: user.*)."""
    try:
        return os.getxattr(path, "user.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _entries(directory: Path, upper: Path) -> list[tuple[str, str]]:
    """(path the sandbox saw, change) for every entry of one upper layer."""
    out: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(upper):
        rel = os.path.relpath(root, upper)
        seen = Path(directory) if rel == "." else Path(directory) / rel
        for name in dirs:
            # a directory the task made; one copied up (a file below it changed) existed;
            # one marked opaque was removed and made again (what it held is gone)
            if not os.path.lexists(seen / name):
                out.append((str(seen / name), "made"))
            elif _opaque(os.path.join(root, name)):
                out.append((str(seen / name), "replaced"))
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            # overlayfs records a deletion as a 0/0 character device (a whiteout)
            whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
            out.append((str(seen / name), "deleted" if whiteout else "written"))
    return out


def end(container: ContainerPlan, audit: AuditLog) -> list[tuple[str, str]]:
    """Record what the run wrote in its scratch views (``scratch_write`` events), then
    remove the layers; return the (path, change) pairs recorded."""
    emit = audit.emit
    recorded: list[tuple[str, str]] = []
    total = 0
    for directory, layer in container.scratch:
        entries = _entries(directory, layer / "upper")
        total += len(entries)
        for path, change in entries:
            if len(recorded) >= MAX_RECORDED:
                break
            recorded.append((path, change))
            emit(
                "scratch_write",
                layer="files",
                verdict="report",
                reason="path-not-granted",
                detail=f"{change} in a throwaway view; the host's {directory} is unchanged",
                path=path,
                change=change,
            )
        # overlayfs leaves its work directory with mode 0: open it to remove it
        with contextlib.suppress(OSError):
            os.chmod(layer / "work" / "work", 0o700)
        remove_tree(layer)
    if total > len(recorded):
        emit(
            "layer_note",
            layer="files",
            verdict="report",
            reason="path-not-granted",
            detail=f"{total - len(recorded)} more writes in scratch views were not recorded "
            f"(at most {MAX_RECORDED} a run)",
        )
    return recorded
