"""``stockade explain`` on a policy with deliberate exceptions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_explain_flags_channels_and_exceptions(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "out").mkdir()
    policy = tmp_path / "p.toml"
    policy.write_text(
        f'version = 1\n[filesystem]\nworkspace = "{ws}"\nwrite = ["{tmp_path / "out"}"]\n'
        '[network]\nallow = ["registry.test", "github.com", "*.amazonaws.com", "webhook.site", '
        '"x.ngrok-free.app"]\n[layers]\nsyscalls = false\n'
    )
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c")}
    proc = subprocess.run(
        [sys.executable, "-m", "stockade", "explain", "--policy", str(policy), "--json"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ws,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    dests = {d["entry"]: d for d in data["destinations"]}
    assert all(d["exfiltration_channel"] for d in dests.values())
    assert "upload" in dests["registry.test"]["effects"]
    assert dests["registry.test"]["risk"] is None
    assert "broad" in dests["github.com"]["risk"]
    assert "broad" in dests["*.amazonaws.com"]["risk"]
    assert "tunnel" in dests["webhook.site"]["risk"]
    assert "tunnel" in dests["x.ngrok-free.app"]["risk"]
    kinds = {(e["kind"], e["value"]) for e in data["exceptions"]}
    assert ("disabled layer", "syscalls") in kinds
    assert ("writable path", str(tmp_path / "out")) in kinds
    residual = {r["action"] for r in data["residual"]}
    assert "upload-to:registry.test" in residual
    assert "read-ssh-key" not in residual
    text = subprocess.run(
        [sys.executable, "-m", "stockade", "explain", "--policy", str(policy)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ws,
    )
    assert "EXFILTRATION CHANNEL" in text.stdout
