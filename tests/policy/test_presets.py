"""Toolchain presets: the grant as data, and its merge by the loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy, parse_policy_text
from stockade.policy._presets import PRESETS, expand_presets
from stockade.policy._schema import SCHEMA


def test_python_node_git_hosts() -> None:
    grant = expand_presets(["python", "node", "git"])
    assert grant.hosts == (
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
    )
    assert set(PRESETS) == {"python", "node", "git"}


def _first_match(rules: tuple[dict[str, object], ...], host: str, method: str, path: str) -> str:
    """First-match-wins evaluation of the rule data, with ``/**`` as a path prefix."""
    for rule in rules:
        if rule["host"] != host or method not in rule["methods"]:  # type: ignore[operator]
            continue
        for pattern in rule["paths"]:  # type: ignore[attr-defined]
            if (
                pattern == "/**"
                or (pattern.startswith("/**/") and path.endswith(pattern[3:]))
                or (pattern.endswith("/**") and path.startswith(pattern[:-2]))
            ):
                return str(rule["action"])
    return "deny"


def test_git_fetch_allowed_push_denied_unless_allow_push() -> None:
    rules = expand_presets(["git"]).rules
    assert _first_match(rules, "github.com", "GET", "/o/r.git/info/refs") == "allow"
    assert _first_match(rules, "github.com", "POST", "/o/r.git/git-upload-pack") == "allow"
    assert _first_match(rules, "github.com", "POST", "/o/r.git/git-receive-pack") == "deny"
    assert {"host", "methods", "paths", "action"} == set(rules[0])
    pushing = expand_presets(["git"], allow_push=True).rules
    assert _first_match(pushing, "github.com", "POST", "/o/r.git/git-receive-pack") == "allow"


def test_registries_are_read_only() -> None:
    rules = expand_presets(["python", "node"]).rules
    assert _first_match(rules, "pypi.org", "GET", "/simple/requests/") == "allow"
    assert _first_match(rules, "registry.npmjs.org", "PUT", "/left-pad") == "deny"
    assert _first_match(rules, "pypi.org", "POST", "/legacy/") == "deny"
    assert (
        _first_match(rules, "registry.npmjs.org", "POST", "/-/npm/v1/security/advisories/bulk")
        == "allow"
    )


def test_duplicates_merge_once() -> None:
    grant = expand_presets(["python", "python"])
    assert grant.hosts == ("pypi.org", "files.pythonhosted.org")
    assert len(grant.rules) == len(expand_presets(["python"]).rules)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="python, node, git"):
        expand_presets(["ruby"])


def test_loader_merges_preset(tmp_path: Path) -> None:
    policy = parse_policy_text(
        '[presets]\nuse = ["python"]\n[network]\nallow = ["example.test"]\n'
        '[env]\npass = ["VIRTUAL_ENV"]\n',
        workspace=tmp_path,
    )
    assert policy.network.allow == ("example.test", "pypi.org", "files.pythonhosted.org")
    names = [e.name for e in policy.env.pass_]
    assert names.count("VIRTUAL_ENV") == 1
    assert "PIP_NO_INPUT" in names
    if "rules" not in SCHEMA["network"]:
        assert any("network.rules" in n for n in policy.notes)


def test_loader_names_the_bad_preset(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"presets\.use\[1\]: \"ruby\": unknown preset"):
        parse_policy_text('[presets]\nuse = ["git", "ruby"]\n', workspace=tmp_path)
    with pytest.raises(PolicyError, match=r"presets\.allow_push"):
        parse_policy_text('[presets]\nuse = ["git"]\nallow_push = "yes"\n', workspace=tmp_path)
    with pytest.raises(PolicyError, match=r"presets\.use"):
        parse_policy_text('[presets]\nuse = "git"\n', workspace=tmp_path)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    (h / ".config" / "stockade").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(h / ".config"))
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return h


def test_workspace_policy_cannot_widen_with_a_preset(home: Path) -> None:
    (Path.cwd() / "stockade.toml").write_text('[presets]\nuse = ["node"]\n')
    with pytest.raises(PolicyError, match=r"presets\.use.*registry\.npmjs\.org.*only tighten"):
        load_policy()


def test_workspace_policy_may_use_a_preset_the_user_allows(home: Path) -> None:
    (home / ".config" / "stockade" / "policy.toml").write_text(
        '[network]\nallow = ["registry.npmjs.org", "example.test"]\n'
    )
    (Path.cwd() / "stockade.toml").write_text(
        '[presets]\nuse = ["node"]\n[network]\nallow = ["registry.npmjs.org"]\n'
    )
    policy = load_policy()
    assert policy.network.allow == ("registry.npmjs.org",)
    # the preset's env names are not added by a workspace file
    assert "NODE_ENV" not in [e.name for e in policy.env.pass_]


def test_preset_request_rules_reach_the_effective_policy(tmp_path: Path) -> None:
    policy_file = tmp_path / "p.toml"
    policy_file.write_text('version = 1\n[presets]\nuse = ["git"]\n')
    rules = load_policy(policy_file, workspace=tmp_path).network.rules
    push = [r for r in rules if r.paths == ("/**/git-receive-pack",)]
    assert push
    assert push[0].action == "deny"
    # The twin: allow_push turns the push rule into an allow.
    policy_file.write_text('version = 1\n[presets]\nuse = ["git"]\nallow_push = true\n')
    rules = load_policy(policy_file, workspace=tmp_path).network.rules
    assert all(r.action == "allow" for r in rules if r.paths == ("/**/git-receive-pack",))
