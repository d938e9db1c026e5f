"""Policy v1: loading, validation errors that name the key, composition that only tightens."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy, parse_policy_text
from stockade.policy._units import format_size, parse_size


def test_builtin_default_is_workspace_rw_no_network(home: Path) -> None:
    p = load_policy()
    assert p.filesystem.workspace == Path.cwd().resolve()
    assert p.network.allow == ()
    assert p.layers.active() == (
        "files",
        "container",
        "syscalls",
        "secrets",
        "egress",
        "inspect",
        "limits",
        # on by default, acting only on a workspace in mode = "overlay" (off here)
        "overlay",
    )
    assert not p.filesystem.overlay
    assert p.sources == ("built-in",)
    assert p.limits.memory == 4 * 1024**3


def test_full_v1_contract_parses(home: Path) -> None:
    text = """
version = 1
[filesystem]
workspace = "."
read = ["/usr/share"]
write = []
deny = ["**/.env", "~/.aws"]
[env]
pass = ["CI", { name = "MY_TOKEN", allow_secret = true }]
set = { NODE_ENV = "test" }
[network]
allow = ["registry.npmjs.org", "*.pythonhosted.org", "example.test:8443", "192.0.2.10", "198.51.100.0/24"]
deny = ["bad.example.test"]
hosts = { "name.test" = "127.0.0.1" }
[limits]
pids = 64
memory = "512MiB"
file_size = 1048576
cpu_seconds = 30
wall_seconds = 12.5
[layers]
inspect = false
"""
    p = parse_policy_text(text)
    assert p.filesystem.read == (Path("/usr/share"),)
    assert p.filesystem.deny == ("**/.env", str(home / ".aws"))
    assert [e.name for e in p.env.pass_] == ["CI", "MY_TOKEN"]
    assert p.env.set == {"NODE_ENV": "test"}
    assert p.network.hosts == {"name.test": "127.0.0.1"}
    assert p.limits.memory == 512 * 1024**2
    assert p.limits.wall_seconds == 12.5
    assert "inspect" not in p.layers.active()


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("[filesytem]\n", "filesytem", "unknown key"),
        ("[filesystem]\nreed = []\n", "filesystem.reed", "unknown key"),
        ('[filesystem]\nread = "/usr"\n', "filesystem.read", "list of strings"),
        ("[filesystem]\nread = [1]\n", "filesystem.read[0]", "expected a string"),
        ('[limits]\nmemory = "lots"\n', "limits.memory", "size"),
        ("[limits]\npids = -1\n", "limits.pids", "at least 1"),
        ("[limits]\npids = true\n", "limits.pids", "whole number"),
        ("[limits]\nwall_seconds = -3\n", "limits.wall_seconds", ">= 0"),
        ('[layers]\nfiles = "no"\n', "layers.files", "true or false"),
        ("version = 2\n", "version", "unsupported"),
        ('[network]\nallow = ["*"]\n', "network.allow[0]", "wildcard"),
        ('[network]\nhosts = { "a.test" = "not-an-ip" }\n', "network.hosts.a.test", "IP address"),
        ('[env]\npass = ["GH_TOKEN"]\n', "env.pass[0]", "allow_secret"),
        ('[env]\npass = ["AWS_SECRET_ACCESS_KEY"]\n', "env.pass[0]", "credential"),
        ('[env]\nset = { "1BAD" = "x" }\n', "env.set.1BAD", "not a valid"),
        ('[filesystem]\nwrite = ["/"]\n', "filesystem.write[0]", "grants write to /"),
        ('[filesystem]\nwrite = ["~"]\n', "filesystem.write[0]", "home directory"),
        ('[filesystem]\nprotect = ["../x"]\n', "filesystem.protect[0]", "inside the workspace"),
        (
            '[filesystem]\nworkspace = "/nonexistent-stockade-dir"\n',
            "filesystem.workspace",
            "not a directory",
        ),
    ],
)
def test_bad_policies_name_the_key(home: Path, text: str, key: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy_text(text, "p.toml")
    message = str(err.value)
    # FILE:LINE: KEY: the line of the key (#24: errors name the line when it is known)
    assert re.match(rf"p\.toml:\d+: {re.escape(key)}:", message), message
    assert fragment in message


def test_not_toml_is_an_error(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[filesystem\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(bad)


def test_missing_policy_file(home: Path, tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(tmp_path / "nope.toml")


def test_workspace_symlink_to_root_refused(home: Path, tmp_path: Path) -> None:
    link = tmp_path / "looks-like-a-project"
    link.symlink_to("/")
    with pytest.raises(PolicyError, match="whole system"):
        parse_policy_text(f'[filesystem]\nworkspace = "{link}"\n', "p.toml")


def test_write_symlink_into_home_refused(home: Path, tmp_path: Path) -> None:
    link = tmp_path / "cache"
    link.symlink_to(home)
    with pytest.raises(PolicyError, match="home directory"):
        parse_policy_text(f'[filesystem]\nwrite = ["{link}"]\n', "p.toml")


def test_read_path_resolving_elsewhere_is_reported(home: Path, tmp_path: Path) -> None:
    (home / "data").mkdir()
    link = tmp_path / "data"
    link.symlink_to(home / "data")
    p = parse_policy_text(f'[filesystem]\nread = ["{link}"]\n', "p.toml")
    assert p.filesystem.read == (home / "data",)
    assert any("inside your home directory" in n for n in p.notes)


def test_plain_read_path_has_no_note(home: Path) -> None:
    p = parse_policy_text('[filesystem]\nread = ["/usr/share"]\n', "p.toml")
    assert p.notes == ()


def test_user_policy_then_workspace_policy_tightens(home: Path) -> None:
    user = home / ".config" / "stockade" / "policy.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[network]\nallow = ["a.test", "b.test"]\n[limits]\npids = 100\n')
    Path("stockade.toml").write_text('[network]\nallow = ["a.test"]\n[limits]\npids = 50\n')
    p = load_policy()
    assert p.network.allow == ("a.test",)
    assert p.limits.pids == 50
    assert len(p.sources) == 2


def test_workspace_policy_cannot_widen(home: Path) -> None:
    Path("stockade.toml").write_text('[network]\nallow = ["evil.test"]\n')
    with pytest.raises(PolicyError, match="can only tighten"):
        load_policy()


def test_workspace_policy_cannot_disable_layer(home: Path) -> None:
    Path("stockade.toml").write_text("[layers]\nfiles = false\n")
    with pytest.raises(PolicyError, match=r"layers\.files.*can only tighten"):
        load_policy()


def test_workspace_policy_cannot_loosen_limits(home: Path) -> None:
    Path("stockade.toml").write_text("[limits]\npids = 100000\n")
    assert load_policy().limits.pids == 512


def test_explicit_policy_is_trusted(home: Path) -> None:
    Path("stockade.toml").write_text('[network]\nallow = ["a.test"]\n')
    p = load_policy(Path("stockade.toml"))
    assert p.network.allow == ("a.test",)


def test_allow_host_from_cli_is_validated(home: Path) -> None:
    assert load_policy(extra_allow=("x.test",)).network.allow == ("x.test",)
    with pytest.raises(PolicyError, match="--allow-host"):
        load_policy(extra_allow=("*",))


def test_digest_changes_with_policy(home: Path) -> None:
    a = parse_policy_text("")
    b = parse_policy_text('[network]\nallow = ["a.test"]\n')
    assert a.digest() != b.digest()
    assert a.digest() == parse_policy_text("").digest()


def test_sizes() -> None:
    assert parse_size("4GiB") == 4 * 1024**3
    assert parse_size("1.5KiB") == 1536
    assert parse_size("10MB") == 10_000_000
    assert format_size(512 * 1024**2) == "512MiB"
    with pytest.raises(ValueError, match="size"):
        parse_size("4 parsecs")


def test_home_relative_paths_expand(home: Path) -> None:
    (home / "tools").mkdir()
    p = parse_policy_text('[filesystem]\nread = ["~/tools"]\n')
    assert p.filesystem.read == (Path(os.path.realpath(home / "tools")),)


def test_trust_widenings_name_what_a_file_opens_and_nothing_it_repeats(tmp_path: Path) -> None:
    from stockade.policy._load import parse_policy_text
    from stockade.policy._trust import widenings

    base = 'version = 1\n[network]\nallow = ["a.test"]\n[[network.rules]]\nhost = "a.test"\nmethods = ["GET"]\n'
    now = parse_policy_text(base, workspace=tmp_path)
    more = parse_policy_text(
        base
        + '[[network.rules]]\nhost = "a.test"\nmethods = ["POST"]\n'
        + "[limits]\npids = 100000\n[layers]\ninspect = false\n",
        workspace=tmp_path,
    )
    assert widenings(now, more) == [
        "network.rules allow: a.test POST /**",
        "layers switched off: inspect",
        "limits raised: pids",
    ]
    assert widenings(now, now) == []  # the twin: the same policy opens nothing
    tighter = parse_policy_text("version = 1\n[limits]\npids = 10\n", workspace=tmp_path)
    assert widenings(now, tighter) == []
