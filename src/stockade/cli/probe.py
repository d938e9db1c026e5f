"""``stockade probe``: run a scenario for real under every subset of layers.

Builds a throw-away world (temporary HOME with canaries, servers on 127.0.0.1 only),
runs the scenario's "test suite" under each subset of the switchable layers, and prints
the model's prediction beside what really happened. Exit status: 0 when model and
reality agree on every cell and every switchable layer could be measured; 1 on any
disagreement; 3 when some layer is not enforceable in this build; 125 when
``--backend gvisor`` is asked for and there is no usable runsc (never a fallback to
bubblewrap).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stockade.policy import LAYERS
from stockade.policy._model import BACKENDS


def _layers(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in LAYERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown layer {unknown[0]!r}; layers are {', '.join(LAYERS)}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``stockade probe``."""
    from stockade.probe.scenarios import SCENARIOS

    parser.add_argument(
        "--scenario", choices=SCENARIOS, default="seed", help="which scenario (default: seed)"
    )
    parser.add_argument(
        "--layers",
        type=_layers,
        default=None,
        help="comma-separated layers to switch (default: those the scenario exercises)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="bubblewrap",
        help="the container's runtime for every run: bubblewrap (host kernel), gvisor "
        "(runsc, a kernel of its own; container and egress then stay on in every run, "
        "see docs/gvisor.md) or landlock (no namespaces; the model predicts each row "
        "under it, see docs/security-model.md); default: bubblewrap",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="also write a self-contained HTML report"
    )
    parser.add_argument(
        "--cost-runs",
        type=int,
        default=5,
        metavar="N",
        help="runs of `true` per cost figure, median taken (0: skip)",
    )


def execute(args: argparse.Namespace) -> int:
    """Run the probe and print the report."""
    from stockade.probe import _terminal
    from stockade.probe._html import render_html
    from stockade.probe._runner import probe

    report = probe(
        args.scenario, args.layers, backend=args.backend, cost_repeat=max(args.cost_runs, 0)
    )
    data = report.to_json()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        sys.stdout.write(_terminal.render(data, colour=_terminal.use_colour(sys.stdout)))
    if args.html is not None:
        args.html.write_text(render_html(data), encoding="utf-8")
        if not args.json:
            print(f"  HTML report: {args.html}")
    return report.exit_code
