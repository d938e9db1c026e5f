"""The landlock backend's split grants (runtime/_landlock.write_grants, read_grants) on
real directory trees: which paths get which rule. The kernel side (what a rule lets
through) is tested in test_landlock_backend.py and the attack suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.runtime._landlock import read_grants, write_grants


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for sub in ("src/pkg", ".git/hooks", "docs"):
        (root / sub).mkdir(parents=True)
    for name in ("README", "src/pkg/m.py", ".git/config", ".envrc", "docs/x.md"):
        (root / name).write_text("x\n")
    os.symlink("/etc", root / "lnk")
    return root


def test_write_grant_split_around_kept_paths_existing_or_not(ws: Path) -> None:
    keep = [ws / ".git/hooks", ws / ".envrc", ws / ".vscode", ws / "src/pkg/new"]
    write, read, split = write_grants([ws], keep)
    s = str(ws)
    # the workspace, .git (holds hooks) and src/pkg (would hold "new") are split:
    # listed read-only, each other entry granted on its own; .vscode and src/pkg/new do
    # not exist and cannot be made (their directories are split); the link is not
    # granted (its target is judged on its own)
    assert split == (ws, ws / ".git", ws / "src", ws / "src/pkg")
    assert read == (s, f"{s}/.git", f"{s}/src", f"{s}/src/pkg")
    assert write == (f"{s}/.git/config", f"{s}/README", f"{s}/docs", f"{s}/src/pkg/m.py")


def test_write_grant_whole_without_kept_paths_and_inside_a_kept_one(ws: Path) -> None:
    assert write_grants([ws], [ws.parent / "elsewhere"]) == ((str(ws),), (), ())
    assert write_grants([ws / "docs"], [ws]) == ((), (str(ws / "docs"),), ())
    assert write_grants([ws], [ws]) == ((), (str(ws),), ())


def test_read_grant_split_around_hidden_paths(ws: Path) -> None:
    s = str(ws)
    read, listed = read_grants([s, "/nonexistent-root"], [f"{s}/src/pkg/m.py", f"{s}/.envrc"])
    assert listed == (s, f"{s}/src", f"{s}/src/pkg")
    assert read == (f"{s}/.git", f"{s}/README", f"{s}/docs", "/nonexistent-root")
    # a root inside a hidden path is left out; a hidden path that does not exist hides
    # nothing
    assert read_grants([f"{s}/src/pkg"], [f"{s}/src"]) == ((), ())
    assert read_grants([s], [f"{s}/nothing"]) == ((s,), ())
