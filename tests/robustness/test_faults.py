"""Faults: stockade killed, the proxy gone, no audit, no bwrap, no Landlock, bad CLI.

Each fault must end fail-closed (DESIGN §6): nothing of the sandbox survives, no network
without the proxy, no run without an audit log or a layer, a one-line error and no
traceback. Where something is left behind, the test says what.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import stockade
from stockade.enforce import limits
from stockade.runtime import _egress, _host
from tests.conftest import World, as_nobody

pytestmark = pytest.mark.usefixtures("kernel")


def _policy(world: World) -> Path:
    path = world.root / "p.toml"
    path.write_text('[network]\nallow = ["local.test"]\nhosts = { "local.test" = "127.0.0.1" }\n')
    return path


def _pids_with(marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                if cmdline.startswith("sh\0-c\0sleep") and marker in cmdline:
                    out.append(int(entry.name))
    return out


def _cgroups_of(run_id: str) -> list[Path]:
    support = limits.detect()
    if support is None:
        return []
    return [p / f"stockade-{run_id}" for p in support.parents.values()]


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _kill_mid_run(world: World, ok_server: int, tmp: Path) -> tuple[str, list[str]]:
    """Start a run that used the proxy and holds two sleepers; SIGKILL the CLI.

    Returns the run id and the names in the private TMPDIR right after the kill.
    """
    marker = f"{world.canary}-kill"
    audit = world.root / "audit.jsonl"
    url = f"http://local.test:{ok_server}/"
    script = (
        f"python3 -c \"import urllib.request as u; u.urlopen('{url}', timeout=5).read()\"; "
        f"sh -c 'sleep 60' {marker} & sh -c 'sleep 61' {marker}"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stockade",
            "run",
            "--policy",
            str(_policy(world)),
            "--audit",
            str(audit),
            "--",
            "sh",
            "-c",
            script,
        ],
        cwd=world.workspace,
        env=dict(world.env, TMPDIR=str(tmp)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            used = any(e["event"] == "net_connect" for e in _events(audit))
            if used and len(_pids_with(marker)) >= 2:
                break
            time.sleep(0.05)
        assert any(e["event"] == "net_connect" and e["verdict"] == "allow" for e in _events(audit))
        assert len(_pids_with(marker)) >= 2, "the sandboxed processes never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pids_with(marker):
        time.sleep(0.05)
    assert _pids_with(marker) == [], "a sandboxed process survived SIGKILL of stockade"
    run_id = _events(audit)[0]["run_id"]
    return run_id, sorted(os.listdir(tmp))


def test_sigkill_mid_run_with_proxy(world: World, ok_server: int) -> None:
    """Nothing of the sandbox survives; its cgroup goes with the next run."""
    tmp = world.root / "tmp"
    tmp.mkdir()
    run_id, left = _kill_mid_run(world, ok_server, tmp)
    proc = world.stockade("run", "--", "true", env=dict(world.env, TMPDIR=str(tmp)))
    assert proc.returncode == 0, proc.stderr
    # The killed run's cgroup is empty (its processes are dead) and swept by the next run.
    assert [p for p in _cgroups_of(run_id) if p.exists()] == []
    # The next run cleans up after itself.
    assert all(not name.startswith("stockade-") or name in left for name in os.listdir(tmp))


def test_sigkill_leaves_no_scratch_dir_after_next_run(world: World, ok_server: int) -> None:
    tmp = world.root / "tmp"
    tmp.mkdir()
    _kill_mid_run(world, ok_server, tmp)
    world.stockade("run", "--", "true", env=dict(world.env, TMPDIR=str(tmp)))
    assert [n for n in os.listdir(tmp) if n.startswith("stockade-")] == []


# --- the proxy fails mid-run ------------------------------------------------------------

PROBE = r"""
import json, os, socket, sys, time, urllib.request
url, port, go, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def attempt(f):
    try:
        return f()
    except Exception as exc:
        return type(exc).__name__ + ":" + str(getattr(exc, "reason", exc))
out = {"before": attempt(lambda: urllib.request.urlopen(url, timeout=5).status)}
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.02)
out["after"] = attempt(lambda: urllib.request.urlopen(url, timeout=5).status)
out["proxy_port"] = attempt(lambda: socket.create_connection(("127.0.0.1", 3128), 3).close() or "open")
out["direct_local"] = attempt(lambda: socket.create_connection(("127.0.0.1", port), 3).close() or "open")
out["direct_host"] = attempt(lambda: socket.create_connection((sys.argv[5], port), 3).close() or "open")
print(json.dumps(out))
"""


def _host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _probe_run(world: World, ok_server: int, go: Path, ready: Path) -> stockade.CompletedRun:
    """Run PROBE in the sandbox: one request, ``ready``, wait for ``go``, then every way out."""
    return stockade.run(
        [
            "python3",
            "-c",
            PROBE,
            f"http://local.test:{ok_server}/",
            str(ok_server),
            str(go),
            str(ready),
            _host_ip(),
        ],
        policy=_policy(world),
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run_and_break(
    world: World, ok_server: int, monkeypatch: pytest.MonkeyPatch, how: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    proxies: list[_egress.RunProxy] = []
    real_attach = _egress.RunProxy.attach

    def attach(self: _egress.RunProxy, child_pid: int) -> None:
        proxies.append(self)
        real_attach(self, child_pid)

    monkeypatch.setattr(_egress.RunProxy, "attach", attach)
    go, ready = world.workspace / "go", world.workspace / "ready"
    result: dict[str, Any] = {}

    def run() -> None:
        result["run"] = _probe_run(world, ok_server, go, ready)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "the sandboxed probe never started"
    assert proxies
    rp = proxies[0]
    if how == "close":
        rp.loop.call_soon_threadsafe(rp.proxy.close)
    else:  # the listener dies under the proxy (as if its descriptor were lost)
        listener = rp.proxy._listeners[0]
        listener.shutdown(socket.SHUT_RDWR)
    time.sleep(0.3)
    go.touch()
    thread.join(60)
    completed = result["run"]
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout), completed.events


@pytest.mark.parametrize("how", ["close", "listener"])
def test_proxy_gone_means_no_network(
    world: World, ok_server: int, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    seen, events = _run_and_break(world, ok_server, monkeypatch, how)
    assert seen["before"] == 200
    assert seen["after"] != 200, seen
    assert seen["proxy_port"] != "open", seen
    assert seen["direct_local"] != "open", seen
    assert seen["direct_host"] != "open", seen
    assert "Refused" in seen["proxy_port"] or "refused" in seen["proxy_port"], seen
    allowed = [e for e in events if e["event"] == "net_connect" and e["verdict"] == "allow"]
    assert len(allowed) == 1  # only the request made before the proxy went
    if how == "listener":
        # A listener that dies is a failure the run reports (a close is deliberate).
        failed = [e for e in events if e["event"] == "proxy_failed"]
        assert len(failed) == 1, events
        assert "listener" in failed[0]["detail"]


def test_proxy_task_failure_is_reported(
    world: World, ok_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The accept loop dies with an exception: no network, and ``proxy_failed`` in the audit."""
    from stockade.egress import _proxy

    async def broken(sock: socket.socket, accepted: object, closed: object) -> None:
        raise RuntimeError("simulated proxy crash")

    monkeypatch.setattr(_proxy, "accept_forever", broken)
    go, ready = world.workspace / "go", world.workspace / "ready"
    ready.touch()
    go.touch()
    r = _probe_run(world, ok_server, go, ready)
    seen = json.loads(r.stdout)
    assert seen["before"] != 200, seen
    assert seen["after"] != 200, seen
    assert seen["direct_local"] != "open", seen
    assert seen["direct_host"] != "open", seen
    failed = [e for e in r.events if e["event"] == "proxy_failed"]
    assert len(failed) == 1, r.events
    assert "simulated proxy crash" in failed[0]["detail"]


# --- no audit, no bwrap, no Landlock ----------------------------------------------------


def test_unwritable_audit_refuses_api(world: World) -> None:
    marker = world.workspace / "ran"
    with pytest.raises(stockade.SandboxError, match="audit"):
        stockade.run(
            ["touch", str(marker)],
            workspace=world.workspace,
            env=world.env,
            audit="/proc/stockade/audit.jsonl",
        )
    assert not marker.exists()


def test_unwritable_audit_dir_refuses_as_nobody(world: World) -> None:
    marker = world.workspace / "ran"
    locked = Path(os.environ.get("TMPDIR", "/tmp")) / f"stockade-locked-{os.getpid()}"
    locked.mkdir(mode=0o755, exist_ok=True)
    try:
        proc = as_nobody(
            world, "run", "--audit", str(locked / "a.jsonl"), "--", "touch", str(marker)
        )
        assert proc.returncode == 125, proc.stderr
        assert "audit" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not marker.exists()
        assert not (locked / "a.jsonl").exists()
    finally:
        locked.rmdir()


def _refused(proc: subprocess.CompletedProcess[str], marker: Path) -> None:
    assert proc.returncode == 125, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not marker.exists(), "the command ran"


def test_no_bwrap_on_path_refuses_naming_the_fix(world: World) -> None:
    marker = world.workspace / "ran"
    empty = world.root / "empty-bin"
    empty.mkdir()
    env = dict(world.env, PATH=str(empty))
    env.pop("STOCKADE_BWRAP", None)
    proc = world.stockade("run", "--", "/usr/bin/touch", str(marker), env=env)
    _refused(proc, marker)
    assert "bubblewrap" in proc.stderr
    assert "install" in proc.stderr


def test_bwrap_env_pointing_nowhere_refuses(world: World) -> None:
    marker = world.workspace / "ran"
    proc = world.stockade(
        "run", "--", "touch", str(marker), env=dict(world.env, STOCKADE_BWRAP="/nonexistent")
    )
    _refused(proc, marker)


def test_bwrap_env_pointing_nowhere_names_the_fix(world: World) -> None:
    proc = world.stockade("run", "--", "true", env=dict(world.env, STOCKADE_BWRAP="/nonexistent"))
    assert "STOCKADE_BWRAP" in proc.stderr or "install" in proc.stderr


def test_no_landlock_refuses_naming_the_fix(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = world.workspace / "ran"
    monkeypatch.setattr(_host, "landlock_abi", lambda: 0)
    with pytest.raises(stockade.Unavailable, match=r"Landlock.*--disable files"):
        stockade.run(["touch", str(marker)], workspace=world.workspace, env=world.env)
    assert not marker.exists()
    # The twin: with the files layer off, it runs.
    r = stockade.run(
        ["touch", str(marker)], workspace=world.workspace, env=world.env, disable=["files"]
    )
    assert r.returncode == 0
    assert marker.exists()


def test_no_seccomp_refuses(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = world.workspace / "ran"
    monkeypatch.setattr(_host, "seccomp_available", lambda: False)
    with pytest.raises(stockade.Unavailable, match="--disable syscalls"):
        stockade.run(["touch", str(marker)], workspace=world.workspace, env=world.env)
    assert not marker.exists()


# --- bad command lines ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("bogus",),
        ("--bogus",),
        ("run", "--bogus", "--", "true"),
        ("run", "--timeout", "-1", "--", "true"),
        ("run", "--timeout", "0", "--", "true"),
        ("run", "--timeout", "soon", "--", "true"),
        ("run", "--disable", "bogus", "--", "true"),
        ("run", "--audit"),
        ("run",),
        ("run", "--"),
        ("run", "--policy", "/nonexistent", "--", "true"),
        ("run", "--workspace", "/nonexistent", "--", "true"),
        ("run", "--workspace", "x" * 5000, "--", "true"),
        ("run", "--allow-host", "*", "--", "true"),
        ("run", "--policy", "a", "--srt-settings", "b", "--", "true"),
        ("check", "--bogus"),
        ("log", "--bogus"),
    ],
)
def test_bad_cli_invocation(world: World, args: tuple[str, ...]) -> None:
    marker = world.workspace / "ran"
    proc = world.stockade(*args)
    assert proc.returncode == 125, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "internal error" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, proc.stderr  # argparse adds its usage line; one error line
    assert lines[0].startswith("stockade"), proc.stderr
    assert not marker.exists()


def test_timeout_nan_is_refused(world: World) -> None:
    proc = world.stockade("run", "--timeout", "nan", "--", "true")
    assert proc.returncode == 125


# --- a placeholder cannot be made ---------------------------------------------------------


def test_a_placeholder_that_cannot_be_made_stops_the_run(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every layer on, the placeholders of protected paths are made while bubblewrap
    starts; one that cannot be made (a full disk, here injected) stops the run before its
    command starts, and leaves nothing behind."""
    from stockade.enforce import paths

    real = paths.make_placeholders

    def full_disk(dirs: Any, files: Any, *, strict: bool = True) -> Any:
        made, _ = real(list(dirs)[:1], [], strict=strict)  # one made, then the disk is full
        paths.remove_placeholders(made)
        raise OSError(28, "No space left on device", str(world.workspace / ".vscode"))

    monkeypatch.setattr(paths, "make_placeholders", full_disk)
    with pytest.raises(stockade.SandboxError, match=r"placeholder .*No space left"):
        stockade.run(["sh", "-c", "touch ran"], workspace=world.workspace, env=world.env)
    assert sorted(os.listdir(world.workspace)) == ["README"]
    # The twin: with room on the disk, the same run runs, and tidies up.
    monkeypatch.setattr(paths, "make_placeholders", real)
    done = stockade.run(["sh", "-c", "touch ran"], workspace=world.workspace, env=world.env)
    assert done.returncode == 0
    assert sorted(os.listdir(world.workspace)) == ["README", "ran"]
