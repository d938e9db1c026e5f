"""``stockade run``: run a command inside the sandbox."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from stockade._exceptions import EXIT_STOCKADE_ERROR
from stockade.policy import LAYERS
from stockade.policy._model import BACKEND_CHOICES

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

    from stockade.policy import Policy

#: how ``--ask`` asks about hosts that are not on the allow-list
ASK_MODES = ("auto", "tty", "never", "control")
#: option -> (attribute, conversion); the same options add_arguments declares
_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--policy": ("policy", Path),
    "--srt-settings": ("srt_settings", Path),
    "--workspace": ("workspace", Path),
    "--audit": ("audit", Path),
    "--timeout": ("timeout", float),
    "--ask": ("ask", lambda v: ASK_MODES[ASK_MODES.index(v)]),
    "--ask-timeout": ("ask_timeout", float),
    "--control-fd": ("control_fd", int),
    "--upstream-proxy": ("upstream_proxy", str),
    "--backend": ("backend", lambda v: BACKEND_CHOICES[BACKEND_CHOICES.index(v)]),
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
        "ask": "auto",
        "ask_timeout": None,
        "control_fd": None,
        "upstream_proxy": None,
        "backend": None,
        "allow_host": [],
        "disable": [],
        "overlay": False,
        "command": [],
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            ns["command"] = list(argv[i:])
            return SimpleNamespace(**ns) if len(argv) > i + 1 else None
        if arg == "--overlay":
            ns["overlay"] = True
            i += 1
            continue
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
        "--overlay",
        action="store_true",
        help="keep the run's writes in a layer (the workspace stays untouched); review "
        "with 'stockade changes/diff RUN', then 'stockade apply' or 'discard' (docs/overlay.md)",
    )
    parser.add_argument(
        "--audit",
        type=Path,
        metavar="FILE",
        help="append audit events to FILE, outside the workspace and every filesystem.write "
        "path (a log the sandbox can write is refused; default: one file per run in "
        "~/.local/state/stockade/runs)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="kill the whole sandbox after S seconds (exit 124)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        help="the container's runtime for this run: bubblewrap (host kernel), gvisor "
        "(runsc, a kernel of its own; see docs/gvisor.md), landlock (no namespaces, for "
        "hosts that refuse them: Landlock and seccomp alone; see docs/security-model.md) "
        "or auto (bubblewrap, else landlock with [container] allow_degraded); default: "
        "[container] backend",
    )
    parser.add_argument(
        "--upstream-proxy",
        metavar="URL",
        help='chain every allowed connection through this proxy ("http://host:port", or '
        '"env" for HTTPS_PROXY/NO_PROXY); replaces network.upstream.proxy',
    )
    parser.add_argument(
        "--ask",
        choices=ASK_MODES,
        default="auto",
        help="ask about hosts not on the allow-list: on the terminal (tty), over "
        "--control-fd (control), never; auto: the terminal when there is one (see "
        "docs/approval.md)",
    )
    parser.add_argument(
        "--ask-timeout",
        type=float,
        metavar="S",
        help="seconds an answer may take, then denied (default 120; control: 30)",
    )
    parser.add_argument(
        "--control-fd",
        type=int,
        metavar="N",
        help="one end of a socketpair: the harness's control channel (asks out, answers "
        "and live updates in, NDJSON); implies --ask control",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the command and its arguments, after --"
    )


def _approval(
    args: argparse.Namespace | SimpleNamespace, policy: Any, command: list[str]
) -> tuple[Any, Any]:
    """The run's approval broker and control channel, from ``--ask``; (False, None) after
    a usage error was printed; (None, None) when nobody is asked (no broker needed)."""
    if args.control_fd is not None and args.ask in ("never", "tty"):
        # Two answers to "who is asked": refuse rather than pick one silently.
        print(
            f"stockade run: --ask {args.ask} and --control-fd name two ways of asking; "
            "give --control-fd alone (or with --ask control), or drop it",
            file=sys.stderr,
        )
        return False, None
    mode = "control" if args.control_fd is not None else args.ask
    if args.ask_timeout is not None and not 0 < args.ask_timeout < float("inf"):
        print(
            f"stockade run: --ask-timeout {args.ask_timeout:g}: must be a positive number",
            file=sys.stderr,
        )
        return False, None
    if mode == "never" or not policy.layers.egress or policy.network.strict:
        return None, None
    if mode == "control":
        from stockade.api import _broker

        if args.control_fd is None or args.control_fd < 3:
            print(
                "stockade run: --ask control needs --control-fd N (3 or more): one end of a "
                "socketpair the harness made",
                file=sys.stderr,
            )
            return False, None
        import os
        import stat

        try:
            if not stat.S_ISSOCK(os.fstat(args.control_fd).st_mode):
                raise OSError("not a socket")
        except OSError as exc:
            print(f"stockade run: --control-fd {args.control_fd}: {exc}", file=sys.stderr)
            return False, None
        from stockade.egress.approval._control import ControlChannel

        channel = ControlChannel(args.control_fd)
        broker = _broker(policy, channel, args.ask_timeout or 30.0)
        if not channel.start(broker):
            print("stockade: the control channel sent no hello; nothing is asked", file=sys.stderr)
        return broker, channel
    from stockade.runtime._terminal import terminal_opens

    if mode == "auto" and not terminal_opens():
        # No terminal: denied as without asking (host-not-allowed). Checked before the
        # prompt machinery is imported: it brings the whole egress package (~45 ms),
        # which a run with no terminal and no network never needs.
        return None, None
    from stockade.api import _broker
    from stockade.approvers import tty

    prompt = tty()
    if not prompt.available():
        # --ask tty without a terminal: each off-list request is denied, and says why.
        return _broker(policy, _NoTerminal(), args.ask_timeout or 120.0), None
    return _broker(policy, prompt, args.ask_timeout or 120.0), None


class _NoTerminal:
    """``--ask auto`` without a terminal: every ask is ``approval-unavailable``."""

    channel = "tty"

    def available(self) -> bool:
        return False

    def answered_by(self) -> str:
        return "tty:none"

    async def ask(self, request: Any) -> None:
        from stockade.egress.approval import Unanswerable

        raise Unanswerable("no terminal")


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
        return EXIT_STOCKADE_ERROR
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        print(
            f"stockade run: --timeout {args.timeout:g}: must be a positive number of seconds",
            file=sys.stderr,
        )
        return EXIT_STOCKADE_ERROR
    if args.srt_settings is not None:
        if args.policy is not None:
            print(
                "stockade run: --policy and --srt-settings name two policies; give one",
                file=sys.stderr,
            )
            return EXIT_STOCKADE_ERROR
        from stockade.policy._load import add_allowed_hosts
        from stockade.policy._srt import policy_from_srt

        policy = add_allowed_hosts(
            policy_from_srt(args.srt_settings, args.workspace), tuple(args.allow_host)
        )
    else:
        policy = load_policy(
            args.policy, workspace=args.workspace, extra_allow=tuple(args.allow_host)
        )
    if args.upstream_proxy is not None:
        from stockade.policy._load import with_upstream_proxy

        policy = with_upstream_proxy(policy, args.upstream_proxy)
    if args.disable:
        policy = replace(policy, layers=policy.layers.without(*args.disable))
    if args.backend is not None:
        from stockade.policy._model import ContainerPolicy

        policy = replace(
            policy,
            container=ContainerPolicy(
                backend=args.backend, allow_degraded=policy.container.allow_degraded
            ),
        )
    if getattr(args, "overlay", False):
        policy = replace(policy, filesystem=replace(policy.filesystem, overlay=True))
    if policy.filesystem.overlay and not policy.layers.overlay:
        # --disable overlay: the workspace is read-write (as [layers] overlay = false)
        policy = replace(policy, filesystem=replace(policy.filesystem, overlay=False))
    approval, channel = _approval(args, policy, command)
    if approval is False:
        return EXIT_STOCKADE_ERROR
    for hint in policy.hints:
        print(f"stockade: note: {hint}", file=sys.stderr)
    for warning in policy.warnings:
        print(f"stockade: warning: {warning}", file=sys.stderr)
    result = run(
        RunRequest(
            argv=command,
            policy=policy,
            audit_path=args.audit,
            timeout=args.timeout,
            forward_signals=True,
            approval=approval,
            report=_warn,
        )
    )
    if channel is not None:
        channel.close()
    for line in denial_summary(result.denials, result.audit_path, args.policy):
        print(line, file=sys.stderr)
    for line in grace_summary(result.events, policy, args.policy):
        print(line, file=sys.stderr)
    if result.layer is not None:
        print(
            f"stockade: overlay run {result.run_id}: the workspace is untouched; review with "
            f"'stockade changes {result.run_id}', then 'stockade apply {result.run_id}' or "
            f"'stockade discard {result.run_id}'",
            file=sys.stderr,
        )
    return result.returncode


def grace_summary(
    events: Sequence[dict[str, Any]], policy: Policy, policy_file: Path | None = None
) -> list[str]:
    """The lines ``run`` prints after a run in a grace period that let through what the
    policy does not admit: what, and that a person must extend the policy on purpose
    before the period ends (nothing is ever added to it by itself)."""
    from stockade._denials import grace_reports

    seen = grace_reports(events)
    until = policy.network.grace_until
    if not seen or until is None:
        return []
    from stockade.policy._load import user_policy_path

    where = str(policy_file) if policy_file is not None else str(user_policy_path())
    shown = ", ".join(seen[:_TARGETS_SHOWN])
    if len(seen) > _TARGETS_SHOWN:
        shown += f", and {len(seen) - _TARGETS_SHOWN} more"
    line = (
        f"stockade: grace period until {until.isoformat()}: this run needed {len(seen)} "
        f"thing(s) the policy does not admit, let through and reported ({shown}); extend "
        f"{where} on purpose (stockade policy diff, or network.allow and [[network.rules]]) "
        "before then: after it they are refused"
    )
    return ["".join(c if c.isprintable() else "?" for c in line)]


def _warn(line: str) -> None:
    """A run's warning for the person (the runtime hands them here; it prints nothing)."""
    print(line, file=sys.stderr)


#: events with a ``deny`` verdict that are no refusal of the command's: the answer that
#: refused a connection (the connection is listed itself) and a revoke of the policy
_NOT_REFUSALS = ("answer", "policy_change")
#: how many targets the summary names per kind of denial
_TARGETS_SHOWN = 3


def _cli_hint(reason: str, host: str, policy_file: Path | None) -> str | None:
    """What a person can do about one kind of refusal, or None when nothing applies."""
    from stockade.policy._load import user_policy_path

    where = str(policy_file) if policy_file is not None else str(user_policy_path())
    if reason == "host-not-allowed":
        return f"to allow {host}: --allow-host {host}, or network.allow in {where}"
    if reason == "address-not-public":
        return (
            f"{host} resolves to a private or loopback address, which is refused unless "
            f"its address is pinned: add it to network.hosts (and network.allow) in {where}"
        )
    if reason == "port-not-allowed":
        return f'to allow another port of {host}: network.allow = ["{host}:PORT"] in {where}'
    return None


def denial_summary(
    denials: Sequence[dict[str, Any]], audit_path: Path | None, policy_file: Path | None = None
) -> list[str]:
    """The lines ``run`` prints on stderr after a run that had denials: one line that
    counts them by layer and reason and names what was refused, then one hint per kind
    of network refusal that has a fix."""
    from stockade._denials import denial_target

    kinds: dict[str, list[str]] = {}
    hosts: dict[str, str] = {}
    for event in denials:
        if event.get("event") in _NOT_REFUSALS:
            continue
        key = f"{event.get('layer')} {event.get('reason')}"
        kinds.setdefault(key, []).append(denial_target(event))
        host = event.get("host") or event.get("name")
        if host and event.get("layer") == "egress":
            hosts.setdefault(str(event.get("reason")), str(host))
    if not kinds:
        return []
    parts = []
    for key, targets in sorted(kinds.items()):
        named = list(dict.fromkeys(t for t in targets if t))
        shown = ", ".join(named[:_TARGETS_SHOWN])
        if len(named) > _TARGETS_SHOWN:
            shown += f", and {len(named) - _TARGETS_SHOWN} more"
        parts.append(f"{len(targets)} {key}" + (f" ({shown})" if shown else ""))
    total = sum(len(t) for t in kinds.values())
    where = f"; details in {audit_path}" if audit_path else ""
    # A target comes from the sandbox (paths, names): one printable line.
    line = f"stockade: denied {total}: {', '.join(parts)}{where}"
    lines = ["".join(c if c.isprintable() else "?" for c in line)]
    for reason, host in hosts.items():
        hint = _cli_hint(reason, host, policy_file)
        if hint is not None:
            lines.append("".join(c if c.isprintable() else "?" for c in f"stockade: hint: {hint}"))
    return lines
