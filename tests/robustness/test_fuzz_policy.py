"""Fuzzing the policy loader: any text, any nested table gives a Policy or a PolicyError.

Never another exception (a traceback is a crash on bad input, DESIGN §6), and through the
CLI ``stockade check FILE`` answers with exit 0, or exit 125 and one line on stderr.
A policy the loader accepts is also accepted by the egress rules built from it (a value
that only fails when a run starts was not validated).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stockade._exceptions import PolicyError
from stockade.egress import EgressRules
from stockade.policy import Policy, parse_policy_text
from stockade.policy._load import _build
from stockade.policy._schema import SCHEMA
from tests.robustness.conftest import count_example

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def in_workspace() -> Iterator[Path]:
    """A workspace directory as the current directory (relative paths resolve there)."""
    root = Path(tempfile.mkdtemp(prefix="stockade-fuzz-policy-"))
    (root / "ws").mkdir()
    (root / "ca.pem").write_text("not a CA\n")
    old = Path.cwd()
    os.chdir(root / "ws")
    try:
        yield root / "ws"
    finally:
        os.chdir(old)
        import shutil

        shutil.rmtree(root, ignore_errors=True)


# --- TOML text out of Python values (the standard library only reads TOML) ---------------


def _string(text: str) -> str:
    # JSON escapes the C0 controls, quote and backslash as TOML does; DEL is TOML's too.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(name: str) -> str:
    return _string(name)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def to_toml(raw: dict[str, Any]) -> str:
    return "".join(f"{_key(k)} = {toml_value(v)}\n" for k, v in raw.items())


# --- strategies -------------------------------------------------------------------------

INTERESTING_STRINGS = [
    "",
    ".",
    "..",
    "/",
    "~",
    "~nosuchuser/x",
    "/tmp",
    "/proc/self",
    "a" * 300,
    "a/" * 2100,
    "x" * 5000,
    "\x00",
    "a\x00b",
    "\n",
    "*",
    "*.",
    "*.com",
    "*.example.com",
    "example.com",
    "EXAMPLE.com.",
    "127.0.0.1",
    "0x7f.1",
    "[::1]",
    "::1",
    "10.0.0.0/8",
    "10.0.0.1/8",
    "0.0.0.0/0",
    "example.com:443",
    "example.com:0",
    "example.com:99999",
    "xn--",
    "xn--zz",
    "bücher.de",
    "１２７.０.０.１",
    "http://x",
    "env:HOME",
    "env:",
    "file:/etc/hostname",
    "file:relative",
    "file:/" + "a" * 5000,
    "authorization",
    "host",
    "GET",
    "get",
    "/**",
    "/v1/*",
    "***",
    "/../x",
    "4GiB",
    "1e400",
    "9" * 400 + ".5",
    "9" * 400,
    "0",
    "0B",
    "-1",
    "git",
    "npm",
    "github",
    "CI",
    "GH_TOKEN",
    "allow",
    "deny",
    "report",
    "1",
]
NUMBERS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 65535, 65536, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_PICK = st.sampled_from(INTERESTING_STRINGS)
STRINGS = st.one_of(_PICK, _PICK, _PICK, st.text(max_size=40))
SCALARS = st.one_of(st.booleans(), NUMBERS, STRINGS)
KEYS = sorted({k for table in SCHEMA.values() if isinstance(table, dict) for k in table})
SECTION_KEYS = sorted(SCHEMA)


def _values(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return SCALARS
    inner = _values(depth - 1)
    return st.one_of(
        SCALARS,
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), inner, max_size=4),
    )


FIELDS = sorted(
    (section, key)
    for section, table in SCHEMA.items()
    if isinstance(table, dict) and section != "secrets"
    for key in table
)
VALID_BASE: dict[str, Any] = {
    "network": {"allow": ["a.test", "*.example.com"]},
    "env": {"pass": ["CI"]},
}


def _field_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(STRINGS, max_size=3), STRINGS, STRINGS, SCALARS, _values(2))


# Values shaped like what each kind of field takes, so that a bad one gets past the type
# check and into the code that interprets it (paths, sizes, host names).
PATHS = st.one_of(
    st.text(alphabet="a/.~_\x00-", max_size=40),
    st.builds(
        lambda unit, n: unit * n,
        st.sampled_from(["a", "a/", "../", "x/" * 8]),
        st.integers(0, 3000),
    ),
    st.builds(lambda n: "p" * n, st.integers(200, 5000)),  # past NAME_MAX and PATH_MAX
)
SIZES = st.one_of(
    st.from_regex(r"\A[0-9]{1,500}(\.[0-9]{1,5})? ?([KMGT]i?B?|B)?\Z"),
    st.integers(-(2**70), 2**70),
    st.builds(
        lambda n, tail: "9" * n + tail, st.integers(250, 500), st.sampled_from(["", ".5", "GiB"])
    ),
)
HOSTS = st.one_of(
    st.from_regex(r"\A[a-zA-Z0-9.*:\[\]_/-]{0,40}\Z"),
    st.text(max_size=20),
    st.sampled_from(INTERESTING_STRINGS),
)
TYPED: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("filesystem", "workspace"): PATHS,
    ("filesystem", "read"): st.lists(PATHS, max_size=3),
    ("filesystem", "write"): st.lists(PATHS, max_size=3),
    ("filesystem", "deny"): st.lists(PATHS, max_size=3),
    ("filesystem", "protect"): st.lists(PATHS, max_size=3),
    ("limits", "memory"): SIZES,
    ("limits", "file_size"): SIZES,
    ("limits", "pids"): SIZES,
    ("limits", "cpu_seconds"): SIZES,
    ("limits", "wall_seconds"): st.one_of(SIZES, st.floats()),
    ("network", "allow"): st.lists(HOSTS, max_size=3),
    ("network", "deny"): st.lists(HOSTS, max_size=3),
    ("network", "hosts"): st.dictionaries(HOSTS, HOSTS, max_size=3),
    ("network", "tls"): st.fixed_dictionaries({"upstream_ca": PATHS}),
    ("labels", "secret_files"): st.lists(PATHS, max_size=3),
}


@st.composite
def policies(draw: st.DrawFn) -> dict[str, Any]:
    """A raw policy table: a valid one with a few fields set to anything.

    Errors stop the loader at the first bad key, so a table that is wrong everywhere
    only ever exercises the first check; one to three bad fields reach every one.
    """
    if draw(st.integers(0, 9)) == 0:
        # Any shape at all, keys mostly the schema's.
        return draw(
            st.dictionaries(
                st.one_of(st.sampled_from(sorted(SCHEMA)), st.text(max_size=8)), _values(2)
            )
        )
    raw: dict[str, Any] = json.loads(json.dumps(VALID_BASE)) if draw(st.booleans()) else {}
    for section, key in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            continue
        if (section, key) == ("network", "rules"):
            table[key] = draw(
                st.lists(
                    st.dictionaries(
                        st.sampled_from(["host", "methods", "paths", "action", "x"]),
                        _field_values(),
                    ),
                    max_size=3,
                )
                | _values(1)
            )
        elif (section, key) in TYPED and draw(st.integers(0, 3)) > 0:
            table[key] = draw(TYPED[section, key])
        else:
            table[key] = draw(_field_values())
    if draw(st.integers(0, 4)) == 0:
        secrets: dict[str, Any] = {}
        for name in draw(st.lists(st.sampled_from(["API_KEY", "bad-name", ""]), max_size=2)):
            secrets[name] = draw(
                st.dictionaries(
                    st.sampled_from(["from", "hosts", "header", "other"]), _field_values()
                )
            )
        raw["secrets"] = secrets
    if draw(st.integers(0, 9)) == 0:
        raw[draw(st.sampled_from(["version", "unknown"]))] = draw(_values(1))
    return raw


# --- the property -----------------------------------------------------------------------


def _accepts_or_policy_error(text: str) -> Policy | None:
    try:
        policy = parse_policy_text(text, "fuzz.toml")
    except PolicyError as exc:
        message = str(exc)
        # "fuzz.toml: " or, when the key's line is found, "fuzz.toml:LINE: "
        assert re.match(r"fuzz\.toml(:\d+)?: ", message), message
        # One line on a terminal: no line break, no escape sequence from the policy.
        assert message.isprintable(), repr(message)
        return None
    assert isinstance(policy, Policy)
    # What the loader accepts, the runtime can use: no error deferred to the run.
    try:
        EgressRules.from_policy(policy.network)
    except PolicyError as exc:
        pytest.fail(f"the loader accepted a network section the egress layer refuses: {exc}")
    policy.digest()
    policy.to_dict()
    return policy


# Regressions found by this file (each was an uncaught exception before the fix).
REGRESSIONS = [
    "[presets]\nuse = []\n[network]\nrules = 5\n",  # TypeError
    '[filesystem]\nworkspace = "' + "a" * 5000 + '"\n',  # OSError ENAMETOOLONG
    '[network.tls]\nupstream_ca = "' + "a/" * 3000 + '"\n',  # OSError ENAMETOOLONG
    '[limits]\nmemory = "' + "9" * 400 + '.5"\n',  # OverflowError
    '[filesystem]\nworkspace = "a\\u0000b"\n',  # ValueError: embedded null byte
    '[network.tls]\nupstream_ca = "a\\u0000b"\n',
    '[secrets.K]\nfrom = "file:/a\\u0000b"\nhosts = ["a.test"]\n[network]\nallow = ["a.test"]\n',
    '[network]\nhosts = { ".." = "127.0.0.1" }\n',  # accepted, then refused at run time
    '[limits]\nfile_size = "0Gi"\n',  # KeyError (found by the slow fuzz test)
    '[limits]\nmemory = "4Gi"\n',
    '[env]\npass = "\\u001e"\n',  # a raw control character split the one-line error
    '[env.set]\n"A\\nB" = "x"\n',
    '[network]\nallow = ["a\\u2028b"]\n',
    '[network]\nallow = ["\\u001b[2J"]\n',
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300))
def test_any_text(in_workspace: Path, text: str) -> None:
    count_example("policy: any text")
    _accepts_or_policy_error(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=policies())
def test_any_nested_table_through_toml(in_workspace: Path, raw: dict[str, Any]) -> None:
    count_example("policy: nested tables (TOML text)")
    _accepts_or_policy_error(to_toml(raw))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=policies())
def test_any_nested_dict_composed_on_a_user_policy(in_workspace: Path, raw: dict[str, Any]) -> None:
    """The workspace-file path: the same validator, then the may-only-tighten composition."""
    count_example("policy: nested dicts (composed)")
    base = parse_policy_text(
        '[network]\nallow = ["a.test", "*.example.com"]\nhosts = { "a.test" = "127.0.0.1" }\n'
        '[env]\npass = ["CI"]\n',
        "user.toml",
    )
    try:
        policy = _build(raw, "ws.toml", base=base, cwd=in_workspace, ws_override=in_workspace)
    except PolicyError:
        return
    assert isinstance(policy, Policy)
    EgressRules.from_policy(policy.network)


@pytest.mark.parametrize("text", REGRESSIONS)
def test_regressions(in_workspace: Path, text: str) -> None:
    _accepts_or_policy_error(text)


def _check_cli(path: Path, cwd: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("STOCKADE_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "stockade", "check", str(path)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode in (0, 125), (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    if proc.returncode == 125:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith("stockade: "), proc.stderr


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=policies())
@example(raw={"presets": {"use": []}, "network": {"rules": 5}})
@example(raw={"limits": {"memory": "9" * 400 + ".5"}})
@example(raw={"filesystem": {"workspace": "a" * 5000}})
def test_cli_check_exit_code_and_one_line(in_workspace: Path, raw: dict[str, Any]) -> None:
    count_example("policy: stockade check FILE")
    path = in_workspace.parent / "policy.toml"
    path.write_text(to_toml(raw))
    _check_cli(path, in_workspace)


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not utf-8", b"[[[", b"version = 2\n", b"x" * 100_000, b"\x00"],
    ids=["not-utf8", "bad-toml", "version", "huge", "nul"],
)
def test_cli_check_bad_files(in_workspace: Path, content: bytes) -> None:
    path = in_workspace.parent / "policy.toml"
    path.write_bytes(content)
    _check_cli(path, in_workspace)


def test_cli_check_unreadable_and_directory(in_workspace: Path) -> None:
    _check_cli(in_workspace, in_workspace)  # a directory, not a file
    _check_cli(in_workspace.parent / "missing.toml", in_workspace)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=policies())
def test_any_nested_table_many(in_workspace: Path, raw: dict[str, Any]) -> None:
    count_example("policy: nested tables (slow)")
    _accepts_or_policy_error(to_toml(raw))
