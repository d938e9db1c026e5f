"""EgressRules.check_lookup: which names the resolver answers with an address."""

from __future__ import annotations

import pytest

from stockade.egress import EgressRules
from stockade.policy import Reason

RULES = EgressRules(
    allow=("api.test", "*.cdn.test", "db.test:5432", "10.0.0.0/8", "192.0.2.7"),
    deny=("bad.cdn.test", "api.test:25", "*.evil.cdn.test", "10.1.0.0/16"),
    hosts={"pinned.test": "10.0.0.5", "bad.cdn.test": "10.0.0.6"},
    extra_allow=("cli.test",),
    local=frozenset(),
)


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("api.test", "api.test"),  # denied on port 25 only: still resolves
        ("a.cdn.test", "*.cdn.test"),
        ("a.b.cdn.test", "*.cdn.test"),
        ("db.test", "db.test:5432"),  # allowed on one port: needs an address
        ("cli.test", "cli.test"),  # --allow-host
        ("pinned.test", "hosts.pinned.test"),  # pinned, not in allow
    ],
)
def test_names_that_resolve(host: str, rule: str) -> None:
    decision = RULES.check_lookup(host)
    assert decision.allowed
    assert decision.rule == rule


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("bad.cdn.test", Reason.HOST_DENIED),  # deny wins over the wildcard and the pin
        ("x.evil.cdn.test", Reason.HOST_DENIED),
        ("cdn.test", Reason.HOST_NOT_ALLOWED),  # *.cdn.test is the subdomains only
        ("api.test.evil", Reason.HOST_NOT_ALLOWED),
        ("xapi.test", Reason.HOST_NOT_ALLOWED),
        ("other.test", Reason.HOST_NOT_ALLOWED),
    ],
)
def test_names_that_do_not(host: str, reason: Reason) -> None:
    decision = RULES.check_lookup(host)
    assert not decision.allowed
    assert decision.reason is reason


def test_a_deny_with_a_port_never_stops_a_lookup_but_still_stops_that_port() -> None:
    assert RULES.check_lookup("api.test").allowed
    assert not RULES.check_name("api.test", 25).allowed
    assert RULES.check_name("api.test", 443).allowed
    assert RULES.check_lookup("db.test").allowed
    assert not RULES.check_name("db.test", 443).allowed


def test_address_entries_do_not_make_names_resolve() -> None:
    # IP and CIDR entries name addresses, not host names.
    rules = EgressRules(allow=("10.0.0.0/8",), deny=("192.0.2.0/24",), local=frozenset())
    assert not rules.check_lookup("any.test").allowed
    assert rules.check_lookup("any.test").reason is Reason.HOST_NOT_ALLOWED
