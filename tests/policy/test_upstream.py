"""``[network.upstream]``: validation at load, the workspace rule, and resolution at start
(``proxy = "env"``, ``NO_PROXY``, the auth file). Pure except for the files it writes."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

from stockade._exceptions import PolicyError
from stockade.egress.upstream import resolve_upstream
from stockade.policy import load_policy, parse_policy_text
from stockade.policy._load import with_upstream_proxy
from stockade.policy._model import UpstreamPolicy
from stockade.policy._upstream import parse_no_proxy, parse_proxy_url, redact_url
from tests.conftest import require


def policy(table: str) -> str:
    return f'[network]\nallow = ["a.test"]\n[network.upstream]\n{table}\n'


@pytest.fixture
def auth(tmp_path: Path) -> Path:
    path = tmp_path / "auth" / "proxy-auth"
    path.parent.mkdir()
    path.write_text("alice:s3cret-pw\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace that does not hold the auth file."""
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    return ws


def test_a_full_table_loads_and_is_part_of_the_digest(auth: Path, elsewhere: Path) -> None:
    text = policy(
        'proxy = "http://Proxy.Corp.test:8080"\n'
        'no_proxy = ["*.corp.test", "10.0.0.0/8", "git.test:22"]\n'
        f'auth_file = "{auth}"\nconnect_by = "name"'
    )
    loaded = parse_policy_text(text)
    assert loaded.network.upstream == UpstreamPolicy(
        "http://Proxy.Corp.test:8080", ("*.corp.test", "10.0.0.0/8", "git.test:22"), auth, "name"
    )
    assert loaded.to_dict()["network"]["upstream"]["auth_file"] == str(auth)
    plain = parse_policy_text('[network]\nallow = ["a.test"]\n')
    assert plain.network.upstream is None
    assert plain.digest() != loaded.digest()


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ('proxy = "http://alice:s3cret@proxy.test:3128"', "network.upstream.proxy", "auth_file"),
        ('proxy = "https://proxy.test:3128"', "network.upstream.proxy", "http://"),
        ('proxy = "socks5://proxy.test:1080"', "network.upstream.proxy", "not supported"),
        ('proxy = "http://proxy.test"', "network.upstream.proxy", "port"),
        ('proxy = "http://proxy.test:99999"', "network.upstream.proxy", "65535"),
        ('proxy = "http://proxy.test:3128/path"', "network.upstream.proxy", "no path"),
        ('proxy = "proxy.test:3128"', "network.upstream.proxy", "scheme"),
        ("proxy = 3128", "network.upstream.proxy", "http://host:port"),
        ('no_proxy = ["a.test"]', "network.upstream", "no proxy"),
        ('proxy = "env"\nno_proxy = ["*"]', "network.upstream.no_proxy[0]", "wildcard"),
        ('proxy = "env"\nconnect_by = "ip"', "network.upstream.connect_by", "address"),
        ('proxy = "env"\nauth_file = "/nonexistent/auth"', "network.upstream.auth_file", "no such"),
        ('proxy = "env"\nuser = "alice"', "network.upstream.user", "unknown key"),
    ],
)
def test_wrong_values_name_the_key_and_the_fix(table: str, key: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy_text(policy(table))
    message = str(info.value)
    assert f"{key}:" in message
    assert words in message
    assert "s3cret" not in message  # a URL with credentials is never echoed with them


def test_an_auth_file_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    inside = ws / "proxy-auth"
    inside.write_text("alice:pw\n")
    inside.chmod(0o600)
    with pytest.raises(PolicyError, match=r"auth_file.*inside the workspace"):
        parse_policy_text(policy(f'proxy = "env"\nauth_file = "{inside}"'), workspace=ws)


def test_a_workspace_file_cannot_set_or_change_the_upstream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    (config / "stockade").mkdir(parents=True)
    (config / "stockade" / "policy.toml").write_text(policy('proxy = "http://proxy.test:3128"'))
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.chdir(ws)
    assert load_policy().network.upstream == UpstreamPolicy("http://proxy.test:3128")
    for table in ('proxy = "http://evil.test:3128"', 'proxy = "http://proxy.test:3128"'):
        (ws / "stockade.toml").write_text(f"[network.upstream]\n{table}\n")
        with pytest.raises(PolicyError, match=r"network\.upstream.*only tighten"):
            load_policy()
    # The twin: a workspace file that tightens something else keeps the user's upstream.
    (ws / "stockade.toml").write_text('[network]\ndeny = ["b.test"]\n')
    assert load_policy().network.upstream == UpstreamPolicy("http://proxy.test:3128")


def test_the_command_line_option_replaces_only_the_url(auth: Path, elsewhere: Path) -> None:
    loaded = parse_policy_text(
        policy(f'proxy = "env"\nno_proxy = ["a.test"]\nauth_file = "{auth}"')
    )
    changed = with_upstream_proxy(loaded, "http://10.0.0.1:3128")
    assert changed.network.upstream == UpstreamPolicy(
        "http://10.0.0.1:3128", ("a.test",), auth, "address"
    )
    with pytest.raises(PolicyError, match=r"--upstream-proxy: \"http://\*\*\*@p:1\""):
        with_upstream_proxy(loaded, "http://user:pw@p:1")


def test_url_parsing() -> None:
    assert parse_proxy_url("http://[2001:db8::1]:3128") == ("2001:db8::1", 3128)
    assert parse_proxy_url("HTTP://Proxy.test:8080/") == ("proxy.test", 8080)
    assert redact_url("http://alice:pw@proxy:1") == "http://***@proxy:1"
    assert redact_url("http://proxy:1") == "http://proxy:1"


def test_no_proxy_entries() -> None:
    v4 = ipaddress.ip_address("10.1.2.3")
    exact = parse_no_proxy("git.test:22")
    assert exact.matches("git.test", 22, v4)
    assert not exact.matches("git.test", 443, v4)
    assert not exact.matches("sub.git.test", 22, v4)
    suffix = parse_no_proxy("*.corp.test")
    assert suffix.matches("a.corp.test", 443, v4)
    assert not suffix.matches("corp.test", 443, v4)
    network = parse_no_proxy("10.0.0.0/8")
    assert network.matches("anything.test", 443, v4)
    assert network.matches("x", 1, ipaddress.ip_address("::ffff:10.0.0.1"))
    assert not network.matches("x", 1, ipaddress.ip_address("192.0.2.1"))
    # NO_PROXY's own conventions: a domain is itself and everything under it.
    for text in ("corp.test", ".corp.test", "*.corp.test"):
        entry = parse_no_proxy(text, convention=True)
        assert entry.matches("corp.test", 443, v4)
        assert entry.matches("a.b.corp.test", 443, v4)
        assert not entry.matches("notcorp.test", 443, v4)
    assert parse_no_proxy("*", convention=True).everything
    assert parse_no_proxy("10.0.0.0/8:443", convention=True).matches("x", 443, v4)


def test_env_is_read_from_stockade_s_environment(auth: Path) -> None:
    table = UpstreamPolicy("env", ("a.test",), auth)
    assert resolve_upstream(table, {}) is None  # nothing set: direct
    env = {
        "https_proxy": "proxy.test:8080",
        "HTTP_PROXY": "http://other.test:1",
        "NO_PROXY": "corp.test, 10.0.0.0/8",
    }
    upstream = resolve_upstream(table, env)
    assert upstream is not None
    assert (upstream.host, upstream.port, upstream.source) == ("proxy.test", 8080, "https_proxy")
    assert upstream.url == "http://proxy.test:8080"
    address = ipaddress.ip_address("192.0.2.7")
    assert upstream.direct("a.test", 443, address)  # the policy's no_proxy
    assert upstream.direct("x.corp.test", 443, address)  # NO_PROXY
    assert upstream.direct("b.test", 443, ipaddress.ip_address("10.9.9.9"))
    assert upstream.direct("b.test", 443, ipaddress.ip_address("127.0.0.1"))  # loopback
    assert not upstream.direct("b.test", 443, address)
    assert upstream.authorization == b"Basic YWxpY2U6czNjcmV0LXB3"
    assert "s3cret" not in repr(upstream)
    assert resolve_upstream(table, {"NO_PROXY": "*", "HTTPS_PROXY": "http://p.test:1"}) is None
    with pytest.raises(PolicyError) as info:
        resolve_upstream(table, {"HTTPS_PROXY": "http://alice:s3cret@p.test:1"})
    assert "HTTPS_PROXY" in str(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "mode", "words"),
    [
        ("alice:pw\n", 0o640, "chmod 600"),
        ("alice:pw\n", 0o604, "chmod 600"),
        ("no-colon-here\n", 0o600, "user:password"),
        ("alice:pw\nbob:pw\n", 0o600, "one line"),
        ("", 0o600, "user:password"),
    ],
)
def test_auth_files_that_are_refused(tmp_path: Path, content: str, mode: int, words: str) -> None:
    path = tmp_path / "auth"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(PolicyError) as info:
        resolve_upstream(UpstreamPolicy("http://p.test:1", auth_file=path), {})
    assert "network.upstream.auth_file" in str(info.value)
    assert words in str(info.value)
    assert "pw" not in str(info.value).replace(str(path), "")


def test_an_auth_file_of_another_user_is_refused(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "giving the file to another user needs root")
    path = tmp_path / "auth"
    path.write_text("alice:pw\n")
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(PolicyError, match="not by you"):
        resolve_upstream(UpstreamPolicy("http://p.test:1", auth_file=path), {})
