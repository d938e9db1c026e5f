"""The resolver files a sandbox's /etc gets (runtime/_egress.resolver_files) are kept in
stockade's cache, checked before each use, and written into the run's scratch only where
the cache cannot be written. Real runs under bubblewrap, real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.runtime import _egress
from tests.conftest import World


def _cache(world: World) -> Path:
    return Path(world.env["XDG_CACHE_HOME"]) / "stockade" / "resolver"


def _scratch_never_asked() -> Path:
    raise AssertionError("the scratch directory was asked for")


def test_the_files_are_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = _egress.resolver_files(_scratch_never_asked, "box", isolate=True)
    second = _egress.resolver_files(_scratch_never_asked, "box", isolate=True)
    assert first == second
    hosts = next(src for src, target in first if target == os.path.realpath("/etc/hosts"))
    assert hosts.parent == tmp_path / "stockade" / "resolver"
    assert "127.0.1.1\tbox\n" in hosts.read_text()
    assert hosts.stat().st_mode & 0o777 == 0o644


def test_a_changed_cached_file_is_written_anew_before_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever changed it (the cache is read-only in every sandbox, so not a sandbox), its
    content is checked at each use: what a run binds is what stockade wrote."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    files = _egress.resolver_files(_scratch_never_asked, "box", isolate=True)
    hosts = {target: src for src, target in files}[os.path.realpath("/etc/hosts")]
    hosts.write_text("203.0.113.7\tregistry.npmjs.org\n")
    files = _egress.resolver_files(_scratch_never_asked, "box", isolate=True)
    again = {target: src for src, target in files}
    assert again[os.path.realpath("/etc/hosts")] == hosts
    assert "registry.npmjs.org" not in hosts.read_text()
    assert "127.0.1.1\tbox\n" in hosts.read_text()


def test_an_unwritable_cache_falls_back_to_the_scratch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory would be\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    files = _egress.resolver_files(lambda: scratch, "box", isolate=True)
    assert files
    assert all(src.parent == scratch for src, _ in files)


def test_a_run_resolves_through_the_cached_files(world: World, kernel: None) -> None:
    """End to end: the sandbox's /etc/hosts and /etc/resolv.conf are the cached files'
    content."""
    proc = world.stockade("run", "--", "sh", "-c", "cat /etc/hosts /etc/resolv.conf")
    assert proc.returncode == 0, proc.stderr
    assert "127.0.1.1\tstockade" in proc.stdout
    assert "nameserver 127.0.0.1" in proc.stdout
    cached = sorted(p.name.split("-", 1)[1] for p in _cache(world).iterdir())
    assert "hosts" in cached
    assert "resolv.conf" in cached
