"""``stockade review RUN``: an overlay run's file changes beside its network decisions."""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``review``."""
    parser.add_argument("run", help="the run id of an overlay run (a unique prefix, or last)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


def execute(args: argparse.Namespace) -> int:
    """Print the review; exit 0."""
    from stockade.policy._text import for_terminal
    from stockade.workspace import Layer
    from stockade.workspace._review import render, review

    doc = review(Layer.open(args.run))
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        sys.stdout.write(for_terminal(render(doc)))  # names and hosts the sandbox chose
    return 0
