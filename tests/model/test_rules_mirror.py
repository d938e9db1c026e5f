"""The model's request-rule matcher agrees with the enforcement's on a table of cases."""

from __future__ import annotations

import pytest

from stockade.egress.inspect import HostMatch, RuleSet
from stockade.egress.inspect._rules import compile_glob as enforced_glob
from stockade.model import RuleHost, Rules
from stockade.model._rules import compile_glob
from stockade.policy import Reason, RequestRule

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
    ["a.test", "*.a.test", "A.Test.", "a.test:443", "[::1]:8080", "10.0.0.1", "bücher.de"],
)
def test_host_patterns_parse_alike(pattern: str) -> None:
    ours, theirs = RuleHost.parse(pattern), HostMatch.parse(pattern)
    assert (ours.host, ours.suffix, ours.port) == (theirs.host, theirs.suffix, theirs.port)


@pytest.mark.parametrize("glob", ["/**", "/v1/**", "/pkg/*", "/x/**/y", "/a**b", "/lit.txt"])
def test_globs_compile_alike(glob: str) -> None:
    assert compile_glob(glob).pattern == enforced_glob(glob).pattern
