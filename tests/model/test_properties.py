"""Property tests: monotonicity and independence over random policies and actions."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.model import (
    Action,
    Boundary,
    Credential,
    Kind,
    Route,
    check_monotonic,
    evaluate,
    subsets,
)
from stockade.policy import (
    LAYERS,
    BoundSecret,
    EnvPass,
    EnvPolicy,
    FilesystemPolicy,
    LimitsPolicy,
    NetworkPolicy,
    Policy,
    RequestRule,
)

HOSTS = [
    "a.test",
    "b.test",
    "api.a.test",
    "127.0.0.1",
    "10.0.0.5",
    "203.0.113.7",
    "169.254.169.254",
]
PATHS = [
    "/w/src/x",
    "/w/.git/hooks/pre-commit",
    "/h/.ssh/id",
    "/etc/passwd",
    "/usr/bin/x",
    "/r/data",
    "/o/out",
    "/tmp/x",
    "/etc/shadow",
    "/w/.env",
]
NAMES = ["PATH", "LANG", "GH_TOKEN", "MY_VAR", "LC_ALL", "AWS_SECRET_ACCESS_KEY"]

host_entries = st.sampled_from(
    [
        "a.test",
        "*.a.test",
        "b.test:443",
        "127.0.0.1",
        "10.0.0.0/8",
        "169.254.169.254",
        "203.0.113.0/24",
    ]
)

policies = st.builds(
    lambda allow, deny, pins, read, write, denyg, protect, passed, fsize: Policy(
        filesystem=FilesystemPolicy(
            workspace=Path("/w"),
            read=tuple(Path(p) for p in read),
            write=tuple(Path(p) for p in write),
            deny=tuple(denyg),
            protect=tuple(protect),
        ),
        env=EnvPolicy(pass_=tuple(EnvPass(n) for n in passed)),
        network=NetworkPolicy(allow=tuple(allow), deny=tuple(deny), hosts=pins),
        limits=LimitsPolicy(file_size=fsize),
    ),
    st.lists(host_entries, max_size=4),
    st.lists(host_entries, max_size=2),
    st.dictionaries(
        st.sampled_from(["a.test", "b.test"]),
        st.sampled_from(["127.0.0.1", "10.0.0.5"]),
        max_size=2,
    ),
    st.lists(st.sampled_from(["/r", "/h/.cache"]), max_size=2),
    st.lists(st.sampled_from(["/o"]), max_size=1),
    st.lists(st.sampled_from(["**/.env", "/h/.ssh"]), max_size=2),
    st.lists(st.sampled_from(["src/gen"]), max_size=1),
    st.lists(st.sampled_from(["MY_VAR", "GH_TOKEN"]), max_size=2),
    st.integers(min_value=1, max_value=10_000),
)

rules = st.lists(
    st.builds(
        RequestRule,
        st.sampled_from(["a.test", "*.a.test", "b.test:443"]),
        st.lists(st.sampled_from(["GET", "HEAD", "POST"]), max_size=2).map(tuple),
        st.lists(st.sampled_from(["/v1/**", "/pkg/*", "/**"]), min_size=1, max_size=2).map(tuple),
        st.sampled_from(["allow", "deny", "report"]),
    ),
    max_size=3,
).map(tuple)

bound_secrets = st.lists(
    st.builds(
        lambda hosts: BoundSecret("KEY", "env:KEY", tuple(hosts)),
        st.lists(st.sampled_from(["a.test", "api.a.test"]), min_size=1, max_size=2),
    ),
    max_size=1,
).map(tuple)


def with_inspect(
    policy: Policy, request_rules: tuple[RequestRule, ...], secrets: tuple[BoundSecret, ...]
) -> Policy:
    """``policy`` with request rules and bound secrets (the inspect layer's input)."""
    net = policy.network
    return Policy(
        filesystem=policy.filesystem,
        env=policy.env,
        network=NetworkPolicy(
            allow=net.allow,
            deny=net.deny,
            hosts=net.hosts,
            tls_ports=(443, 8080),
            rules=request_rules,
        ),
        limits=policy.limits,
        secrets=secrets,
    )


inspected_policies = st.builds(with_inspect, policies, rules, bound_secrets)


@st.composite
def actions(draw: st.DrawFn) -> Action:
    kind = draw(st.sampled_from(list(Kind)))
    host = draw(st.sampled_from(HOSTS))
    return Action(
        id=draw(st.text("abcdef", min_size=1, max_size=6)),
        kind=kind,
        target=draw(
            st.sampled_from(PATHS + NAMES + ["userns", "bpf", "file_size", "pids", "@abs"])
        ),
        needed=draw(st.booleans()),
        host=host,
        port=draw(st.sampled_from([80, 443, 8080])),
        method=draw(st.sampled_from(["GET", "PUT", "POST", "HEAD"])),
        path=draw(st.sampled_from(["/", "/v1/x", "/pkg/y"])),
        resolved=draw(st.sampled_from(["", *PATHS])),
        credential=draw(st.sampled_from(list(Credential))),
        amount=draw(st.integers(min_value=0, max_value=20_000)),
        routes=draw(
            st.sampled_from([(Route.DIRECT, Route.PROXY), (Route.PROXY,), (Route.DIRECT,)])
        ),
        labelled=draw(st.booleans()),
    )


@settings(max_examples=60, deadline=None)
@given(inspected_policies, st.lists(actions(), min_size=1, max_size=6))
def test_adding_a_layer_never_opens_anything(policy: Policy, acts: list[Action]) -> None:
    assert check_monotonic(Boundary(policy), acts) == []


@settings(max_examples=100, deadline=None)
@given(
    inspected_policies,
    st.lists(actions(), min_size=1, max_size=6),
    st.sets(st.sampled_from(LAYERS)),
)
def test_through_iff_some_route_has_no_active_layer_stopping_it(
    policy: Policy, acts: list[Action], layers: set[str]
) -> None:
    b = Boundary(policy)
    ev = evaluate(b, acts, layers)
    for outcome in ev.outcomes:
        a = outcome.action
        expected = any(
            all(b.stops(layer, a, route) is None for layer in layers) for route in a.paths_out
        )
        assert outcome.through == expected
        if len(a.paths_out) == 1:
            # one route: the layers' own verdicts on the action decide it
            assert outcome.through == all(b.stops(layer, a) is None for layer in layers)
    assert ev.open_unneeded + ev.broken_needed <= len(acts)


@settings(max_examples=60, deadline=None)
@given(inspected_policies, st.lists(actions(), min_size=1, max_size=5))
def test_counts_are_monotonic_in_the_layer_set(policy: Policy, acts: list[Action]) -> None:
    b = Boundary(policy)
    for small in subsets(("files", "container", "egress", "inspect")):
        big = (*small, "secrets", "syscalls")
        assert evaluate(b, acts, big).open_unneeded <= evaluate(b, acts, small).open_unneeded
        assert evaluate(b, acts, big).broken_needed >= evaluate(b, acts, small).broken_needed


@settings(max_examples=80, deadline=None)
@given(policies)
def test_workspace_reads_never_stopped_by_files(policy: Policy) -> None:
    b = Boundary(policy)
    a = Action("r", Kind.FILE_READ, "/w/src/main.py", True)
    assert b.stops("files", a) is None


@settings(max_examples=60, deadline=None)
@given(inspected_policies, st.lists(actions(), min_size=1, max_size=4))
def test_each_route_is_monotonic_on_its_own(policy: Policy, acts: list[Action]) -> None:
    b = Boundary(policy)
    for small in subsets(("container", "egress", "inspect")):
        big = (*small, "files")
        for a in acts:
            small_open = evaluate(b, [a], small).outcome(a.id).through_routes
            big_open = evaluate(b, [a], big).outcome(a.id).through_routes
            assert set(big_open) <= set(small_open)
