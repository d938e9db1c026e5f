"""Placeholders of protected paths (enforce/paths.py), on a real file system."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stockade._exceptions import SandboxError
from stockade.enforce import paths
from stockade.policy._tables import GIT_DIR_PROTECTED
from tests.conftest import require


def test_protect_paths_makes_or_lists_the_placeholders(tmp_path: Path) -> None:
    made = paths.protect_paths(tmp_path)
    # A missing directory name is held by an empty file (paths._ABSENT_DIRS says why);
    # .git, which a bind of the run's own repository lands on, by a directory.
    assert (tmp_path / ".vscode").is_file()
    assert (tmp_path / ".vscode").stat().st_size == 0
    assert (tmp_path / ".git").is_dir()
    assert (tmp_path / ".envrc").is_file()
    assert tmp_path / ".git" in made.existing
    assert set(made.created) <= set(made.existing)
    assert made.pending_dirs == made.pending_files == ()
    assert paths.remove_placeholders(made.created) == []
    assert list(tmp_path.iterdir()) == []
    # Deferred: the same paths are protected, and none is made yet.
    listed = paths.protect_paths(tmp_path, defer=True)
    assert list(tmp_path.iterdir()) == []
    assert set(listed.existing) == set(made.existing)
    assert set(listed.pending_dirs) | set(listed.pending_files) == set(made.created)


def test_the_gvisor_backend_holds_missing_directory_names_with_directories(
    tmp_path: Path,
) -> None:
    # absent_dirs (gVisor: an empty directory gets a read-only tmpfs, cheaper there than
    # a bind): the directory names get empty directories, the file names still files.
    made = paths.protect_paths(tmp_path, absent_dirs=True)
    for name in paths._ABSENT_DIRS:
        assert (tmp_path / name).is_dir()
        assert list((tmp_path / name).iterdir()) == []
        assert tmp_path / name in made.existing
    assert (tmp_path / ".envrc").is_file()
    assert paths.remove_placeholders(made.created) == []
    assert list(tmp_path.iterdir()) == []
    listed = paths.protect_paths(tmp_path, defer=True, absent_dirs=True)
    assert set(listed.pending_dirs) >= {tmp_path / n for n in paths._ABSENT_DIRS}
    assert tmp_path / ".envrc" in listed.pending_files


def test_a_placeholder_that_cannot_be_made(tmp_path: Path) -> None:
    dirs = [tmp_path / ".vscode"]
    files = [tmp_path / ".envrc", tmp_path / "missing" / ".mcp.json"]
    # Lenient (the workspace may be read-only): what fails is reported, the rest made.
    created, failed = paths.make_placeholders(dirs, files, strict=False)
    assert created == [tmp_path / ".vscode", tmp_path / ".envrc"]
    assert failed == [tmp_path / "missing" / ".mcp.json"]
    paths.remove_placeholders(created)
    # Strict: the failure is raised, and what this call made is gone again.
    with pytest.raises(FileNotFoundError):
        paths.make_placeholders(dirs, files, strict=True)
    assert list(tmp_path.iterdir()) == []
    # A placeholder another run made already is shared, not made twice.
    (tmp_path / ".vscode").mkdir()
    assert paths.make_placeholders(dirs, files[:1]) == ([tmp_path / ".envrc"], [])


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=a@b.test", "-c", "user.name=n", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """A repository with a linked worktree outside it, a submodule whose name holds a
    slash, a nested submodule in that one, and no hooks directory."""
    require(shutil.which("git") is not None, "git is not installed")
    repo, inner, outer = tmp_path / "repo", tmp_path / "inner", tmp_path / "outer"
    for path in (repo, inner, outer):
        path.mkdir()
        _git(path, "init", "-q")
    _git(inner, "commit", "-q", "--allow-empty", "-m", "inner")
    _git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(inner), "in")
    _git(outer, "commit", "-q", "-m", "outer")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    _git(
        repo,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "add",
        "-q",
        str(outer),
        "libs/outer",
    )
    _git(
        repo,
        "-c",
        "protocol.file.allow=always",
        "submodule",
        "update",
        "-q",
        "--init",
        "--recursive",
    )
    _git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
    shutil.rmtree(repo / ".git" / "hooks")
    return repo


def test_every_git_redirect_is_protected_or_gets_a_placeholder(layout: Path) -> None:
    git = layout / ".git"
    sub = git / "modules" / "libs" / "outer"
    nested = sub / "modules" / "in"
    listed = paths.protect_paths(layout, defer=True)
    protected = set(listed.existing)
    pending = set(listed.pending_dirs) | set(listed.pending_files)
    for gitdir in (git, sub, nested):
        for name, _kind in GIT_DIR_PROTECTED:
            assert gitdir / name in protected, gitdir / name
        # Those missing are placeholders: hooks here, commondir and the rest everywhere.
        assert gitdir / "commondir" in pending
        assert gitdir / "config" not in pending
    assert git / "hooks" in set(listed.pending_dirs)
    # The admin directory of the linked worktree is inside the read-only worktrees/:
    # no bind or pin of its own.
    assert not any(
        p != git / "worktrees" and p.is_relative_to(git / "worktrees") for p in protected
    )
    assert not any(p.is_relative_to(git / "worktrees") for p in listed.pinned)
    # Submodule checkouts' .git files, and HEAD at the top (the bare-repository fallback).
    assert layout / "libs" / "outer" / ".git" in protected
    assert layout / "libs" / "outer" / "in" / ".git" in protected
    assert layout / "HEAD" in pending
    # Made for real, each placeholder is inert and goes again.
    made = paths.protect_paths(layout)
    assert (git / "commondir").read_text() == ".\n"
    assert (git / "objects" / "info" / "alternates").read_bytes() == b""
    assert (layout / "HEAD").read_bytes() == b""
    _git(layout, "status")
    _git(layout, "commit", "-q", "--allow-empty", "-m", "with placeholders")
    assert paths.remove_placeholders(made.created) == []
    assert not (layout / "HEAD").exists()
    assert not (git / "hooks").exists()


def test_a_worktree_workspace_protects_what_its_git_file_points_to(layout: Path) -> None:
    wt = layout.parent / "wt"
    common = layout / ".git"
    # The common directory is not writable inside: nothing of it is bound (binding it
    # would make it visible).
    alone = paths.protect_paths(wt, defer=True)
    assert all(p.is_relative_to(wt) for p in alone.existing)
    assert wt / ".git" in alone.existing
    # Granted writable (filesystem.write), its redirects are protected like the workspace's.
    granted = paths.protect_paths(wt, defer=True, writable=[common])
    assert {common / "config", common / "worktrees", common / "commondir"} <= set(granted.existing)
    assert common / "objects" / "info" in granted.pinned
    assert not any(p.is_relative_to(common / "worktrees" / "wt") for p in granted.pinned)
    # Only the admin directory granted: its own redirect files.
    admin = common / "worktrees" / "wt"
    only_admin = paths.protect_paths(wt, defer=True, writable=[admin])
    assert {admin / "commondir", admin / "gitdir", admin / "config.worktree"} <= set(
        only_admin.existing
    )
    assert common / "config" not in only_admin.existing


def test_a_git_file_pointing_where_the_sandbox_could_build_a_repository(tmp_path: Path) -> None:
    (tmp_path / ".git").write_text("gitdir: .real-git\n")
    with pytest.raises(SandboxError, match="does not exist but could be created"):
        paths.protect_paths(tmp_path, defer=True)
    # The twin: once that repository exists, it is protected instead.
    (tmp_path / ".git").unlink()
    _git(tmp_path, "init", "-q", "--separate-git-dir", str(tmp_path / ".real-git"))
    listed = paths.protect_paths(tmp_path, defer=True)
    assert tmp_path / ".real-git" / "config" in listed.existing
    assert tmp_path / ".real-git" / "worktrees" in listed.pending_dirs
    # Outside every writable area nothing can be built there: the run goes ahead.
    (tmp_path / ".git").write_text(f"gitdir: {tmp_path.parent / 'elsewhere-missing'}\n")
    assert tmp_path / ".git" in paths.protect_paths(tmp_path, defer=True).existing
