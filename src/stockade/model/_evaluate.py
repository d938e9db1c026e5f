"""Evaluation of a set of actions against a set of layers, and the monotonicity check."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stockade.model._actions import Action
from stockade.model._layers import Boundary
from stockade.policy import LAYERS, Reason


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the layers did to one action: every active layer that stops it, with why."""

    action: Action
    stopped_by: tuple[tuple[str, Reason], ...]

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
        stops = []
        for layer in active:
            reason = boundary.stops(layer, action)
            if reason is not None:
                stops.append((layer, reason))
        outcomes.append(Outcome(action, tuple(stops)))
    return Evaluation(active, tuple(outcomes))


def subsets(layers: Iterable[str]) -> list[tuple[str, ...]]:
    """Every subset of ``layers`` (canonical order), smallest first."""
    base = canonical(layers)
    out: list[tuple[str, ...]] = []
    for size in range(len(base) + 1):
        out.extend(itertools.combinations(base, size))
    return out


@dataclass(frozen=True, slots=True)
class Violation:
    """Adding ``added`` to ``layers`` let ``action`` through that ``layers`` stopped."""

    layers: tuple[str, ...]
    added: str
    action: str


def check_monotonic(
    boundary: Boundary, actions: Sequence[Action], layers: Iterable[str] = LAYERS
) -> list[Violation]:
    """Check that adding a layer never opens anything, over every subset of ``layers``.

    Returns the violations (empty when the boundary is monotonic).
    """
    base = canonical(layers)
    through = {s: {a.id for a in evaluate(boundary, actions, s).through} for s in subsets(base)}
    violations = []
    for subset, open_ids in through.items():
        for extra in base:
            if extra in subset:
                continue
            bigger = canonical((*subset, extra))
            for action_id in sorted(through[bigger] - open_ids):
                violations.append(Violation(subset, extra, action_id))
    return violations


def exercised_layers(boundary: Boundary, actions: Sequence[Action]) -> tuple[str, ...]:
    """The layers that stop at least one of ``actions`` (the ones worth switching)."""
    return tuple(
        layer for layer in LAYERS if any(boundary.stops(layer, a) is not None for a in actions)
    )
