"""``network.grace_until``: a learnt policy's grace period, as the loader and the one
egress decision see it (pure: no sandbox). The end-to-end runs are in
tests/learning/test_grace.py."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy, parse_policy_text
from stockade.policy._network import EgressRules, grace_in_force
from stockade.policy._rulematch import RuleSet
from tests.policy.conftest import user_policy

TODAY = datetime.datetime.now(datetime.UTC).date()


def _day(days: int) -> str:
    return (TODAY + datetime.timedelta(days=days)).isoformat()


def test_a_date_or_a_day_string_is_read_and_enters_the_digest() -> None:
    plain = parse_policy_text('[network]\nallow = ["a.test"]\n', "p.toml")
    dated = parse_policy_text(f'[network]\nallow = ["a.test"]\ngrace_until = {_day(7)}\n', "p.toml")
    quoted = parse_policy_text(f'[network]\nallow = ["a.test"]\ngrace_until = "{_day(7)}"\n', "p")
    assert dated.network.grace_until == TODAY + datetime.timedelta(days=7)
    assert quoted.network.grace_until == dated.network.grace_until
    assert plain.network.grace_until is None
    assert dated.digest() != plain.digest()
    assert "grace_until" not in plain.to_dict()["network"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"soon"', "expected a day"),
        ("7", "expected a day"),
        ("2026-12-01T10:00:00Z", "no time"),
        (_day(91), "at most 90 days from today"),
    ],
)
def test_bad_or_too_long_grace_periods_are_refused(value: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message) as err:
        parse_policy_text(f"[network]\ngrace_until = {value}\n", "p.toml")
    assert "network.grace_until" in str(err.value)
    # the twin: the longest period allowed loads
    assert parse_policy_text(f"[network]\ngrace_until = {_day(90)}\n", "p").network.grace_until


def test_a_workspace_file_can_never_state_a_grace_period(home: Path) -> None:
    user_policy(home, '[network]\nallow = ["a.test"]\n')
    Path("stockade.toml").write_text(f"[network]\ngrace_until = {_day(7)}\n")
    with pytest.raises(PolicyError, match=r"network\.grace_until.*can only tighten"):
        load_policy()
    # even one already over, and even when the user's policy states one itself
    user_policy(home, f'[network]\nallow = ["a.test"]\ngrace_until = {_day(7)}\n')
    Path("stockade.toml").write_text(f"[network]\ngrace_until = {_day(-3)}\n")
    with pytest.raises(PolicyError, match="can only tighten"):
        load_policy()
    # the twin: the user's grace period stands under a workspace file that tightens
    Path("stockade.toml").write_text("[network]\nallow = []\n")
    merged = load_policy()
    assert merged.network.allow == ()
    assert merged.network.grace_until == TODAY + datetime.timedelta(days=7)


def test_in_force_through_its_last_day_then_over() -> None:
    policy = parse_policy_text(f"[network]\ngrace_until = {_day(3)}\n", "p.toml")
    last = TODAY + datetime.timedelta(days=3)
    assert grace_in_force(policy.network, last) == last.isoformat()
    assert grace_in_force(policy.network, last + datetime.timedelta(days=1)) == ""
    assert grace_in_force(parse_policy_text("", "p").network) == ""


def test_egress_reports_what_the_allow_list_lacks_and_refuses_the_rest() -> None:
    policy = parse_policy_text(
        f'[network]\nallow = ["a.test"]\ndeny = ["evil.test"]\ngrace_until = {_day(3)}\n', "p"
    )
    rules = EgressRules.from_policy(policy.network, local=frozenset())
    off_list = rules.check_name("b.test", 443)
    assert (off_list.verdict, off_list.reason, off_list.rule) == (
        "report",
        "host-not-allowed",
        "grace",
    )
    assert off_list.allowed
    assert rules.check_lookup("b.test").verdict == "report"
    # the allow-list's own hosts are allowed as ever (the twin) ...
    assert rules.check_name("a.test", 443).verdict == "allow"
    # ... a deny entry still refuses, and so does every address check
    assert rules.check_name("evil.test", 443).verdict == "deny"
    metadata = rules.check_address("b.test", 80, ipaddress.ip_address("169.254.169.254"))
    assert metadata.decision.verdict == "deny"
    private = rules.check_address("b.test", 80, ipaddress.ip_address("10.1.2.3"))
    assert private.decision.verdict == "deny"
    # once over (or for `policy diff` / `verify`), the same name is refused
    after = EgressRules.from_policy(
        policy.network, local=frozenset(), today=TODAY + datetime.timedelta(days=4)
    )
    assert after.check_name("b.test", 443).verdict == "deny"
    strict = EgressRules.from_policy(policy.network, local=frozenset(), grace=False)
    assert strict.check_name("b.test", 443).verdict == "deny"


def test_request_rules_report_an_unmatched_request_and_keep_deny_rules() -> None:
    policy = parse_policy_text(
        '[network]\nallow = ["api.test"]\n'
        '[[network.rules]]\nhost = "api.test"\nmethods = ["GET"]\npaths = ["/v1/**"]\n'
        '[[network.rules]]\nhost = "api.test"\npaths = ["/admin/**"]\naction = "deny"\n',
        "p",
    )
    graced = RuleSet(policy.network.rules, grace=_day(3))
    unmatched = graced.decide("api.test", 443, "POST", "/v1/orders")
    assert (unmatched.verdict, unmatched.reason, unmatched.rule) == (
        "report",
        "no-rule-matched",
        "grace",
    )
    assert graced.decide("api.test", 443, "GET", "/v1/items").verdict == "allow"
    assert graced.decide("api.test", 443, "GET", "/admin/x").verdict == "deny"
    enforced = RuleSet(policy.network.rules)
    assert enforced.decide("api.test", 443, "POST", "/v1/orders").verdict == "deny"


def test_stockade_trust_names_a_grace_period_among_what_pinning_opens() -> None:
    """A workspace file pinned with ``stockade trust`` is read as the user's own, so it
    may state a grace period: the person pinning it is told (policy._trust.widenings)."""
    from stockade.policy._trust import widenings

    now = parse_policy_text('[network]\nallow = ["a.test"]\n', "user")
    graced = parse_policy_text(f'[network]\nallow = ["a.test"]\ngrace_until = {_day(7)}\n', "ws")
    assert any(
        line.startswith(f"network.grace_until: {_day(7)}") for line in widenings(now, graced)
    )
    # the twins: the same period as the user's own, or none, opens nothing more
    assert widenings(graced, graced) == []
    assert widenings(graced, now) == []
