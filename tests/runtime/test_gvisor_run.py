"""End to end under the real runsc (``[container] backend = "gvisor"``).

Opt-in: these run only with ``STOCKADE_GVISOR=1`` (then a missing or unusable runsc is a
failure under ``STOCKADE_MUST_WORK=1``, as every kernel test's); ``scripts/setup
--gvisor`` fetches runsc. Serial and few: each sandbox costs ~80 MB and 0.2-0.4 s.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import SECRET_ENV, SECRET_FILES, World

GVISOR = ("--backend", "gvisor")


@pytest.fixture
def gworld(world: World, runsc: str) -> World:
    # The world's HOME is a fake one: name the runsc to use explicitly.
    world.env["STOCKADE_RUNSC"] = runsc
    return world


def test_exit_code_stdout_and_stderr(gworld: World) -> None:
    proc = gworld.stockade("run", *GVISOR, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "out\n"
    assert "err" in proc.stderr


def test_runs_on_a_kernel_of_its_own(gworld: World) -> None:
    proc = gworld.stockade("run", *GVISOR, "--", "cat", "/proc/version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Linux version 4.4.0")  # the Sentry's, not the host's


def test_workspace_writes_reach_the_host_and_home_is_discarded(gworld: World) -> None:
    proc = gworld.stockade(
        "run", *GVISOR, "--", "sh", "-c", "echo w > out.txt; echo h > ~/left.txt; ls -A ~"
    )
    assert proc.returncode == 0, proc.stderr
    assert (gworld.workspace / "out.txt").read_text() == "w\n"
    assert proc.stdout == "left.txt\n"  # HOME started empty
    assert not (gworld.home / "left.txt").exists()


def test_secrets_stay_out(gworld: World) -> None:
    script = "; ".join(f"cat ~/{rel} 2>/dev/null" for rel in SECRET_FILES)
    script += "; cat /etc/shadow; env; true"
    proc = gworld.stockade("run", *GVISOR, "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert gworld.canary not in proc.stdout + proc.stderr
    assert "root:" not in proc.stdout  # /etc/shadow is /dev/null inside
    for name in SECRET_ENV:
        assert f"{name}=" not in proc.stdout


def test_system_is_read_only_and_the_twin_writes_tmp(gworld: World) -> None:
    proc = gworld.stockade(
        "run",
        *GVISOR,
        "--",
        "sh",
        "-c",
        "echo x > /etc/stockade-test || echo refused; echo y > /tmp/t && cat /tmp/t",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused\ny\n"
    assert not Path("/etc/stockade-test").exists()


def test_seccomp_and_no_capabilities(gworld: World) -> None:
    proc = gworld.stockade(
        "run", *GVISOR, "--", "grep", "-E", "^(Seccomp|CapEff):", "/proc/self/status"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Seccomp:\t2" in proc.stdout
    assert "CapEff:\t0000000000000000" in proc.stdout


def test_allowed_host_reachable_and_others_not(gworld: World) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        policy = gworld.root / "policy.toml"
        policy.write_text(
            f'version = 1\n[network]\nallow = ["web.test:{port}"]\n'
            f'hosts = {{ "web.test" = "127.0.0.1" }}\n'
        )
        curl = 'curl -sS -m 5 -o /dev/null -w "%{http_code}\\n"'
        script = (
            f"{curl} http://web.test:{port}/; {curl} http://other.test:{port}/; "
            f"{curl} --noproxy '*' http://web.test:{port}/; {curl} --noproxy '*' http://192.0.2.1/"
        )
        proc = gworld.stockade("run", "--policy", str(policy), *GVISOR, "--", "sh", "-c", script)
    finally:
        server.shutdown()
        server.server_close()
    # Explicit proxy, then transparent capture: the allowed host works both ways, the
    # others are refused by the proxy (403), never reached directly.
    assert proc.stdout.split() == ["200", "403", "200", "403"], proc.stderr


def test_no_survivors_after_sigkill_of_stockade(gworld: World) -> None:
    env = dict(gworld.env)
    proc = subprocess.Popen(
        [*gworld.command, "run", *GVISOR, "--", "sh", "-c", "echo started; sleep 300"],
        cwd=gworld.workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"

    def tree(pid: int) -> list[int]:
        out = [pid]
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            out += tree(int(child))
        return out

    pids = [p for p in tree(proc.pid) if p != proc.pid]
    assert pids  # runsc run, its sandbox and gofer
    proc.kill()
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in pids if _alive(p)]
    assert not alive, f"processes left after SIGKILL of stockade: {alive}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_wall_time_kill(gworld: World) -> None:
    started = time.monotonic()
    proc = gworld.stockade("run", *GVISOR, "--timeout", "1", "--", "sleep", "30")
    assert proc.returncode == 124
    assert time.monotonic() - started < 10


def test_missing_runsc_is_exit_125_never_bubblewrap(world: World) -> None:
    env = dict(world.env, STOCKADE_RUNSC=str(world.root / "no-runsc"))
    proc = world.stockade("run", *GVISOR, "--", "true", env=env)
    assert proc.returncode == 125
    assert "runsc" in proc.stderr


def test_an_old_runsc_is_refused_with_exit_125(world: World) -> None:
    fake = world.root / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~20221219.0'\n")
    fake.chmod(0o755)
    proc = world.stockade(
        "run", *GVISOR, "--", "true", env=dict(world.env, STOCKADE_RUNSC=str(fake))
    )
    assert proc.returncode == 125
    assert "release-20230227.0" in proc.stderr
