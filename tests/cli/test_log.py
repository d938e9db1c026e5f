"""``stockade log``: real audit files written by the real sink, read by the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stockade.audit import AuditLog
from stockade.policy import Decision, Reason
from tests.conftest import World


@pytest.fixture
def state(tmp_path: Path) -> Path:
    runs = tmp_path / "state" / "stockade" / "runs"
    a = AuditLog("aaaa11112222", runs / "20260101T000000-aaaa11112222.jsonl")
    a.emit("run_start", argv=["npm", "test"])
    a.decision(
        "denied", Decision.deny("egress", Reason.HOST_NOT_ALLOWED), host="evil.test", port=443
    )
    a.decision(
        "denied", Decision.deny("egress", Reason.HOST_NOT_ALLOWED), host="api.evil.test", port=443
    )
    a.decision("connect", Decision.allow("egress"), host="registry.npmjs.org", port=443)
    a.emit("run_end", returncode=1, end=True)
    a.close()
    b = AuditLog("bbbb33334444", runs / "20260101T000001-bbbb33334444.jsonl")
    b.emit("run_start", argv=["env"])
    b.decision(
        "denied",
        Decision.deny("secrets", Reason.CREDENTIAL_ENV, detail="GH_TOKEN"),
        name="GH_TOKEN",
    )
    b.emit("run_end", returncode=0, end=True)
    b.close()
    # A torn last line (a writer killed mid-line) is skipped, not a crash.
    with (runs / "20260101T000001-bbbb33334444.jsonl").open("a") as fh:
        fh.write('{"time": 1, "run_')
    return tmp_path / "state"


def log(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    return subprocess.run(
        [sys.executable, "-m", "stockade", "log", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_reads_every_run_in_order(state: Path) -> None:
    result = log(state)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8
    assert "aaaa11112222" in lines[0]
    assert "npm test" in lines[0]
    assert "bbbb33334444" in lines[-1]
    assert "exit 0" in lines[-1]
    denied = next(line for line in lines if "evil.test:443" in line)
    for part in ("denied", "egress", "deny", "host-not-allowed"):
        assert part in denied


def test_filters(state: Path) -> None:
    assert len(log(state, "--run", "bbbb").stdout.splitlines()) == 3
    assert len(log(state, "--verdict", "deny").stdout.splitlines()) == 3
    assert len(log(state, "--layer", "secrets").stdout.splitlines()) == 1
    assert len(log(state, "--event", "run_end").stdout.splitlines()) == 2
    host = log(state, "--host", "evil.test").stdout.splitlines()
    assert len(host) == 2  # evil.test and its subdomain, not registry.npmjs.org
    assert all("evil.test" in line for line in host)
    assert log(state, "--run", "nomatch").stdout == ""


def test_json_lines(state: Path) -> None:
    out = log(state, "--json", "--layer", "egress").stdout.splitlines()
    events = [json.loads(line) for line in out]
    assert [e["host"] for e in events] == ["evil.test", "api.evil.test", "registry.npmjs.org"]
    assert all(e["run_id"] == "aaaa11112222" for e in events)


def test_denials_grouped(state: Path) -> None:
    lines = log(state, "--denials").stdout.splitlines()
    assert lines[0].split()[:3] == ["2", "egress", "host-not-allowed"]
    assert "evil.test:443, api.evil.test:443" in lines[0]
    assert lines[1].split()[:3] == ["1", "secrets", "credential-env"]
    groups = [json.loads(x) for x in log(state, "--denials", "--json").stdout.splitlines()]
    assert groups[0]["count"] == 2
    assert groups[0]["runs"] == ["aaaa11112222"]
    assert "network.allow" in groups[0]["hint"]


def test_explicit_file_and_missing_file(state: Path, tmp_path: Path) -> None:
    one = next((state / "stockade" / "runs").glob("*aaaa*"))
    assert len(log(state, "--file", str(one)).stdout.splitlines()) == 5
    missing = log(state, "--file", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 125
    assert "no such audit file" in missing.stderr
    empty = log(tmp_path / "empty-state")
    assert empty.returncode == 125
    assert "no audit logs yet" in empty.stderr


def test_reads_what_a_real_run_wrote(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(state), "STOCKADE_LOG_TEST_TOKEN": "x"}
    run = subprocess.run(
        [sys.executable, "-m", "stockade", "run", "--workspace", str(ws), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ws,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr
    out = log(state, "--layer", "secrets", "--json").stdout.splitlines()
    assert any(json.loads(x).get("name") == "STOCKADE_LOG_TEST_TOKEN" for x in out)


def test_follow_prints_new_events_and_stops_on_sigint(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    audit = AuditLog("cccc55556666", path)
    audit.emit("run_start", argv=["sleep"])
    argv = [sys.executable, "-m", "stockade", "log", "--follow", "--file", str(path)]
    with subprocess.Popen(
        [*argv, "--verdict", "deny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            time.sleep(1.0)
            audit.decision("denied", Decision.deny("egress", Reason.HOST_DENIED), host="late.test")
            audit.emit("run_end", returncode=0, end=True)  # filtered out by --verdict deny
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "late.test" in line
            assert "host-denied" in line
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
            assert proc.stdout.read() == ""
        finally:
            if proc.poll() is None:
                proc.kill()
            audit.close()


def _verify(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"XDG_STATE_HOME": str(state)} if state else {})}
    return subprocess.run(
        [sys.executable, "-m", "stockade", "log", "--verify", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_verify_real_runs_then_each_tampering(kernel: None, world: World) -> None:
    path = world.root / "run.jsonl"
    argv = [*world.command, "run", "--audit", str(path), "--"]
    # Two runs at once write one file (their lines interleave), then a third. The slow
    # one has begun (its run_start is in the file) before the quick one starts, and
    # waits for it to finish: the interleaving holds however slow start-up is under load.
    wait = "i=0; while [ ! -e quick-done ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    with subprocess.Popen([*argv, "sh", "-c", wait], cwd=world.workspace, env=world.env) as slow:
        deadline = time.monotonic() + 60
        while b"run_start" not in (path.read_bytes() if path.exists() else b""):
            assert slow.poll() is None, "the slow run ended before it began"
            assert time.monotonic() < deadline, "the slow run never wrote run_start"
            time.sleep(0.05)
        quick = world.stockade("run", "--audit", str(path), "--", "true")
        (world.workspace / "quick-done").touch()
        assert quick.returncode == 0, quick.stderr
        assert slow.wait(timeout=60) == 0
    assert world.stockade("run", "--audit", str(path), "--", "false").returncode == 1
    raw = path.read_bytes().splitlines(keepends=True)
    events = [json.loads(line) for line in raw]
    runs = list(dict.fromkeys(e["run_id"] for e in events))
    assert len(runs) == 3
    assert all(e["schema"] == 1 for e in events)
    order = [e["run_id"] for e in events]
    assert order.index(runs[1]) < max(i for i, r in enumerate(order) if r == runs[0])
    # Checked against the run records the runs left in the world's state.
    ok = _verify(str(path), state=world.root / "state")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout == f"{path}: ok: 3 runs, {len(events)} events, chains intact\n"

    # The first run's lines: its run_start, the events between, its run_end.
    mine = [i for i, e in enumerate(events) if e["run_id"] == runs[0]]
    assert events[mine[-1]]["event"] == "run_end"
    assert len(mine) >= 3
    start, middle, end = mine[0], mine[1], mine[-1]
    forged = json.loads(raw[middle])
    forged["reason"] = "nothing-to-see"
    edited = json.dumps(forged, separators=(",", ":")).encode() + b"\n"
    swapped = list(raw)
    swapped[mine[1]], swapped[mine[2]] = raw[mine[2]], raw[mine[1]]
    cases = {
        "edited": ([*raw[:middle], edited, *raw[middle + 1 :]], "changed after it was written"),
        "removed": ([*raw[:middle], *raw[middle + 1 :]], "events removed"),
        "reordered": (swapped, "events reordered"),
        "no run_end": ([*raw[:end], *raw[end + 1 :]], "no end"),
        "forged": ([*raw[: start + 1], edited, *raw[start + 1 :]], "comes after seq"),
        "truncated": ([*raw[:-1], raw[-1][:50]], "an incomplete last line"),
    }
    for name, (lines, why) in cases.items():
        tampered = world.root / f"{name.replace(' ', '-')}.jsonl"
        tampered.write_bytes(b"".join(lines))
        result = _verify(str(tampered))
        assert result.returncode == 1, (name, result.stdout)
        assert why in result.stdout, (name, result.stdout)
        assert "Traceback" not in result.stdout + result.stderr
        if name != "truncated":
            first = result.stdout.splitlines()[0]
            assert first.startswith(f"{tampered}: line "), first
            assert f"run {runs[0]}:" in first, (name, first)


def test_verify_every_default_log_and_garbage(state: Path, tmp_path: Path) -> None:
    result = _verify(state=state)
    lines = result.stdout.splitlines()
    assert result.returncode == 1
    # The first run's file is whole; the second ends with a torn line (see the fixture).
    assert lines[0].endswith("aaaa11112222.jsonl: ok: 1 runs, 5 events, chains intact")
    assert lines[1].endswith(
        "bbbb33334444.jsonl: line 4: an incomplete last line (no newline):"
        " the log was cut in the middle of an event"
    )
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\x00\xff{{{\n" + b'{"run_id": "x"}\n' * 20 + b"[[[")
    result = _verify(str(garbage))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{garbage}: line 1: not UTF-8 text: not an audit event"
    assert lines[1] == (
        f"{garbage}: line 2: run x: no schema field: written before the log was chained, or edited"
    )
    assert lines[-1] == f"{garbage}: ... and 12 more problems"
    missing = _verify(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith("nope.jsonl: No such file or directory")


def test_verify_does_not_combine_with_event_filters(state: Path) -> None:
    for option in ("--follow", "--denials", "--json"):
        result = log(state, "--verify", option)
        assert result.returncode == 125
        assert result.stderr.strip() == (
            f"stockade log: --verify checks whole files; {option} does not combine with it"
        )


def test_a_line_says_what_the_resolver_and_capture_decided() -> None:
    from stockade.cli.log import format_event

    query = {"event": "dns_query", "verdict": "deny", "name": "evil.test", "type": "A"}
    assert format_event(query).endswith("evil.test (A query)")
    captured = {"event": "net_connect", "host": "web.test", "port": 443, "mode": "transparent"}
    assert format_event(captured).endswith("web.test:443 (captured)")
    proxied = {"event": "net_connect", "host": "web.test", "port": 443}
    assert format_event(proxied).endswith("web.test:443")


def test_a_file_without_events_is_an_error(state: Path, tmp_path: Path) -> None:
    # Issue 24 (polish): a garbage file printed nothing and exited 0.
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n{also not\n")
    result = log(state, "--file", str(garbage))
    assert result.returncode == 125
    assert f"{garbage}: no audit events in it" in result.stderr
    # The twin: a real log beside it is still shown, and an empty file is no error.
    one = next((state / "stockade" / "runs").glob("*aaaa*"))
    both = log(state, "--file", str(one), "--file", str(garbage))
    assert both.returncode == 125
    assert len(both.stdout.splitlines()) == 5
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert log(state, "--file", str(empty)).returncode == 0


def test_pending_filter_and_aligned_columns(tmp_path: Path) -> None:
    # Issue 24 (polish): --verdict pending was refused, and net_request/policy_change
    # pushed their rows' columns out of line.
    runs = tmp_path / "state" / "stockade" / "runs"
    a = AuditLog("cccc55556666", runs / "20260101T000002-cccc55556666.jsonl")
    a.emit("run_start", argv=["curl"])
    a.emit("ask", layer="egress", verdict="pending", reason="host-not-allowed", host="a.test")
    a.decision("net_request", Decision.allow("egress"), host="a.test", port=443)
    a.decision("net_connect", Decision.allow("egress"), host="a.test", port=443)
    a.emit("policy_change", layer="egress", verdict="allow", reason="allowed", generation=2)
    a.emit("run_end", returncode=0, end=True)
    a.close()
    state = tmp_path / "state"
    pending = log(state, "--verdict", "pending")
    assert pending.returncode == 0, pending.stderr
    (line,) = pending.stdout.splitlines()
    assert " ask " in line
    assert "a.test" in line
    # The layer column starts at one offset on every row.
    rows = [r for r in log(state).stdout.splitlines() if " egress " in r]
    assert len(rows) == 4
    assert len({r.index(" egress ") for r in rows}) == 1, rows
