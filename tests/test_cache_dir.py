"""stockade's cache is spelt once: where programs that run on the host are built (the
launcher, the network helper, the front end), where runsc is kept, and the trust root
every sandbox gets read-only are the same directory, whatever XDG_CACHE_HOME says."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade import _build, _roots
from stockade.enforce import gvisor


@pytest.mark.parametrize("value", ["", "relative/cache", "/abs/cache"])
def test_every_user_of_the_cache_names_the_trust_root(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", value)
    root = _roots.cache_dir()
    assert _build.cache_dir() == root
    assert gvisor.cache_dir() == root / "runsc"
    # A relative value is ignored (XDG): never a cache relative to the working directory,
    # which may be the workspace.
    expected = Path(value) / "stockade" if value.startswith("/") else tmp_path / ".cache/stockade"
    assert root == expected


def test_a_warm_process_follows_each_environment_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories are remembered by what they are made of (a warm process asks for
    them some twenty times a run), so that another caller's environment (a Sandbox, a
    server's worker) still gets its own: a changed variable or HOME changes the answer,
    and the same ones give the same."""
    monkeypatch.setenv("HOME", str(tmp_path / "a"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert _roots.state_dir() == tmp_path / "a/.local/state/stockade"
    monkeypatch.setenv("HOME", str(tmp_path / "b"))
    assert _roots.state_dir() == tmp_path / "b/.local/state/stockade"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert _roots.state_dir() == tmp_path / "xdg/stockade"
    assert _roots.state_dir({"HOME": str(tmp_path / "c")}) == tmp_path / "c/.local/state/stockade"
    assert _roots.config_dir() == tmp_path / "b/.config/stockade"  # the same HOME: not mixed up
    monkeypatch.delenv("XDG_STATE_HOME")
    assert _roots.state_dir() == tmp_path / "b/.local/state/stockade"
