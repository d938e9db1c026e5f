"""The seed scenario's table (DESIGN §2), on the model alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stockade.model import Boundary, Route, check_monotonic, evaluate, exercised_layers, subsets
from stockade.policy import Reason
from stockade.probe import scenarios
from stockade.probe.scenarios import Layout


@pytest.fixture
def seed() -> scenarios.Scenario:
    return scenarios.build("seed", Layout(Path("/w")))


@pytest.fixture
def boundary(seed: scenarios.Scenario) -> Boundary:
    return Boundary(seed.policy)


def test_seed_has_three_needed_and_five_unneeded(seed: scenarios.Scenario) -> None:
    needed = [a.id for a in seed.actions if a.needed]
    unneeded = [a.id for a in seed.actions if not a.needed]
    assert needed == ["read-workspace", "write-workspace", "download"]
    assert unneeded == ["read-ssh-key", "write-system", "survive", "connect-evil", "upload"]


def test_files_container_egress_stop_four_of_five_and_the_upload_gets_through(
    seed: scenarios.Scenario, boundary: Boundary
) -> None:
    ev = evaluate(boundary, seed.actions, ("files", "container", "egress"))
    assert ev.open_unneeded == 1
    assert ev.broken_needed == 0
    assert [a.id for a in ev.through if not a.needed] == ["upload"]


def test_inspect_closes_the_upload(seed: scenarios.Scenario, boundary: Boundary) -> None:
    ev = evaluate(boundary, seed.actions, ("files", "container", "egress", "inspect"))
    assert ev.open_unneeded == 0
    assert ev.broken_needed == 0
    upload = ev.outcome("upload")
    # egress closes the direct route, inspect the proxy route egress lets on
    routes = {r.route: [layer for layer, _ in r.stopped_by] for r in upload.routes}
    assert routes == {Route.DIRECT: ["egress"], Route.PROXY: ["inspect"]}
    assert ev.outcome("download").through


@pytest.mark.parametrize(
    ("action", "stoppers"),
    [
        ("read-ssh-key", ["files", "container"]),
        ("write-system", ["files", "container"]),
        ("survive", ["container"]),
        ("connect-evil", ["egress"]),
        ("upload", ["egress", "inspect"]),
        ("read-workspace", []),
        ("write-workspace", []),
        ("download", []),
    ],
)
def test_which_layer_stops_each_seed_action(
    seed: scenarios.Scenario, boundary: Boundary, action: str, stoppers: list[str]
) -> None:
    ev = evaluate(boundary, seed.actions, ("files", "container", "egress", "inspect"))
    assert [layer for layer, _ in ev.outcome(action).stopped_by] == stoppers


def test_inspect_alone_lets_the_upload_through_directly(
    seed: scenarios.Scenario, boundary: Boundary
) -> None:
    ev = evaluate(boundary, seed.actions, ("inspect",))
    upload = ev.outcome("upload")
    assert upload.through
    assert upload.through_routes == (Route.DIRECT,)
    assert ev.open_unneeded == 5
    proxy = next(r for r in upload.routes if r.route is Route.PROXY)
    assert [layer for layer, _ in proxy.stopped_by] == ["inspect"]


def test_upload_needs_egress_and_inspect_together(
    seed: scenarios.Scenario, boundary: Boundary
) -> None:
    for subset in subsets(("files", "container", "egress", "inspect")):
        ev = evaluate(boundary, seed.actions, subset)
        closed = "egress" in subset and "inspect" in subset
        assert ev.outcome("upload").through is not closed, subset


def test_no_needed_action_broken_in_any_subset(
    seed: scenarios.Scenario, boundary: Boundary
) -> None:
    for subset in subsets(
        ("files", "container", "syscalls", "secrets", "egress", "inspect", "limits")
    ):
        assert evaluate(boundary, seed.actions, subset).broken_needed == 0, subset


def test_everything_open_with_no_layer(seed: scenarios.Scenario, boundary: Boundary) -> None:
    ev = evaluate(boundary, seed.actions, ())
    assert ev.open_unneeded == 5
    assert ev.broken_needed == 0


def test_seed_exercises_the_four_boundaries(seed: scenarios.Scenario, boundary: Boundary) -> None:
    assert exercised_layers(boundary, seed.actions) == ("files", "container", "egress", "inspect")


@pytest.mark.parametrize("name", scenarios.SCENARIOS)
def test_scenarios_are_monotonic_on_every_subset(name: str) -> None:
    sc = scenarios.build(name, Layout(Path("/w")))
    assert check_monotonic(Boundary(sc.policy), sc.actions) == []


def test_extended_needed_actions_never_broken() -> None:
    sc = scenarios.build("extended", Layout(Path("/w")))
    b = Boundary(sc.policy)
    everything = ("files", "container", "syscalls", "secrets", "egress", "inspect", "limits")
    full = evaluate(b, sc.actions, everything)
    assert full.broken_needed == 0
    # On the host kernel every layer lets the kernel parse a control message; only a
    # kernel of the sandbox's own (gvisor) closes the last one.
    assert [a.id for a in full.through if not a.needed] == ["host-kernel"]
    on_gvisor = evaluate(b.with_backend("gvisor"), sc.actions, everything)
    assert on_gvisor.broken_needed == 0
    assert on_gvisor.open_unneeded == 0


def test_extended_encoded_label_is_stopped_by_inspect_alone() -> None:
    """A labelled secret, base64 in a GET query to the allowed, inspected registry: only
    the inspect layer (through the proxy egress forces) stops it, for labelled-data."""
    sc = scenarios.build("extended", Layout(Path("/w")))
    assert sc.policy.labels.configured
    (action,) = [a for a in sc.actions if a.id == "encoded-label"]
    assert action.labelled
    assert not action.needed
    b = Boundary(sc.policy)
    assert b.stops("inspect", action, Route.PROXY) == Reason.LABELLED_DATA
    # The same request without the labelled value is allowed by the registry's rules.
    assert b.stops("inspect", replace(action, labelled=False), Route.PROXY) is None
    everything = ("files", "container", "syscalls", "secrets", "egress", "inspect", "limits")
    for layers in subsets(everything):
        outcome = evaluate(b, sc.actions, layers).outcome("encoded-label")
        assert outcome.through == (not {"egress", "inspect"} <= set(layers)), layers
    # The seed scenario labels nothing: its table is unchanged.
    assert not scenarios.build("seed", Layout(Path("/w"))).policy.labels.configured
