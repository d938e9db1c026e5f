"""``stockade check``: validate a policy and print the effective policy."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stockade._roots import Narrowed
    from stockade.policy import Policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``check``."""
    parser.add_argument(
        "file", nargs="?", type=Path, help="policy file, as --policy (the older spelling)"
    )
    parser.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="policy file (default: the search order of run), as run and explain take it",
    )
    parser.add_argument("--workspace", type=Path, metavar="DIR", help="workspace to check against")
    parser.add_argument("--json", action="store_true", help="print the effective policy as JSON")
    parser.add_argument(
        "--plan",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="print the plan of a run of COMMAND (default: true) under this policy: "
        "backend, tools, mounts, limits, terminal, egress listeners, audit log; nothing "
        "is started. Put it last: what follows is the command",
    )


def fast_parse(argv: list[str]) -> argparse.Namespace | None:
    """``check [OPTIONS] --plan [--] COMMAND...``: everything after ``--plan`` is the
    command, ``--`` and options included (argparse would take them for its own); None
    without ``--plan`` (argparse parses it all)."""
    if "--plan" not in argv:
        return None
    at = argv.index("--plan")
    parser = argparse.ArgumentParser(prog="stockade check")
    add_arguments(parser)
    args = parser.parse_args(argv[:at])
    command = argv[at + 1 :]
    args.plan = command[1:] if command[:1] == ["--"] else command
    return args


def execute(args: argparse.Namespace) -> int:
    """Print the effective policy and any notes; exit 125 on an invalid policy."""
    from stockade._exceptions import PolicyError
    from stockade.policy import load_policy
    from stockade.policy._units import format_size

    if args.policy is not None and args.file is not None and args.policy != args.file:
        raise PolicyError(f"check: --policy {args.policy} and {args.file} name two policies")
    args.file = args.policy if args.policy is not None else args.file
    policy = load_policy(args.file, workspace=args.workspace)
    for hint in policy.hints:
        print(f"stockade: note: {hint}", file=sys.stderr)
    if args.plan is not None:
        return _print_plan(policy, args.plan, as_json=args.json)
    data = policy.to_dict()
    ws_policy = _workspace_policy(policy) if args.file is None else None
    narrowed = _narrowed(policy)
    net_grace = _grace(policy)
    if args.json:
        data["sources"] = list(policy.sources)
        data["notes"] = list(policy.notes)
        data["warnings"] = list(policy.warnings)
        data["digest"] = policy.digest()
        if ws_policy is not None:
            data["workspace_policy"] = {"path": str(ws_policy[0]), "trust": ws_policy[1]}
        data["narrowed"] = [n.describe() for n in narrowed]
        if net_grace is not None:
            data["grace"] = net_grace
        print(json.dumps(data, indent=2))
        return 0
    print(f"policy: {' + '.join(policy.sources)}  ({policy.digest()[:19]})")
    if ws_policy is not None:
        path, state = ws_policy
        says = {
            "trusted": "trusted (pinned with stockade trust): read as your own policy",
            "changed": "CHANGED since you trusted it: it may only tighten until you run "
            f"stockade trust {path} again",
            "untrusted": "untrusted: it may only tighten your policy "
            f"(stockade trust {path} lets it widen)",
        }
        print(f"workspace policy  {path}: {says[state]}")
    for item in narrowed:
        print(f"narrowed    {item.describe()}")
    fs = policy.filesystem
    print(f"workspace   {fs.workspace}  (read-write)")
    for p in fs.read:
        print(f"read        {p}")
    for p in fs.write:
        print(f"write       {p}")
    for g in fs.deny:
        print(f"deny        {g}")
    for g in fs.protect:
        print(f"protect     {g}")
    net = policy.network
    print(f"network     {', '.join(net.allow) if net.allow else 'none (no host is reachable)'}")
    for h in net.deny:
        print(f"  deny      {h}")
    for name, addr in net.hosts.items():
        print(f"  pin       {name} -> {addr}")
    if net_grace is not None:
        print(f"  GRACE     {net_grace['says']}")
    for rule in net.rules:
        # The request rules decide inspected requests: the human view shows them as the
        # JSON view does, in file order (the first match wins).
        methods = ",".join(rule.methods) if rule.methods else "any method"
        print(
            f"  rule      {rule.name}: {rule.action} {methods} {rule.host} {' '.join(rule.paths)}"
        )
    env = policy.env
    if env.pass_:
        print(
            f"env pass    {', '.join(e.name + (' (secret)' if e.allow_secret else '') for e in env.pass_)}"
        )
    for name in env.set:
        print(f"env set     {name}")
    lim = policy.limits
    print(
        f"limits      pids {lim.pids}, memory {format_size(lim.memory)}, file size "
        f"{format_size(lim.file_size)}, cpu {lim.cpu_seconds or 'unlimited'}"
        f"{'s' if lim.cpu_seconds else ''}, wall {f'{lim.wall_seconds:g}s' if lim.wall_seconds else 'unlimited'}"
    )
    active = policy.layers.active()
    off = [name for name in data["layers"] if name not in active]
    print(f"layers      {', '.join(active)}" + (f"  (OFF: {', '.join(off)})" if off else ""))
    for note in policy.notes:
        print(f"note        {note}")
    for warning in policy.warnings:
        print(f"WARNING     {warning}")
    return 0


def _grace(policy: Policy) -> dict[str, object] | None:
    """The policy's grace period as ``check`` shows it (None when it states none)."""
    from stockade.policy._network import grace_in_force

    until = policy.network.grace_until
    if until is None:
        return None
    if grace_in_force(policy.network):
        says = (
            f"in force until {until.isoformat()} (UTC): a host or request this policy does "
            "not admit is let through and reported (rule grace), not refused; deny entries, "
            "deny rules and address checks are enforced; after it, all of it is"
        )
    else:
        says = f"ended {until.isoformat()}: the policy is enforced as written"
    return {
        "until": until.isoformat(),
        "in_force": bool(grace_in_force(policy.network)),
        "says": says,
    }


def _print_plan(policy: Policy, command: list[str], *, as_json: bool) -> int:
    """Plan a run of ``command`` as ``stockade run`` would (:mod:`stockade.runtime._plan`)
    and print it; nothing is started, no file is written."""
    import shlex

    from stockade.runtime._plan import plan
    from stockade.runtime._request import RunRequest

    warnings: list[str] = []
    planned = plan(RunRequest(argv=command or ["true"], policy=policy), warnings.append)
    data = planned.describe()
    data["warnings"] = warnings
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{'argv':<24}{shlex.join(data.pop('argv'))}")
    for key, value in data.items():
        _print_field(key, value)
    return 0


def _print_field(key: str, value: object) -> None:
    """One line per value, nested keys joined with dots (``limits.pids  256``)."""
    if isinstance(value, dict):
        for sub, item in value.items():
            _print_field(f"{key}.{sub}", item)
    elif isinstance(value, list):
        if not value:
            print(f"{key:<24}(none)")
        for item in value:
            print(f"{key:<24}{item}")
    else:
        shown = "-" if value is None else str(value).lower() if isinstance(value, bool) else value
        print(f"{key:<24}{shown}")


def _workspace_policy(policy: Policy) -> tuple[Path, str] | None:
    """The workspace ``stockade.toml`` this policy was composed with, and its trust."""
    from stockade.policy._load import WORKSPACE_POLICY
    from stockade.policy._trust import TrustStore

    for source in policy.sources:
        trusted = source.endswith(" (trusted)")
        path = Path(source.removesuffix(" (trusted)"))
        if path.name != WORKSPACE_POLICY:
            continue
        if trusted:
            return path, "trusted"
        try:
            state = TrustStore().status(path, path.read_bytes())
        except OSError:
            state = "untrusted"
        return path, "changed" if state == "changed" else "untrusted"
    return None


def _narrowed(policy: Policy) -> tuple[Narrowed, ...]:
    """stockade's own directories that a grant of ``policy`` would have exposed."""
    from stockade import _roots

    fs = policy.filesystem
    return _roots.narrowed((fs.workspace, *fs.write), visible=fs.read)
