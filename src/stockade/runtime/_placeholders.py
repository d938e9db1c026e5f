"""Placeholders of protected paths, shared by the concurrent runs of one workspace.

A protected path that does not exist yet (``.vscode/``, ``.envrc``, ...) gets an empty
placeholder for the run, bound read-only. Two runs in one workspace at once share them:
the second sees the first's placeholders as existing paths and binds them too, so they
may only go when the last run of the workspace ends. A small registry per workspace, in
the user's state directory and guarded by ``flock``, records which stockade processes use
the workspace and which placeholders were made; whoever leaves last (or the next run,
after processes killed with SIGKILL) removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from stockade._exceptions import SandboxError
from stockade._hash import sha256_hex
from stockade._process import alive
from stockade.enforce import paths

_SHARED = "placeholders"
#: the start time of the first live run of the workspace (for the repository sweep)
_SINCE = "since"
#: seconds: the kernel's coarse file-time clock against time.time()
_CLOCK_MARGIN = 0.02


def _registry(state_dir: Path, workspace: Path) -> Path:
    digest = sha256_hex(str(workspace).encode())[:16]
    path = state_dir / "workspaces" / digest
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SandboxError(
            f"cannot create {path}, where stockade keeps the workspace's placeholder "
            f"registry: {exc.strerror}; set XDG_STATE_HOME to a writable directory"
        ) from None
    return path


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    fd = os.open(registry / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _alive(name: str) -> bool:
    pid = name.split("-", 1)[0]
    return pid.isdigit() and alive(int(pid))


def _users(registry: Path) -> list[str]:
    """The registered runs still alive; entries of processes that are gone are dropped."""
    live = []
    with os.scandir(registry) as entries:
        for entry in entries:
            if not entry.name.endswith(".run"):
                continue
            if _alive(entry.name):
                live.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    return live


def _tidy(registry: Path) -> list[Path]:
    """With no run left in the workspace, remove every recorded placeholder."""
    shared = registry / _SHARED
    if _users(registry) or not shared.exists():
        return []
    left = paths.remove_placeholders(Path(line) for line in shared.read_text().splitlines())
    shared.unlink(missing_ok=True)
    return left


class Claim:
    """This run's use of a workspace's protected-path placeholders."""

    def __init__(self, state_dir: Path, workspace: Path, run_id: str) -> None:
        self.registry = _registry(state_dir, workspace)
        self.entry = self.registry / f"{os.getpid()}-{run_id}.run"
        self.workspace = workspace
        #: before the sandbox exists: every change it makes is at or after this
        self.started = time.time()
        self.roots: tuple[Path, ...] = ()
        self.protected: frozenset[Path] = frozenset()
        #: what :meth:`protect` swept after a run that ended without its own sweep
        self.leftovers: list[tuple[Path, list[str]]] = []

    def protect(
        self,
        workspace: Path,
        extra: Iterable[str],
        *,
        defer: bool = False,
        writable: Iterable[Path] = (),
        absent_dirs: bool = False,
    ) -> paths.Protection:
        """Register this run, tidy after dead ones, and make the placeholders it needs
        (with ``defer``, only list them: :meth:`make` makes them). ``writable``: the
        other read-write directories, whose git directories are protected too;
        ``absent_dirs``: see :func:`paths.protect_paths`."""
        with _locked(self.registry):
            _tidy(self.registry)
            self.entry.touch()
            try:
                protection = paths.protect_paths(
                    workspace, extra, defer=defer, writable=writable, absent_dirs=absent_dirs
                )
            except BaseException:
                self.entry.unlink(missing_ok=True)  # refused: this run uses nothing
                raise
            self._record(protection.created)
            self.roots = (workspace, *(Path(w) for w in writable))
            self.protected = frozenset(protection.existing)
            if not [u for u in _users(self.registry) if u != self.entry.name]:
                since_file = self.registry / _SINCE
                try:
                    left_by = float(since_file.read_text())
                except (OSError, ValueError):
                    left_by = None
                if left_by is not None:
                    # No run is live, yet the first of the last runs left its start: the
                    # last of them ended without its sweep (killed, or its caller was, as
                    # a served run's is then). What it made or changed below the roots
                    # is its sandbox's own configuration on the host until swept: now,
                    # before this run's sandbox starts, not at this run's end.
                    # (This run's protected set says nothing of what that run could
                    # write: a repository it made is protected from this run on.)
                    self.leftovers = self._sweep(left_by, workspace=True, protected=False)
                # the first of the runs that will share this workspace: the sweep of the
                # last one out looks at everything made since this one began
                since_file.write_text(repr(self.started))
            return protection

    def sweep_repositories(self, *, workspace: bool = True) -> list[tuple[Path, list[str]]]:
        """Sanitize the repositories made or changed below the writable roots since the
        first live run of the workspace began (:func:`_newrepo.sweep`), when this run is
        the last one of the workspace; [] while another still runs (it sweeps, and
        meanwhile its sandbox could still write there). ``workspace``: whether the
        workspace itself was writable (an overlay run's was not)."""
        with _locked(self.registry):
            if [u for u in _users(self.registry) if u != self.entry.name]:
                return []
            since_file = self.registry / _SINCE
            try:
                since = min(float(since_file.read_text()), self.started)
            except (OSError, ValueError):
                since = self.started
            found = self._sweep(since, workspace=workspace, protected=True)
            since_file.unlink(missing_ok=True)
            return found

    def _sweep(
        self, since: float, *, workspace: bool, protected: bool
    ) -> list[tuple[Path, list[str]]]:
        """Sweep below the roots from ``since``; ``protected``: skip the git directories
        this run protected (their config bound read-only: not writable in it)."""
        from stockade.runtime import _newrepo

        roots = self.roots if workspace else self.roots[1:]
        # The workspace's own .git is protected, or staged and adopted already.
        skip = {self.workspace / ".git"}
        if protected:
            skip |= {p.parent for p in self.protected if p.name == "config"}
        # File timestamps come from the kernel's coarse clock, which may trail
        # time.time() by a tick (a few ms); ``started`` was taken before the sandbox
        # existed, so a small margin loses nothing the sandbox did.
        return _newrepo.sweep(roots, since - _CLOCK_MARGIN, skip)

    def make(self, protection: paths.Protection) -> None:
        """Make the placeholders ``protect(..., defer=True)`` listed; OSError when one
        cannot be made (none of them is left then). This run is registered, so no
        other run removes them meanwhile, and one another run made is shared."""
        with _locked(self.registry):
            created, _ = paths.make_placeholders(
                protection.pending_dirs, protection.pending_files, strict=True
            )
            self._record(created)

    def record_placeholder(self, path: Path) -> None:
        """Record one placeholder this run made outside :meth:`protect` (a staged
        ``.git`` mount point), so the last run out removes it if it is still empty."""
        with _locked(self.registry):
            self._record([path])

    def forget_placeholder(self, path: Path) -> None:
        """Drop ``path`` from the placeholders: it now holds real content (an adopted
        repository) and is nobody's to remove."""
        with _locked(self.registry):
            shared = self.registry / _SHARED
            try:
                lines = shared.read_text().splitlines()
            except FileNotFoundError:
                return
            shared.write_text("".join(f"{line}\n" for line in lines if line != str(path)))

    def _record(self, created: list[Path] | tuple[Path, ...]) -> None:
        if created:
            with (self.registry / _SHARED).open("a") as fh:
                fh.write("".join(f"{p}\n" for p in created))

    def release(self) -> list[Path]:
        """Unregister; the last run out removes the placeholders. Returns any not removed."""
        with _locked(self.registry):
            self.entry.unlink(missing_ok=True)
            return _tidy(self.registry)
