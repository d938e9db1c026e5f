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
