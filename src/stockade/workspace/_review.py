"""What an overlay run did, in one place: its file changes (and what apply would do with
each) beside its network decisions (hosts reached, requests refused, asks), read from the
audit logs of the runs that wrote the layer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stockade.workspace._apply import apply
from stockade.workspace._changes import scan
from stockade.workspace._layer import Layer


def audit_dir() -> Path:
    """``$XDG_STATE_HOME/stockade/runs``, where the CLI writes one audit log per run."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stockade" / "runs"


def _events(run_ids: list[str], where: Path) -> tuple[list[dict[str, Any]], list[str]]:
    events: list[dict[str, Any]] = []
    missing = []
    for run_id in run_ids:
        files = sorted(where.glob(f"*-{run_id}.jsonl")) if where.is_dir() else []
        if not files:
            missing.append(run_id)
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict) and event.get("run_id", run_id) == run_id:
                        events.append(event)
    return events, missing


def review(layer: Layer, *, logs: Path | None = None) -> dict[str, Any]:
    """The review of ``layer``: changes with their apply verdicts, and the network."""
    meta = layer.meta
    runs = [str(r) for r in meta.get("runs") or [meta["run_id"]]]
    changes = scan(layer)
    verdicts = {o.path: o for o in apply(layer, dry_run=True)} if layer.state != "running" else {}
    files = []
    for change in changes:
        entry = change.to_json()
        outcome = verdicts.get(change.path)
        if outcome is not None:
            entry["apply"] = "refused" if outcome.action == "refused" else "ok"
            if outcome.action == "refused":
                entry["refused_because"] = outcome.reason
        files.append(entry)
    events, missing = _events(runs, logs if logs is not None else audit_dir())
    reached: dict[str, int] = {}
    refused: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    other_denials: list[dict[str, Any]] = []
    for e in events:
        name = str(e.get("event", ""))
        verdict = e.get("verdict")
        reason = str(e.get("reason", ""))
        if name.startswith(("net_", "dns_")):
            where = f"{e.get('host', '')}:{e.get('port', '')}".rstrip(":")
            if verdict == "allow":
                reached[where] = reached.get(where, 0) + 1
            elif verdict == "deny":
                refused.append({"host": where, "reason": reason, "event": name})
            if reason.startswith("approval") or "answered_by" in e:
                asked.append({"host": where, "reason": reason, "verdict": verdict})
        elif verdict == "deny":
            other_denials.append(
                {"layer": e.get("layer"), "reason": reason, "detail": e.get("detail", "")}
            )
    return {
        "run": meta["run_id"],
        "runs": runs,
        "state": layer.state,
        "workspace": str(layer.workspace),
        "files": files,
        "network": {
            "reached": [{"host": h, "connections": n} for h, n in sorted(reached.items())],
            "refused": refused,
            "asked": asked,
        },
        "denials": other_denials,
        "logs_missing": missing,
    }


def render(doc: dict[str, Any]) -> str:
    """The review as text for a terminal."""
    lines = [f"run {doc['run']} ({doc['state']}), workspace {doc['workspace']}", ""]
    files = doc["files"]
    lines.append(f"files: {len(files)} changed")
    for f in files:
        verdict = f.get("apply", "")
        why = f"  REFUSED: {f['refused_because']}" if verdict == "refused" else ""
        lines.append(f"  {f['kind']:<9} {f['path']}{why}")
    net = doc["network"]
    lines += ["", f"network: {len(net['reached'])} hosts reached, {len(net['refused'])} refused"]
    lines += [f"  reached  {r['host']} ({r['connections']}x)" for r in net["reached"]]
    lines += [f"  refused  {r['host']}: {r['reason']}" for r in net["refused"]]
    lines += [f"  asked    {a['host']}: {a['reason'] or a['verdict']}" for a in net["asked"]]
    if doc["denials"]:
        lines += ["", f"other denials: {len(doc['denials'])}"]
        lines += [f"  {d['layer']} {d['reason']}: {d['detail']}" for d in doc["denials"]]
    if doc["logs_missing"]:
        lines += ["", f"no audit log found for run(s) {', '.join(doc['logs_missing'])}"]
    return "\n".join(lines) + "\n"
