"""Placeholders of protected paths (enforce/paths.py), on a real file system."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.enforce import paths


def test_protect_paths_makes_or_lists_the_placeholders(tmp_path: Path) -> None:
    made = paths.protect_paths(tmp_path)
    assert (tmp_path / ".vscode").is_dir()
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
