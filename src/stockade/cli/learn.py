"""``stockade learn [--runs N] [-o RUN_DIR] -- CMD``: run a task in learning mode.

Nothing the task needs is refused (docs/learn.md says what learning changes: every host
name, never a metadata or private address; the host's configuration directories readable,
writes there kept in a throwaway copy-on-write view) and everything is recorded in
RUN_DIR for ``stockade policy suggest``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``learn``."""
    parser.usage = "stockade learn [--runs N] [-o RUN_DIR] [--policy FILE] [--see DIR] -- CMD..."
    parser.add_argument("--runs", type=int, default=1, help="run the task N times (merged)")
    parser.add_argument(
        "-o",
        "--out",
        help="the run directory, outside the workspace "
        "(default: a new one under $XDG_STATE_HOME/stockade/learn)",
    )
    parser.add_argument("--policy", help="the policy learning starts from")
    parser.add_argument("--workspace", help="the read-write root (default: the policy's)")
    parser.add_argument(
        "--see",
        action="append",
        default=[],
        metavar="DIR",
        help="make a host directory readable in learning (besides /etc, /opt, /srv, ...); "
        "the task's writes there land in a throwaway view, recorded, never on the host",
    )
    parser.add_argument("--timeout", type=float, help="wall-time limit of each run, in seconds")
    parser.add_argument("command", nargs="+", help="the task (after --)")


def execute(args: argparse.Namespace) -> int:
    """Learn; print where the observations are; exit with the last run's status."""
    import sys

    from stockade._exceptions import PolicyError
    from stockade.learning import learn

    if args.runs < 1:
        raise PolicyError(f"--runs {args.runs}: learn at least once")
    result = learn(
        args.command,
        policy=args.policy,
        workspace=args.workspace,
        out=args.out,
        runs=args.runs,
        see=args.see,
        timeout=args.timeout,
    )
    # The task's output was captured (its digest is what verify compares): written out
    # here, to a terminal it passes the relay's filter, as a run's output would
    # (runtime/_escapes.py: no clipboard, no answer typed into the shell).
    for stream, data in ((sys.stdout, result.stdout), (sys.stderr, result.stderr)):
        if data and stream.isatty():
            from stockade.runtime._escapes import TerminalFilter

            data = TerminalFilter().feed(data)
        stream.buffer.write(data or b"")
        stream.flush()
    counts: dict[str, int] = {}
    for obs in result.observations:
        counts[obs["kind"]] = counts.get(obs["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(
        f"stockade: learnt {len(result.returncodes)} run(s) into {result.run_dir} ({summary}); "
        f"files seen by {result.mechanism}. Next: stockade policy suggest {result.run_dir}",
        file=sys.stderr,
    )
    return result.returncodes[-1]
