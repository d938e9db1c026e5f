"""Turning a policy's file-system section into concrete paths for one run.

Three jobs, each with I/O on the host's file system (so not in ``policy``):

* toolchains installed under HOME (pyenv, nvm, ``~/.local/bin``, ``~/.cargo/bin``, ...)
  keep working: the directories on the caller's PATH, and what their entries resolve to,
  are made visible read-only, unless they are (or contain) a secret location;
* ``filesystem.deny`` globs are expanded to the paths that exist now;
* protected paths inside the workspace (``.git/hooks``, ``.claude/``, ...) are listed,
  with placeholders for those that do not exist yet, so that they cannot be created.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from stockade._record import record
from stockade.policy._tables import DEFAULT_PROTECTED

#: Locations under HOME that hold credentials; never bound into the sandbox, even when a
#: PATH entry points into them.
SECRET_HOME_PATHS: tuple[str, ...] = (
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".config/op",
    ".config/stockade",
    ".claude",
    ".claude.json",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".yarnrc",
    ".yarnrc.yml",
    ".docker",
    ".kube",
    ".gnupg",
    ".password-store",
    ".git-credentials",
    ".gitconfig",
    ".config/git/credentials",
    ".cache/git/credential",
    ".local/share/keyrings",
    ".vault-token",
    ".terraform.d",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".node_repl_history",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
)

#: Top-level directories under HOME that are whole toolchain installations: a PATH entry
#: inside one needs the rest of it (pyenv's shims exec ``pyenv``, nvm's node its lib).
TOOLCHAIN_ROOTS: tuple[str, ...] = (
    ".pyenv",
    ".nvm",
    ".fnm",
    ".volta",
    ".cargo/bin",
    ".rustup",
    ".bun",
    ".deno",
    ".rbenv",
    ".goenv",
    ".asdf",
    ".sdkman",
    ".juliaup",
    "go",
    ".local/bin",
    ".local/pipx",
    ".poetry",
)


#: Protected names that get a placeholder when missing, so they cannot be created inside.
#: (A glob or a path under .git is only protected where it exists; .git itself is
#: protected when the workspace is not a repository, so no repository can be created.)
_DIR_PLACEHOLDERS = (".claude", ".cursor", ".vscode", ".idea", ".husky", ".devcontainer")
_FILE_PLACEHOLDERS = (".mcp.json", ".envrc", ".gitmodules", "stockade.toml")
#: Inside an existing .git directory. An empty commondir makes git fail, so its
#: placeholder says "." (the git directory itself), which changes nothing.
_GIT_PLACEHOLDERS = ("commondir", "config.worktree")
_PLACEHOLDER_CONTENT = {"commondir": b".\n"}

#: Expanding a deny glob stops after this long; the run is refused rather than partly
#: protected when it does.
DENY_GLOB_BUDGET_S = 2.0


def _is_within(path: Path, root: Path) -> bool:
    # String prefixes, not Path.parents: this runs thousands of times per start.
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def secret_paths(home: Path) -> tuple[Path, ...]:
    """The credential locations under ``home``."""
    return tuple(home / rel for rel in SECRET_HOME_PATHS)


def _touches_secret(path: Path, secrets: Iterable[Path]) -> bool:
    # A bind of ``path`` exposes every secret under it, and binding something inside a
    # secret location exposes that secret.
    return any(_is_within(s, path) or _is_within(path, s) for s in secrets)


def _toolchain_root(path: Path) -> Path | None:
    """The toolchain installation ``path`` belongs to (``/x/.pyenv`` for ``/x/.pyenv/shims``)."""
    parts = path.parts
    for root in TOOLCHAIN_ROOTS:
        want = tuple(root.split("/"))
        for i in range(1, len(parts) - len(want) + 1):
            if parts[i : i + len(want)] == want:
                return Path(*parts[: i + len(want)])
    return None


_TOOLCHAIN_CACHE: dict[tuple[object, ...], tuple[Path, ...]] = {}


def toolchain_paths(env_path: str, home: Path, denied: Iterable[Path] = ()) -> tuple[Path, ...]:
    """Read-only binds that keep the caller's PATH tools working inside the sandbox.

    Cached per process, keyed on the PATH, the deny list and the modification times of
    the PATH directories (adding or removing a link changes them), so that the runs of a
    warm :class:`~stockade.Sandbox` do not scan the same directories again.
    """
    denied = tuple(denied)
    stamps = []
    for spelled in env_path.split(os.pathsep):
        try:
            stamps.append(os.stat(spelled).st_mtime_ns if os.path.isabs(spelled) else 0)
        except OSError:
            stamps.append(-1)
    key = (env_path, home, denied, tuple(stamps))
    cached = _TOOLCHAIN_CACHE.get(key)
    if cached is None:
        if len(_TOOLCHAIN_CACHE) > 32:
            _TOOLCHAIN_CACHE.clear()
        cached = _TOOLCHAIN_CACHE[key] = _scan_toolchains(env_path, home, denied)
    return cached


def _scan_toolchains(env_path: str, home: Path, denied: tuple[Path, ...]) -> tuple[Path, ...]:
    """The uncached work of :func:`toolchain_paths`.

    Only directories under ``home`` (the rest of HOME is a fresh tmpfs) or outside the
    system paths are returned; a directory that is or holds a secret location is never
    returned.
    """
    secrets = [*secret_paths(home), *denied]
    out: list[Path] = []

    def add(path: Path) -> None:
        if path == home or path == Path("/") or _touches_secret(path, secrets):
            return
        if any(_is_within(path, p) for p in out):
            return
        out[:] = [p for p in out if not _is_within(p, path)]
        out.append(path)

    for spelled in env_path.split(os.pathsep):
        if not spelled or not os.path.isabs(spelled):
            continue  # a relative PATH entry would resolve inside the sandbox anyway
        try:
            real = Path(spelled).resolve()
            if not real.is_dir():
                continue
        except (OSError, RuntimeError):
            continue  # unreadable (another user's home) or a symlink loop: nothing to bind
        root = _toolchain_root(real)
        if root is not None:
            add(root)
        elif _is_within(real, home) or not any(
            _is_within(real, Path(s)) for s in ("/usr", "/bin", "/sbin", "/opt")
        ):
            add(real)
        if root is not None and root.name != "bin":
            continue  # a whole toolchain installation is bound; its links point inside it
        if not _is_within(real, home):
            continue
        # Entries of a PATH directory under HOME may be symlinks into a tool's own
        # installation (pipx: ~/.local/bin/x -> ~/.local/pipx/venvs/x/bin/x).
        try:
            entries = list(os.scandir(real))
        except OSError:
            entries = []
        home_prefix = str(home) + "/"
        for entry in entries:
            try:
                if not entry.is_symlink():  # from the directory entry: no stat
                    continue
                real_target = os.path.realpath(entry.path)
                if not real_target.startswith(home_prefix):
                    continue
                target = Path(real_target)
                if not target.exists() or not _is_within(target, home):
                    continue
            except OSError:
                continue
            add(target.parent.parent if target.parent.name == "bin" else target)
    return tuple(out)


@record
class DenyMatches:
    """What ``filesystem.deny`` globs matched at the start of a run."""

    files: tuple[Path, ...]
    dirs: tuple[Path, ...]


def expand_deny(globs: Iterable[str], workspace: Path, visible: Iterable[Path]) -> DenyMatches:
    """Expand deny globs to existing paths inside the ``visible`` areas.

    Relative globs are matched inside the workspace. A path outside every visible area
    needs no mask (it is invisible anyway). Symlinks are resolved, so a deny on a link
    denies the real file.

    Raises:
        TimeoutError: expanding took longer than :data:`DENY_GLOB_BUDGET_S`; the caller
            refuses the run rather than protect only part of the tree.
    """
    roots = [workspace, *visible]
    deadline = time.monotonic() + DENY_GLOB_BUDGET_S
    files: list[Path] = []
    dirs: list[Path] = []
    for pattern in globs:
        full = pattern if os.path.isabs(pattern) else str(workspace / pattern)
        for hit in glob.iglob(full, recursive=True, include_hidden=True):
            if time.monotonic() > deadline:
                raise TimeoutError(pattern)
            real = Path(hit).resolve()
            if not any(_is_within(real, r) for r in roots):
                continue
            (dirs if real.is_dir() else files).append(real)
    return DenyMatches(tuple(dict.fromkeys(files)), tuple(dict.fromkeys(dirs)))


@record
class Protection:
    """Protected paths for one run."""

    #: existing protected paths, re-bound read-only
    existing: tuple[Path, ...]
    #: directories between the workspace and a protected path, bound onto themselves so
    #: that renaming them (to build a fresh unprotected copy) fails with EBUSY
    pinned: tuple[Path, ...]
    #: placeholders created for this run (removed afterwards if still empty)
    created: tuple[Path, ...]
    #: placeholders still to create (directories, then files), already listed in
    #: ``existing``: see ``defer`` of :func:`protect_paths`
    pending_dirs: tuple[Path, ...] = ()
    pending_files: tuple[Path, ...] = ()


def _expand(root: Path, pattern: str) -> list[Path]:
    """Existing paths matching ``pattern`` under ``root``; literal patterns need no glob."""
    if not any(c in pattern for c in "*?["):
        path = root / pattern
        return [path] if os.path.lexists(path) else []
    # Only glob below the literal prefix, and only when it exists (.git/modules is rare).
    prefix = pattern.split("*", 1)[0].rsplit("/", 1)[0]
    if prefix and not os.path.isdir(root / prefix):
        return []
    return [Path(hit) for hit in sorted(glob.glob(str(root / pattern), include_hidden=True))]


def protect_paths(workspace: Path, extra: Iterable[str] = (), *, defer: bool = False) -> Protection:
    """List and prepare the protected paths of ``workspace``.

    Missing agent/IDE files and directories get an empty placeholder on the host for the
    duration of the run: a read-only bind needs something to bind, and without it the
    sandbox could create the file. :func:`remove_placeholders` takes them away again.
    A placeholder that cannot be made (a read-only workspace) is left out: nothing can
    create the path then. With ``defer``, none is made yet: they are listed (as
    protected, and as pending) for :func:`make_placeholders`, for a caller that makes them
    while the sandbox starts, and that fails closed if it cannot.
    """
    existing: list[Path] = []
    created: list[Path] = []
    pinned: list[Path] = []
    git = workspace / ".git"
    patterns = list(DEFAULT_PROTECTED) + list(extra)
    if git.is_file() or git.is_symlink():
        # A .git file redirects git to another directory (worktrees, submodules).
        patterns.append(".git")
    for pattern in patterns:
        for path in _expand(workspace, pattern):
            if path.is_symlink():
                # The bind follows the link; protect what git would follow, too.
                real = path.resolve()
                if _is_within(real, workspace):
                    existing.append(real)
            existing.append(path)
    missing_dirs = [n for n in _DIR_PLACEHOLDERS if not os.path.lexists(workspace / n)]
    missing_files = [n for n in _FILE_PLACEHOLDERS if not os.path.lexists(workspace / n)]
    if not os.path.lexists(git):
        missing_dirs.append(".git")
    elif git.is_dir() and not git.is_symlink():
        # Files git reads from .git that a repository usually lacks: created, they would
        # redirect git (commondir points the common dir, and so config and hooks,
        # elsewhere) or add configuration. Placeholders keep them from being created.
        for name in _GIT_PLACEHOLDERS:
            if not os.path.lexists(git / name):
                missing_files.append(f".git/{name}")
    dirs = [workspace / name for name in missing_dirs]
    files = [workspace / name for name in missing_files]
    if defer:
        existing += [*dirs, *files]
    else:
        made, failed = make_placeholders(dirs, files, strict=False)
        created += made
        existing += [p for p in (*dirs, *files) if p not in failed]
    for path in existing:
        parent = path.parent
        while parent != workspace and _is_within(parent, workspace):
            pinned.append(parent)
            parent = parent.parent
    existing = [p for p in dict.fromkeys(existing) if _is_within(p, workspace)]
    return Protection(
        existing=tuple(existing),
        pinned=tuple(sorted(set(pinned), key=lambda p: len(p.parts))),
        created=tuple(created),
        pending_dirs=tuple(dirs) if defer else (),
        pending_files=tuple(files) if defer else (),
    )


def make_placeholders(
    dirs: Iterable[Path], files: Iterable[Path], *, strict: bool = True
) -> tuple[list[Path], list[Path]]:
    """Create empty placeholder directories and files; return (created, failed).

    One that exists already (another run of the workspace made it) is neither. With
    ``strict``, the first failure removes what this call created and raises.
    """
    created: list[Path] = []
    failed: list[Path] = []
    for target, is_dir in [*((d, True) for d in dirs), *((f, False) for f in files)]:
        try:
            if is_dir:
                os.mkdir(target, 0o755)
            else:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                try:
                    os.write(fd, _PLACEHOLDER_CONTENT.get(target.name, b""))
                except OSError:
                    os.unlink(target)
                    raise
                finally:
                    os.close(fd)
        except FileExistsError:
            continue
        except OSError:
            if strict:
                remove_placeholders(created)
                raise
            failed.append(target)  # a read-only workspace needs no protection from writes
            continue
        created.append(target)
    return created, failed


def remove_placeholders(created: Iterable[Path]) -> list[Path]:
    """Remove this run's placeholders that are still empty; return those left in place."""
    import stat

    left: list[Path] = []
    # Deepest first: a placeholder may hold another run's (.git then .git/commondir).
    # One lstat per path and plain os calls: this runs after every command, before its
    # exit status is reported.
    for path in sorted(set(created), key=lambda p: len(p.parts), reverse=True):
        spelled = str(path)
        try:
            mode = os.lstat(spelled).st_mode
            if stat.S_ISDIR(mode):
                os.rmdir(spelled)  # fails on a directory the command filled: left
                continue
            if stat.S_ISREG(mode):
                with open(spelled, "rb") as fh:
                    unchanged = fh.read(64) == _PLACEHOLDER_CONTENT.get(path.name, b"")
                if unchanged:
                    os.unlink(spelled)
                    continue
        except FileNotFoundError:
            continue  # already gone (another run of the workspace removed it)
        except OSError:
            pass
        left.append(path)
    return left


#: Directories not searched for sockets: large, and no host service listens in them.
_SOCKET_SKIP = frozenset(
    {"node_modules", ".venv", "venv", "__pycache__", ".tox", "target", "dist", "build"}
)
SOCKET_SCAN_DEPTH = 4
SOCKET_SCAN_BUDGET_S = 0.2


def workspace_sockets(workspace: Path) -> tuple[list[Path], bool]:
    """Unix sockets of host services inside the workspace (git's fsmonitor daemon, a dev
    server), to be masked: ``connect()`` needs no write permission, so neither a
    read-only bind nor Landlock (before its unix-socket rules) would stop it.

    Searches :data:`SOCKET_SCAN_DEPTH` levels deep within :data:`SOCKET_SCAN_BUDGET_S`;
    returns the sockets found and whether the search was complete.
    """
    import stat

    deadline = time.monotonic() + SOCKET_SCAN_BUDGET_S
    found: list[Path] = []
    stack: list[tuple[str, int]] = [(str(workspace), 0)]
    while stack:
        if time.monotonic() > deadline:
            return found, False
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 < SOCKET_SCAN_DEPTH and entry.name not in _SOCKET_SKIP:
                        stack.append((entry.path, depth + 1))
                elif (
                    not entry.is_file(follow_symlinks=False)
                    and not entry.is_symlink()
                    and stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)
                ):
                    found.append(Path(entry.path))
            except OSError:
                continue
    return found, True


def caller_home(env: Mapping[str, str]) -> Path:
    """The caller's home directory as a resolved path."""
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home).resolve()
