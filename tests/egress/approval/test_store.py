"""approved.toml: written atomically under a lock, valid TOML, merged at load, refused
where the sandbox could write it; network.strict composes as a tightening."""

from __future__ import annotations

import multiprocessing
import tomllib
from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.egress.approval._store import ApprovedStore, refusal
from stockade.policy import load_policy


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").mkdir()
    return tmp_path / "config" / "stockade"


def test_always_is_written_and_reloads(config: Path, tmp_path: Path) -> None:
    store = ApprovedStore()
    assert store.path == config / "approved.toml"
    before, after = store.add(
        [("allow", "api.example.test:443"), ("deny", "evil.test")],
        answered_by='tty:/dev/pts/3 "quoted"\n',
        run="r1",
        argv=["pip", "install", "-e", "."],
    )
    assert before is None
    assert after is not None
    data = tomllib.loads(store.path.read_text())
    assert data["allow"][0]["pattern"] == "api.example.test:443"
    assert data["allow"][0]["argv"] == ["pip", "install", "-e", "."]
    assert data["deny"][0]["pattern"] == "evil.test"
    policy = load_policy(workspace=tmp_path / "ws")
    assert "api.example.test:443" in policy.network.allow
    assert "evil.test" in policy.network.deny
    assert str(store.path) in policy.sources
    # The twin: an explicit --policy file is reproducible and ignores approvals.
    explicit = tmp_path / "p.toml"
    explicit.write_text("version = 1\n")
    assert "api.example.test:443" not in load_policy(explicit).network.allow
    assert store.remove(["api.example.test"]) == ["api.example.test:443"]
    assert "api.example.test:443" not in load_policy(workspace=tmp_path / "ws").network.allow


def test_a_workspace_policy_cannot_add_approvals(config: Path, tmp_path: Path) -> None:
    (tmp_path / "ws" / "stockade.toml").write_text('[network]\nallow = ["x.test"]\n')
    with pytest.raises(PolicyError, match="only tighten"):
        load_policy(workspace=tmp_path / "ws")
    ApprovedStore().add([("allow", "x.test")])
    assert "x.test" in load_policy(workspace=tmp_path / "ws").network.allow


def test_broken_file_is_refused_not_overwritten(config: Path) -> None:
    config.mkdir(parents=True)
    (config / "approved.toml").write_text('[[allow]]\npattern = "*"\n')
    with pytest.raises(PolicyError):
        ApprovedStore().add([("allow", "a.test")])
    assert (config / "approved.toml").read_text() == '[[allow]]\npattern = "*"\n'


def test_refused_inside_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "cfg" / "stockade").mkdir(parents=True)
    link = tmp_path / "elsewhere"
    link.symlink_to(ws / "cfg")
    assert refusal(ws / "cfg" / "stockade" / "approved.toml", [ws]) is not None
    assert refusal(link / "stockade" / "approved.toml", [ws]) is not None
    assert refusal(tmp_path / "cfg" / "stockade" / "approved.toml", [ws]) is None


def _writer(path: str, n: int) -> None:
    store = ApprovedStore(Path(path))
    for i in range(10):
        store.add([("allow", f"h{n}-{i}.test")])


def test_concurrent_writers_are_serialised(tmp_path: Path) -> None:
    path = tmp_path / "approved.toml"
    procs = [multiprocessing.Process(target=_writer, args=(str(path), n)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    patterns = {e["pattern"] for e in ApprovedStore(path).entries()}
    assert len(patterns) == 40


def test_strict_only_tightens(config: Path, tmp_path: Path) -> None:
    assert not load_policy(workspace=tmp_path / "ws").network.strict
    (tmp_path / "ws" / "stockade.toml").write_text("[network]\nstrict = true\n")
    assert load_policy(workspace=tmp_path / "ws").network.strict
    config.mkdir(parents=True)
    (config / "policy.toml").write_text("[network]\nstrict = true\n")
    (tmp_path / "ws" / "stockade.toml").write_text("[network]\nstrict = false\n")
    assert load_policy(workspace=tmp_path / "ws").network.strict
