"""Repositories nested into the workspace's index during a run are reported.

Index files are written by real git (versions 2, 3 with extended flags, and 4 with
prefix-compressed paths); the end-to-end cases run the attack inside a real sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from stockade.enforce.gitlinks import gitlinks, nested_repositories
from tests.conftest import World, require

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.test",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.test",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    require(shutil.which("git") is not None, "git is not installed")
    top = tmp_path / "repo"
    top.mkdir()
    git(top, "init", "-q")
    for name in ("a.txt", "dir/b.txt", "dir/c.txt"):
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(name)
    git(top, "add", ".")
    git(top, "commit", "-qm", "one")
    return top


def add_gitlink(top: Path, path: str) -> None:
    sub = top / path
    sub.mkdir(parents=True)
    git(sub, "init", "-q")
    git(sub, "commit", "-q", "--allow-empty", "-m", "x")
    sha = git(sub, "rev-parse", "HEAD")
    git(top, "update-index", "--add", "--cacheinfo", f"160000,{sha},{path}")


@pytest.mark.parametrize("version", [2, 3, 4])
def test_gitlinks_are_read_from_every_index_version(repo: Path, version: int) -> None:
    add_gitlink(repo, "dir/nested")
    add_gitlink(repo, "zz")
    if version == 3:
        # An entry with extended flags makes git write version 3.
        git(repo, "update-index", "--skip-worktree", "a.txt")
    git(repo, "update-index", "--index-version", str(version))
    assert (repo / ".git/index").read_bytes()[4:8] == version.to_bytes(4, "big")
    links, complete = gitlinks(repo / ".git/index")
    assert complete
    assert links == ["dir/nested", "zz"]


def test_an_index_without_gitlinks_has_none_and_garbage_is_not_read(repo: Path) -> None:
    assert gitlinks(repo / ".git/index") == ([], True)
    bad = repo / "garbage"
    bad.write_bytes(b"DIRC\x00\x00\x00\x02\x00\x00\x00\x09" + b"\x01" * 40)
    assert gitlinks(bad) == ([], False)


def test_a_new_nested_repository_is_found_and_an_old_one_is_not(repo: Path) -> None:
    add_gitlink(repo, "old")
    time.sleep(0.05)
    since = time.time() - 0.01
    assert nested_repositories(repo, since) == []  # the index did not change since
    add_gitlink(repo, "new")
    assert nested_repositories(repo, since) == [repo / "new"]


SCRIPT = r"""
set -e
git init -q sub
git -C sub -c user.name=t -c user.email=t@example.test commit -q --allow-empty -m x
# What the attack plants: configuration git on the host would obey in sub.
git -C sub config core.fsmonitor "touch $PWD/pwned-by-fsmonitor"
git update-index --add --cacheinfo 160000,$(git -C sub rev-parse HEAD),sub
"""


def run_in_repository(world: World, script: str) -> tuple[str, list[dict[str, object]]]:
    """``sh -c script`` in the sandbox, in a workspace that is a git repository with one
    commit; stderr and the audit events."""
    require(shutil.which("git") is not None, "git is not installed")
    ws = world.workspace
    git(ws, "init", "-q")
    git(ws, "add", ".")
    git(ws, "commit", "-qm", "base")
    audit = world.root / "audit.jsonl"
    env = dict(world.env, **GIT_ENV)
    proc = world.stockade("run", "--audit", str(audit), "--", "sh", "-c", script, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, [json.loads(line) for line in audit.read_text().splitlines()]


@pytest.mark.usefixtures("kernel")
def test_a_run_that_nests_a_repository_is_reported(world: World) -> None:
    stderr, events = run_in_repository(world, SCRIPT)
    assert "nested a repository at sub" in stderr
    (found,) = [e for e in events if e["event"] == "git_nested_repository"]
    assert found["path"] == str(world.workspace / "sub")
    assert found["verdict"] == "report"


@pytest.mark.usefixtures("kernel")
def test_a_run_that_commits_is_not_reported(world: World) -> None:
    script = (
        "echo more >> README && git add README && "
        "git -c user.name=t -c user.email=t@example.test commit -qm more"
    )
    stderr, events = run_in_repository(world, script)
    assert "nested a repository" not in stderr
    assert not [e for e in events if e["event"] == "git_nested_repository"]
    assert git(world.workspace, "log", "--format=%s", "-1") == "more"
