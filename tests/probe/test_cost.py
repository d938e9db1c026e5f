"""A layer's start-up cost in the probe's report: never negative, always with its spread.

The cost is the median of paired differences (every layer on, then all but one, in the
same turn); a difference not above its spread is reported as "below noise", never as
a layer that makes a command faster (#24, polish list).
"""

from __future__ import annotations

from stockade.probe._runner import layer_cost
from stockade.probe._terminal import cost_text


def test_noise_is_never_a_negative_cost() -> None:
    # Without the layer the command happened to be slower twice: the old computation
    # (median with minus median without) said -4 ms.
    cost, spread = layer_cost([50.0, 52.0, 51.0], [55.0, 49.0, 56.0])
    assert cost == 0.0
    assert spread > 0
    assert cost_text(cost, spread) == f"below noise (± {spread:.1f} ms)"


def test_a_real_cost_is_shown_with_its_spread() -> None:
    # The twin: a layer that adds 9-11 ms in every turn, whatever the machine does.
    cost, spread = layer_cost([60.0, 80.0, 70.0], [50.0, 71.0, 59.0])
    assert cost == 10.0
    assert spread == 1.0
    assert cost_text(cost, spread) == "+10.0 ± 1.0 ms"


def test_a_difference_within_its_spread_is_noise() -> None:
    cost, spread = layer_cost([10.0, 10.0, 10.0], [9.0, 10.0, 5.0])
    # median difference 1.0, spread (5 - 0) / 2 = 2.5: not above it
    assert (cost, spread) == (0.0, 2.5)


def test_not_measured_is_empty() -> None:
    assert cost_text(None, None) == ""
    assert layer_cost([], []) == (0.0, 0.0)
