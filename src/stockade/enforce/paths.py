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

from stockade._exceptions import SandboxError
from stockade._record import record
from stockade._roots import Narrowed
from stockade.policy._tables import DEFAULT_PROTECTED, GIT_DIR_PROTECTED, HOOK_MANAGERS

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
#: (Inside git directories, :func:`_git_protection` decides; .git itself is protected
#: when the workspace is not a repository, so no repository can be created.)
#:
#: These are directories where they exist, but a missing one is held by an empty *file*:
#: bound read-only onto itself, the name is taken (no directory of that name can be
#: made, and a mount point cannot be removed or renamed), which is all a placeholder is
#: for. An empty file costs no data block; an empty directory costs one, and freeing it
#: made each ``rmdir`` at the end of a run 0.15 ms here and about 1.2 ms on an ext4
#: mounted with ``discard``: 7 of them after every run. Inside, a missing ``.vscode`` is
#: then an empty read-only file rather than an empty read-only directory, which is
#: closer to "not there" for the tools that look (``isdir(".idea")``).
_ABSENT_DIRS = (
    ".claude",
    ".cursor",
    ".vscode",
    ".idea",
    ".husky",
    ".devcontainer",
    ".gemini",
)
# (mise's files are protected where they exist but get no placeholder: mise trusts a
# config file by its path, and one it has never seen is not trusted, so only an existing
# one can be turned into code; a visible empty mise.toml in every workspace would be.)
_FILE_PLACEHOLDERS = (".mcp.json", ".envrc", ".gitmodules", "stockade.toml", "HEAD")
#: An empty commondir makes git fail, so its placeholder says "." (the git directory
#: itself), which changes nothing.
_PLACEHOLDER_CONTENT = {"commondir": b".\n"}
#: In the administrative directory of a linked worktree git reads ``config`` and
#: ``hooks`` from the common directory (its ``commondir`` says where), and ``gitdir``
#: names the worktree's own directory (``git worktree remove`` deletes it).
_LINKED_PROTECTED = (("commondir", "f"), ("config.worktree", "f"), ("gitdir", "f"))
#: How deep submodules (``modules/<name>``, names may hold slashes, nested submodules
#: under ``modules/<name>/modules``) are searched for git directories.
_MODULES_DEPTH = 8

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


#: Directories the container binds whole (a subset of ``SYSTEM_PATHS``): a PATH entry in
#: one needs no bind of its own, though its environment's base interpreter may.
_SYSTEM_BIN_ROOTS = (Path("/usr"), Path("/bin"), Path("/sbin"), Path("/opt"))


def _is_system(path: Path) -> bool:
    return any(_is_within(path, root) for root in _SYSTEM_BIN_ROOTS)


def env_prefix(bin_dir: Path) -> Path | None:
    """The installation prefix ``bin_dir`` (a resolved ``.../bin``) is the ``bin/`` of,
    when that prefix is an environment a program finds its libraries in through its own
    location: a Python virtual environment (``pyvenv.cfg``), a conda environment
    (``conda-meta/``), or a standalone Python or Node installation (a uv-managed Python,
    a Node tarball: ``bin/python3`` with ``lib/python3.*``, ``bin/node`` with
    ``lib/node_modules``). None for any other directory: binding its parent would show
    more than the PATH asked for.
    """
    if bin_dir.name != "bin":
        return None
    prefix = bin_dir.parent
    try:
        if (prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir():
            return prefix
        if (bin_dir / "python3").exists() and any((prefix / "lib").glob("python3*")):
            return prefix
        if (bin_dir / "node").exists() and (prefix / "lib" / "node_modules").is_dir():
            return prefix
    except OSError:
        return None
    return None


def _venv_base(prefix: Path) -> Path | None:
    """The base interpreter's ``bin`` directory named by ``prefix/pyvenv.cfg``'s
    ``home`` key, resolved; None without one."""
    try:
        with open(prefix / "pyvenv.cfg", "rb") as fh:
            lines = fh.read(1 << 16).decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "home" and os.path.isabs(value.strip()):
            try:
                base = Path(value.strip()).resolve()
            except (OSError, RuntimeError):
                return None
            return base if base.is_dir() else None
    return None


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

    def add(path: Path) -> bool:
        if path == home or path == Path("/") or _touches_secret(path, secrets):
            return False
        if any(_is_within(path, p) for p in out):
            return True
        out[:] = [p for p in out if not _is_within(p, path)]
        out.append(path)
        return True

    def bind_dir(real: Path, depth: int = 0) -> Path | None:
        """Bind ``real`` (a PATH directory, resolved), or the toolchain or environment
        it belongs to; return the toolchain root, if it was one."""
        root = _toolchain_root(real)
        if root is not None:
            add(root)
            return root
        system = _is_system(real) and not _is_within(real, home)  # visible anyway
        prefix = env_prefix(real)
        # The whole environment, not only its bin/: Python finds pyvenv.cfg and lib/
        # beside the interpreter, and without them silently runs as the base Python.
        if prefix is not None and (system or add(prefix)):
            # A virtual environment runs its base interpreter, and needs its standard
            # library: where pyvenv.cfg's ``home`` says (a pyenv or uv Python under HOME).
            base = _venv_base(prefix)
            if base is not None and base != real and depth < 4:  # venvs of venvs, no loop
                bind_dir(base, depth + 1)
            return None
        if not system:
            add(real)
        return None

    for spelled in env_path.split(os.pathsep):
        if not spelled or not os.path.isabs(spelled):
            continue  # a relative PATH entry would resolve inside the sandbox anyway
        try:
            real = Path(spelled).resolve()
            if not real.is_dir():
                continue
        except (OSError, RuntimeError):
            continue  # unreadable (another user's home) or a symlink loop: nothing to bind
        root = bind_dir(real)
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


def _root_of(path: Path, roots: Iterable[Path]) -> Path | None:
    """The innermost of ``roots`` that holds ``path`` (where the sandbox can write it)."""
    best: Path | None = None
    for root in roots:
        if _is_within(path, root) and (best is None or len(root.parts) > len(best.parts)):
            best = root
    return best


def _gitfile_target(dotgit: Path) -> Path | None:
    """The directory a ``.git`` file (``gitdir: <path>``, relative to the file's
    directory) or a ``.git`` symlink names, resolved; None when it names none."""
    if dotgit.is_symlink():
        return dotgit.resolve()
    try:
        with open(dotgit, "rb") as fh:
            text = fh.read(4096).decode(errors="replace")
    except OSError:
        return None
    first = text.split("\\n", 1)[0].strip()
    if not first.startswith("gitdir:"):
        return None  # git refuses such a file ("invalid gitfile format"): nothing to follow
    target = Path(first[len("gitdir:") :].strip())
    return (dotgit.parent / target).resolve()


def _commondir(gitdir: Path) -> Path | None:
    """The common directory ``gitdir/commondir`` names (relative to ``gitdir``), or None."""
    try:
        text = (gitdir / "commondir").read_text(errors="replace").strip()
    except OSError:
        return None
    return (gitdir / text).resolve() if text else None


def _config_value(gitdir: Path, section_name: str, key_name: str) -> str | None:
    """The last value of ``section.key`` in ``gitdir/config`` (``[section]`` tables only),
    by a plain reading of the protected file: git itself is not run on a repository the
    sandbox may have written."""
    section = ""
    try:
        with open(gitdir / "config", "rb") as fh:
            lines = fh.read(1 << 20).decode(errors="replace").splitlines()
    except OSError:
        return None
    found: str | None = None
    for line in lines:
        text = line.strip()
        if text.startswith("["):
            section = text[1:].split("]", 1)[0].strip().lower()
        elif section == section_name and "=" in text:
            key, value = (part.strip() for part in text.split("=", 1))
            if key.lower() == key_name and value:
                found = value.strip('"')  # the last one wins, as in git
    return found


def _core_worktree(gitdir: Path) -> Path | None:
    """``core.worktree`` of ``gitdir/config`` (git sets it in a submodule's git directory,
    relative to it), resolved; None without one."""
    value = _config_value(gitdir, "core", "worktree")
    return (gitdir / value).resolve() if value else None


def _hooks_path(gitdir: Path, top: Path | None) -> Path | None:
    """``core.hooksPath`` of ``gitdir/config``, resolved (relative to the worktree
    ``top``, where git runs hooks), or None: husky and many projects point it at a
    directory of the tree, where the sandbox could write the hooks git then runs."""
    found = _config_value(gitdir, "core", "hookspath")
    if found is None:
        return None
    path = Path(os.path.expanduser(found))
    if not path.is_absolute():
        path = (top if top is not None else gitdir) / path
    return Path(os.path.realpath(path))


def _refuse_missing(path: Path, what: str, roots: Iterable[Path]) -> None:
    """Refuse the run when git would follow a redirect to ``path``, which does not exist
    but lies where the sandbox can create it (a git directory it built, config and all)."""
    if os.path.lexists(path) or _root_of(path, roots) is None:
        return
    raise SandboxError(
        f"{what} points to {path}, which does not exist but could be created inside the "
        "sandbox (git on the host would then use a repository the sandbox built); fix the "
        "pointer or create that repository before the run"
    )


@record
class _GitPlan:
    """What :func:`_git_protection` found: paths to bind read-only, placeholders to make."""

    existing: list[Path]
    dirs: list[Path]
    files: list[Path]


def _protect_gitdir(gitdir: Path, plan: _GitPlan, roots: tuple[Path, ...], depth: int = 0) -> None:
    """Add ``gitdir``'s redirect entries (and its submodules') to ``plan``, those that
    lie where the sandbox could write them."""
    if _root_of(gitdir, roots) is None:
        return  # read-only or invisible inside: nothing to protect
    linked = gitdir.parent.name == "worktrees" and os.path.lexists(gitdir / "commondir")
    for name, kind in _LINKED_PROTECTED if linked else GIT_DIR_PROTECTED:
        path = gitdir / name
        if os.path.lexists(path):
            plan.existing.append(path)
            if path.is_symlink():
                # The bind follows the link; protect what git would follow, too.
                real = path.resolve()
                if _root_of(real, roots) is not None:
                    plan.existing.append(real)
        elif name != "gitdir" and os.path.isdir(path.parent):
            (plan.dirs if kind == "d" else plan.files).append(path)
    if linked:
        return
    checkout = _core_worktree(gitdir)
    if checkout is not None and os.path.lexists(checkout / ".git"):
        # A submodule's checkout finds its git directory through this .git file, and
        # git on the host follows it from the superproject (``git status`` runs git in
        # every submodule): pointed elsewhere, it would pick a repository of the sandbox.
        plan.existing.append(checkout / ".git")
    # Submodules: modules/<name> is a git directory; a name may hold slashes
    # (modules/libs/x), and a submodule has submodules of its own (modules/a/modules/b).
    stack = [(gitdir / "modules", depth)]
    while stack:
        directory, level = stack.pop()
        if level >= _MODULES_DEPTH:
            continue
        try:
            entries = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for entry in entries:
            sub = Path(entry.path)
            if os.path.lexists(sub / "HEAD") or os.path.lexists(sub / "config"):
                _protect_gitdir(sub, plan, roots, level + 1)
            else:
                stack.append((sub, level + 1))


def _git_protection(top: Path, roots: tuple[Path, ...]) -> _GitPlan:
    """The redirect entries of the repository at ``top`` (a workspace or a writable
    root): its ``.git`` directory, or what a ``.git`` file points to and that directory's
    common directory (a linked worktree or a submodule checkout opened as ``top``).

    Raises:
        SandboxError: a ``.git`` file or a ``commondir`` points to a directory that does
            not exist yet but could be created inside the sandbox.
    """
    plan = _GitPlan([], [], [])
    dotgit = top / ".git"
    if dotgit.is_symlink() or dotgit.is_file():
        gitdir = _gitfile_target(dotgit)
        if gitdir is None:
            return plan
        _refuse_missing(gitdir, f"{dotgit}", roots)
        gitdir_common = _commondir(gitdir)
        if gitdir_common is not None:
            _refuse_missing(gitdir_common, f"{gitdir / 'commondir'}", roots)
            _protect_gitdir(gitdir_common, plan, roots)
        if gitdir.is_dir():
            _protect_gitdir(gitdir, plan, roots)
    elif dotgit.is_dir() and not _empty_dir(dotgit):
        # (An empty .git is no repository yet but the mount point of a run that staged
        # one, runtime/_newrepo.py: placeholders inside would be what the host's .git
        # then holds, and the staging run could not adopt its repository into it.)
        _protect_gitdir(dotgit, plan, roots)
    if dotgit.is_dir() or dotgit.is_file() or dotgit.is_symlink():
        target = dotgit if dotgit.is_dir() else _gitfile_target(dotgit)
        hooks = _hooks_path(target, top) if target is not None else None
        if hooks is not None and _root_of(hooks, roots) is not None:
            # The hooks git will run, wherever core.hooksPath puts them.
            if os.path.lexists(hooks):
                plan.existing.append(hooks)
            elif os.path.isdir(hooks.parent):
                plan.dirs.append(hooks)
        run_hooks = hooks if hooks is not None else (target / "hooks" if target else None)
        for name in _hook_manager_configs(run_hooks):
            # The installed hook runs whatever this file of the worktree says.
            path = top / name
            if os.path.lexists(path):
                plan.existing.append(path)
            elif _root_of(top, roots) is not None:
                plan.files.append(path)
    return plan


def _hook_manager_configs(hooks: Path | None) -> list[str]:
    """The configuration files (at the worktree's top) of the git hook managers whose
    hooks are installed in ``hooks``: pre-commit, lefthook and overcommit install a
    hook that runs the commands their file in the tree names, so with one installed that
    file is code the host runs on the next commit, as a hook itself would be."""
    if hooks is None:
        return []
    try:
        entries = [e for e in os.scandir(hooks) if not e.name.endswith(".sample")]
    except OSError:
        return []
    found: dict[str, None] = {}
    for entry in entries[:64]:
        try:
            if not entry.is_file(follow_symlinks=False) or entry.stat().st_size > 1 << 20:
                continue
            with open(entry.path, "rb") as fh:
                head = fh.read(8192)
        except OSError:
            continue
        for marker, names in HOOK_MANAGERS:
            if marker in head:
                found.update(dict.fromkeys(names))
    return list(found)


def _empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _outermost(paths: Iterable[Path], dirs: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside one of the protected directories ``dirs`` (a
    read-only bind of the directory already holds them; a bind or a pin of their own
    would only add mounts)."""
    outer = list(dirs)
    return [p for p in paths if not any(p != d and _is_within(p, d) for d in outer)]


def protect_paths(
    workspace: Path,
    extra: Iterable[str] = (),
    *,
    defer: bool = False,
    writable: Iterable[Path] = (),
    absent_dirs: bool = False,
) -> Protection:
    """List and prepare the protected paths of ``workspace``.

    Missing agent/IDE files and directories get an empty placeholder on the host for the
    duration of the run: a read-only bind needs something to bind, and without it the
    sandbox could create the file. :func:`remove_placeholders` takes them away again.
    A placeholder that cannot be made (a read-only workspace) is left out: nothing can
    create the path then. With ``defer``, none is made yet: they are listed (as
    protected, and as pending) for :func:`make_placeholders`, for a caller that makes them
    while the sandbox starts, and that fails closed if it cannot.

    Git's redirect entries (:data:`~stockade.policy._tables.GIT_DIR_PROTECTED`) are
    protected in every git directory the sandbox could write: the workspace's, its
    submodules', and those of a ``.git`` file's target and its common directory, and of
    a repository at the top of a ``writable`` directory (``filesystem.write``), when
    they lie in the workspace or in one of ``writable``.

    ``absent_dirs``: a missing ``.vscode``, ``.claude``, ... (:data:`_ABSENT_DIRS`) is
    held by an empty directory rather than an empty file (the gVisor backend mounts an
    empty read-only tmpfs there, which costs the Sentry a third of a bind).

    Raises:
        SandboxError: a ``.git`` file or a ``commondir`` points to a directory that does
            not exist yet but could be created inside the sandbox.
    """
    existing: list[Path] = []
    created: list[Path] = []
    pinned: list[Path] = []
    roots = (workspace, *(Path(w) for w in writable if os.path.isdir(w)))
    missing_dirs: list[Path] = []
    missing_files: list[Path] = []
    # Every writable root is protected like the workspace (DESIGN §6), and so is every
    # repository found below one: git, husky, direnv, editor and agent settings there
    # run on the host later just the same.
    tops = list(dict.fromkeys((*roots, *nested_repositories(roots))))
    for top in tops:
        git = top / ".git"
        patterns = list(DEFAULT_PROTECTED) + list(extra)
        if git.is_file() or git.is_symlink():
            # A .git file redirects git to another directory (worktrees, submodules).
            patterns.append(".git")
        for pattern in patterns:
            for path in _expand(top, pattern):
                if path.is_symlink():
                    # The bind follows the link; protect what git would follow, too.
                    real = path.resolve()
                    if _root_of(real, roots) is not None:
                        existing.append(real)
                existing.append(path)
        absent = [n for n in (*_ABSENT_DIRS, *_FILE_PLACEHOLDERS) if not os.path.lexists(top / n)]
        missing_files += [top / n for n in absent if not (absent_dirs and n in _ABSENT_DIRS)]
        if absent_dirs:
            missing_dirs += [top / n for n in absent if n in _ABSENT_DIRS]
        if not os.path.lexists(git):
            missing_dirs.append(git)
    for top in tops:
        found = _git_protection(top, roots)
        existing += found.existing
        missing_dirs += found.dirs
        missing_files += found.files
        if top != workspace and os.path.lexists(top / ".git"):
            # A repository at the top of a writable directory falls back to the
            # directory itself as a bare one just as the workspace does (_tables).
            if os.path.lexists(top / "HEAD"):
                existing.append(top / "HEAD")
            else:
                missing_files.append(top / "HEAD")
    protected_dirs = [p for p in existing if p.is_dir()] + missing_dirs
    dirs = list(dict.fromkeys(_outermost(missing_dirs, protected_dirs)))
    files = list(dict.fromkeys(_outermost(missing_files, protected_dirs)))
    if defer:
        existing += [*dirs, *files]
    else:
        made, failed = make_placeholders(dirs, files, strict=False)
        created += made
        existing += [p for p in (*dirs, *files) if p not in failed]
    existing = [
        p
        for p in dict.fromkeys(_outermost(existing, protected_dirs))
        if _root_of(p, roots) is not None
    ]
    for path in existing:
        root = _root_of(path, roots)
        parent = path.parent
        while root is not None and parent != root and _is_within(parent, root):
            pinned.append(parent)
            parent = parent.parent
    for root in roots[1:]:
        if root != workspace and _is_within(workspace, root):
            # A write grant above the workspace: the workspace and every directory
            # between stay where they are (a renamed workspace with a fresh .git of the
            # sandbox's in its place would be the repository the host's git uses next).
            parent = workspace
            while parent != root and _is_within(parent, root):
                pinned.append(parent)
                parent = parent.parent
    return Protection(
        existing=tuple(existing),
        pinned=tuple(sorted(set(pinned), key=lambda p: len(p.parts))),
        created=tuple(created),
        pending_dirs=tuple(dirs) if defer else (),
        pending_files=tuple(files) if defer else (),
    )


#: How deep below a writable root repositories are looked for, and for how long.
REPOSITORY_SCAN_DEPTH = 3
REPOSITORY_SCAN_BUDGET_S = 0.2


def nested_repositories(roots: Iterable[Path]) -> list[Path]:
    """Directories holding a ``.git`` up to :data:`REPOSITORY_SCAN_DEPTH` levels below
    each of ``roots`` (not the roots themselves), within :data:`REPOSITORY_SCAN_BUDGET_S`
    in all: a write grant over ``~/src`` holds the repositories a person uses next."""
    deadline = time.monotonic() + REPOSITORY_SCAN_BUDGET_S
    found: list[Path] = []
    stack: list[tuple[str, int]] = [(str(r), 0) for r in roots]
    while stack:
        if time.monotonic() > deadline:
            break
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False) or entry.name in _SOCKET_SKIP:
                    continue
            except OSError:
                continue
            if entry.name == ".git":
                continue
            if os.path.lexists(os.path.join(entry.path, ".git")):
                found.append(Path(entry.path))
            if depth + 1 < REPOSITORY_SCAN_DEPTH and not entry.name.startswith("."):
                stack.append((entry.path, depth + 1))
    return found


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


@record
class RootGuard:
    """How stockade's own trust roots are kept out of one sandbox's reach."""

    #: roots bound read-only onto themselves (they lie where the sandbox could write)
    protected: tuple[Path, ...]
    #: directories from the writable grant down to each protected root, bound onto
    #: themselves: renaming one (to put a fresh, writable copy in its place) fails EBUSY
    pinned: tuple[Path, ...]
    #: roots hidden under an empty read-only tmpfs (they hold a private key)
    masked: tuple[Path, ...]


def guard_trust_roots(narrowed: Iterable[Narrowed]) -> RootGuard:
    """Plan the binds that keep each narrowed trust root (``stockade._roots.narrowed``)
    read-only or masked inside the sandbox.

    A read-only root that does not exist yet is created first (mode 0700): left missing
    inside a writable grant, the sandbox could create it, with a policy or a launcher of
    its own for the next run to trust. A masked root that does not exist needs no mask.
    """
    protected: list[Path] = []
    pinned: list[Path] = []
    masked: list[Path] = []
    for item in narrowed:
        root = item.root.path
        if item.root.mode == "mask":
            if os.path.isdir(root):
                masked.append(root)
            continue
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"{item.root.what} at {root} lies inside {item.grant}, which the sandbox can "
                f"write, and cannot be created to be kept read-only ({exc.strerror}); "
                "narrow the grant or point the XDG variable elsewhere"
            ) from None
        protected.append(root)
        grant = Path(os.path.realpath(item.grant))
        parent = root.parent
        while parent != grant and _is_within(parent, grant):
            pinned.append(parent)
            parent = parent.parent
    return RootGuard(
        protected=tuple(dict.fromkeys(protected)),
        pinned=tuple(sorted(set(pinned), key=lambda p: len(p.parts))),
        masked=tuple(dict.fromkeys(masked)),
    )
