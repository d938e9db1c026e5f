"""Validation of network.rules, network.tls, [secrets.NAME] and [labels]."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade._exceptions import PolicyError
from stockade.policy import parse_policy_text
from stockade.policy._load import load_policy

BASE = """
[network]
allow = ["registry.test", "*.api.test"]
"""


def test_full_inspect_policy_loads(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    p = parse_policy_text(
        BASE
        + f"""
tls = {{ upstream_ca = "{ca}" }}
[[network.rules]]
host = "registry.test"
methods = ["get", "HEAD"]
paths = ["/**"]
[[network.rules]]
host = "v1.api.test"
action = "report"
[secrets.API_KEY]
from = "env:REAL_KEY"
hosts = ["v1.api.test"]
header = "X-Api-Key"
[labels]
secret_files = [".env", "~/.aws/credentials"]
secret_env = ["DB_PASSWORD"]
canaries = ["canary-token-1"]
""",
        workspace=tmp_path,
    )
    assert [r.methods for r in p.network.rules] == [("GET", "HEAD"), ()]
    assert p.network.rules[1].name == "network.rules[1]"
    assert p.network.upstream_ca == ca
    (secret,) = p.secrets
    assert (secret.name, secret.source, secret.header) == ("API_KEY", "env:REAL_KEY", "x-api-key")
    assert p.labels.configured
    assert "secrets" in p.to_dict()
    assert "REAL_KEY" in str(p.to_dict())  # the source, never a value


@pytest.mark.parametrize(
    ("extra", "key", "fix"),
    [
        ('[[network.rules]]\nhost = "evil.test"', "network.rules[0].host", "network.allow"),
        ('[[network.rules]]\nhost = "registry.test"\naction = "maybe"', ".action", "allow, deny"),
        (
            '[[network.rules]]\nhost = "registry.test"\npaths = ["v1"]',
            ".paths[0]",
            'starts with "/"',
        ),
        ('[[network.rules]]\nhost = "registry.test"\npaths = ["/a/../b"]', ".paths[0]", "dot"),
        ('[[network.rules]]\nhost = "registry.test"\nmethods = ["G T"]', ".methods[0]", "method"),
        ('[[network.rules]]\nhost = "registry.test"\nverb = "GET"', ".verb", "unknown key"),
        ('[secrets.K]\nfrom = "env:K"\nhosts = ["evil.test"]', "secrets.K.hosts[0]", "allow"),
        ('[secrets.K]\nfrom = "vault:K"\nhosts = ["registry.test"]', "secrets.K.from", "env:"),
        ('[secrets.K]\nfrom = "env:K"\nhosts = []', "secrets.K.hosts", "list the hosts"),
        (
            '[secrets.K]\nfrom = "file:rel/key"\nhosts = ["registry.test"]',
            "secrets.K.from",
            "absolute",
        ),
        (
            '[secrets.K]\nfrom = "env:K"\nhosts = ["registry.test"]\nheader = "host"',
            ".header",
            "cannot",
        ),
        (
            '["secrets"."bad-name"]\nfrom = "env:K"\nhosts = ["registry.test"]',
            "secrets.bad-name",
            "A-Z",
        ),
        ('[labels]\ncanaries = ["short"]', "labels.canaries[0]", "8 characters"),
        ('[labels]\nsecret_env = ["1BAD"]', "labels.secret_env[0]", "variable name"),
        ('[labels]\nfiles = ["x"]', "labels.files", "unknown key"),
    ],
)
def test_errors_name_key_value_and_fix(tmp_path: Path, extra: str, key: str, fix: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(BASE + extra, "p.toml", workspace=tmp_path)
    message = str(info.value)
    assert key in message
    assert fix in message


def test_tls_upstream_ca_must_exist(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"network\.tls\.upstream_ca"):
        parse_policy_text(BASE + 'tls = { upstream_ca = "/nonexistent.pem" }', workspace=tmp_path)


def _compose(tmp_path: Path, user: str, ws: str) -> object:
    user_file = tmp_path / "user.toml"
    user_file.write_text(user)
    (tmp_path / "stockade.toml").write_text(ws)
    import os

    old = os.environ.get("XDG_CONFIG_HOME")
    (tmp_path / "cfg" / "stockade").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cfg" / "stockade" / "policy.toml").write_text(user)
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path / "cfg")
    try:
        return load_policy(workspace=tmp_path)
    finally:
        if old is None:
            del os.environ["XDG_CONFIG_HOME"]
        else:
            os.environ["XDG_CONFIG_HOME"] = old


USER = BASE + '[[network.rules]]\nhost = "registry.test"\nmethods = ["GET"]\n'


def test_workspace_may_add_deny_rules_and_labels(tmp_path: Path) -> None:
    ws = (
        '[network]\n[[network.rules]]\nhost = "registry.test"\npaths = ["/private/**"]\n'
        'action = "deny"\n[labels]\ncanaries = ["ws-canary-123"]\n'
    )
    policy = _compose(tmp_path, USER, ws)
    rules = policy.network.rules  # type: ignore[attr-defined]
    assert [r.action for r in rules] == ["deny", "allow"]
    assert [r.index for r in rules] == [0, 1]
    assert policy.labels.canaries == ("ws-canary-123",)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "ws",
    [
        '[network]\n[[network.rules]]\nhost = "registry.test"\nmethods = ["PUT"]\n',
        '[secrets.K]\nfrom = "file:~/.ssh/id_rsa"\nhosts = ["registry.test"]\n',
        '[network]\ntls = { upstream_ca = "/etc/hostname" }\n',
    ],
)
def test_workspace_cannot_widen_inspect(tmp_path: Path, ws: str) -> None:
    with pytest.raises(PolicyError, match="tighten"):
        _compose(tmp_path, USER, ws)


def test_http2_defaults_on_and_a_workspace_may_only_turn_it_off(tmp_path: Path) -> None:
    assert _compose(tmp_path, USER, "").inspect.http2 is True  # type: ignore[attr-defined]
    off = _compose(tmp_path, USER, "[inspect]\nhttp2 = false\n")
    assert off.inspect.http2 is False  # type: ignore[attr-defined]
    user_off = USER + "\n[inspect]\nhttp2 = false\n"
    assert _compose(tmp_path, user_off, "").inspect.http2 is False  # type: ignore[attr-defined]
    with pytest.raises(PolicyError, match="tighten"):
        _compose(tmp_path, user_off, "[inspect]\nhttp2 = true\n")
