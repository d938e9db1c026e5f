"""Fuzzing host normalisation: one canonical spelling, so one decision per destination.

``normalize_host`` is idempotent, and any spelling of a host (case, trailing dot, IDNA
U-label or A-label, full-width characters, every numeric IPv4 form, IPv6 with brackets or
zeros written out) either normalises to the canonical form or is refused; never to
another name. The rule decision on a variant is the decision on the canonical form,
whether the variant is in the request or in the rule.
"""

from __future__ import annotations

import contextlib
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.egress import EgressRules
from stockade.policy._hosts import PatternKind, normalize_host, parse_pattern
from tests.robustness.conftest import count_example

NAMES = [
    "allowed.test",
    "api.allowed.test",
    "deep.api.allowed.test",
    "denied.test",
    "x.denied.test",
    "other.test",
    "bücher.test",
    "xn--bcher-kva.test",
    "straße.test",
    "münchen.denied.test",
    "_acme.allowed.test",
]
ADDRESSES = ["127.0.0.1", "10.1.2.3", "192.0.2.10", "169.254.169.254", "::1", "2001:db8::1"]
RULES = EgressRules(
    allow=(
        "allowed.test",
        "*.allowed.test",
        "bücher.test",
        "straße.test",
        "127.0.0.1",
        "10.0.0.0/8",
        "[2001:db8::1]",
        "other.test:443",
    ),
    deny=("denied.test", "*.denied.test", "10.1.0.0/16", "::1"),
    local=frozenset(),
)


def _ipv4_variants(address: ipaddress.IPv4Address) -> st.SearchStrategy[str]:
    value = int(address)
    octets = [value >> 24, (value >> 16) & 255, (value >> 8) & 255, value & 255]

    def spell(number: int, how: str) -> str:
        if how == "hex":
            return hex(number)
        if how == "HEX":
            return "0X" + format(number, "X")
        if how == "oct":
            return "0" + format(number, "o")
        return str(number)

    forms = st.sampled_from(["dec", "hex", "HEX", "oct"])
    return st.one_of(
        st.builds(lambda h: spell(value, h), forms),  # one number: 2130706433
        st.builds(
            lambda a, b: f"{spell(octets[0], a)}.{spell(value & 0xFFFFFF, b)}", forms, forms
        ),  # 127.1
        st.builds(
            lambda a, b, c: (
                f"{spell(octets[0], a)}.{spell(octets[1], b)}.{spell(value & 0xFFFF, c)}"
            ),
            forms,
            forms,
            forms,
        ),
        st.lists(forms, min_size=4, max_size=4).map(
            lambda hs: ".".join(spell(o, h) for o, h in zip(octets, hs, strict=True))
        ),
    )


def _ipv6_variants(address: ipaddress.IPv6Address) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [address.compressed, address.exploded, address.exploded.upper(), f"[{address.compressed}]"]
    )


FULLWIDTH = {chr(c): chr(c - 0x21 + 0xFF01) for c in range(0x21, 0x7F)}


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, str]:
    """(canonical, a variant spelling of it)."""
    if draw(st.booleans()):
        address = ipaddress.ip_address(draw(st.sampled_from(ADDRESSES)))
        canonical = address.compressed
        if isinstance(address, ipaddress.IPv4Address):
            text = draw(_ipv4_variants(address))
        else:
            text = draw(_ipv6_variants(address))
    else:
        name = draw(st.sampled_from(NAMES))
        canonical = normalize_host(name)
        text = draw(st.sampled_from([name, canonical]))
    # Case, full-width characters and a trailing dot, anywhere that does not change meaning.
    chars = []
    for ch in text:
        roll = draw(st.integers(0, 5))
        if roll == 0 and ch.isascii():
            ch = ch.swapcase()  # not "ß".swapcase(), which is "SS": another name
        elif roll == 1 and ch in FULLWIDTH and not text.startswith("[") and ":" not in text:
            ch = FULLWIDTH[ch]
        chars.append(ch)
    text = "".join(chars)
    if ":" not in text and draw(st.booleans()):
        text += "."
    return canonical, text


@settings(max_examples=1000, deadline=None)
@given(raw=st.text(max_size=80) | st.from_regex(r"[0-9a-fA-FxX.:\[\]]{1,40}", fullmatch=True))
def test_normalize_is_idempotent(raw: str) -> None:
    count_example("hosts: idempotence (any text)")
    try:
        once = normalize_host(raw)
    except ValueError:
        return
    assert normalize_host(once) == once
    assert once == once.lower()
    assert not once.endswith(".")
    assert once.isascii()


@settings(max_examples=600, deadline=None)
@given(pair=spellings(), port=st.sampled_from([80, 443, 8080]))
def test_variant_spelling_gets_the_canonical_decision(pair: tuple[str, str], port: int) -> None:
    count_example("hosts: variant spellings")
    canonical, variant = pair
    try:
        host = normalize_host(variant)
    except ValueError:
        # Refused: the proxy denies it (bad-hostname). Never for the plain spellings.
        assert variant.lower().rstrip(".") != canonical, variant
        return
    assert host == canonical, (variant, host)
    assert RULES.check_name(host, port) == RULES.check_name(canonical, port)


@settings(max_examples=400, deadline=None)
@given(rule=spellings(), request=spellings(), port=st.sampled_from([80, 443]))
def test_variant_spelling_in_a_rule_matches_like_the_canonical(
    rule: tuple[str, str], request: tuple[str, str], port: int
) -> None:
    count_example("hosts: variant spellings in rules")
    canonical_rule, variant_rule = rule
    try:
        pattern = parse_pattern(variant_rule)
    except ValueError:
        return  # the loader refuses the policy (a PolicyError): nothing is matched
    reference = parse_pattern(canonical_rule)
    host = request[0]
    assert pattern.host == reference.host
    assert pattern.matches(host, port) == reference.matches(host, port)
    if reference.kind is PatternKind.EXACT:
        wild = parse_pattern("*." + canonical_rule)
        try:
            wild_variant = parse_pattern("*." + variant_rule.rstrip("."))
        except ValueError:
            return
        assert wild_variant.matches(host, port) == wild.matches(host, port)


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("１２７.０.０.１", "127.0.0.1"),
        ("[::1]", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("ALLOWED.TEST.", "allowed.test"),
        ("BÜCHER.test", "xn--bcher-kva.test"),
        ("ａｌｌｏｗｅｄ.test", "allowed.test"),
    ],
)
def test_known_spellings(spelling: str, canonical: str) -> None:
    assert normalize_host(spelling) == canonical
    assert RULES.check_name(normalize_host(spelling), 443) == RULES.check_name(canonical, 443)


@pytest.mark.slow
@settings(max_examples=10000, deadline=None)
@given(pair=spellings(), raw=st.text(max_size=80), port=st.sampled_from([80, 443, 8080]))
def test_hosts_many(pair: tuple[str, str], raw: str, port: int) -> None:
    count_example("hosts: variants + idempotence (slow)")
    canonical, variant = pair
    with contextlib.suppress(ValueError):
        host = normalize_host(variant)
        assert host == canonical, (variant, host)
        assert RULES.check_name(host, port) == RULES.check_name(canonical, port)
    with contextlib.suppress(ValueError):
        once = normalize_host(raw)
        assert normalize_host(once) == once
