"""stockade._fs: the one writer of a file stockade creates (write_new) and of one it
replaces (replace_file), on the real file system."""

from __future__ import annotations

import _thread
import os
import stat
from pathlib import Path

import pytest

from stockade._fs import replace_file, write_new


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{_thread.get_ident()}.tmp")


def test_replace_file_puts_the_data_with_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "record"
    old = os.umask(0o077)
    try:
        replace_file(target, b"first", 0o644)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    replace_file(target, b"second" * 100_000)  # the default: private
    assert target.read_bytes() == b"second" * 100_000
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record"]


def test_replace_file_never_writes_a_file_another_name_reaches(tmp_path: Path) -> None:
    """The data goes to a new file renamed over the path: a hard link to the old file
    keeps the old content (the twin: the path has the new)."""
    target = tmp_path / "record"
    target.write_bytes(b"old")
    other = tmp_path / "other-name"
    os.link(target, other)
    replace_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert other.read_bytes() == b"old"


def test_replace_file_does_not_follow_a_link_planted_at_its_temporary_name(
    tmp_path: Path,
) -> None:
    target = tmp_path / "record"
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    _tmp_name(target).symlink_to(victim)
    replace_file(target, b"data")
    assert victim.read_bytes() == b"untouched"
    assert target.read_bytes() == b"data"
    assert not target.is_symlink()
    assert not _tmp_name(target).exists()


def test_replace_file_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "a-directory"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        replace_file(target, b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory"]
    assert list(target.iterdir()) == []


def test_write_new_refuses_what_exists_and_links(tmp_path: Path) -> None:
    made = tmp_path / "made"
    write_new(made, b"x", 0o600)
    assert made.read_bytes() == b"x"
    with pytest.raises(FileExistsError):
        write_new(made, b"y", 0o600)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        write_new(link, b"y", 0o600)
    assert not (tmp_path / "elsewhere").exists()
