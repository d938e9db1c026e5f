"""``stockade policy suggest|verify|diff``: from learning runs to a proven policy.

* ``suggest RUN... [-o FILE] [--verify -- CMD]``: the smallest policy admitting what the
  learning runs observed, as commented TOML (docs/learn.md states the rules); with
  ``--verify`` it is written only when ``verify`` passes.
* ``verify POLICY [--learned RUN] -- CMD``: re-run the task under POLICY (needed actions
  broken must be 0), then the probe's attack scenario under it: both counts.
* ``diff POLICY RUN...``: what later runs needed that POLICY does not admit.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from stockade.learning import VerifyResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the sub-commands of ``policy``."""
    parser.usage = (
        "stockade policy suggest RUN... [-o FILE] [--grace DAYS] [--verify -- CMD...]\n"
        "       stockade policy verify POLICY [--learned RUN] [--no-attacks] -- CMD...\n"
        "       stockade policy diff POLICY RUN..."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("suggest", help="the smallest policy admitting the observations")
    s.add_argument("runs", nargs="+", help="learn run directories (merged)")
    s.add_argument("-o", "--out", help="write the policy here (default: standard output)")
    s.add_argument("--verify", action="store_true", help="write it only when verify passes")
    s.add_argument("--no-attacks", action="store_true", help="with --verify: skip the scenario")
    s.add_argument(
        "--grace",
        type=int,
        default=0,
        metavar="DAYS",
        help="the policy states a grace period of DAYS (at most 90): until it ends, what it "
        "does not admit is reported, not refused (docs/learn.md)",
    )
    v = sub.add_parser("verify", help="re-run the task and the attack scenario under a policy")
    v.add_argument("policy", help="the policy file")
    v.add_argument("--learned", action="append", default=[], help="learn run directory")
    v.add_argument("--workspace", help="the read-write root (default: the policy's)")
    v.add_argument("--no-attacks", action="store_true", help="skip the attack scenario")
    d = sub.add_parser("diff", help="what later runs needed that the policy does not admit")
    d.add_argument("policy", help="the policy file")
    d.add_argument("runs", nargs="+", help="learn run directories")
    for p in (s, v):
        p.set_defaults(command=[])


def fast_parse(args: list[str]) -> argparse.Namespace | None:
    """Split the task off at ``--`` (argparse would take it for sub-command arguments)."""
    if "--" not in args:
        return None
    import sys

    from stockade.cli import VERBS, _parser

    cut = args.index("--")
    ns = _parser("policy", VERBS["policy"][1], sys.modules[__name__]).parse_args(args[:cut])
    ns.command = args[cut + 1 :]
    return ns


def _print_verify(result: VerifyResult) -> None:
    import sys

    from stockade.policy._text import one_line

    print(f"needed actions broken: {len(result.broken)}", file=sys.stderr)
    for line in result.broken:
        # observations name what the sandbox chose (paths): one escaped line each
        print(f"  broken: {one_line(line)}", file=sys.stderr)
    if result.open is not None:
        print(
            f"unneeded actions open: {len(result.open)} "
            f"(of {len(result.open) + len(result.stopped)} in the attack scenario)",
            file=sys.stderr,
        )
        for action, why in result.open:
            print(f"  open: {action}: {why}", file=sys.stderr)


def execute(args: argparse.Namespace) -> int:
    """Exit 0 on success; 1 when verify finds a needed action broken (or drift)."""
    import sys
    from pathlib import Path

    from stockade._exceptions import PolicyError
    from stockade.learning import RunDir, drift, suggest_from, verify

    if args.action == "suggest":
        suggestion = suggest_from(args.runs, grace_days=args.grace)
        text = suggestion.to_toml()
        if args.verify:
            if not args.command:
                raise PolicyError("suggest --verify needs the task after --")
            if not args.out:
                raise PolicyError("suggest --verify needs -o FILE (written only when it passes)")
            workspace = RunDir(Path(args.runs[-1])).summary()["runs"][-1]["workspace"]
            candidate = Path(args.out + ".candidate")
            candidate.write_text(text, encoding="utf-8")
            try:
                result = verify(
                    candidate,
                    args.command,
                    learned=args.runs,
                    workspace=workspace,
                    attacks=not args.no_attacks,
                )
            finally:
                candidate.unlink()
            _print_verify(result)
            if not result.passed:
                print("stockade: the suggestion breaks the task; not written", file=sys.stderr)
                return 1
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
            print(f"stockade: wrote {args.out}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    if args.action == "verify":
        if not args.command:
            raise PolicyError("verify needs the task after --")
        result = verify(
            args.policy,
            args.command,
            learned=args.learned,
            workspace=args.workspace,
            attacks=not args.no_attacks,
        )
        _print_verify(result)
        return 0 if result.passed else 1
    lines = drift(args.policy, args.runs)
    from stockade.policy._text import one_line

    for line in lines:
        print(one_line(line))  # what later runs did, named by the sandbox: one line each
    if not lines:
        print("stockade: the policy admits everything these runs needed", file=sys.stderr)
    return 1 if lines else 0
