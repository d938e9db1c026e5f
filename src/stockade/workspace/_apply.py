"""Apply an overlay run's changes to the real workspace, or refuse them one by one.

Each change is applied atomically, and only when the three-way check passes (below): a
file of the layer is moved onto its target by one rename where the layer and the workspace share
a file system (and the file has one name, the applying user's), else written beside its
target and renamed over it. Crash guarantee: one ``syncfs`` before (the run's data) and
one after (the copies) the whole apply, none per file; a change leaves the layer only
once it is on the disk in the workspace (a move: in the same rename), so after a crash
of the machine every change is in the layer, or in the workspace, or both (applied but
not yet taken out of the layer: a second apply then refuses it as changed on the host).

The three-way check: the host's file must still be what it was when the run began (its
base). The base of each changed path is recorded when the
run ends (:func:`record_base`: inode, size, mtime and ctime, with any change during the
run already marked); a layer whose run was killed before that has no record, and then a
host file whose ctime is not older than the run's start counts as changed.

Never applied, and listed as refused with the reason:

- a path in the protected set (``.git/hooks``, ``.git/config``, ``.husky/``,
  ``stockade.toml``, ... the tables in :mod:`stockade.policy._tables`, plus the policy's
  ``filesystem.protect``), a git directory made anywhere in the tree, and ``.git``
  itself: these run code on the host later;
- anything below a symlink (every directory on the way is opened with ``O_NOFOLLOW``),
  and a symlink that leads out of the workspace, except to the system's programs and
  libraries (:data:`stockade.policy._tables.LINK_TARGETS_OUTSIDE`, for a virtualenv's interpreter);
- a special file (device, FIFO, socket); setuid, setgid bits are dropped.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import itertools
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any

from stockade._record import asdict, record
from stockade.policy._tables import DEFAULT_PROTECTED, GIT_DIR_PROTECTED, LINK_TARGETS_OUTSIDE
from stockade.workspace._at import DIR_FLAGS as _DIR_FLAGS
from stockade.workspace._at import Refused as _Refused
from stockade.workspace._at import open_parent as _open_parent
from stockade.workspace._changes import Change, is_opaque, is_whiteout, scan
from stockade.workspace._diff import selected
from stockade.workspace._layer import Layer, LayerError


@record
class Outcome:
    """What happened to one change."""

    path: str
    #: applied | refused
    action: str
    kind: str
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v != ""}


@functools.cache
def _patterns(patterns: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    # Split once: apply asks about every one of 10,000 paths.
    return tuple((p, PurePosixPath(p).parts) for p in patterns)


_GIT_PARTS = tuple((name, tuple(name.split("/"))) for name, _ in GIT_DIR_PROTECTED)


@functools.cache
def _first_names(patterns: tuple[str, ...]) -> frozenset[str] | None:
    """The first names of ``patterns`` when none is a glob (None: some is, ask each)."""
    firsts = {pp[0] for _, pp in _patterns(patterns) if pp}
    return None if any(glob.has_magic(f) for f in firsts) else frozenset(firsts)


def protected_reason(rel: str, extra: Sequence[str] = ()) -> str | None:
    """Why ``rel`` (workspace-relative) is never applied, or None when it may be."""
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if not parts:
        return None
    patterns = (*DEFAULT_PROTECTED, *extra)
    firsts = _first_names(patterns)
    if firsts is not None and parts[0] not in firsts and ".git" not in parts:
        return None  # no pattern starts with its first name, and no git directory in it
    for pattern, pp in _patterns(patterns):
        if len(parts) >= len(pp) and all(
            a == b or fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pp, strict=False)
        ):
            return f"protected path ({pattern}): it runs or is trusted on the host"
    if parts and parts[0] == ".git" and len(parts) == 1:
        return "protected path (.git): the repository itself is never replaced"
    for i, part in enumerate(parts):
        if part != ".git":
            continue
        below = parts[i + 1 :]
        for name, np in _GIT_PARTS:
            if tuple(below[: len(np)]) == np:
                return f"protected path (.git/{name}): git runs it on the host"
        if i > 0:
            return "a nested git repository: git on the host would run its configuration"
    return None


def record_base(layer: Layer, **also: Any) -> None:
    """Record the host's state of every path the layer changes (call once a run ended).

    A path recorded already keeps its record: the base is the host's file as the layer
    first met it, and a later run of the same layer (a Sandbox session) changes nothing
    about that; nor does a path leaving the layer (an apply records the file it wrote as
    the new base). ``also``: more fields written to ``layer.json`` with it.
    """
    meta = layer.meta
    t0 = int(meta.get("started_coarse_ns", 0))
    recorded = layer.base
    base: dict[str, Any] = dict(recorded or {})
    workspace = str(layer.workspace)
    # Every name the upper layer holds (and, below an opaque directory, every name it
    # hides): a superset of the changes' paths, found without reading any content, so
    # the end of a run that wrote 10,000 files costs one lstat per file here.
    paths = _layer_paths(str(layer.upper), workspace)
    for rel in paths:
        if rel not in base:
            base[rel] = _host_state(os.path.join(workspace, rel), t0)
    if paths or recorded is not None:
        # A run that changed nothing has nothing to record (a write saved at the end of
        # every such run); a later run of the layer, or apply, records what it finds.
        layer.write_base(base)
    if also:
        layer.update(**also)


def _layer_paths(upper: str, lower: str) -> list[str]:
    """The workspace-relative names the layer decides: every entry of the upper layer,
    and every lower entry below a whiteout or hidden by an opaque directory."""
    out: list[str] = []

    def lower_tree(rel: str) -> None:
        try:
            entries = list(os.scandir(os.path.join(lower, rel)))
        except OSError:
            return
        for entry in entries:
            sub = f"{rel}/{entry.name}"
            out.append(sub)
            if entry.is_dir(follow_symlinks=False):
                lower_tree(sub)

    def walk(rel: str) -> None:
        here = os.path.join(upper, rel) if rel else upper
        try:
            entries = list(os.scandir(here))
        except OSError:
            return
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            out.append(sub)
            if entry.is_dir(follow_symlinks=False):
                walk(sub)
            elif entry.is_file(follow_symlinks=False) is False and not entry.is_symlink():
                lower_tree(sub)  # a whiteout (a device): what it deletes below, if a dir
        if rel and is_opaque(here):
            names = {e.name for e in entries}
            try:
                hidden = [e for e in os.scandir(os.path.join(lower, rel)) if e.name not in names]
            except OSError:
                hidden = []
            for entry in hidden:
                out.append(f"{rel}/{entry.name}")
                if entry.is_dir(follow_symlinks=False):
                    lower_tree(f"{rel}/{entry.name}")

    walk("")
    return out


def _host_state(path: str, t0: int) -> dict[str, Any]:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"exists": False}
    return {
        "exists": True,
        "mode": st.st_mode,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        # Changed on the host after the run began: the layer's view of it is stale.
        "changed_during_run": not stat.S_ISDIR(st.st_mode) and st.st_ctime_ns >= t0,
    }


def _conflict(
    change: Change, rel: str, host: os.stat_result | None, meta: dict[str, Any]
) -> str | None:
    """Why the host's ``rel`` is no longer the base the change was made on, or None."""
    base = (meta.get("base") or {}).get(rel)  # meta: layer.json's fields plus "base"
    if base is not None:
        if base.get("changed_during_run"):
            return "changed on the host while the run ran"
        if not base.get("exists"):
            if host is None or (stat.S_ISDIR(host.st_mode) and change.type == "dir"):
                return None
            return "created on the host since the run began"
        if host is None:
            return "deleted on the host since the run began"
        if stat.S_ISDIR(host.st_mode) and stat.S_ISDIR(base["mode"]):
            return None  # a directory's own contents are checked file by file
        now = (host.st_mode, host.st_ino, host.st_size, host.st_mtime_ns, host.st_ctime_ns)
        then = (base["mode"], base["ino"], base["size"], base["mtime_ns"], base["ctime_ns"])
        return None if now == then else "changed on the host since the run began"
    # No record (the run was killed before its end): the run's start is the base.
    if host is None:
        return None if change.kind in ("added",) else "deleted on the host since the run began"
    if stat.S_ISDIR(host.st_mode):
        return None
    if change.kind == "added":
        return "created on the host since the run began"
    if host.st_ctime_ns >= int(meta.get("started_coarse_ns", 0)):
        return "changed on the host since the run began"
    return None


class _Dirs:
    """The workspace's directories an apply opened, by workspace-relative path: each
    opened once (component by component, ``O_NOFOLLOW``) and kept until the apply ends,
    so 10,000 files in 100 directories cost 100 opens, not 30,000."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.fds: dict[tuple[str, ...], int] = {}
        #: the workspace's device (a layer's file on it is moved, not copied)
        self.dev = os.fstat(root_fd).st_dev

    def parent(self, rel: str, *, create: bool, upper: str) -> tuple[int, str]:
        """``rel``'s parent directory's fd (owned by this cache) and ``rel``'s last name."""
        parts = PurePosixPath(rel).parts
        key = parts[:-1]
        fd = self.fds.get(key)
        if fd is None:
            # from the deepest directory on the way already open
            depth = len(key)
            while depth and key[:depth] not in self.fds:
                depth -= 1
            start = self.fds[key[:depth]] if depth else self.root_fd
            fd, _ = _open_parent(start, rel, create=create, upper=upper, skip=depth)
            self.fds[key] = fd
        return fd, parts[-1]

    def forget(self, rel: str) -> None:
        """Close what is cached at or below ``rel`` (a directory removed or replaced)."""
        parts = PurePosixPath(rel).parts
        for key in [k for k in self.fds if k[: len(parts)] == parts]:
            os.close(self.fds.pop(key))

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _lstat_at(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _escapes(workspace: str, rel: str, target: str) -> bool:
    base = os.path.dirname(os.path.join(workspace, rel))
    resolved = os.path.normpath(os.path.join(base, target))
    inside = (workspace, *LINK_TARGETS_OUTSIDE)
    return not any(resolved == r or resolved.startswith(r.rstrip("/") + "/") for r in inside)


def _remove_at(fd: int, name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(name, dir_fd=fd)  # ENOTEMPTY: something was added there on the host
    else:
        os.unlink(name, dir_fd=fd)


#: The temporary names of one process's applies (``O_EXCL`` refuses a name in use).
_TMP_NAMES = itertools.count()


def _tmp_name() -> str:
    return f".stockade-apply-{os.getpid()}-{next(_TMP_NAMES)}"


def _write_file(fd: int, name: str, source: str, mode: int, size: int) -> None:
    tmp = _tmp_name()
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
        try:
            # copy_file_range shares extents where the file system can (a reflink);
            # it may refuse across file systems, and plain copies finish the job.
            # The size is known (the layer is not running): no call to find the end.
            copied = 0
            with contextlib.suppress(OSError):
                while copied < size:
                    n = os.copy_file_range(src, out, size - copied)
                    if not n:
                        break
                    copied += n
            if copied < size:
                while chunk := os.read(src, 1 << 20):
                    os.write(out, chunk)
            os.fchmod(out, mode & 0o1777)  # no setuid/setgid bit reaches the host
            # No fsync per file: the rename makes each file whole or absent for every
            # reader, and one syncfs once every file is in place (apply) makes them
            # durable before the layer lets go of any.
        finally:
            os.close(out)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=fd)
        raise
    finally:
        os.close(src)


def _movable(ust: os.stat_result, workspace_dev: int | None) -> bool:
    """Whether the upper file ``ust`` may be moved into the workspace rather than copied:
    the same file system, one name only (no other name in the layer shares the inode),
    and the applying user's own."""
    return (
        workspace_dev is not None
        and ust.st_dev == workspace_dev
        and ust.st_nlink == 1
        and ust.st_uid == os.geteuid()
    )


def _move_file(fd: int, name: str, upper_path: str, ust: os.stat_result) -> None:
    """Rename the upper file onto ``name``: it leaves the layer exactly when it lands,
    in one atomic rename (after a crash it is in one place or the other, never lost)."""
    # As a copy would be: no extended attribute of the layer (overlayfs's own
    # user.overlay.* among them) and no setuid/setgid bit reaches the host.
    for attr in os.listxattr(upper_path, follow_symlinks=False):
        if attr.startswith("user."):
            os.removexattr(upper_path, attr, follow_symlinks=False)
    mode = stat.S_IMODE(ust.st_mode)
    if mode & ~0o1777:
        os.chmod(upper_path, mode & 0o1777, follow_symlinks=False)
    os.rename(upper_path, name, dst_dir_fd=fd)


def _put(
    fd: int,
    name: str,
    change: Change,
    upper_path: str,
    ust: os.stat_result,
    host: os.stat_result | None,
    workspace_dev: int | None = None,
) -> None:
    """Make ``name`` in ``fd`` what the upper layer has at ``upper_path`` (``ust``):
    moved when :func:`_movable` (``workspace_dev``: the workspace's device, None for
    never), copied otherwise."""
    if change.kind == "replaced" and host is not None and stat.S_ISDIR(host.st_mode):
        _remove_at(fd, name, host)  # its contents were deleted (listed) before
    if stat.S_ISREG(ust.st_mode) and _movable(ust, workspace_dev):
        _move_file(fd, name, upper_path, ust)
    elif stat.S_ISREG(ust.st_mode):
        _write_file(fd, name, upper_path, stat.S_IMODE(ust.st_mode), ust.st_size)
    elif stat.S_ISLNK(ust.st_mode):
        tmp = _tmp_name()
        os.symlink(os.readlink(upper_path), tmp, dir_fd=fd)
        try:
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise
    elif stat.S_ISDIR(ust.st_mode):
        mode = stat.S_IMODE(ust.st_mode) & 0o1777
        if host is None or not stat.S_ISDIR(host.st_mode):
            if host is not None:
                _remove_at(fd, name, host)
            os.mkdir(name, mode, dir_fd=fd)
        dfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            os.fchmod(dfd, mode)
        finally:
            os.close(dfd)


def _forget(layer: Layer, rel: str) -> None:
    """Take an applied path out of the upper layer, so the layer lists what is left."""
    path = os.path.join(layer.upper, rel)
    try:
        os.unlink(path)
    except IsADirectoryError:
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only once empty: its children are applied first
    except OSError:
        pass  # gone already


def apply(
    layer: Layer,
    paths: Iterable[str] = (),
    *,
    protect: Sequence[str] = (),
    dry_run: bool = False,
    choose: Any = None,
) -> list[Outcome]:
    """Apply the layer's changes at or below ``paths`` (all when empty); one
    :class:`Outcome` per change. ``choose(change) -> bool``, when given, is asked about
    each change that may be applied (``apply --interactive``)."""
    if layer.state == "running":
        raise LayerError(f"run {layer.run_id} is still running; apply its changes once it ended")
    layer.check_workspace()
    if layer.base is None:
        # The run was killed before its end recorded the base: record it now, from the
        # run's start (a host file changed since is marked as such).
        record_base(layer)
    meta = {**layer.meta, "base": layer.base or {}}
    changes = selected(scan(layer, sniff=False), paths)
    workspace = str(layer.workspace)
    upper = str(layer.upper)
    # Deletions deepest first (a directory after its contents), then the rest top-down
    # (a directory before what goes in it).
    deletions = sorted(
        (c for c in changes if c.kind == "deleted"), key=lambda c: c.path, reverse=True
    )
    writes = sorted((c for c in changes if c.kind != "deleted"), key=lambda c: c.path)
    root_fd = os.open(workspace, _DIR_FLAGS)
    dirs = _Dirs(root_fd)
    if not dry_run and changes:
        # The layer's files are moved where they can be (the same file system): flush
        # what the run wrote first, so that a moved file's data is on the disk before
        # its name is.
        _syncfs(root_fd)
    outcomes: list[Outcome] = []
    applied: set[str] = set()
    try:
        for change in [*deletions, *writes]:
            outcome = _apply_one(
                layer, dirs, change, meta, protect, upper, workspace, dry_run, choose
            )
            outcomes.append(outcome)
            if outcome.action == "applied":
                applied.add(change.path)
        if not dry_run and applied:
            # The crash guarantee: once a change leaves the layer (below, or by its
            # move), it is on the disk. One flush of the workspace's file system for the
            # whole apply, not one fsync per file (10,000 flushes: minutes on a busy disk).
            _syncfs(root_fd)
    finally:
        dirs.close()
        os.close(root_fd)
    if not dry_run and applied:
        for rel in sorted(applied, reverse=True):
            _forget(layer, rel)
        for c in changes:
            if c.path in applied and c.old_path:
                _forget(layer, c.old_path)
        history = list(meta.get("applied", []))
        history += [o.to_json() for o in outcomes if o.action == "applied"]
        gone = applied | {c.old_path for c in changes if c.path in applied and c.old_path}
        # What this apply wrote is now the host's own, exactly: the base of a later run
        # of the layer (a Sandbox session) that changes it again.
        base = dict(meta.get("base") or {})
        for rel in gone:
            state = _host_state(os.path.join(workspace, rel), 0)
            state["changed_during_run"] = False
            base[rel] = state
        layer.write_base(base)
        layer.update(applied=history)
    return sorted(outcomes, key=lambda o: o.path)


def _syncfs(fd: int) -> None:
    """Flush the file system holding ``fd`` (syncfs(2)); the whole system's when the C
    library has no syncfs."""
    from stockade._libc import libc

    lib = libc()
    if not hasattr(lib, "syncfs") or lib.syncfs(fd) != 0:
        os.sync()


def _apply_one(
    layer: Layer,
    dirs: _Dirs,
    change: Change,
    meta: dict[str, Any],
    protect: Sequence[str],
    upper: str,
    workspace: str,
    dry_run: bool,
    choose: Any,
) -> Outcome:
    def refuse(reason: str) -> Outcome:
        return Outcome(change.path, "refused", change.kind, reason)

    for rel in filter(None, (change.path, change.old_path)):
        why = protected_reason(rel, protect)
        if why:
            return refuse(why)
    if change.type == "other":
        return refuse("a special file (device, FIFO or socket) is never applied")
    link = change.type == "symlink" and change.kind != "deleted" and change.target is not None
    if link and _escapes(workspace, change.path, change.target or ""):
        return refuse(f"a symlink that leads out of the workspace ({change.target})")
    try:
        fd, name = dirs.parent(
            change.path, create=not dry_run and change.kind != "deleted", upper=upper
        )
    except _Refused as exc:
        return refuse(str(exc))
    except FileNotFoundError:
        return refuse("its directory is gone on the host")
    try:
        host = _lstat_at(fd, name)
        why = _conflict(change, change.path, host, meta)
        old: tuple[int, str, os.stat_result | None] | None = None
        if why is None and change.kind == "renamed" and change.old_path:
            ofd, oname = dirs.parent(change.old_path, create=False, upper=upper)
            ohost = _lstat_at(ofd, oname)
            old = (ofd, oname, ohost)
            why = _conflict(change, change.old_path, ohost, meta)
        if why is not None:
            return refuse(why)
        if choose is not None and not choose(change):
            return Outcome(change.path, "skipped", change.kind, "not chosen")
        if dry_run:
            return Outcome(change.path, "applied", change.kind, "dry run")
        if change.kind == "deleted":
            if host is not None:
                try:
                    _remove_at(fd, name, host)
                except OSError as exc:
                    return refuse(f"cannot remove it: {exc.strerror} (changed on the host?)")
                dirs.forget(change.path)
        else:
            upper_path = os.path.join(upper, change.path)
            ust = os.lstat(upper_path)
            if is_whiteout(upper_path, ust):
                return refuse("the layer changed while applying")
            if host is not None and stat.S_ISDIR(host.st_mode) and not stat.S_ISDIR(ust.st_mode):
                dirs.forget(change.path)  # a directory replaced: its fds are stale
            _put(fd, name, change, upper_path, ust, host, dirs.dev)
            if old is not None and old[2] is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old[1], dir_fd=old[0])
        return Outcome(change.path, "applied", change.kind)
    except _Refused as exc:
        return refuse(str(exc))
    except OSError as exc:
        return refuse(f"{exc.strerror or exc}")


def discard(layer: Layer) -> None:
    """Throw the layer away: the real workspace keeps what it has."""
    layer.discard()
