"""``stockade discard RUN``: throw an overlay run's layer away (the workspace keeps what it has)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``discard``."""
    parser.add_argument("run", help="the run id of an overlay run (a unique prefix, or last)")


def execute(args: argparse.Namespace) -> int:
    """Remove the layer; exit 0."""
    from stockade.workspace import Layer, discard

    layer = Layer.open(args.run)
    run_id = layer.run_id
    discard(layer)
    print(f"stockade: discarded the layer of run {run_id}", file=sys.stderr)
    return 0
