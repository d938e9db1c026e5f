"""Address classes and the rule order, without sockets."""

from __future__ import annotations

import ipaddress

import pytest

from stockade._exceptions import PolicyError
from stockade.egress import AddressClass, EgressRules, classify, local_addresses
from stockade.egress._addr import _parse_fib_trie, _parse_if_inet6

NO_LOCAL: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address] = frozenset()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("8.8.8.8", AddressClass.PUBLIC),
        ("2606:4700::1111", AddressClass.PUBLIC),
        ("127.0.0.1", AddressClass.LOOPBACK),
        ("127.255.255.254", AddressClass.LOOPBACK),
        ("::1", AddressClass.LOOPBACK),
        ("0.0.0.0", AddressClass.UNSPECIFIED),
        ("::", AddressClass.UNSPECIFIED),
        ("0.1.2.3", AddressClass.RESERVED),
        ("169.254.1.1", AddressClass.LINK_LOCAL),
        ("fe80::1", AddressClass.LINK_LOCAL),
        ("10.0.0.1", AddressClass.PRIVATE),
        ("172.16.0.1", AddressClass.PRIVATE),
        ("172.31.255.255", AddressClass.PRIVATE),
        ("172.32.0.1", AddressClass.PUBLIC),
        ("192.168.1.1", AddressClass.PRIVATE),
        ("fd00::1", AddressClass.PRIVATE),
        ("fc00::1", AddressClass.PRIVATE),
        ("100.64.0.1", AddressClass.CGNAT),
        ("100.127.255.255", AddressClass.CGNAT),
        ("100.128.0.1", AddressClass.PUBLIC),
        ("224.0.0.1", AddressClass.MULTICAST),
        ("ff02::1", AddressClass.MULTICAST),
        ("255.255.255.255", AddressClass.BROADCAST),
        ("240.0.0.1", AddressClass.RESERVED),
        ("198.18.0.1", AddressClass.RESERVED),
        ("192.0.2.1", AddressClass.DOCUMENTATION),
        ("198.51.100.1", AddressClass.DOCUMENTATION),
        ("203.0.113.10", AddressClass.DOCUMENTATION),
        ("2001:db8::1", AddressClass.DOCUMENTATION),
        ("169.254.169.254", AddressClass.METADATA),
        ("169.254.170.2", AddressClass.METADATA),
        ("fd00:ec2::254", AddressClass.METADATA),
        ("100.100.100.200", AddressClass.METADATA),
        ("168.63.129.16", AddressClass.METADATA),
        # IPv6 forms carrying IPv4 are judged by the IPv4 address inside
        ("::ffff:127.0.0.1", AddressClass.LOOPBACK),
        ("::ffff:169.254.169.254", AddressClass.METADATA),
        ("::ffff:8.8.8.8", AddressClass.PUBLIC),
        ("::127.0.0.1", AddressClass.LOOPBACK),
        ("::10.0.0.1", AddressClass.PRIVATE),
        ("64:ff9b::7f00:1", AddressClass.LOOPBACK),
        ("64:ff9b::a9fe:a9fe", AddressClass.METADATA),
        ("64:ff9b:1::a00:1", AddressClass.PRIVATE),
        ("2002:7f00:1::", AddressClass.LOOPBACK),
        ("2002:a9fe:a9fe::", AddressClass.METADATA),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", AddressClass.LOOPBACK),  # Teredo 127.0.0.1
    ],
)
def test_classify(address: str, expected: AddressClass) -> None:
    assert classify(ipaddress.ip_address(address), NO_LOCAL) is expected


def test_own_addresses_are_self() -> None:
    mine = ipaddress.ip_address("192.0.2.2")
    assert classify(mine, frozenset({mine})) is AddressClass.SELF
    assert classify(
        ipaddress.ip_address("8.8.4.4"), frozenset({ipaddress.ip_address("8.8.4.4")})
    ) is (AddressClass.SELF)


def test_local_addresses_are_read_from_proc() -> None:
    found = local_addresses(refresh=True)
    assert ipaddress.ip_address("127.0.0.1") in found


def test_proc_parsers() -> None:
    trie = "Main:\n  +-- 0.0.0.0/0\n     |-- 10.1.2.3\n        /32 host LOCAL\n     |-- 10.1.2.0\n"
    trie += "        /24 link UNICAST\n"
    assert _parse_fib_trie(trie) == {ipaddress.ip_address("10.1.2.3")}
    inet6 = "fd000000000000000000000000000002 04 40 00 82     eth0\n"
    assert _parse_if_inet6(inet6) == {ipaddress.ip_address("fd00::2")}


def _rules(**kwargs: object) -> EgressRules:
    return EgressRules(local=NO_LOCAL, **kwargs)  # type: ignore[arg-type]


def test_name_order_deny_wins() -> None:
    rules = _rules(allow=("*.example.com",), deny=("bad.example.com",))
    assert rules.check_name("api.example.com", 443).allowed
    assert rules.check_name("bad.example.com", 443).reason == "host-denied"
    assert rules.check_name("example.com", 443).reason == "host-not-allowed"
    assert rules.check_name("other.test", 443).reason == "host-not-allowed"


def test_extra_allow_is_added() -> None:
    rules = _rules(allow=("a.test",), extra_allow=("b.test",))
    assert rules.check_name("b.test", 80).allowed


def test_address_rules() -> None:
    rules = _rules(
        allow=("app.test", "10.0.0.0/8", "169.254.169.254", "169.254.0.0/16"),
        deny=("10.9.0.0/16",),
        hosts={"pinned.test": "127.0.0.1", "meta.test": "169.254.170.2"},
    )
    ip = ipaddress.ip_address
    assert rules.check_address("app.test", 443, ip("8.8.8.8")).decision.allowed
    assert rules.check_address("app.test", 443, ip("10.1.1.1")).decision.allowed
    denied = rules.check_address("app.test", 443, ip("10.9.1.1")).decision
    assert denied.reason == "host-denied"
    assert rules.check_address("app.test", 443, ip("192.168.0.1")).decision.reason == (
        "address-not-public"
    )
    # a pin covers its own name only
    assert rules.check_address("pinned.test", 80, ip("127.0.0.1")).decision.allowed
    assert not rules.check_address("app.test", 80, ip("127.0.0.1")).decision.allowed
    # metadata: only an entry naming that single address opens it; ranges and pins do not
    assert rules.check_address("x.test", 80, ip("169.254.169.254")).decision.allowed
    meta = rules.check_address("meta.test", 80, ip("169.254.170.2")).decision
    assert meta.reason == "address-metadata"
    assert rules.check_address("x.test", 80, ip("::ffff:169.254.170.2")).decision.reason == (
        "address-metadata"
    )


def test_self_address_reason() -> None:
    mine = ipaddress.ip_address("192.0.2.2")
    rules = EgressRules(allow=("a.test",), local=frozenset({mine}))
    assert rules.check_address("a.test", 80, mine).decision.reason == "address-self"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"allow": ("*",)}, 'network.allow[0]: "*": a bare wildcard'),
        ({"allow": ("ok.test", "*.com")}, "network.allow[1]"),
        ({"deny": ("a.*.test",)}, "network.deny[0]"),
        ({"extra_allow": ("*",)}, "--allow-host[0]"),
        ({"hosts": {"a.test": "not-an-ip"}}, "network.hosts.a.test"),
        ({"hosts": {"a b": "127.0.0.1"}}, "network.hosts"),
        ({"tls_ports": (0,)}, "network.tls_ports"),
    ],
)
def test_invalid_policy_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=None) as info:
        _rules(**kwargs)
    assert message in str(info.value)


def test_from_policy_object() -> None:
    from stockade.policy import NetworkPolicy

    network = NetworkPolicy(allow=("a.test",), hosts={"a.test": "127.0.0.1"}, tls_ports=(443, 8443))
    rules = EgressRules.from_policy(network, extra_allow=("b.test",))
    assert rules.check_name("b.test", 1).allowed
    assert rules.pin("a.test") == ipaddress.ip_address("127.0.0.1")
    assert rules.is_tls_port(8443)
