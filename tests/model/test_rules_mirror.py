"""The model agrees with the enforcement on one table of hosts, spellings, addresses and rules.

The model (``stockade explain``, the probe) must predict exactly what the proxy does:
request rules, which hosts are inspected, and the egress verdict on a name and on each
address it resolves to (the metadata table included). The enforcement side here is the
proxy's own objects (:class:`stockade.egress.EgressRules`, the inspect layer's
:class:`~stockade.egress.inspect.Inspector`), fed the host as the proxy is: normalised.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from stockade.egress import METADATA_ADDRESSES, EgressRules
from stockade.egress.inspect import Inspector, RuleSet, SecretStore
from stockade.egress.inspect._rules import compile_glob as enforced_glob
from stockade.model import Boundary, RuleHost, Rules
from stockade.model._rules import compile_glob
from stockade.policy import Policy, Reason, RequestRule, parse_policy_text
from stockade.policy._hosts import normalize_host, parse_pattern

RULES = (
    RequestRule("api.test", ("POST",), ("/v1/files", "/v1/files/**"), "deny", 0),
    RequestRule("api.test", (), ("/v1/**",), "allow", 1),
    RequestRule("*.cdn.test", ("GET", "HEAD"), ("/pkg/*",), "allow", 2),
    RequestRule("reg.test:8443", ("GET",), ("/**",), "allow", 3),
    RequestRule("report.test", ("PUT",), ("/**",), "report", 4),
    RequestRule("10.0.0.1", ("GET",), ("/x/**/y",), "allow", 5),
)

CASES = [
    ("api.test", 443, "POST", "/v1/files"),
    ("api.test", 443, "POST", "/v1/files/a/b"),
    ("api.test", 443, "POST", "/v1/chat"),
    ("api.test", 443, "GET", "/v1"),
    ("api.test", 443, "GET", "/v2/x"),
    ("x.cdn.test", 443, "GET", "/pkg/a"),
    ("x.cdn.test", 443, "GET", "/pkg/a/b"),
    ("x.cdn.test", 443, "PUT", "/pkg/a"),
    ("cdn.test", 443, "PUT", "/pkg/a"),
    ("reg.test", 8443, "GET", "/anything"),
    ("reg.test", 443, "PUT", "/anything"),
    ("report.test", 443, "PUT", "/up"),
    ("report.test", 443, "GET", "/up"),
    ("10.0.0.1", 443, "GET", "/x/a/b/y"),
    ("10.0.0.1", 443, "GET", "/x/y"),
    ("other.test", 443, "DELETE", "/"),
]


def _enforced(host: str, port: int, method: str, path: str) -> Reason | None:
    decision = RuleSet(RULES).decide(host, port, method, path)
    # "report" counts as allowed: its reason only says what a deny would refuse
    return None if decision.allowed else decision.reason


@pytest.mark.parametrize(("host", "port", "method", "path"), CASES)
def test_model_rules_agree_with_the_enforcement(
    host: str, port: int, method: str, path: str
) -> None:
    model = Rules(RULES)
    assert model.decide(host, port, method, path) == _enforced(host, port, method, path)
    assert model.ruled(host, port) == RuleSet(RULES).ruled(host, port)


@pytest.mark.parametrize(
    "pattern",
    [
        "a.test",
        "*.a.test",
        "A.Test.",
        "a.test:443",
        "[::1]:8080",
        "10.0.0.1",
        "bücher.de",
        "straße.test",
        "*.straße.test",
    ],
)
def test_host_patterns_parse_alike(pattern: str) -> None:
    """A rule's host, as the model and the proxy read it, is the allow-list's pattern."""
    rule = RequestRule(pattern, (), ("/**",), "allow", 0)
    (ours,) = Rules((rule,))._set.hosts
    (theirs,) = RuleSet((rule,)).hosts
    allow = parse_pattern(pattern)
    assert isinstance(ours, RuleHost)
    assert (ours.host, ours.kind, ours.port) == (theirs.host, theirs.kind, theirs.port)
    assert (theirs.host, theirs.kind, theirs.port) == (allow.host, allow.kind, allow.port)


# -- one table: hosts, IDN spellings, addresses, rules -----------------------------------

MIRROR_POLICY = """
[network]
allow = ["straße.test", "api.test", "*.cdn.test", "169.254.0.0/16", "168.63.0.0/16",
         "100.64.0.0/10", "fd00::/8", "10.0.0.0/8", "192.0.2.7", "meta.test", "wire.test",
         "pinned.test", "priv.test"]
deny = ["bad.api.test", "10.9.0.0/16"]

[network.hosts]
"meta.test" = "169.254.170.2"
"wire.test" = "168.63.129.16"
"pinned.test" = "10.1.2.3"
"straße.test" = "127.0.0.1"

[[network.rules]]
host = "straße.test"
methods = ["GET"]

[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/v1/**"]

[secrets.KEY]
from = "env:REAL_KEY"
hosts = ["*.cdn.test"]
"""

#: (host as a client spells it, port, address it resolved to: "" when unknown)
CONNECTS = [
    ("straße.test", 443, ""),
    ("STRASSE.test", 443, ""),
    ("strasse.test", 443, ""),
    ("xn--strae-oqa.test", 443, ""),
    ("Straße.Test.", 443, ""),
    ("ｓｔｒａßｅ.test", 443, ""),
    ("api.test", 443, "93.184.216.34"),
    ("API.TEST.", 443, "10.0.0.5"),
    ("bad.api.test", 443, "93.184.216.34"),
    ("x.cdn.test", 443, "169.254.169.254"),
    ("cdn.test", 443, "93.184.216.34"),
    ("meta.test", 443, ""),
    ("wire.test", 443, ""),
    ("pinned.test", 443, ""),
    ("priv.test", 443, "10.9.1.1"),
    ("priv.test", 443, "192.168.1.1"),
    ("priv.test", 443, "10.1.1.1"),
    ("192.0.2.7", 443, ""),
    ("other.test", 443, "93.184.216.34"),
    *(
        (str(a) if a.version == 4 else f"[{a}]", 80, "")
        for a in sorted(METADATA_ADDRESSES, key=str)
    ),
    *(("api.test", 443, str(a)) for a in sorted(METADATA_ADDRESSES, key=str)),
]


def _policy(tmp_path: Path) -> Policy:
    return parse_policy_text(MIRROR_POLICY, "mirror.toml", workspace=tmp_path)


def _enforced_connect(rules: EgressRules, raw: str, port: int, address: str) -> Reason | None:
    """What the proxy decides for a connection to ``raw:port`` resolving to ``address``."""
    host = normalize_host(raw)
    named = rules.check_name(host, port)
    if not named.allowed:
        return named.reason
    ip = rules.pin(host)
    if ip is None:
        literal = host.strip("[]")
        try:
            ip = ipaddress.ip_address(literal)
        except ValueError:
            ip = ipaddress.ip_address(address) if address else None
    if ip is None:
        return None
    verdict = rules.check_address(host, port, ip)
    return None if verdict.decision.allowed else verdict.decision.reason


@pytest.mark.parametrize(("host", "port", "address"), CONNECTS)
def test_model_egress_agrees_with_the_enforcement(
    tmp_path: Path, host: str, port: int, address: str
) -> None:
    policy = _policy(tmp_path)
    enforced = EgressRules.from_policy(policy.network, local=frozenset())
    model = Boundary(policy)
    assert model.host_decision(host, port, address) == _enforced_connect(
        enforced, host, port, address
    )


@pytest.mark.parametrize("address", sorted(METADATA_ADDRESSES, key=str), ids=str)
def test_every_metadata_address_is_refused_by_the_model_too(address: object) -> None:
    """Inside an allowed range, by literal and by a pinned name: refused in both."""
    text = str(address)
    wide = ipaddress.ip_network(f"{text}/16", strict=False)  # an allowed range around it
    policy = parse_policy_text(
        f'[network]\nallow = ["{wide}", "m.test"]\n[network.hosts]\n"m.test" = "{text}"\n',
        "m.toml",
    )
    literal = text if ":" not in text else f"[{text}]"
    model = Boundary(policy)
    enforced = EgressRules.from_policy(policy.network, local=frozenset())
    for host in (literal, "m.test"):
        assert model.host_decision(host, 443) == Reason.ADDRESS_METADATA
        assert _enforced_connect(enforced, host, 443, "") == Reason.ADDRESS_METADATA


#: (host as a client spells it, port)
INSPECTS = [
    ("straße.test", 443),
    ("xn--strae-oqa.test", 443),
    ("STRASSE.test", 443),
    ("strasse.test", 443),
    ("api.test", 443),
    ("api.test", 8443),
    ("x.cdn.test", 443),
    ("cdn.test", 443),
    ("other.test", 443),
]


@pytest.mark.parametrize(("host", "port"), INSPECTS)
def test_model_inspection_agrees_with_the_enforcement(tmp_path: Path, host: str, port: int) -> None:
    policy = _policy(tmp_path)
    store = SecretStore.resolve(policy.secrets, {"REAL_KEY": "real-key-0123456789"})
    inspector = Inspector.from_policy(policy, {}, secrets=store)
    model = Boundary(policy)
    assert model.inspected(host, port) == inspector.inspects(normalize_host(host), port)


def test_rules_on_an_idn_host_are_applied(tmp_path: Path) -> None:
    """The bug this table was made for: a rule on straße.test names xn--strae-oqa.test."""
    policy = _policy(tmp_path)
    store = SecretStore.resolve(policy.secrets, {"REAL_KEY": "real-key-0123456789"})
    inspector = Inspector.from_policy(policy, {}, secrets=store)
    assert inspector.inspects("xn--strae-oqa.test", 443)
    assert not inspector.inspects("strasse.test", 443)
    put = inspector.rules.decide("xn--strae-oqa.test", 443, "PUT", "/x")
    get = inspector.rules.decide("xn--strae-oqa.test", 443, "GET", "/x")
    assert (put.allowed, put.reason) == (False, Reason.NO_RULE_MATCHED)
    assert get.allowed
    model = Boundary(policy)
    assert model.rule_decision("straße.test", 443, "PUT", "/x") == Reason.NO_RULE_MATCHED
    assert model.rule_decision("straße.test", 443, "GET", "/x") is None


@pytest.mark.parametrize("glob", ["/**", "/v1/**", "/pkg/*", "/x/**/y", "/a**b", "/lit.txt"])
def test_globs_compile_alike(glob: str) -> None:
    assert compile_glob(glob).pattern == enforced_glob(glob).pattern
