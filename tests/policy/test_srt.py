"""Importing srt settings: the README examples map, unmappable keys are refused by name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from stockade import PolicyError
from stockade.policy._srt import policy_from_srt, srt_to_policy, srt_to_toml

#: srt README, "Complete Configuration Example" (reproduced in research/srt.md §2).
README_COMPLETE: dict[str, Any] = {
    "network": {
        "allowedDomains": [
            "github.com",
            "*.github.com",
            "lfs.github.com",
            "api.github.com",
            "npmjs.org",
            "*.npmjs.org",
        ],
        "deniedDomains": ["malicious.com"],
        "allowUnixSockets": ["/var/run/docker.sock"],
        "allowLocalBinding": False,
    },
    "filesystem": {
        "denyRead": ["~/.ssh"],
        "allowRead": [],
        "allowWrite": [".", "src/", "test/", "/tmp"],
        "denyWrite": [".env", "config/production.json"],
    },
    "ignoreViolations": {
        "*": ["/usr/bin", "/System"],
        "git push": ["/usr/bin/nc"],
        "npm": ["/private/tmp"],
    },
    "enableWeakerNestedSandbox": False,
    "enableWeakerNetworkIsolation": False,
    "allowAppleEvents": False,
}

#: srt README, TLS termination with an exclude.
README_TLS: dict[str, Any] = {
    "network": {
        "allowedDomains": ["*.example.com", "internal-mtls.example.net"],
        "deniedDomains": [],
        "tlsTerminate": {
            "excludeDomains": ["internal-mtls.example.net"],
            "extraCaCertPaths": ["/etc/internal-mtls-roots.pem"],
        },
    }
}


def test_readme_complete_example_maps(tmp_path: Path) -> None:
    policy = srt_to_policy(README_COMPLETE, "srt.json", tmp_path)
    assert policy.filesystem.workspace == tmp_path.resolve()
    assert policy.network.allow == (
        "github.com",
        "*.github.com",
        "lfs.github.com",
        "api.github.com",
        "npmjs.org",
        "*.npmjs.org",
    )
    assert policy.network.deny == ("malicious.com",)
    assert policy.filesystem.deny == (str(Path.home() / ".ssh"),)
    # ".", "src/", "test/" are inside the workspace (already writable); /tmp is a real grant.
    assert policy.filesystem.write == (Path("/tmp").resolve(),)
    assert policy.filesystem.protect == (".env", "config/production.json")
    # Nothing that only srt honours became a grant: no docker.sock anywhere.
    assert "docker.sock" not in json.dumps(policy.to_dict())
    assert any("allowUnixSockets" in n for n in policy.notes)
    assert any("ignoreViolations" in n for n in policy.notes)


def test_generated_toml_is_commented_and_round_trips(tmp_path: Path) -> None:
    text = srt_to_toml(README_COMPLETE, "srt.json", tmp_path)
    assert "stockade is stricter than srt" in text
    assert "read the whole file system" in text
    assert '"*.npmjs.org",  # network.allowedDomains[5]' in text
    raw = tomllib.loads(text)
    assert raw["version"] == 1
    assert raw["network"]["allow"][0] == "github.com"
    assert raw["filesystem"]["workspace"] == str(tmp_path.resolve())


def test_readme_tls_example_is_refused_by_key(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"network\.tlsTerminate"):
        srt_to_policy(README_TLS, "srt.json", tmp_path)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"network": {"httpProxyPort": 8080}}, "network.httpProxyPort"),
        ({"network": {"socksProxyPort": 1080}}, "network.socksProxyPort"),
        ({"network": {"allowAllUnixSockets": True}}, "network.allowAllUnixSockets"),
        ({"network": {"deniedDomains": ["*:22"]}}, r"network\.deniedDomains\[0\]"),
        ({"network": {"allowedDomains": ["*"]}}, r"network\.allowedDomains\[0\]"),
        ({"network": {"somethingNew": 1}}, "network.somethingNew"),
        ({"enableWeakerNestedSandbox": True}, "enableWeakerNestedSandbox"),
        ({"credentials": {"envVars": []}}, "credentials"),
        ({"bwrapPath": "/opt/bwrap"}, "bwrapPath"),
        ({"filesystem": {"disabled": True}}, "filesystem.disabled"),
        ({"filesystem": {"allowGitConfig": True}}, "filesystem.allowGitConfig"),
        ({"filesystem": {"allowWrite": ["build/*.o"]}}, r"filesystem\.allowWrite\[0\]"),
        ({"filesystem": {"denyWrite": ["/etc/hosts"]}}, r"filesystem\.denyWrite\[0\]"),
        ({"filesystem": {"denyRead": ["."]}}, r"filesystem\.denyRead\[0\]"),
        (
            {"filesystem": {"denyRead": ["/srv/data"], "allowRead": ["/srv/data/public"]}},
            r"filesystem\.allowRead\[0\]",
        ),
        ({"filesystem": {"allowWrite": ["/"]}}, r"filesystem\.write"),
        ({"unknownTopLevel": True}, "unknownTopLevel"),
    ],
)
def test_unmappable_key_is_refused_and_named(
    tmp_path: Path, settings: dict[str, Any], key: str
) -> None:
    with pytest.raises(PolicyError, match=key):
        srt_to_policy(settings, "srt.json", tmp_path)


def test_deny_everything_empties_allow(tmp_path: Path) -> None:
    policy = srt_to_policy(
        {"network": {"allowedDomains": ["github.com"], "deniedDomains": ["*"]}},
        "srt.json",
        tmp_path,
    )
    assert policy.network.allow == ()


def test_empty_settings_give_no_network_and_workspace_only(tmp_path: Path) -> None:
    policy = srt_to_policy({}, "srt.json", tmp_path)
    assert policy.network.allow == ()
    assert policy.filesystem.read == ()
    assert policy.filesystem.write == ()


def test_literal_entries_and_trailing_globstar(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    policy = srt_to_policy(
        {
            "filesystem": {
                "allowWrite": [{"path": "/tmp/**"}],
                "denyWrite": [{"path": "secrets/**", "literal": False}],
                "allowRead": ["/usr/share/doc"],
            }
        },
        "srt.json",
        tmp_path,
    )
    assert policy.filesystem.write == (Path("/tmp").resolve(),)
    assert policy.filesystem.protect == ("secrets",)
    assert policy.filesystem.read == (Path("/usr/share/doc").resolve(),)
    with pytest.raises(PolicyError, match=r"filesystem\.denyRead\[0\]"):
        srt_to_policy(
            {"filesystem": {"denyRead": [{"path": "a[1]", "literal": True}]}}, "srt.json", tmp_path
        )


def test_policy_from_srt_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "srt-settings.json"
    path.write_text(json.dumps(README_COMPLETE))
    policy = policy_from_srt(path, tmp_path)
    assert policy.network.deny == ("malicious.com",)
    assert policy.sources == (f"{path} (imported)",)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PolicyError, match="not valid JSON"):
        policy_from_srt(tmp_path / "bad.json", tmp_path)
    with pytest.raises(PolicyError, match="cannot read"):
        policy_from_srt(tmp_path / "missing.json", tmp_path)


def test_strict_allowlist_true_becomes_network_strict(tmp_path: Path) -> None:
    # Issue 24 item 8: srt refuses an unlisted host without asking; so must the import.
    settings = {"network": {"allowedDomains": ["a.test"], "strictAllowlist": True}}
    policy = srt_to_policy(settings, "srt.json", tmp_path)
    assert policy.network.strict is True
    text = srt_to_toml(settings, "srt.json", tmp_path)
    assert "strict = true" in text
    # The twin: false (or absent) keeps stockade's default, which may ask.
    for network in ({"allowedDomains": ["a.test"], "strictAllowlist": False}, {}):
        assert srt_to_policy({"network": network}, "srt.json", tmp_path).network.strict is False
