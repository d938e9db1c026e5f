"""``stockade init``: real workspaces, real git, the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stockade.cli.init import remote_host
from stockade.policy import load_policy, parse_policy_text


def init(ws: Path, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # init pins what it writes (stockade trust) in stockade's state: a private one here.
    env["XDG_STATE_HOME"] = str((home or ws.parent / f"{ws.name}-home") / ".local" / "state")
    if home is not None:
        env["XDG_CONFIG_HOME"] = str(home / ".config")
    return subprocess.run(
        [sys.executable, "-m", "stockade", "init", "--workspace", str(ws), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def git(ws: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=ws, check=True, capture_output=True)


def test_python_node_and_github_remote(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "requirements-dev.txt").write_text("pytest\n")
    (tmp_path / "package.json").write_text("{}")
    git(tmp_path, "init", "-q")
    git(tmp_path, "remote", "add", "origin", "https://github.com/octo/x.git")
    git(tmp_path, "remote", "add", "corp", "https://git.corp.test/octo/x")
    git(tmp_path, "remote", "add", "ssh", "git@gitlab.test:octo/x.git")
    result = init(tmp_path, "--print")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    raw = tomllib.loads(text)
    assert raw["presets"]["use"] == ["python", "node", "git"]
    assert raw["network"]["allow"] == ["git.corp.test"]
    assert "found pyproject.toml, requirements-dev.txt" in text
    assert "can only TIGHTEN the user policy" in text
    assert "--policy stockade.toml" in text
    assert "git over ssh cannot reach it" in text
    assert not (tmp_path / "stockade.toml").exists()
    # Trusted explicitly (--policy), the starter loads with the presets' hosts.
    policy = parse_policy_text(text, workspace=tmp_path)
    assert "pypi.org" in policy.network.allow
    assert "registry.npmjs.org" in policy.network.allow


def test_writes_once_then_needs_force(tmp_path: Path) -> None:
    (tmp_path / "package.json").write_text("{}")
    first = init(tmp_path)
    assert first.returncode == 0, first.stderr
    target = tmp_path / "stockade.toml"
    assert tomllib.loads(target.read_text())["presets"]["use"] == ["node"]
    target.write_text("# my own\n")
    second = init(tmp_path)
    assert second.returncode == 125
    assert "--force" in second.stderr
    assert target.read_text() == "# my own\n"
    assert init(tmp_path, "--force").returncode == 0
    assert "[presets]" in target.read_text()


def test_empty_workspace_lists_presets_and_loads_as_workspace_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    home = tmp_path / "home"
    assert init(ws, "--no-trust", home=home).returncode == 0
    text = (ws / "stockade.toml").read_text()
    assert "use = []" in text
    assert "python: PyPI" in text
    # With nothing to widen, the file works as a plain workspace policy.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    policy = load_policy(workspace=ws)
    assert policy.sources[-1] == str(ws / "stockade.toml")
    assert policy.network.allow == ()


def test_worktree_git_file_is_followed(tmp_path: Path) -> None:
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q")
    git(
        main,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t.test",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    )
    git(main, "remote", "add", "origin", "https://github.com/octo/x.git")
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    result = init(tmp_path / "wt", "--print")
    assert result.returncode == 0, result.stderr
    assert tomllib.loads(result.stdout)["presets"]["use"] == ["git"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/o/r.git", ("github.com", True)),
        ("https://user@GitHub.com/o/r", ("github.com", True)),
        ("ssh://git@host.test:2222/o/r", ("host.test", False)),
        ("git@gitlab.test:o/r.git", ("gitlab.test", False)),
        ("/srv/git/r.git", None),
        ("../r", None),
    ],
)
def test_remote_host(url: str, expected: tuple[str, bool] | None) -> None:
    assert remote_host(url) == expected
