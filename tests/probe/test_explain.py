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


def test_explain_says_which_layer_stops_each_attack_under_each_runtime(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = tmp_path / "p.toml"
    policy.write_text(f'version = 1\n[filesystem]\nworkspace = "{ws}"\n')
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "c")}

    def explain(*extra: str) -> dict[str, object]:
        proc = subprocess.run(
            [sys.executable, "-m", "stockade", "explain", "--policy", str(policy), *extra],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=ws,
        )
        assert proc.returncode == 0, proc.stderr
        data: dict[str, object] = json.loads(proc.stdout) if "--json" in extra else {}
        data["text"] = proc.stdout
        return data

    bwrap = explain("--json")
    assert bwrap["backend"] == "bubblewrap"
    by = {d["action"]: d for d in bwrap["by_backend"]}  # type: ignore[attr-defined]
    assert by["host-kernel"]["bubblewrap"] == []
    assert by["host-kernel"]["gvisor"] == ["container"]
    assert by["read-ssh-key"] == {**by["read-ssh-key"], "gvisor": ["container"]}
    assert by["nested-userns"]["gvisor"] == ["syscalls"]
    assert "upload" not in by  # the same layers stop it on either runtime
    residual = {r["action"] for r in bwrap["residual"]}  # type: ignore[attr-defined]
    assert "host-kernel" in residual
    gvisor = explain("--json", "--backend", "gvisor")
    assert gvisor["backend"] == "gvisor"
    assert "host-kernel" not in {r["action"] for r in gvisor["residual"]}  # type: ignore[attr-defined]
    text = str(explain("--backend", "gvisor")["text"])
    assert "container runtime: gvisor" in text
    assert "host-kernel" in text
    assert "nothing stops it" in text


def test_explain_knows_the_overlay_workspace(tmp_path: Path) -> None:
    from stockade.cli.explain import analyse
    from stockade.policy import load_policy

    ws = tmp_path / "ws"
    ws.mkdir()
    policy = tmp_path / "p.toml"
    policy.write_text(f'[filesystem]\nworkspace = {{ path = "{ws}", mode = "overlay" }}\n')
    data = analyse(load_policy(policy, workspace=ws))
    assert data["workspace_mode"] == "overlay"
    residual = {r["action"] for r in data["residual"]}
    assert not {"tamper-ci", "link-out", "hook-approved"} & residual
    by_backend = {d["action"]: d for d in data["by_backend"]}
    assert by_backend["tamper-ci"]["bubblewrap"] == ["overlay"]
    # gVisor runs the overlay too (mounted around runsc): not refused, the same layer
    assert by_backend["tamper-ci"]["gvisor"] == ["overlay"]
    gv = analyse(load_policy(policy, workspace=ws), "gvisor")
    assert not [e for e in gv["exceptions"] if e["kind"].startswith("overlay workspace")]
    assert not {"tamper-ci", "link-out"} & {r["action"] for r in gv["residual"]}
    # landlock still refuses it, and explain says so
    ll = analyse(load_policy(policy, workspace=ws), "landlock")
    assert ("overlay workspace under landlock", "overlay") in {
        (e["kind"], e["value"]) for e in ll["exceptions"]
    }
    # the twin: a read-write workspace lets the edit of the CI configuration through
    policy.write_text(f'[filesystem]\nworkspace = "{ws}"\n')
    rw = analyse(load_policy(policy, workspace=ws))
    assert rw["workspace_mode"] == "read-write"
    open_ = {r["action"] for r in rw["residual"]}
    assert {"tamper-ci", "link-out"} <= open_
    assert "hook-approved" not in open_  # the container keeps the protected set read-only
