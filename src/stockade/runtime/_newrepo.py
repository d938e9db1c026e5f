"""A repository the sandbox creates in a workspace that has none (``git init``).

A workspace that is not a repository keeps ``.git`` from being created: left free, the
sandbox could write a ``.git/config`` whose ``core.fsmonitor`` runs on the host at the next
``git status``. But an agent starting a project runs ``git init`` first, and ``cargo new``
and other scaffolders do the same, so refusing breaks needed work.

So ``.git`` is staged: inside the sandbox it is a private directory of the run (bound over
the workspace's empty ``.git`` mount point), where git works as usual; the host sees an
empty ``.git`` meanwhile, so no host git reads what the sandbox writes while it runs.
When the run is over (every process of the sandbox gone), stockade adopts what was made:

* ``config`` keeps only keys that steer no program (:data:`SAFE_KEYS`: the repository
  format, core flags, remotes' URLs and refspecs, branches' upstreams); every other key
  (``core.fsmonitor``, ``core.hooksPath``, filters, ``diff.external``, ``include.path``,
  ``core.sshCommand``, aliases, ...) is dropped and named in the audit log;
* ``hooks/`` keeps only git's ``*.sample`` files, which git never runs;
* ``commondir``, ``config.worktree``, ``worktrees/`` and ``objects/info/alternates`` (git's
  redirects) and any symlink at the top of the git directory are dropped;
* submodules' git directories under ``modules/`` get the same treatment;

and the result moves into the workspace's ``.git``. From the next run on it is an
existing repository, protected like any other.

A repository the sandbox makes (or changes) *below* the top, or in a write grant, cannot
be staged: no mount point exists before the run for a name the sandbox has yet to pick.
Left alone, it would be the sandbox's own configuration on the host: git run there obeys
its ``core.fsmonitor``, and a shell prompt that shows git status runs git on every ``cd``.
So when the last run of a workspace is over, :func:`sweep` looks for every ``.git`` below
the writable roots that was made or changed since the first of those runs began, and
gives each the same sanitizing as an adopted repository, in place. A repository the
agent cloned keeps its remotes and branches and works as before.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Collection, Iterable
from pathlib import Path

from stockade import _roots
from stockade._fs import write_new
from stockade._record import record

#: Configuration keys a repository the sandbox made may keep (``section.key``, and for
#: remotes and branches ``section.<name>.key``).
SAFE_KEYS = frozenset(
    {
        "core.repositoryformatversion",
        "core.filemode",
        "core.bare",
        "core.logallrefupdates",
        "core.ignorecase",
        "core.precomposeunicode",
        "core.symlinks",
        "extensions.objectformat",
    }
)
_SAFE_SUBSECTION_KEYS = {"remote": {"url", "fetch", "pushurl"}, "branch": {"remote", "merge"}}
_REDIRECTS = ("commondir", "config.worktree", "worktrees", "objects/info/alternates")
_MODULES_DEPTH = 8


@record
class Staged:
    """A workspace ``.git`` staged for one run: the mount point and the run's directory."""

    target: Path
    inner: Path


def stage(workspace: Path, scratch: Path) -> Staged | None:
    """Stage ``workspace/.git`` when it is missing or an empty directory; None otherwise.

    The caller binds ``inner`` read-write over ``target`` inside the sandbox, and the
    mount point exists on the host from now on (an empty directory, as the placeholder
    it replaces; :func:`adopt` fills it or the placeholder sweep removes it).
    """
    target = workspace / ".git"
    try:
        if os.path.lexists(target):
            if target.is_symlink() or not target.is_dir() or not _empty(target):
                return None
        else:
            os.mkdir(target, 0o755)
    except OSError:
        return None
    inner = scratch / "new-git"
    inner.mkdir(mode=0o700)
    return Staged(target, inner)


def _safe(key: str) -> bool:
    if key in SAFE_KEYS:
        return True
    section, _, rest = key.partition(".")
    name, _, leaf = rest.rpartition(".")
    return bool(name) and leaf in _SAFE_SUBSECTION_KEYS.get(section, ())


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _read_config(path: Path) -> list[tuple[str, str]] | None:
    """``(key, value)`` entries of a git config file, parsed by git itself (no include
    is followed with ``--file``); None when it cannot be parsed."""
    import shutil

    git = shutil.which("git", path=_roots.HOST_PATH)
    if git is None:
        return None
    env = {**_roots.host_environment(), "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}
    try:
        out = subprocess.run(
            [git, "config", "--file", str(path), "--list", "-z"],
            capture_output=True,
            env=env,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    entries = []
    for item in out.stdout.decode(errors="surrogateescape").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            entries.append((key, value))
    return entries


def _write_config(path: Path, entries: list[tuple[str, str]]) -> None:
    sections: dict[str, list[tuple[str, str]]] = {}
    for key, value in entries:
        section, _, rest = key.partition(".")
        name, _, leaf = rest.rpartition(".")
        header = f'[{section} "{name}"]' if name else f"[{section}]"
        sections.setdefault(header, []).append((leaf, value))
    text = "".join(
        header + "\n" + "".join(f"\t{leaf} = {_quote(value)}\n" for leaf, value in keys)
        for header, keys in sections.items()
    )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    write_new(path, text.encode(), 0o644)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        import shutil

        shutil.rmtree(path)


def sanitize(gitdir: Path, dropped: list[str], prefix: str = "", depth: int = 0) -> None:
    """Make ``gitdir`` a git directory whose use by host git runs nothing the sandbox
    chose (see the module docstring); append what was dropped to ``dropped``."""
    with os.scandir(gitdir) as listing:
        top = list(listing)
    for entry in top:
        if entry.is_symlink():
            dropped.append(f"{prefix}{entry.name} (a symlink)")
            os.unlink(entry.path)
    for rel in _REDIRECTS:
        path = gitdir / rel
        if os.path.lexists(path):
            dropped.append(prefix + rel)
            _remove(path)
    config = gitdir / "config"
    if os.path.lexists(config):
        entries = _read_config(config) if config.is_file() else None
        if entries is None:
            dropped.append(f"{prefix}config (unreadable: replaced)")
            entries = [("core.repositoryformatversion", "0"), ("core.bare", "false")]
        kept = [(k, v) for k, v in entries if _safe(k)]
        dropped += [f"{prefix}config: {k}" for k, _ in entries if not _safe(k)]
        _write_config(config, kept)
    hooks = gitdir / "hooks"
    if hooks.is_dir():
        with os.scandir(hooks) as listing:
            hook_entries = list(listing)
        for entry in hook_entries:
            if not (entry.name.endswith(".sample") and entry.is_file(follow_symlinks=False)):
                dropped.append(f"{prefix}hooks/{entry.name}")
                _remove(Path(entry.path))
    modules = gitdir / "modules"
    if modules.is_dir() and depth < _MODULES_DEPTH:
        for sub in _git_dirs(modules):
            sanitize(sub, dropped, f"{prefix}{sub.relative_to(gitdir)}/", depth + 1)


def _git_dirs(modules: Path) -> list[Path]:
    out: list[Path] = []
    stack = [modules]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as listing:
            entries = list(listing)
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            sub = Path(entry.path)
            if (sub / "HEAD").exists() or (sub / "config").exists():
                out.append(sub)
            else:
                stack.append(sub)
    return out


def _changed(paths: Iterable[Path], since: float) -> bool:
    for path in paths:
        try:
            # ctime: no process can set it back (utimes sets mtime and moves ctime on)
            if os.lstat(path).st_ctime >= since:
                return True
        except OSError:
            continue
    return False


def _repository_of(dotgit: Path, roots: tuple[Path, ...]) -> Path | None:
    """The git directory a ``.git`` entry stands for, when it lies below ``roots`` (a
    ``.git`` file or link to anywhere else names a directory the sandbox could not
    write, so nothing it chose)."""
    try:
        if dotgit.is_symlink():
            target = dotgit.resolve()
        elif dotgit.is_file():
            with open(dotgit, "rb") as fh:
                text = fh.read(4096).decode("utf-8", "replace").strip()
            if not text.startswith("gitdir:"):
                return None
            target = (dotgit.parent / text.removeprefix("gitdir:").strip()).resolve()
        else:
            return dotgit
    except (OSError, RuntimeError):
        return None
    if not target.is_dir() or not any(target.is_relative_to(r) for r in roots):
        return None
    return target


def new_repositories(
    roots: Iterable[Path], since: float, skip: Collection[Path] = ()
) -> list[Path]:
    """Every git directory below ``roots`` that was made or changed at ``since`` or later
    (a wall-clock time): its ``.git`` entry, the directory itself, its ``config`` or its
    ``hooks``. ``skip``: git directories left alone (those protected read-only for the
    run, the workspace's own). Every directory is listed (``.git`` directories are not
    descended into); no link is followed on the way."""
    tops = tuple(dict.fromkeys(r for r in roots if r.is_dir() and not r.is_symlink()))
    skipped = set(skip)
    found: dict[Path, None] = {}
    stack = list(tops)
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            if entry.name == ".git":
                dotgit = Path(entry.path)
                repository = _repository_of(dotgit, tops)
                if repository is None or repository in skipped or dotgit in skipped:
                    continue
                if _changed(
                    (dotgit, repository, repository / "config", repository / "hooks"), since
                ):
                    found[repository] = None
            elif entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return list(found)


def sweep(
    roots: Iterable[Path], since: float, skip: Collection[Path] = ()
) -> list[tuple[Path, list[str]]]:
    """Sanitize every repository :func:`new_repositories` finds; each with what was
    dropped. Call it only with no sandbox left that could write below ``roots``."""
    out = []
    for repository in new_repositories(roots, since, skip):
        dropped: list[str] = []
        try:
            sanitize(repository, dropped)
        except OSError as exc:
            dropped.append(f"(not finished: {exc.strerror})")
        out.append((repository, dropped))
    return out


def adopt(staged: Staged) -> tuple[bool, list[str]]:
    """Sanitize what the run made in ``staged.inner`` and move it into the workspace's
    ``.git``. Returns (adopted, dropped): nothing is adopted when the run made nothing,
    or when the workspace's ``.git`` is no longer empty (another run adopted first)."""
    if not made_any(staged):
        return False, []
    dropped: list[str] = []
    sanitize(staged.inner, dropped)
    target = staged.target
    try:
        if target.is_symlink() or not target.is_dir() or not _empty(target):
            return False, dropped
    except OSError:
        return False, dropped
    with os.scandir(staged.inner) as entries:
        names = [entry.name for entry in entries]
    import shutil

    for name in names:
        shutil.move(str(staged.inner / name), target / name)
    return True, dropped


def made_any(staged: Staged) -> bool:
    """Whether the run left anything in its staged directory."""
    try:
        return not _empty(staged.inner)
    except OSError:
        return False


def _empty(path: Path) -> bool:
    """Whether the directory ``path`` holds nothing (OSError when it cannot be read)."""
    with os.scandir(path) as entries:
        return next(entries, None) is None


def keep_aside(staged: Staged, run_id: str) -> Path | None:
    """Move a sanitized repository that could not be adopted into stockade's state
    (``repositories/<run id>``); its path, or None when that fails too."""
    target = _roots.state_dir() / "repositories" / run_id
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        import shutil

        shutil.move(str(staged.inner), target)
    except OSError:
        return None
    return target
