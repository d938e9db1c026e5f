"""``stockade changes RUN``: what an overlay run changed (its layer, not yet applied).

``stockade changes --list`` lists the layers kept in the state directory.
"""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``changes``."""
    parser.usage = "stockade changes [--json] RUN [PATHS...] | stockade changes --list"
    parser.add_argument(
        "run", nargs="?", help="the run id of an overlay run (a unique prefix, or last)"
    )
    parser.add_argument("paths", nargs="*", help="only changes at or below these paths")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--list", action="store_true", help="list the overlay layers kept")


def execute(args: argparse.Namespace) -> int:
    """Print the changes; exit 0 (125 when the layer cannot be read)."""
    from stockade.policy._text import for_terminal
    from stockade.workspace import Layer, changes

    if args.list or args.run is None:
        rows = []
        for layer in Layer.all():
            meta = layer.meta
            rows.append(
                {
                    "run": meta["run_id"],
                    "state": layer.state,
                    "workspace": meta["workspace"],
                    "changes": len(changes(layer)),
                    "layer": str(layer.root),
                }
            )
        if args.json:
            print(json.dumps({"layers": rows}, indent=1))
        elif not rows:
            print("no overlay layers", file=sys.stderr)
        for row in rows if not args.json else []:
            print(
                for_terminal(
                    f"{row['run']}  {row['state']:<11} {row['changes']:>6} changes  {row['workspace']}"
                )
            )
        return 0
    layer = Layer.open(args.run)
    found = changes(layer, tuple(args.paths))
    if args.json:
        doc = {
            "run": layer.run_id,
            "state": layer.state,
            "workspace": str(layer.workspace),
            "changes": [c.to_json() for c in found],
        }
        print(json.dumps(doc, indent=1))
        return 0
    for change in found:
        # names the sandbox chose: no escape sequence reaches the reviewer's terminal
        print(for_terminal(change.describe()))
    if not found:
        print(f"run {layer.run_id}: no changes", file=sys.stderr)
    return 0
