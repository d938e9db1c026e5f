"""The synthetic-address pool: one stable address per name, never recycled."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.egress.dns import POOL, AddressPool
from stockade.policy import Reason
from tests.egress.dns import wire
from tests.egress.dns.conftest import RULES, ask, make_server


def test_default_pool_is_loopback() -> None:
    assert ipaddress.IPv4Network("127.64.0.0/16") == POOL
    assert AddressPool().network == POOL
    assert all(address.is_loopback for address in (POOL.network_address, POOL[-1]))


def test_same_name_same_address_and_distinct_names_distinct_addresses() -> None:
    pool = AddressPool()
    first = pool.issue("a.test")
    second = pool.issue("b.test")
    assert first is not None
    assert second is not None
    assert first != second
    assert pool.issue("a.test") == first
    assert len(pool) == 2
    assert first != POOL.network_address  # x.x.0.0 is skipped
    assert pool.name_of(first) == "a.test"
    assert pool.name_of(second) == "b.test"


def test_a_30_holds_two_names_then_refuses_new_ones_but_keeps_old_ones() -> None:
    pool = AddressPool(ipaddress.IPv4Network("127.99.0.0/30"))
    one, two = pool.issue("one.test"), pool.issue("two.test")
    assert [str(one), str(two)] == ["127.99.0.1", "127.99.0.2"]
    assert pool.issue("three.test") is None
    assert pool.issue("four.test") is None
    # Never the broadcast address, never a recycled one.
    assert pool.issue("one.test") == one
    assert pool.issue("two.test") == two
    assert pool.name_of(ipaddress.IPv4Address("127.99.0.3")) is None
    assert len(pool) == 2


def test_smaller_than_a_30_is_refused() -> None:
    with pytest.raises(ValueError):
        AddressPool(ipaddress.IPv4Network("127.99.0.0/31"))


def test_name_of_mapped_ipv6_spellings() -> None:
    pool = AddressPool()
    address = pool.issue("a.test")
    assert address is not None
    for spelling in (f"::ffff:{address}", "::ffff:7f40:1", "0:0:0:0:0:ffff:7f40:0001"):
        assert pool.name_of(ipaddress.IPv6Address(spelling)) == "a.test"
    # IPv4-compatible, NAT64 and plain IPv6 addresses are not the same address.
    for other in (f"::{address}", f"64:ff9b::{address}", "::1", "2001:db8::7f40:1"):
        assert pool.name_of(ipaddress.IPv6Address(other)) is None
    assert pool.name_of(ipaddress.IPv4Address("127.64.0.2")) is None  # not issued yet
    assert pool.name_of(ipaddress.IPv4Address("127.0.0.1")) is None


def test_covers() -> None:
    pool = AddressPool()
    for inside in ("127.64.0.0", "127.64.0.1", "127.64.200.7", "127.64.255.255"):
        assert pool.covers(ipaddress.IPv4Address(inside))
        assert pool.covers(ipaddress.IPv6Address(f"::ffff:{inside}"))
    for outside in ("127.63.255.255", "127.65.0.0", "127.0.0.1", "10.64.0.1"):
        assert not pool.covers(ipaddress.IPv4Address(outside))
        assert not pool.covers(ipaddress.IPv6Address(f"::ffff:{outside}"))
    assert not pool.covers(ipaddress.IPv6Address("::127.64.0.1"))
    assert not pool.covers(ipaddress.IPv6Address("::1"))


@settings(max_examples=50, deadline=None)
@given(
    names=st.lists(
        st.from_regex(r"[a-z][a-z0-9]{0,10}\.test", fullmatch=True), min_size=1, max_size=40
    )
)
def test_issue_is_a_stable_injection(names: list[str]) -> None:
    pool = AddressPool()
    issued: dict[str, ipaddress.IPv4Address] = {}
    for name in names + list(reversed(names)):
        address = pool.issue(name)
        assert address is not None
        assert issued.setdefault(name, address) == address
        assert pool.covers(address)
        assert pool.name_of(address) == name
    assert len(set(issued.values())) == len(issued) == len(pool)


def test_server_folds_case_before_issuing() -> None:
    server, _ = make_server()
    upper = ask(server, wire.query("ALLOWED.TEST"))
    lower = ask(server, wire.query("allowed.test"))
    mixed = ask(server, wire.query("Allowed.Test"))
    assert upper.answers[0].rdata == lower.answers[0].rdata == mixed.answers[0].rdata
    assert len(server.pool) == 1


def test_server_on_a_full_pool_refuses_new_names_and_keeps_old_ones() -> None:
    pool = AddressPool(ipaddress.IPv4Network("127.99.0.0/30"))
    server, events = make_server(RULES, pool)
    first = ask(server, wire.query("a.wild.test")).answers[0].rdata
    second = ask(server, wire.query("b.wild.test")).answers[0].rdata
    for qtype in (wire.A, wire.AAAA):
        refused = ask(server, wire.query("c.wild.test", qtype))
        assert refused.rcode == wire.REFUSED
        assert refused.answers == []
    assert ask(server, wire.query("a.wild.test")).answers[0].rdata == first
    assert ask(server, wire.query("b.wild.test")).answers[0].rdata == second
    # A denied name is still NXDOMAIN, not REFUSED: the policy answers first.
    assert ask(server, wire.query("denied.test")).rcode == wire.NXDOMAIN
    (full,) = events.for_name("c.wild.test")
    assert full[0].reason is Reason.CONNECTION_LIMIT
    assert not full[0].allowed
