"""Shared fixtures of the policy tests: a HOME and a workspace of their own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh HOME (and XDG_CONFIG_HOME in it); the current directory is a workspace."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(h / ".config"))
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return h


def user_policy(home: Path, text: str) -> None:
    """Write the user policy of ``home``."""
    path = home / ".config" / "stockade" / "policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
