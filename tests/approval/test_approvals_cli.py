"""``stockade approvals list|revoke`` and ``stockade log`` beside asks (no kernel needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stockade.cli.log import format_event
from stockade.egress.approval._store import ApprovedStore


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "stockade", "approvals", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_list_and_revoke(tmp_path: Path) -> None:
    assert "no approvals" in cli(tmp_path, "list").stdout
    ApprovedStore(tmp_path / "stockade" / "approved.toml").add(
        [("allow", "api.example.test:443"), ("deny", "evil.test")], answered_by="tty:/dev/pts/1"
    )
    listed = cli(tmp_path, "list")
    assert "api.example.test:443" in listed.stdout
    assert "by tty:/dev/pts/1" in listed.stdout
    rows = [json.loads(line) for line in cli(tmp_path, "list", "--json").stdout.splitlines()]
    assert [r["pattern"] for r in rows] == ["api.example.test:443", "evil.test"]
    revoked = cli(tmp_path, "revoke", "api.example.test")
    assert revoked.returncode == 0
    assert "revoked api.example.test:443" in revoked.stdout
    assert cli(tmp_path, "revoke", "api.example.test").returncode == 1
    assert cli(tmp_path, "revoke").returncode == 125
    assert "api.example.test" not in cli(tmp_path, "list").stdout


def test_log_shows_an_ask_beside_the_connections_it_decided() -> None:
    base = {"time": 0, "run_id": "r1", "layer": "egress", "host": "a.test", "port": 443}
    ask = format_event(
        {
            **base,
            "event": "ask",
            "verdict": "pending",
            "ask_id": "a1",
            "channel": "tty",
            "waiting": 2,
        }
    )
    answer = format_event(
        {
            **base,
            "event": "answer",
            "verdict": "allow",
            "ask_id": "a1",
            "scope": "run",
            "answered_by": "tty:/dev/pts/1",
        }
    )
    conn = format_event({**base, "event": "net_connect", "verdict": "allow", "rule": "grant:a1"})
    assert "[ask a1 via tty, 2 waiting]" in ask
    assert "[ask a1 run by tty:/dev/pts/1]" in answer
    assert "[ask a1]" in conn
