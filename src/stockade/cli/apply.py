"""``stockade apply RUN [PATHS]``: write an overlay run's changes into the real workspace.

Each file is applied atomically, after a three-way check against the file as it was
when the run began; protected paths, paths below a symlink and symlinks leading out of
the workspace are refused and named. Exit 0 when everything asked for was applied, 1
when something was refused.
"""

from __future__ import annotations

import json
import sys

from stockade.policy._text import for_terminal

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from stockade.workspace import Change


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``apply``."""
    parser.usage = "stockade apply [--json] [--dry-run] [--interactive] RUN [PATHS...]"
    parser.add_argument("run", help="the run id of an overlay run (a unique prefix, or last)")
    parser.add_argument("paths", nargs="*", help="only changes at or below these paths")
    parser.add_argument("--json", action="store_true", help="the outcomes as JSON")
    parser.add_argument("--dry-run", action="store_true", help="check, write nothing")
    parser.add_argument(
        "--interactive", "-i", action="store_true", help="ask about each change on the terminal"
    )


def _ask(change: Change) -> bool:
    from stockade.workspace import Layer  # noqa: F401 (kept light: imported lazily)

    while True:
        try:
            answer = input(f"{for_terminal(change.describe())}  apply? [y/n/d(iff)/q] ")
            answer = answer.strip().lower()
        except EOFError:
            return False
        if answer in ("y", "yes"):
            return True
        if answer in ("n", "no", ""):
            return False
        if answer in ("q", "quit"):
            raise KeyboardInterrupt
        if answer in ("d", "diff"):
            sys.stdout.write(for_terminal(_ask_diff(change)))


_LAYER = None


def _ask_diff(change: Change) -> str:
    from stockade.workspace._diff import diff_one

    assert _LAYER is not None
    return diff_one(_LAYER, change)


def execute(args: argparse.Namespace) -> int:
    """Apply; print one line per change; exit 0, or 1 when something was refused."""
    global _LAYER
    from stockade.policy import load_policy
    from stockade.workspace import Layer, apply

    layer = Layer.open(args.run)
    _LAYER = layer
    if args.interactive and not sys.stdin.isatty():
        print("stockade apply: --interactive needs a terminal on stdin", file=sys.stderr)
        return 2
    protect: tuple[str, ...] = ()
    try:
        protect = load_policy(None, workspace=layer.workspace).filesystem.protect
    except Exception:  # the extra protections are an addition; the built-in set stays
        protect = ()
    outcomes = apply(
        layer,
        tuple(args.paths),
        protect=protect,
        dry_run=args.dry_run,
        choose=_ask if args.interactive else None,
    )
    refused = [o for o in outcomes if o.action == "refused"]
    if args.json:
        print(
            json.dumps({"run": layer.run_id, "outcomes": [o.to_json() for o in outcomes]}, indent=1)
        )
    else:
        for o in outcomes:
            tail = f": {o.reason}" if o.reason else ""
            print(for_terminal(f"{o.action:<8} {o.kind:<9} {o.path}{tail}"))
    return 1 if refused else 0
