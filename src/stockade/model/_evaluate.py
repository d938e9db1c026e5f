"""Evaluation of a set of actions against a set of layers, and the monotonicity check."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stockade.model._actions import Action, Route
from stockade.model._layers import Boundary
from stockade.policy import LAYERS, Reason


@dataclass(frozen=True, slots=True)
class RouteOutcome:
    """What the layers did to one route of a network action (``route`` None otherwise)."""

    route: Route | None
    stopped_by: tuple[tuple[str, Reason], ...]

    @property
    def through(self) -> bool:
        """True when no active layer stops this route."""
        return not self.stopped_by


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the layers did to one action.

    ``routes`` holds each route's stoppers. The action gets through when any route does;
    then ``stopped_by`` is empty, otherwise it lists every (layer, reason) that stops some
    route, in canonical layer order.
    """

    action: Action
    stopped_by: tuple[tuple[str, Reason], ...]
    routes: tuple[RouteOutcome, ...] = ()

    @property
    def through_routes(self) -> tuple[Route, ...]:
        """The routes of a network action that get through."""
        return tuple(r.route for r in self.routes if r.through and r.route is not None)

    @property
    def through(self) -> bool:
        """True when no active layer stops the action."""
        return not self.stopped_by

    @property
    def stopper(self) -> str | None:
        """The first layer (in canonical order) that stops the action, if any."""
        return self.stopped_by[0][0] if self.stopped_by else None


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The outcome of every action under one set of active layers."""

    layers: tuple[str, ...]
    outcomes: tuple[Outcome, ...]

    @property
    def through(self) -> tuple[Action, ...]:
        """The actions that get through."""
        return tuple(o.action for o in self.outcomes if o.through)

    @property
    def open_unneeded(self) -> int:
        """Unneeded actions that still get through (the sandbox's residual risk)."""
        return sum(1 for o in self.outcomes if o.through and not o.action.needed)

    @property
    def broken_needed(self) -> int:
        """Needed actions that some layer stops (the sandbox breaking the task)."""
        return sum(1 for o in self.outcomes if not o.through and o.action.needed)

    def outcome(self, action_id: str) -> Outcome:
        """The outcome of the action with id ``action_id``."""
        for o in self.outcomes:
            if o.action.id == action_id:
                return o
        raise KeyError(action_id)


def canonical(layers: Iterable[str]) -> tuple[str, ...]:
    """``layers`` in the canonical order of :data:`~stockade.policy.LAYERS`, checked."""
    chosen = set(layers)
    unknown = chosen - set(LAYERS)
    if unknown:
        raise ValueError(f"unknown layer {sorted(unknown)[0]!r}; layers are {', '.join(LAYERS)}")
    return tuple(name for name in LAYERS if name in chosen)


def evaluate(boundary: Boundary, actions: Sequence[Action], layers: Iterable[str]) -> Evaluation:
    """Judge every action under the active ``layers`` of ``boundary``."""
    active = canonical(layers)
    outcomes = []
    for action in actions:
        routes = tuple(_route(boundary, action, route, active) for route in action.paths_out)
        if any(r.through for r in routes):
            stops: tuple[tuple[str, Reason], ...] = ()
        else:
            seen: dict[str, Reason] = {}
            for r in routes:
                for layer, reason in r.stopped_by:
                    seen.setdefault(layer, reason)
            stops = tuple((layer, seen[layer]) for layer in active if layer in seen)
        outcomes.append(Outcome(action, stops, routes))
    return Evaluation(active, tuple(outcomes))


def _route(
    boundary: Boundary, action: Action, route: Route | None, active: tuple[str, ...]
) -> RouteOutcome:
    stops = []
    for layer in active:
        reason = boundary.stops(layer, action, route)
        if reason is not None:
            stops.append((layer, reason))
    return RouteOutcome(route, tuple(stops))


def subsets(layers: Iterable[str]) -> list[tuple[str, ...]]:
    """Every subset of ``layers`` (canonical order), smallest first."""
    base = canonical(layers)
    out: list[tuple[str, ...]] = []
    for size in range(len(base) + 1):
        out.extend(itertools.combinations(base, size))
    return out


@dataclass(frozen=True, slots=True)
class Violation:
    """Adding ``added`` to ``layers`` let ``action`` through that ``layers`` stopped.

    ``route`` names the route that opened, or is None when the action as a whole did.
    """

    layers: tuple[str, ...]
    added: str
    action: str
    route: Route | None = None


def check_monotonic(
    boundary: Boundary, actions: Sequence[Action], layers: Iterable[str] = LAYERS
) -> list[Violation]:
    """Check that adding a layer never opens anything, over every subset of ``layers``.

    Checked for every route of a network action on its own, and for the action as a
    whole (through when any route is): both must only close as layers are added.
    Returns the violations (empty when the boundary is monotonic).
    """
    base = canonical(layers)
    # Open (action id, route) pairs per subset; route None stands for the whole action.
    open_at: dict[tuple[str, ...], set[tuple[str, Route | None]]] = {}
    for subset in subsets(base):
        ev = evaluate(boundary, actions, subset)
        opened: set[tuple[str, Route | None]] = set()
        for o in ev.outcomes:
            if o.through:
                opened.add((o.action.id, None))
            opened.update((o.action.id, r) for r in o.through_routes)
        open_at[subset] = opened
    violations = []
    for subset, opened in open_at.items():
        for extra in base:
            if extra in subset:
                continue
            bigger = canonical((*subset, extra))
            for action_id, route in sorted(open_at[bigger] - opened, key=_order):
                violations.append(Violation(subset, extra, action_id, route))
    return violations


def _order(item: tuple[str, Route | None]) -> tuple[str, str]:
    return item[0], item[1] or ""


def exercised_layers(boundary: Boundary, actions: Sequence[Action]) -> tuple[str, ...]:
    """The layers that stop at least one route of ``actions`` (the ones worth switching)."""
    return tuple(
        layer
        for layer in LAYERS
        if any(boundary.stops(layer, a, r) is not None for a in actions for r in a.paths_out)
    )


def lost_without_namespaces(boundary: Boundary, actions: Sequence[Action]) -> tuple[str, ...]:
    """The ids of the unneeded ``actions`` that, every layer on, ``bubblewrap`` stops and
    ``landlock`` (no namespaces) lets through: what a host without user namespaces loses."""
    with_ns = evaluate(boundary.with_backend("bubblewrap"), actions, LAYERS)
    without = evaluate(boundary.with_backend("landlock"), actions, LAYERS)
    return tuple(
        a.id
        for a in actions
        if not a.needed and without.outcome(a.id).through and not with_ns.outcome(a.id).through
    )


def kernel_only(boundary: Boundary, actions: Sequence[Action]) -> tuple[str, ...]:
    """The ids of ``actions`` that only a kernel of the sandbox's own stops: every layer
    on, they get through on ``bubblewrap`` (the host kernel) and not on ``gvisor``."""
    on_host = evaluate(boundary.with_backend("bubblewrap"), actions, LAYERS)
    own = evaluate(boundary.with_backend("gvisor"), actions, LAYERS)
    return tuple(
        a.id for a in actions if on_host.outcome(a.id).through and not own.outcome(a.id).through
    )
