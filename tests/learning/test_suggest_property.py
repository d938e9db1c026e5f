"""Property: a suggestion admits everything observed, and nothing an observation does not justify.

Generated observations (hosts under two parents on three ports, requests over inspected
TLS and plain HTTP, file reads in three directories, some refused in learning) go through
:func:`stockade.learning.suggest`; then every allow line must be an observed thing exactly,
or a widening the documented sibling rule permits, and every observed allowed thing must
be admitted by the decisions stockade itself takes (``EgressRules``, ``RuleSet``).
"""

from __future__ import annotations

import tomllib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.learning import suggest
from stockade.learning._suggest import FILE_SIBLINGS, PATH_SIBLINGS, WILDCARD_SIBLINGS
from stockade.policy._model import RequestRule
from stockade.policy._network import EgressRules
from stockade.policy._rulematch import RuleSet

HOSTS = [f"{a}.{p}" for p in ("x.test", "y.test") for a in "abcdefgh"]
PORTS = [80, 443, 8443]
PATHS = [f"/{d}/{n}" for d in ("p", "q") for n in "abcdef"]
FILES = [f"/data/d{d}/f{n}" for d in range(3) for n in range(11)]

net = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["connect", "request"]),
        "host": st.sampled_from(HOSTS),
        "port": st.sampled_from(PORTS),
        "verdict": st.sampled_from(["allow", "allow", "allow", "deny"]),
        "reason": st.just("address-metadata"),
        "method": st.sampled_from(["GET", "POST"]),
        "path": st.sampled_from(PATHS),
        "protocol": st.sampled_from(["https", "http"]),
        "run": st.integers(1, 3),
    }
)
reads = st.fixed_dictionaries(
    {"kind": st.just("read"), "path": st.sampled_from(FILES), "run": st.integers(1, 3)}
)
observations = st.lists(st.one_of(net, reads), max_size=80)


def _ok(obs: dict[str, Any]) -> bool:
    return obs["kind"] in ("connect", "request") and obs["verdict"] == "allow"


# No time limits: a loaded CI machine must not fail a property (HealthCheck.too_slow is one).
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(observations)
def test_every_allow_line_is_justified_and_everything_observed_is_admitted(
    obs: list[dict[str, Any]],
) -> None:
    summaries = [{"runs": [{"workspace": "/ws", "hosts": {}}]}]
    s = suggest(obs, summaries, exists=lambda p: True, isdir=lambda p: False)
    allowed = {(o["host"], o["port"]) for o in obs if _ok(o)}

    for line in s.section("allow"):
        assert line.needs, line
        host, port = line.value.rsplit(":", 1)
        if line.widening:
            parent = host.removeprefix("*.")
            assert host.startswith("*.")
            siblings = {h for h, p in allowed if p == int(port) and h.endswith("." + parent)}
            assert len(siblings) > WILDCARD_SIBLINGS
        else:
            assert (host, int(port)) in allowed

    for line in s.section("rules"):
        host, port = str(line.extra["host"]).rsplit(":", 1)
        seen = {
            o["path"]
            for o in obs
            if _ok(o)
            and o["kind"] == "request"
            and o["protocol"] != "http"
            and (o["host"], o["port"]) == (host, int(port))
        }
        if line.widening:
            directory = line.value.removesuffix("/*")
            assert len({p for p in seen if p.rsplit("/", 1)[0] == directory}) > PATH_SIBLINGS
        else:
            assert line.value in seen
        # one method per rule, and every path it stands for was seen with that method
        (method,) = line.extra["methods"]
        with_method = {
            o["path"]
            for o in obs
            if _ok(o)
            and o["kind"] == "request"
            and o["protocol"] != "http"
            and (o["host"], o["port"], o["method"]) == (host, int(port), method)
        }
        if line.widening:
            directory = line.value.removesuffix("/*")
            assert len({p for p in with_method if p.rsplit("/", 1)[0] == directory}) > PATH_SIBLINGS
        else:
            assert line.value in with_method
        assert line.needs

    read = {o["path"] for o in obs if o["kind"] == "read"}
    for line in s.section("read"):
        assert line.needs
        if line.widening:
            assert len({p for p in read if p.rsplit("/", 1)[0] == line.value}) > FILE_SIBLINGS
        else:
            assert line.value in read

    # complete: stockade's own decisions admit every observed allowed host and request
    rules = EgressRules(allow=tuple(line.value for line in s.section("allow")))
    for host, port in allowed:
        assert rules.check_name(host, port).allowed, (host, port)
    by_host: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for line in s.section("rules"):
        by_host.setdefault((str(line.extra["host"]), tuple(line.extra["methods"])), []).append(
            line.value
        )
    ruleset = RuleSet([RequestRule(h, m, tuple(p)) for (h, m), p in by_host.items()])
    for o in obs:
        if _ok(o) and o["kind"] == "request" and o["protocol"] != "http":
            assert ruleset.decide(o["host"], o["port"], o["method"], o["path"]).allowed, o
    for path in read:
        assert any(
            path == line.value or path.startswith(line.value + "/") for line in s.section("read")
        )

    # the TOML is what the lines say
    doc = tomllib.loads(s.to_toml())
    assert doc["network"]["allow"] == [line.value for line in s.section("allow")]
    assert doc["filesystem"]["read"] == [line.value for line in s.section("read")]
    assert "#   refused even in learning" in s.to_toml() or all(
        o["verdict"] == "allow" for o in obs if o["kind"] != "read"
    )


def test_a_wildcard_needs_more_than_the_documented_siblings() -> None:
    """The boundary of the widening rule: WILDCARD_SIBLINGS names stay exact, one more widens."""
    names = [f"n{i}.pkg.test" for i in range(WILDCARD_SIBLINGS + 1)]

    def obs(hosts: list[str]) -> list[dict[str, Any]]:
        return [
            {"kind": "connect", "host": h, "port": 443, "verdict": "allow", "run": 1} for h in hosts
        ]

    exact = suggest(obs(names[:-1]))
    assert [line.value for line in exact.section("allow")] == [
        f"{h}:443" for h in sorted(names[:-1])
    ]
    wide = suggest(obs(names))
    assert [line.value for line in wide.section("allow")] == ["*.pkg.test:443"]
    assert "WIDENING" in wide.to_toml()
    assert all(n in wide.section("allow")[0].widening for n in names)
