"""``stockade checkpoints RUN``: the checkpoints of an overlay layer (``Sandbox.checkpoint``)."""

from __future__ import annotations

import json
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``checkpoints``."""
    parser.add_argument("run", help="the run id of an overlay layer (a unique prefix, or last)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


def execute(args: argparse.Namespace) -> int:
    """List the checkpoints; exit 0."""
    from stockade.policy._text import for_terminal
    from stockade.workspace import Layer, checkpoints

    layer = Layer.open(args.run)
    points = checkpoints(layer)
    if args.json:
        print(json.dumps({"run": layer.run_id, "checkpoints": points}, indent=1))
        return 0
    for point in points:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(point.get("created", 0)))
        # a name an agent may have chosen (the MCP server's checkpoint tool)
        print(
            for_terminal(f"{point['name']:<24} {when}  ({point.get('seconds', 0):.2f} s to make)")
        )
    if not points:
        print(f"run {layer.run_id}: no checkpoints")
    return 0
