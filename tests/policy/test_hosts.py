"""Host normalisation and host patterns: one spelling per destination, strict patterns."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.policy._decision import Reason
from stockade.policy._hosts import PatternKind, normalize_host, parse_pattern, sni_disagreement


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0.0x0.01", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("2852039166", "169.254.169.254"),
        ("0xA9FEA9FE", "169.254.169.254"),
        ("１２７.０.０.１", "127.0.0.1"),
        ("127。0。0。1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[::FFFF:7F00:1]", "::ffff:7f00:1"),
        ("Example.TEST.", "example.test"),
        ("bücher.test", "xn--bcher-kva.test"),
        ("BÜCHER.test", "xn--bcher-kva.test"),
        ("xn--bcher-kva.test", "xn--bcher-kva.test"),
        ("ｅｘａｍｐｌｅ.test", "example.test"),
        ("_dmarc.example.test", "_dmarc.example.test"),
        ("localhost", "localhost"),
        # UTS 46 drops zero-width characters: the same name, decided the same way.
        ("ex\u200bample.test", "example.test"),
    ],
)
def test_normalize(raw: str, canonical: str) -> None:
    assert normalize_host(raw) == canonical


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "a..b",
        ".a.test",
        "a.test..",
        "a b.test",
        "a\x00b.test",
        "a\x7f.test",
        "a\tb",
        "a\u0085b.test",
        "x" * 64 + ".test",
        ("a" * 63 + ".") * 4 + "test",
        "[fe80::1%eth0]",
        "fe80::1%25eth0",
        "%61.test",
        "1.2.3.4.5",
        "256.0.0.1",
        "1.2.3.256.",
        "4294967296",
        "08.0.0.1",
        "0x1g.0.0.1",
        "example.123",
        "-a.test",
        "a-.test",
        "a_b!.test",
        "[::1",
        "[1.2.3.4]",
        "a.test:80",
        "xn--abc.test",
        "*.test",
        "a/b.test",
    ],
)
def test_normalize_refuses(raw: str) -> None:
    with pytest.raises(ValueError):
        normalize_host(raw)


# A generous alphabet: letters, digits, the separators and look-alikes that matter.
HOSTY = st.text(
    alphabet=st.sampled_from([*"abcxyzABC019-_.:[]%xX", "ü", "。", "１", "ｅ", "\x00"]),
    max_size=40,
)


@given(st.one_of(HOSTY, st.text(max_size=40), st.ip_addresses().map(str)))
def test_normalize_is_idempotent(raw: str) -> None:
    try:
        once = normalize_host(raw)
    except ValueError:
        return
    assert normalize_host(once) == once


@given(st.ip_addresses(v=4))
def test_every_ipv4_spelling_decodes_alike(address: object) -> None:
    number = int(address)  # type: ignore[call-overload]
    dotted = str(address)
    spellings = [str(number), hex(number), "0" + oct(number)[2:] if number else "0"]
    a, b, c, d = (int(p) for p in dotted.split("."))
    spellings += [
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        f"{a:#x}.{b}.{c}.{d}",
    ]
    for spelling in spellings:
        assert normalize_host(spelling) == dotted, spelling


@pytest.mark.parametrize(
    ("text", "kind", "host", "port"),
    [
        ("example.com", PatternKind.EXACT, "example.com", None),
        ("Example.COM.:443", PatternKind.EXACT, "example.com", 443),
        ("*.example.com", PatternKind.SUFFIX, "example.com", None),
        ("*.example.com:8443", PatternKind.SUFFIX, "example.com", 8443),
        ("192.0.2.10", PatternKind.ADDRESS, "192.0.2.10", None),
        ("192.0.2.10:80", PatternKind.ADDRESS, "192.0.2.10", 80),
        ("[2001:db8::1]:443", PatternKind.ADDRESS, "2001:db8::1", 443),
        ("2001:db8::1", PatternKind.ADDRESS, "2001:db8::1", None),
        ("10.0.0.0/8", PatternKind.NETWORK, "10.0.0.0/8", None),
        ("10.0.0.0/8:5432", PatternKind.NETWORK, "10.0.0.0/8", 5432),
        ("[2001:db8::/32]:443", PatternKind.NETWORK, "2001:db8::/32", 443),
        ("bücher.test", PatternKind.EXACT, "xn--bcher-kva.test", None),
    ],
)
def test_parse_pattern(text: str, kind: PatternKind, host: str, port: int | None) -> None:
    pattern = parse_pattern(text)
    assert (pattern.kind, pattern.host, pattern.port) == (kind, host, port)


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("*", "a bare wildcard allows every host; list the hosts"),
        ("*:443", "a bare wildcard"),
        ("*.com", "name the domain"),
        ("api.*.example.com", "only a leading '*.' wildcard"),
        ("*example.com", "only a leading '*.' wildcard"),
        ("example.*", "only a leading '*.' wildcard"),
        ("*.*.example.com", "only a leading '*.' wildcard"),
        ("*.10.0.0.1", "cannot extend an IP address"),
        ("10.0.0.1/8", "write 10.0.0.0/8"),
        ("0.0.0.0/0", "every address"),
        ("example.com:0", "from 1 to 65535"),
        ("example.com:99999", "from 1 to 65535"),
        ("https://example.com", "not a URL"),
        (" example.com", "white space"),
        ("", "empty entry"),
        ("exa mple.com", "white space"),
    ],
)
def test_parse_pattern_refuses_with_a_fix(text: str, fix: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_pattern(text)
    assert fix in str(info.value)


def test_suffix_matches_subdomains_only() -> None:
    pattern = parse_pattern("*.example.com")
    assert pattern.matches("api.example.com", 443)
    assert pattern.matches("a.b.example.com", 80)
    assert not pattern.matches("example.com", 443)
    assert not pattern.matches("badexample.com", 443)
    assert not pattern.matches("example.com.evil.test", 443)


def test_port_and_network_matching() -> None:
    assert parse_pattern("example.com:443").matches("example.com", 443)
    assert not parse_pattern("example.com:443").matches("example.com", 80)
    network = parse_pattern("10.0.0.0/8")
    assert network.matches("10.1.2.3", 80)
    assert not network.matches("11.0.0.1", 80)
    assert not network.matches("ten.test", 80)
    assert parse_pattern("10.0.0.5/32").single_address
    assert not network.single_address


def test_hosts_module_does_not_import_asyncio() -> None:
    code = "import sys, stockade.policy._hosts; print('asyncio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- one SNI check for both TLS paths ------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "host", "reason"),
    [
        (["api.test"], "api.test", None),
        (["API.Test."], "api.test", None),  # one canonical spelling, as the allow-list's
        (["straße.test"], "xn--strae-oqa.test", None),  # IDNA 2008, as the allow-list's
        (["xn--strae-oqa.test"], "xn--strae-oqa.test", None),
        ([], "127.0.0.1", None),  # no SNI to an IP literal (RFC 6066)
        ([], "::1", None),
        ([], "api.test", Reason.SNI_MISSING),
        (["other.test"], "api.test", Reason.SNI_MISMATCH),
        (["api.test", "api.test"], "api.test", Reason.SNI_MISMATCH),  # two names: ambiguous
        (["api.test\x00.evil"], "api.test", Reason.SNI_MISMATCH),  # unreadable
        (["127.0.0.1"], "api.test", Reason.SNI_MISMATCH),
    ],
)
def test_sni_disagreement(names: list[str], host: str, reason: Reason | None) -> None:
    found = sni_disagreement(names, host)
    assert (found[0] if found else None) == reason, found


def test_sni_disagreement_shows_a_hostile_name_on_one_line() -> None:
    found = sni_disagreement(["a" * 300 + ".test"], "api.test")
    assert found is not None
    assert found[0] is Reason.SNI_MISMATCH
    assert len(found[1]) < 200
    assert found[1].isprintable()
