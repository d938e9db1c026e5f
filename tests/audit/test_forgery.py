"""Issue 22, hole 5: the audit log can be forged. Real runs, real bubblewrap.

The attack, as it was done against main: ``--audit`` inside the workspace; the sandboxed
command reads ``run_start``, writes a log of its own ending in a sealed ``run_end`` and
renames it over the file; stockade went on writing to the unlinked inode and
``stockade log --verify`` accepted the forgery (exit 0, no denials, while the run's
summary said "denied 1"). Now such a path is refused before anything runs, and a log out
of the sandbox's reach that someone rewrites afterwards fails ``--verify`` against the
head stockade recorded. Each refusal has its allowed twin, as the invoking user and as
uid 65534.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stockade.audit._verify import verify_file
from tests.conftest import World, as_nobody

pytestmark = pytest.mark.usefixtures("kernel")

#: The forger, as the sandboxed command (or, afterwards, anyone holding the file) runs
#: it: no stockade code, since the chain has no key.
FORGE = r"""
import hashlib, json, os, sys
path = sys.argv[1]
first = open(path, "rb").read().split(b"\n")[0]
start = json.loads(first)
h = lambda b: hashlib.sha256(b).hexdigest()
end = {"time": start["time"] + 0.5, "run_id": start["run_id"], "event": "run_end",
       "layer": "", "verdict": "allow", "reason": "", "returncode": 0, "duration": 0.1,
       "schema": 1, "seq": 1, "prev": h(first)}
line = json.dumps(end, separators=(",", ":")).encode()
line = line[:-1] + b',"final":"' + h(line).encode() + b'"}'
with open(path + ".forged", "wb") as fh:
    fh.write(first + b"\n" + line + b"\n")
os.rename(path + ".forged", path)
open(sys.argv[2], "w").write("forged\n")
"""

WHO = ("user", "nobody")


def stockade(world: World, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in ``world``, as the invoking user or as uid 65534."""
    return as_nobody(world, *args) if who == "nobody" else world.stockade(*args)


def with_denial(world: World) -> None:
    """A unix socket in the workspace: the run masks it and logs one denial."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(world.workspace / "sock"))


def runs_dir(world: World) -> Path:
    return world.root / "state" / "stockade" / "runs"


def records(world: World) -> list[dict[str, object]]:
    where = world.root / "state" / "stockade" / "records"
    return [json.loads(p.read_text()) for p in sorted(where.glob("*.json"))]


@pytest.mark.parametrize("who", WHO)
def test_the_sandbox_forging_its_own_log_is_refused_at_start(world: World, who: str) -> None:
    with_denial(world)
    (world.workspace / "forge.py").write_text(FORGE)
    audit = world.workspace / "audit.jsonl"
    marker = world.workspace / "forged"
    proc = stockade(
        world,
        who,
        "run",
        "--audit",
        str(audit),
        "--",
        "python3",
        str(world.workspace / "forge.py"),
        str(audit),
        str(marker),
    )
    assert proc.returncode == 125, proc.stderr
    # It names the path, why, and where to put it instead.
    assert f"audit log {audit} lies inside {world.workspace}, which the sandbox can write" in (
        proc.stderr
    )
    assert f"default per-run file under {runs_dir(world)}" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing ran, nothing was written: no log to forge, no record of a run.
    assert not marker.exists()
    assert not audit.exists()
    assert records(world) == []


@pytest.mark.parametrize("who", WHO)
def test_a_log_outside_verifies_and_a_later_forgery_fails(world: World, who: str) -> None:
    with_denial(world)
    audit = world.root / "audit.jsonl"
    proc = stockade(world, who, "run", "--audit", str(audit), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "denied 1" in proc.stderr
    (record,) = records(world)
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    st = audit.stat()
    assert record["run_id"] == events[0]["run_id"]
    assert (record["events"], record["path"]) == (len(events), str(audit.resolve()))
    assert (record["dev"], record["ino"]) == (st.st_dev, st.st_ino)
    assert record["final"] == events[-1]["final"]
    ok = stockade(world, who, "log", "--verify", str(audit))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout == f"{audit}: ok: 1 runs, {len(events)} events, chains intact\n"
    assert ok.stderr == ""
    # A copy of the genuine log, kept aside by the host user, stays stockade's log.
    genuine = world.root / "genuine.jsonl"
    genuine.write_bytes(audit.read_bytes())

    # The host user (or anything else that can write the file) forges it as the
    # sandbox did: the chain alone accepts the forgery, which was the hole.
    marker = world.root / "forged"
    subprocess.run([sys.executable, "-c", FORGE, str(audit), str(marker)], check=True)
    assert marker.exists()
    assert verify_file(audit).ok
    assert '"verdict":"deny"' not in audit.read_text()
    forged = stockade(world, who, "log", "--verify", str(audit))
    assert forged.returncode == 1, forged.stdout + forged.stderr
    run_id = events[0]["run_id"]
    assert forged.stdout.splitlines() == [
        f"{audit}: run {run_id}: 2 events, where stockade's run record says it wrote "
        f"{len(events)}: the log was cut or rewritten"
    ]
    # The genuine copy still verifies, wherever it is now.
    copy = stockade(world, who, "log", "--verify", str(genuine))
    assert copy.returncode == 0, copy.stdout + copy.stderr


@pytest.mark.parametrize("who", WHO)
def test_a_workspace_or_granted_audit_path_is_refused_and_where_to_put_it(
    world: World, who: str
) -> None:
    grant = world.root / "out"
    grant.mkdir()
    policy = world.root / "policy.toml"
    policy.write_text(f'version = 1\n[filesystem]\nwrite = ["{grant}"]\n')
    (world.root / "elsewhere").mkdir()
    (world.workspace / "link").symlink_to(world.root / "elsewhere")
    refused = {
        "workspace": world.workspace / "logs" / "audit.jsonl",
        "write grant": grant / "audit.jsonl",
        "symlink in the workspace": world.workspace / "link" / "audit.jsonl",
        "run scratch": Path(world.env.get("TMPDIR") or "/tmp") / "stockade-1-0badf00d" / "a",
    }
    for name, path in refused.items():
        proc = stockade(
            world, who, "run", "--policy", str(policy), "--audit", str(path), "--", "true"
        )
        assert proc.returncode == 125, (name, proc.stderr)
        assert f"audit log {path} lies inside" in proc.stderr, (name, proc.stderr)
        assert "sandbox can write" in proc.stderr, (name, proc.stderr)
        assert f"default per-run file under {runs_dir(world)}" in proc.stderr, name
        assert not path.exists(), name
    # A file with a second name in the workspace: the sandbox reaches it through that.
    linked = world.root / "linked.jsonl"
    linked.write_text("")
    os.link(linked, world.workspace / "alias.jsonl")
    proc = stockade(world, who, "run", "--audit", str(linked), "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert "has 2 hard links" in proc.stderr
    assert linked.read_text() == ""
    # The twins: beside the workspace, and the default per-run file; both verify.
    beside = world.root / "elsewhere" / "audit.jsonl"
    proc = stockade(
        world, who, "run", "--policy", str(policy), "--audit", str(beside), "--", "true"
    )
    assert proc.returncode == 0, proc.stderr
    proc = stockade(world, who, "run", "--policy", str(policy), "--", "true")
    assert proc.returncode == 0, proc.stderr
    (default,) = runs_dir(world).glob("*.jsonl")
    for path in (beside, default):
        ok = stockade(world, who, "log", "--verify", str(path))
        assert ok.returncode == 0, ok.stdout + ok.stderr
    every = stockade(world, who, "log", "--verify")
    assert every.returncode == 0, every.stdout + every.stderr
    assert every.stdout.startswith(f"{default}: ok: 1 runs,")


def test_the_api_refuses_a_workspace_audit_path(world: World) -> None:
    env = dict(world.env)
    code = (
        "import stockade, sys\n"
        "try:\n"
        f"    stockade.run(['true'], workspace={str(world.workspace)!r}, audit=sys.argv[1])\n"
        "except stockade.SandboxError as exc:\n"
        "    print('refused:', exc); sys.exit(3)\n"
    )
    inside = world.workspace / "a.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(inside)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"refused: audit log {inside} lies inside {world.workspace}" in proc.stdout
    assert not inside.exists()
    beside = world.root / "a.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(beside)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert verify_file(beside).ok


def test_a_log_swapped_during_the_run_is_said_and_fails_verify(world: World) -> None:
    audit = world.root / "audit.jsonl"
    go = world.workspace / "go"
    script = "i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    with subprocess.Popen(
        [*world.command, "run", "--audit", str(audit), "--", "sh", "-c", script],
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            deadline = time.monotonic() + 60
            while b"run_start" not in (audit.read_bytes() if audit.exists() else b""):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the run never wrote run_start"
                time.sleep(0.05)
            # Swapped by someone outside: stockade's file moved aside (stockade goes on
            # writing to it there), a forgery of the run put at the path.
            genuine = world.root / "genuine.jsonl"
            os.rename(audit, genuine)
            audit.write_bytes(genuine.read_bytes())
            subprocess.run(
                [sys.executable, "-c", FORGE, str(audit), str(world.root / "m")], check=True
            )
            go.touch()
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert "warning: the audit log was replaced during the run" in err
    (record,) = records(world)
    assert "now names another file" in str(record["replaced"])

    def verify(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*world.command, "log", "--verify", str(path)],
            env=world.env,
            capture_output=True,
            text=True,
            check=False,
        )

    result = verify(audit)
    assert result.returncode == 1, result.stdout
    run_id = record["run_id"]
    assert result.stdout.startswith(
        f"{audit}: run {run_id}: 2 events, where stockade's run record says it wrote"
    ), result.stdout
    assert "stockade saw at the run's end: " in result.stdout
    # The file stockade wrote, where it was moved: whole, authentic, and it says so.
    kept = [json.loads(line) for line in genuine.read_text().splitlines()]
    assert kept[-1]["event"] == "run_end"
    assert "now names another file" in kept[-1]["log_replaced"]
    result = verify(genuine)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_log_without_its_record_says_authorship_cannot_be_checked(world: World) -> None:
    audit = world.root / "audit.jsonl"
    proc = world.stockade("run", "--audit", str(audit), "--", "true")
    assert proc.returncode == 0, proc.stderr
    n = len(audit.read_text().splitlines())
    # Verified where its record is not (another user's state, another machine).
    elsewhere = dict(world.env, XDG_STATE_HOME=str(world.root / "other-state"))
    result = world.stockade("log", "--verify", str(audit), env=elsewhere)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout == f"{audit}: ok: 1 runs, {n} events, chains intact\n"
    assert f"{audit}: authorship cannot be checked: no run record for run " in result.stderr
    assert str(world.root / "other-state" / "stockade" / "records") in result.stderr
    # The twin: with its record, the same file is stockade's (exit 0).
    assert world.stockade("log", "--verify", str(audit)).returncode == 0
    # A broken chain still fails (1), record or not.
    audit.write_bytes(audit.read_bytes()[:-5])
    assert world.stockade("log", "--verify", str(audit), env=elsewhere).returncode == 1


def test_under_gvisor_the_same_refusal_and_the_same_record(world: World, runsc: str) -> None:
    world.env["STOCKADE_RUNSC"] = runsc
    with_denial(world)
    inside = world.workspace / "audit.jsonl"
    proc = world.stockade("run", "--backend", "gvisor", "--audit", str(inside), "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert f"audit log {inside} lies inside {world.workspace}" in proc.stderr
    assert not inside.exists()
    audit = world.root / "audit.jsonl"
    proc = world.stockade("run", "--backend", "gvisor", "--audit", str(audit), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "denied 1" in proc.stderr
    (record,) = records(world)
    assert record["events"] == len(audit.read_text().splitlines())
    assert world.stockade("log", "--verify", str(audit)).returncode == 0
    subprocess.run([sys.executable, "-c", FORGE, str(audit), str(world.root / "m")], check=True)
    forged = world.stockade("log", "--verify", str(audit))
    assert forged.returncode == 1, forged.stdout
    assert "stockade's run record says it wrote" in forged.stdout


def test_the_mcp_server_refuses_a_workspace_audit_path(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stockade import SandboxError
    from stockade.mcp._server import build_server
    from stockade.policy import load_policy

    monkeypatch.setenv("XDG_STATE_HOME", str(world.root / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(world.root / "config"))
    policy = load_policy(workspace=world.workspace)
    inside = world.workspace / "mcp.jsonl"
    with pytest.raises(SandboxError, match=r"lies inside .*which the sandbox can write"):
        build_server(policy, audit=inside)
    assert not inside.exists()
    build_server(policy, audit=world.root / "mcp.jsonl")  # the twin: beside it, accepted


@pytest.mark.parametrize("who", WHO)
def test_state_inside_the_workspace_keeps_the_default_log_out_of_reach(
    world: World, who: str
) -> None:
    # stockade's state is a trust root, read-only inside every sandbox wherever it lies:
    # the default per-run log there is accepted, and the sandbox cannot append to it.
    state = world.workspace / ".state"
    world.env["XDG_STATE_HOME"] = str(state)
    runs = state / "stockade" / "runs"
    script = f'for f in {runs}/*.jsonl; do echo forged >> "$f" && echo WROTE; done; true'
    proc = stockade(world, who, "run", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "WROTE" not in proc.stdout, proc.stdout
    assert "Read-only file system" in proc.stderr, proc.stderr  # it tried, on the real log
    (log,) = runs.glob("*.jsonl")
    assert "forged" not in log.read_text().splitlines()
    ok = stockade(world, who, "log", "--verify", str(log))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The twin: a log beside the state, in the workspace, is still refused.
    beside = state / "audit.jsonl"
    refused = stockade(world, who, "run", "--audit", str(beside), "--", "true")
    assert refused.returncode == 125, refused.stderr
    assert f"audit log {beside} lies inside {world.workspace}" in refused.stderr
