"""``stockade diff RUN [PATHS]``: a unified diff of what an overlay run changed."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``diff``."""
    parser.usage = "stockade diff [--json] RUN [PATHS...]"
    parser.add_argument("run", help="the run id of an overlay run (a unique prefix, or last)")
    parser.add_argument("paths", nargs="*", help="only changes at or below these paths")
    parser.add_argument(
        "--json",
        action="store_true",
        help="each change with its exact diff, as JSON (the text output escapes control characters)",
    )


def execute(args: argparse.Namespace) -> int:
    """Print the diff; exit 0."""
    import sys

    from stockade.policy._text import for_terminal
    from stockade.workspace import Layer, changes
    from stockade.workspace._diff import diff_one

    layer = Layer.open(args.run)
    found = changes(layer, tuple(args.paths))
    if args.json:
        doc = {
            "run": layer.run_id,
            "changes": [{**c.to_json(), "diff": diff_one(layer, c)} for c in found],
        }
        print(json.dumps(doc, indent=1))
        return 0
    for change in found:
        # The sandbox wrote these bytes: shown with control characters escaped, so none
        # can move the cursor over, erase or disguise a line of the diff (--json has the
        # exact text).
        sys.stdout.write(for_terminal(diff_one(layer, change)))
    return 0
