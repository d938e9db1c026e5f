"""``stockade run``: run a command inside the sandbox."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from stockade.policy import LAYERS

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

#: option -> (attribute, conversion); the same options add_arguments declares
_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--policy": ("policy", Path),
    "--srt-settings": ("srt_settings", Path),
    "--workspace": ("workspace", Path),
    "--audit": ("audit", Path),
    "--timeout": ("timeout", float),
}
_LISTS = {"--allow-host": "allow_host", "--disable": "disable"}


def fast_parse(argv: Sequence[str]) -> SimpleNamespace | None:
    """Parse the common forms of ``run``'s arguments without argparse, or return None.

    None (for ``--help``, an unknown option, a missing or bad value, no command) sends
    the arguments to argparse, which gives the error or the help; for everything it
    accepts, the result equals argparse's (tests/cli/test_run_args.py checks that).
    """
    ns: dict[str, Any] = {
        "policy": None,
        "srt_settings": None,
        "workspace": None,
        "audit": None,
        "timeout": None,
        "allow_host": [],
        "disable": [],
        "command": [],
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            ns["command"] = list(argv[i:])
            return SimpleNamespace(**ns) if len(argv) > i + 1 else None
        name, eq, value = arg.partition("=")
        if name in _VALUES or name in _LISTS:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            if name in _VALUES:
                key, convert = _VALUES[name]
                try:
                    ns[key] = convert(value)
                except ValueError:
                    return None
            elif name == "--disable" and value not in LAYERS:
                return None
            else:
                ns[_LISTS[name]].append(value)
            i += 1
            continue
        if arg.startswith("-"):
            return None
        ns["command"] = list(argv[i:])
        return SimpleNamespace(**ns)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``run``."""
    import argparse

    parser.usage = "stockade run [OPTIONS] -- COMMAND [ARGS...]"
    parser.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="policy file (default: search order, see docs/policy.md)",
    )
    parser.add_argument(
        "--srt-settings",
        type=Path,
        metavar="FILE",
        help="use an Anthropic sandbox-runtime settings file as the policy (see docs/srt.md)",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="read-write root (default: policy, else current directory)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="add a host to network.allow (repeatable)",
    )
    parser.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="LAYER",
        choices=LAYERS,
        help=f"switch a layer off for this run (repeatable): {', '.join(LAYERS)}",
    )
    parser.add_argument(
        "--audit",
        type=Path,
        metavar="FILE",
        help="append audit events to FILE (default: one file per run in ~/.local/state/stockade/runs)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="kill the whole sandbox after S seconds (exit 124)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command and its arguments, after --"
    )


def execute(args: argparse.Namespace | SimpleNamespace) -> int:
    """Run the command; return its exit code (or stockade's own, see DESIGN §4 rule 11)."""
    from stockade._record import replace
    from stockade.policy import load_policy
    from stockade.runtime import RunRequest
    from stockade.runtime import execute as run

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "stockade run: no command given; usage: stockade run [OPTIONS] -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        print(
            f"stockade run: --timeout {args.timeout:g}: must be a positive number of seconds",
            file=sys.stderr,
        )
        return 2
    if args.srt_settings is not None:
        if args.policy is not None:
            print(
                "stockade run: --policy and --srt-settings name two policies; give one",
                file=sys.stderr,
            )
            return 2
        from stockade.policy._load import add_allowed_hosts
        from stockade.policy._srt import policy_from_srt

        policy = add_allowed_hosts(
            policy_from_srt(args.srt_settings, args.workspace), tuple(args.allow_host)
        )
    else:
        policy = load_policy(
            args.policy, workspace=args.workspace, extra_allow=tuple(args.allow_host)
        )
    if args.disable:
        policy = replace(policy, layers=policy.layers.without(*args.disable))
    for warning in policy.warnings:
        print(f"stockade: warning: {warning}", file=sys.stderr)
    result = run(
        RunRequest(
            argv=command,
            policy=policy,
            audit_path=args.audit,
            timeout=args.timeout,
            forward_signals=True,
        )
    )
    denials = result.denials
    if denials:
        counts: dict[str, int] = {}
        for event in denials:
            key = f"{event.get('layer')} {event.get('reason')}"
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        where = f"; details in {result.audit_path}" if result.audit_path else ""
        print(f"stockade: denied {len(denials)}: {summary}{where}", file=sys.stderr)
    return result.returncode
