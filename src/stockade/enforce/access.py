"""What a sandboxed command may read and write, asked from outside the sandbox.

Agent frameworks do much of their file I/O in the host process (an editor tool, an
``apply_patch``, an upload), outside every layer. :func:`check_write` and
:func:`check_read` answer, for one host path, what the sandbox of ``policy`` would let
its command do there, with the tables and functions the run itself uses
(:func:`~stockade.enforce.paths.protect_paths`, :func:`~stockade.enforce.paths.expand_deny`,
:data:`~stockade.policy._tables.SYSTEM_PATHS`), so that a host-side write never lands on
a path the sandbox keeps read-only (``.git/hooks``, ``.claude/``, ``.vscode/``, ...).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from stockade._exceptions import Denied
from stockade.enforce import paths
from stockade.policy import Policy
from stockade.policy._tables import SYSTEM_PATHS, SYSTEM_SECRETS


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _within_any(path: Path, roots: Iterable[Path]) -> bool:
    return any(_within(path, r) for r in roots)


def resolve(path: str | os.PathLike[str], policy: Policy) -> Path:
    """``path`` made absolute (relative to the workspace) with its links resolved."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.is_absolute():
        p = policy.filesystem.workspace / p
    return p.resolve()


def _denied(policy: Policy, real: Path) -> bool:
    fs = policy.filesystem
    deny = paths.expand_deny(fs.deny, fs.workspace, (*fs.read, *fs.write))
    return _within_any(real, (*deny.dirs, *deny.files))


def check_write(policy: Policy, path: str | os.PathLike[str], *, recursive: bool = False) -> Path:
    """The resolved path, when the sandbox of ``policy`` lets its command write there.

    Writable: the workspace and ``filesystem.write``, less ``filesystem.deny`` and the
    protected paths (the defaults of :data:`~stockade.policy._tables.DEFAULT_PROTECTED`,
    git's redirect entries in every writable git directory, the placeholders for those
    missing, and ``filesystem.protect``).

    With ``recursive`` (a removal or a move of a whole tree), no protected or denied
    path may lie inside ``path`` either.

    Raises:
        Denied: ``files`` layer, reason ``path-protected``, ``path-denied`` or
            ``path-not-granted``.
    """
    real = resolve(path, policy)
    fs = policy.filesystem
    roots = (fs.workspace, *fs.write)
    if not _within_any(real, roots):
        raise Denied("files", "path-not-granted", f"{real} is outside the writable areas")
    if _denied(policy, real):
        raise Denied("files", "path-denied", f"{real} is under filesystem.deny")
    protection = paths.protect_paths(fs.workspace, fs.protect, defer=True, writable=fs.write)
    for protected in protection.existing:
        if _within(real, protected) or _within(real, protected.resolve()):
            raise Denied(
                "files", "path-protected", f"{real} is read-only in the sandbox ({protected})"
            )
        if recursive and _within(protected, real) and os.path.lexists(protected):
            raise Denied(
                "files", "path-protected", f"{real} holds {protected}, read-only in the sandbox"
            )
    if recursive:
        deny = paths.expand_deny(fs.deny, fs.workspace, (*fs.read, *fs.write))
        for hidden in (*deny.dirs, *deny.files):
            if _within(hidden, real):
                raise Denied("files", "path-denied", f"{real} holds {hidden} (filesystem.deny)")
    return real


def check_read(policy: Policy, path: str | os.PathLike[str], *, home: Path | None = None) -> Path:
    """The resolved path, when the sandbox of ``policy`` lets its command read it.

    Readable: the workspace, ``filesystem.read`` and ``filesystem.write``, and the system
    paths, less ``filesystem.deny``, the host's secret files and the credential
    locations under ``home`` (the caller's HOME, by default this process's).

    Raises:
        Denied: ``files`` layer, reason ``path-denied`` or ``path-not-granted``.
    """
    real = resolve(path, policy)
    fs = policy.filesystem
    roots = (fs.workspace, *fs.read, *fs.write, *(Path(p) for p in SYSTEM_PATHS))
    if not _within_any(real, roots) and real != Path("/"):
        raise Denied("files", "path-not-granted", f"{real} is not visible in the sandbox")
    home = home if home is not None else paths.caller_home(os.environ)
    secrets = (*(Path(s) for s in SYSTEM_SECRETS), *paths.secret_paths(home))
    if _within_any(real, secrets) or _denied(policy, real):
        raise Denied("files", "path-denied", f"{real} is hidden in the sandbox")
    return real


def readable_dir(policy: Policy, path: Path, home: Path) -> bool:
    """Whether ``path`` is a directory the sandbox's command can be started in."""
    try:
        real = check_read(policy, path, home=home)
    except Denied:
        return False
    return real.is_dir()


def _opened(fd: int) -> Path:
    """The path of what ``fd`` is open on (after every link and rename so far)."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


def read_file(policy: Policy, path: str | os.PathLike[str], *, home: Path | None = None) -> bytes:
    """Read ``path`` only when :func:`check_read` allows it, checking the file opened too
    (a link swapped in between the check and the open is not followed past the check)."""
    real = check_read(policy, path, home=home)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        check_read(policy, _opened(fd), home=home)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def write_file(
    policy: Policy, path: str | os.PathLike[str], data: bytes, *, parents: bool = True
) -> Path:
    """Write ``data`` to ``path`` only when :func:`check_write` allows it.

    Missing parent directories are made one by one, each checked first. The final
    component is opened without following a link, and the file actually opened is
    checked again before it is truncated or written (a file made here and then refused
    is removed again).
    """
    real = check_write(policy, path)
    if parents:
        missing = []
        parent = real.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            check_write(policy, directory)
            os.mkdir(directory)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(real, flags | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        fd = os.open(real, flags)
        created = False
    try:
        try:
            opened = check_write(policy, _opened(fd))
        except Denied:
            if created:
                os.unlink(real)
            raise
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return opened
