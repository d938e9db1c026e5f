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
    a.emit("run_end", returncode=1)
    a.close()
    b = AuditLog("bbbb33334444", runs / "20260101T000001-bbbb33334444.jsonl")
    b.emit("run_start", argv=["env"])
    b.decision(
        "denied",
        Decision.deny("secrets", Reason.CREDENTIAL_ENV, detail="GH_TOKEN"),
        name="GH_TOKEN",
    )
    b.emit("run_end", returncode=0)
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
    assert missing.returncode == 1
    assert "no such audit file" in missing.stderr
    empty = log(tmp_path / "empty-state")
    assert empty.returncode == 1
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
            audit.emit("run_end", returncode=0)  # filtered out by --verdict deny
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
