"""``stockade log``: read, filter and follow the audit logs.

By default every file under ``$XDG_STATE_HOME/stockade/runs`` is read (one per run of
``stockade run``, one per ``stockade mcp`` server), oldest first; ``--file`` names
others. Output is one line per event, or one JSON object per line with ``--json``.
``--verify`` checks each log's hash chain instead (see :mod:`stockade.audit._chain`), and
each run against the head recorded when it ended (:mod:`stockade.audit._record`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from stockade._exceptions import EXIT_STOCKADE_ERROR

Event = dict[str, Any]

#: How often --follow looks for new lines and new files.
POLL_SECONDS = 0.2
#: ``--verify``: every chain holds, but a run has no record, so who wrote it is unknown
EXIT_UNRECORDED = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``log``."""
    parser.add_argument(
        "--file",
        type=Path,
        action="append",
        default=[],
        metavar="F",
        help="read this audit file (repeatable; default: every file under the state directory)",
    )
    parser.add_argument("--run", metavar="ID", help="only the run whose id starts with ID")
    parser.add_argument(
        "--verdict",
        choices=("allow", "deny", "report", "pending"),
        help="only this verdict (pending: an ask waiting for its answer)",
    )
    parser.add_argument(
        "--layer", metavar="L", help="only events of this layer (files, egress, ...)"
    )
    parser.add_argument("--host", metavar="H", help="only events about host H or a subdomain of it")
    parser.add_argument(
        "--event", metavar="E", help="only events of this type (run_start, denied, ...)"
    )
    parser.add_argument(
        "--denials", action="store_true", help="group the denials by layer and reason, with counts"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new events (of --file, or of every run) until interrupted",
    )
    parser.add_argument(
        "--verify",
        nargs="?",
        const="",
        metavar="FILE",
        help="check the hash chain of FILE (default: of --file, or of every log) and name "
        "the first event that was edited, removed, reordered or cut, then check each run "
        "against the head stockade recorded when it ended; exit 1 if any run fails, "
        f"{EXIT_UNRECORDED} if every chain holds but a run has no record (its authorship "
        "cannot be checked)",
    )


def _audit_files(args: argparse.Namespace) -> list[Path]:
    if args.file:
        return list(args.file)
    from stockade.runtime._state import default_audit_dir

    root = default_audit_dir()
    files = [p for p in root.glob("*.jsonl") if p.is_file()] if root.is_dir() else []
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def _parse(line: str) -> Event | None:
    line = line.strip()
    if not line:
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None  # a torn or foreign line: skipped, as read_events does
    return value if isinstance(value, dict) else None


def _matches(event: Event, args: argparse.Namespace) -> bool:
    if args.run and not str(event.get("run_id", "")).startswith(args.run):
        return False
    if args.verdict and event.get("verdict") != args.verdict:
        return False
    if args.layer and event.get("layer") != args.layer:
        return False
    if args.event and event.get("event") != args.event:
        return False
    if args.host:
        host = str(event.get("host", "")).lower().rstrip(".")
        want = args.host.lower().rstrip(".")
        if host != want and not host.endswith("." + want):
            return False
    return not (args.denials and event.get("verdict") != "deny")


def _when(event: Event) -> str:
    stamp = event.get("time")
    if isinstance(stamp, int | float):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return "-"


def format_event(event: Event) -> str:
    """One event as one human-readable line: time, run, event, layer, verdict, reason, target."""
    from stockade._denials import denial_target

    target = denial_target(event)
    if not target and event.get("event") == "run_start":
        target = " ".join(str(a) for a in event.get("argv", []))
    elif not target and event.get("event") == "run_end":
        target = f"exit {event.get('returncode')}"
    if event.get("event") == "dns_query" and event.get("type"):
        target = f"{target} ({event['type']} query)"
    elif event.get("mode") == "transparent":
        target = f"{target} (captured)"
    # An ask, its answer and the connections it decided carry one ask id: shown side by
    # side, so that a reader sees who let a connection through (or refused it).
    ask = event.get("ask_id") or _ask_of(str(event.get("rule", "")))
    if ask:
        extra = ""
        if event.get("event") == "answer":
            extra = f" {event.get('scope', '')} by {event.get('answered_by') or '-'}"
        elif event.get("event") == "ask":
            extra = f" via {event.get('channel', '-')}, {event.get('waiting', 1)} waiting"
        target = f"{target} [ask {ask}{extra}]"
    elif event.get("event") == "policy_change":
        changes = [*event.get("add", []), *(f"revoke {r}" for r in event.get("remove", []))]
        target = (
            f"generation {event.get('generation')}: {', '.join(changes)} ({event.get('source')})"
        )
    fields = [
        _when(event),
        str(event.get("run_id", "-")),
        str(event.get("event", "-")),
        str(event.get("layer") or "-"),
        str(event.get("verdict") or "-"),
        str(event.get("reason") or "-"),
    ]
    when, run, kind, layer, verdict, reason = fields
    # Columns as wide as the longest event name (policy_change) and verdict (pending).
    text = f"{when}  {run:<12}  {kind:<13} {layer:<9} {verdict:<7} {reason:<18} {target}".rstrip()
    # A target comes from the sandbox (paths, host names): keep one event on one line.
    return "".join(c if c.isprintable() else "?" for c in text)


def _ask_of(rule: str) -> str:
    """The ask id in a decision's rule (``grant:a3``, ``ask:a3``), if any."""
    for prefix in ("grant:a", "ask:a"):
        if rule.startswith(prefix) and rule[len(prefix) :].isdigit():
            return rule.split(":", 1)[1]
    return ""


def _emit(event: Event, as_json: bool) -> None:
    if as_json:
        print(json.dumps(event, separators=(",", ":"), default=str), flush=True)
    else:
        print(format_event(event), flush=True)


def _read(files: Iterable[Path], unreadable: list[Path] | None = None) -> Iterator[Event]:
    """The events of ``files``; a file that cannot be read, or that has text but not one
    event (not an audit log), is reported on stderr and added to ``unreadable``."""
    for path in files:
        found = text = False
        try:
            with path.open(encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    text = text or bool(line.strip())
                    event = _parse(line)
                    if event is not None:
                        found = True
                        yield event
        except OSError as exc:
            print(f"stockade log: cannot read {path}: {exc.strerror}", file=sys.stderr)
            if unreadable is not None:
                unreadable.append(path)
            continue
        if text and not found:
            print(
                f"stockade log: {path}: no audit events in it (not an audit log)", file=sys.stderr
            )
            if unreadable is not None:
                unreadable.append(path)


def _denial_summary(events: Iterable[Event], as_json: bool) -> None:
    groups: dict[tuple[str, str], list[Event]] = {}
    for event in events:
        key = (str(event.get("layer", "")), str(event.get("reason", "")))
        groups.setdefault(key, []).append(event)
    from stockade._denials import denial_target, explain_denial

    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if not ordered and not as_json:
        print("no denials")
    for (layer, reason), items in ordered:
        targets = list(dict.fromkeys(t for t in (denial_target(e) for e in items) if t))
        if as_json:
            print(
                json.dumps(
                    {
                        "layer": layer,
                        "reason": reason,
                        "count": len(items),
                        "targets": targets,
                        "runs": sorted({str(e.get("run_id")) for e in items}),
                        "hint": explain_denial(items[0])["hint"],
                    }
                )
            )
        else:
            shown = ", ".join(targets[:3]) + (
                f", ... ({len(targets)} in all)" if len(targets) > 3 else ""
            )
            print(f"{len(items):>6}  {layer:<9} {reason:<20} {shown}".rstrip())


def _follow(args: argparse.Namespace) -> None:
    """Print new events as they are appended; new run files are picked up too."""
    explicit = bool(args.file)
    offsets: dict[Path, int] = {}
    partial: dict[Path, str] = {}
    files = _audit_files(args)
    for path in files:
        # Like tail -f: show what the newest file already holds, then only what is new.
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        offsets[path] = 0 if path == files[-1] or explicit else size
    while True:
        for path in _audit_files(args) if not explicit else files:
            offset = offsets.setdefault(path, 0)
            try:
                with path.open("rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError:
                continue
            if not chunk:
                continue
            offsets[path] = offset + len(chunk)
            text = partial.pop(path, "") + chunk.decode("utf-8", errors="replace")
            lines = text.split("\n")
            if lines[-1]:
                partial[path] = lines[-1]  # a line still being written
            for line in lines[:-1]:
                event = _parse(line)
                if event is not None and _matches(event, args):
                    _emit(event, args.json)
        time.sleep(POLL_SECONDS)


#: at most this many problems are printed per file (a foreign file has one per line)
MAX_PROBLEMS = 10


def _verify(args: argparse.Namespace) -> int:
    """Check each log's chain; one line per file, one per problem; 0 when all verify."""
    for name in ("follow", "denials", "json", "run", "verdict", "layer", "host", "event"):
        if getattr(args, name):
            print(
                f"stockade log: --verify checks whole files; --{name} does not combine with it",
                file=sys.stderr,
            )
            return EXIT_STOCKADE_ERROR
    from stockade.audit._record import load_records, records_dir
    from stockade.audit._verify import authorship, verify_file

    files = [Path(args.verify)] if args.verify else []
    files += _audit_files(args) if args.file or not files else []
    if not files:
        print("stockade log: no audit logs yet; 'stockade run' writes one per run", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    records = load_records()
    failed = unrecorded = 0
    for path in files:
        try:
            verdict = verify_file(path)
        except OSError as exc:
            print(f"stockade log: cannot read {path}: {exc.strerror}", file=sys.stderr)
            failed += 1
            continue
        # The chain first (its problems name lines), then the runs against their records.
        found = authorship(path, verdict, records)
        problems = [*map(str, verdict.problems), *found.problems]
        if not problems and verdict.ok:
            print(f"{path}: ok: {verdict.runs} runs, {verdict.events} events, chains intact")
            if found.unrecorded:
                unrecorded += 1
                print(
                    _printable(_no_record(path, found.unrecorded, records_dir())), file=sys.stderr
                )
            continue
        failed += 1
        for problem in problems[:MAX_PROBLEMS]:
            print(_printable(f"{path}: {problem}"))
        if len(problems) > MAX_PROBLEMS:
            print(f"{path}: ... and {len(problems) - MAX_PROBLEMS} more problems")
    if failed:
        return 1
    return EXIT_UNRECORDED if unrecorded else 0


def _no_record(path: Path, runs: list[str], where: Path) -> str:
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    noun = "run" if len(runs) == 1 else "runs"
    return (
        f"stockade log: {path}: authorship cannot be checked: no run record for {noun} "
        f"{shown} in {where} (a log copied from another machine or user, written by "
        "stockade proxy or a server, or its record removed); the chain shows the order "
        "of the events, not who wrote them"
    )


def _printable(text: str) -> str:
    # A run id or an event name comes from the file: keep one problem on one line.
    return "".join(c if c.isprintable() else "?" for c in text)


def execute(args: argparse.Namespace) -> int:
    """Print the matching events; 0 on success (also when none match), 125 when no log exists.

    With ``--verify``: 0 when every run of every log verifies and ends where its run
    record says, 1 when one does not, :data:`EXIT_UNRECORDED` when every chain holds
    but some run has no record (so who wrote it cannot be checked).
    """
    if args.verify is not None:
        return _verify(args)
    if args.follow:
        if args.denials:
            print("stockade log: --follow and --denials do not combine", file=sys.stderr)
            return EXIT_STOCKADE_ERROR
        try:
            _follow(args)
        except KeyboardInterrupt:
            return 0
        return 0
    files = _audit_files(args)
    missing = [p for p in files if not p.is_file()]
    if missing:
        print(f"stockade log: {missing[0]}: no such audit file", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    if not files:
        print("stockade log: no audit logs yet; 'stockade run' writes one per run", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    unreadable: list[Path] = []
    events = (e for e in _read(files, unreadable) if _matches(e, args))
    if args.denials:
        _denial_summary(events, args.json)
    else:
        for event in events:
            _emit(event, args.json)
    # The events of the readable files are shown; a file that gave none is an error.
    return EXIT_STOCKADE_ERROR if unreadable else 0
