"""Data in host names under an allowed wildcard, refused before any lookup.

The DNS sink is the proxy's resolver hook (every name the proxy would look up is
recorded in ``asked``) and stockade's own resolver answering real DNS messages: a name
carrying a label, a secret or a credential is never asked and gets NXDOMAIN; its benign
twin is looked up / gets an address.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade._exceptions import PolicyError
from stockade.egress import EgressRules
from stockade.egress.dns import AddressPool, DnsServer
from stockade.egress.inspect import CertificateAuthority, InspectLayer, Inspector, Pattern
from stockade.egress.inspect._detectors import DetectorSet
from stockade.egress.inspect._names import NameCheck, NameLimit
from stockade.policy import Decision, parse_policy_text
from tests.egress.conftest import ProxyHarness, read_head, static_resolver
from tests.egress.dns import wire

CANARY = b"CANARY-7f3a9c1e-token"
GHP = "ghp_" + "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8"
AWS = b"AKIAIOSFODNN7EXAMPLE"


def _chunks(text: str, size: int) -> str:
    return ".".join(text[i : i + size] for i in range(0, len(text), size))


#: names under the allowed *.wild.test carrying data, and what finds it
CARRYING: dict[str, str] = {
    "canary-raw": f"{CANARY.decode().lower()}.x.wild.test",
    "canary-hex": f"{_chunks(CANARY.hex(), 30)}.wild.test",
    "canary-hex-chunked": f"{_chunks(CANARY.hex(), 7)}.wild.test",
    "github-chunked-dash": f"{_chunks(GHP.replace('_', '-'), 12)}.exfil.wild.test",
    "aws-upper-lowered": f"{AWS.decode().lower()}.wild.test",
    "aws-base32": f"{_chunks(base64.b32encode(b'k=' + AWS).decode().lower().rstrip('='), 20)}"
    ".wild.test",
    "aws-hex": f"{AWS.hex()}.wild.test",
}
BENIGN = [
    "www.wild.test",
    "api-v2.eu-west-1.wild.test",
    "3f2b8c1e8d4a4f1e9a7b2c6d5e4f3a2b.cdn.wild.test",  # a digest-like label
    "d3bd2f1b5e8c.cloudfront.wild.test",
    "xn--bcher-kva.wild.test",
]


def _check(limits: tuple[NameLimit, ...] = ()) -> NameCheck:
    return NameCheck([Pattern(CANARY, "canary[0]", "label")], DetectorSet(), limits)


@pytest.mark.parametrize("case", sorted(CARRYING))
def test_name_carrying_data_is_found(case: str) -> None:
    found = _check().check(CARRYING[case])
    assert found is not None, case
    assert CANARY.decode() not in found.detail
    assert AWS.decode() not in found.detail.upper()


@pytest.mark.parametrize("name", BENIGN)
def test_benign_names_pass(name: str) -> None:
    assert _check().check(name) is None


def test_label_length_and_count_limits() -> None:
    check = _check((NameLimit("wild.test", max_label=20, max_labels=2),))
    assert check.check("www.wild.test") is None
    assert check.check("a.b.wild.test") is None
    too_many = check.check("a.b.c.wild.test")
    assert too_many is not None
    assert "max_labels" in too_many.detail
    too_long = check.check("x" * 21 + ".wild.test")
    assert too_long is not None
    assert "max_label" in too_long.detail
    # Names not under the pattern are not limited.
    assert check.check("x" * 30 + ".other.test") is None


@pytest.fixture
def layer() -> Iterator[InspectLayer]:
    inspector = Inspector(labels=[Pattern(CANARY, "canary[0]", "label")])
    ca = CertificateAuthority.ephemeral()
    made = InspectLayer(inspector, ca, lambda d, f: None)
    yield made
    made.close()


def _connect(proxy: ProxyHarness, authority: str) -> bytes:
    sock = proxy.connect()
    try:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        return read_head(sock)
    finally:
        sock.close()


def _proxy(layer: InspectLayer, resolver: Any) -> ProxyHarness:
    rules = EgressRules(allow=("*.wild.test",), deny=(), hosts={}, local=frozenset())
    return ProxyHarness(rules, resolver, inspect=layer)


def test_proxy_never_looks_up_a_name_carrying_data(layer: InspectLayer) -> None:
    resolver = static_resolver({name: ["127.0.0.1"] for name in BENIGN})
    proxy = _proxy(layer, resolver)
    try:
        for case, name in CARRYING.items():
            answer = _connect(proxy, f"{name}:443")
            assert answer.startswith(b"HTTP/1.1 403"), (case, answer)
        assert resolver.asked == []  # type: ignore[attr-defined]
        events = proxy.wait_events("net_connect", len(CARRYING))
        assert len(events) == len(CARRYING)
        assert {e.reason for e in events} == {"labelled-data", "credential-detected"}
        assert all(e.decision.verdict.value == "deny" for e in events)
        # The twin: a benign name under the same wildcard is looked up (and then refused
        # for its loopback address, which is the address check's business).
        _connect(proxy, "www.wild.test:443")
        assert resolver.asked == ["www.wild.test"]  # type: ignore[attr-defined]
    finally:
        proxy.stop()


def test_resolver_answers_nxdomain_without_issuing_an_address(layer: InspectLayer) -> None:
    rules = EgressRules(allow=("*.wild.test",), deny=(), hosts={}, local=frozenset())
    proxy = _proxy(layer, static_resolver({}))
    events: list[tuple[str, Decision, dict[str, Any]]] = []
    try:
        pool = AddressPool()
        server = DnsServer(rules, pool, lambda e, d, f: events.append((e, d, f)))
        server.check_name = proxy.proxy.check_name
        for case, name in CARRYING.items():
            reply = server.answer(wire.query(name))
            assert reply is not None
            assert wire.parse(reply).rcode == wire.NXDOMAIN, case
        assert len(pool) == 0
        assert all(e == "dns_query" and not d.allowed for e, d, _ in events)
        assert {str(d.reason) for _, d, _ in events} == {"labelled-data", "credential-detected"}
        reply = server.answer(wire.query("www.wild.test"))
        assert reply is not None
        assert wire.parse(reply).rcode == wire.NOERROR
        assert len(pool) == 1
    finally:
        proxy.stop()


def test_name_limits_from_the_policy(tmp_path: Path) -> None:
    text = (
        '[network]\nallow = ["*.wild.test"]\n'
        '[inspect]\nnames = [{ host = "*.wild.test", max_label = 20, max_labels = 2 }]\n'
    )
    policy = parse_policy_text(text, "p.toml", workspace=tmp_path)
    assert policy.inspect.names == (("wild.test", 20, 2),)
    names = Inspector.from_policy(policy, {}).names
    assert names.check("www.wild.test") is None
    assert names.check("x" * 21 + ".wild.test") is not None
    for bad in (
        '[inspect]\nnames = [{ host = "wild.test", max_label = 3 }]\n',
        '[inspect]\nnames = [{ host = "*.wild.test" }]\n',
        '[inspect]\nnames = [{ host = "*.wild.test", max_size = 3 }]\n',
    ):
        with pytest.raises(PolicyError, match=r"inspect\.names\[0\]"):
            parse_policy_text(bad, "p.toml", workspace=tmp_path)
