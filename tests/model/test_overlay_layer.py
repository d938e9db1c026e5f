"""The overlay layer of the model: an unreviewed write never reaches the real workspace,
and apply refuses a protected path or a symlink out even when the reviewer approves.

Each "stopped" case has its "let through" twin beside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.model import Action, Boundary, Kind, check_monotonic, evaluate, exercised_layers
from stockade.policy import LAYERS, Reason
from stockade.probe import scenarios
from stockade.probe.scenarios import Layout

LAYOUT = Layout(Path("/w"))
WS = LAYOUT.workspace


@pytest.fixture
def overlay() -> scenarios.Scenario:
    return scenarios.build("overlay", LAYOUT)


@pytest.fixture
def boundary(overlay: scenarios.Scenario) -> Boundary:
    return Boundary(overlay.policy)


def write(path: Path | str, *, approved: bool = False, link_to: str = "") -> Action:
    return Action("w", Kind.FILE_WRITE, str(path), False, approved=approved, link_to=link_to)


def test_an_unapproved_workspace_write_stops_at_the_layer_an_approved_one_goes_on(
    boundary: Boundary,
) -> None:
    assert boundary.stops("overlay", write(WS / "src" / "app.py")) == Reason.NOT_APPLIED
    assert boundary.stops("overlay", write(WS / "src" / "app.py", approved=True)) is None


def test_apply_refuses_a_protected_path_even_approved(boundary: Boundary) -> None:
    for rel in (".git/hooks/pre-commit", ".husky/pre-commit", "stockade.toml", ".vscode/x"):
        got = boundary.stops("overlay", write(WS / rel, approved=True))
        assert got == Reason.PATH_PROTECTED, rel
    # the twin: a look-alike outside the protected set is applied
    assert boundary.stops("overlay", write(WS / "husky" / "pre-commit", approved=True)) is None


def test_apply_refuses_a_symlink_leading_out_and_applies_one_inside_or_to_the_system(
    boundary: Boundary,
) -> None:
    link = WS / "tools" / "cache"
    out = boundary.stops("overlay", write(link, approved=True, link_to="/home/u/.ssh"))
    assert out == Reason.PATH_NOT_GRANTED
    dotdot = boundary.stops("overlay", write(link, approved=True, link_to="../../etc"))
    assert dotdot == Reason.PATH_NOT_GRANTED
    assert boundary.stops("overlay", write(link, approved=True, link_to="../src")) is None
    venv = write(WS / ".venv" / "bin" / "python", approved=True, link_to="/usr/bin/python3")
    assert boundary.stops("overlay", venv) is None


def test_the_layer_covers_the_workspace_alone(boundary: Boundary) -> None:
    # a write elsewhere (or through a link resolving elsewhere) is the other layers' call
    assert boundary.stops("overlay", write("/etc/profile.d/x.sh")) is None
    through = Action("l", Kind.FILE_WRITE, str(WS / "docs" / "n"), False, resolved="/home/u/.ssh/x")
    assert boundary.stops("overlay", through) is None
    assert boundary.stops("files", through) == Reason.PATH_NOT_GRANTED
    for kind in (Kind.FILE_READ, Kind.ENV_READ, Kind.PROCESS_SURVIVE):
        assert boundary.stops("overlay", Action("x", kind, str(WS / "a"), False)) is None


def test_without_an_overlay_workspace_the_layer_stops_nothing() -> None:
    seed = scenarios.build("seed", LAYOUT)
    plain = Boundary(seed.policy)
    assert not seed.policy.filesystem.overlay
    assert plain.stops("overlay", write(WS / "src" / "app.py")) is None
    assert "overlay" not in exercised_layers(plain, seed.actions)


def test_the_layer_stops_nothing_where_the_runtime_refuses_an_overlay(
    boundary: Boundary,
) -> None:
    # runtime/_overlay.refusal: under landlock such a run never starts (exit 125)
    assert boundary.with_backend("landlock").stops("overlay", write(WS / "a")) is None
    assert boundary.with_backend("bubblewrap").stops("overlay", write(WS / "a")) is not None


def test_under_gvisor_the_layer_stops_what_it_stops_under_bubblewrap(
    overlay: scenarios.Scenario, boundary: Boundary
) -> None:
    # The gVisor entry mounts the same overlayfs layer around runsc (runtime/_overlay).
    gv = boundary.with_backend("gvisor")
    assert gv.stops("overlay", write(WS / "a")) == Reason.NOT_APPLIED
    assert gv.stops("overlay", write(WS / "a", approved=True)) is None
    for action in overlay.actions:
        assert gv.stops("overlay", action) == boundary.stops("overlay", action), action.id


def test_every_layer_on_only_the_overlay_stops_the_tampering(
    overlay: scenarios.Scenario, boundary: Boundary
) -> None:
    ev = evaluate(boundary, overlay.actions, LAYERS)
    assert [layer for layer, _ in ev.outcome("tamper-ci").stopped_by] == ["overlay"]
    assert [layer for layer, _ in ev.outcome("link-out").stopped_by] == ["overlay"]
    assert [layer for layer, _ in ev.outcome("hook-approved").stopped_by] == [
        "container",
        "overlay",
    ]
    assert ev.outcome("write-workspace").through
    assert ev.open_unneeded == 0
    assert ev.broken_needed == 0
    # the twin: without the overlay the tampering reaches the real workspace
    without = evaluate(boundary, overlay.actions, [x for x in LAYERS if x != "overlay"])
    assert {a.id for a in without.through if not a.needed} == {"tamper-ci", "link-out"}


def test_the_overlay_scenario_is_the_seed_and_three_workspace_writes(
    overlay: scenarios.Scenario, boundary: Boundary
) -> None:
    seed = scenarios.build("seed", LAYOUT)
    assert [a.id for a in overlay.actions][: len(seed.actions)] == [a.id for a in seed.actions]
    assert [a.id for a in overlay.actions][len(seed.actions) :] == [
        "tamper-ci",
        "hook-approved",
        "link-out",
    ]
    assert overlay.policy.filesystem.overlay
    assert exercised_layers(boundary, overlay.actions) == (
        "files",
        "container",
        "egress",
        "inspect",
        "overlay",
    )
    assert check_monotonic(boundary, overlay.actions) == []


def test_a_policy_without_the_overlay_layer_has_a_read_write_workspace(tmp_path: Path) -> None:
    from stockade.api import _policy
    from stockade.policy import load_policy

    policy = tmp_path / "p.toml"
    policy.write_text('[filesystem]\nworkspace = { path = ".", mode = "overlay" }\n')
    assert load_policy(policy, workspace=tmp_path).filesystem.overlay
    policy.write_text(
        '[filesystem]\nworkspace = { path = ".", mode = "overlay" }\n[layers]\noverlay = false\n'
    )
    off = load_policy(policy, workspace=tmp_path)
    assert not off.filesystem.overlay
    assert not off.layers.overlay
    on = scenarios.build("overlay", LAYOUT).policy
    assert not _policy(on, None, (), ("overlay",)).filesystem.overlay
    assert _policy(on, None, (), ()).filesystem.overlay
