"""Load: 1,000 concurrent connections through one sandbox's proxy; 50 sandboxes at once."""

from __future__ import annotations

import http.server
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import stockade
from stockade.enforce import limits
from tests.conftest import World

pytestmark = [pytest.mark.usefixtures("kernel"), pytest.mark.slow]

CONNECTIONS = 1000

CLIENT = r"""
import asyncio, json, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
port, n = int(sys.argv[1]), int(sys.argv[2])
async def one(i, start):
    await start.wait()
    r, w = await asyncio.open_connection("127.0.0.1", 3128)
    w.write(b"GET http://local.test:%d/%d HTTP/1.1\r\nHost: local.test\r\nConnection: close\r\n\r\n" % (port, i))
    await w.drain()
    data = await r.read()
    w.close()
    return data.startswith(b"HTTP/1.1 200") and data.endswith(b"ok")
async def main():
    start = asyncio.Event()
    tasks = [asyncio.create_task(one(i, start)) for i in range(n)]
    t0 = time.monotonic(); start.set()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"ok": sum(d is True for d in done), "errors": [repr(d) for d in done if d is not True][:5], "seconds": time.monotonic() - t0}))
asyncio.run(main())
"""


@pytest.fixture
def origin() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 2048

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def processes_with(marker: str) -> list[str]:
    """Pids of the processes whose command line holds ``marker``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    alive.append(entry.name)
            except OSError:
                continue
    return alive


def test_thousand_connections_through_one_proxy(world: World, origin: int) -> None:
    policy = world.root / "p.toml"
    policy.write_text('[network]\nallow = ["local.test"]\nhosts = { "local.test" = "127.0.0.1" }\n')
    fds_before, rss_before = _fds(), _rss_kib()
    started = time.monotonic()
    r = stockade.run(
        ["python3", "-c", CLIENT, str(origin), str(CONNECTIONS)],
        policy=policy,
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    rss_after = _rss_kib()
    time.sleep(0.5)
    fds_after = _fds()
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["ok"] == CONNECTIONS, seen
    connects = [e for e in r.events if e["event"] == "net_connect"]
    assert len(connects) == CONNECTIONS
    assert all(e["verdict"] == "allow" for e in connects)
    assert len({e["path"] for e in r.events if e["event"] == "net_request"}) == CONNECTIONS
    assert fds_after <= fds_before, (fds_before, fds_after)
    growth = rss_after - rss_before
    print(
        f"\nload: {CONNECTIONS} connections in {seen['seconds']:.2f}s (run {elapsed:.2f}s); "
        f"RSS {rss_before} -> {rss_after} KiB (+{growth}); fds {fds_before} -> {fds_after}"
    )
    assert growth < 200 * 1024, f"RSS grew by {growth} KiB"


RUNS = 50


def test_fifty_sandboxes_at_once(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    private_tmp = world.root / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    marker = f"{world.canary}-fifty"
    fds_before = _fds()

    def one(i: int) -> stockade.CompletedRun:
        return stockade.run(
            ["sh", "-c", f"sh -c 'sleep 30' {marker} & echo {i}"],
            workspace=world.workspace,
            env=world.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with ThreadPoolExecutor(RUNS) as pool:
        results = list(pool.map(one, range(RUNS)))
    assert [r.returncode for r in results] == [0] * RUNS, [
        r.stderr for r in results if r.returncode
    ]
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(RUNS)]
    time.sleep(0.3)
    assert processes_with(marker) == []
    support = limits.detect()
    if support is not None:
        left = [
            p / f"stockade-{r.run_id}"
            for r in results
            for p in support.parents.values()
            if (p / f"stockade-{r.run_id}").exists()
        ]
        assert left == []
    assert os.listdir(private_tmp) == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(private_tmp) not in mounts
    assert _fds() <= fds_before


@pytest.mark.parametrize(
    "shared",
    [
        False,
        True,
    ],
    ids=["own-workspaces", "one-workspace"],
)
def test_fifty_cli_sandboxes_at_once_without_cgroups(world: World, shared: bool) -> None:
    """50 ``stockade run`` processes at once, limits layer off (no cgroup, so no sweep race):
    all succeed, nothing of them survives, no scratch directory or mount is left."""
    import subprocess
    import sys

    private_tmp = world.root / "tmp"
    private_tmp.mkdir()
    env = dict(world.env, TMPDIR=str(private_tmp))
    marker = f"{world.canary}-cli50"
    workspaces = []
    for i in range(RUNS):
        ws = world.workspace if shared else world.root / f"ws{i}"
        ws.mkdir(exist_ok=True)
        workspaces.append(ws)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stockade",
                "run",
                "--disable",
                "limits",
                "--",
                "sh",
                "-c",
                f"sh -c 'sleep 30' {marker} & echo {i}",
            ],
            cwd=workspaces[i],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(RUNS)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    failed = [e for p, (_, e) in zip(procs, outs, strict=True) if p.returncode != 0]
    assert failed == [], f"{len(failed)} of {RUNS} failed: {sorted(set(failed))[:3]}"
    assert [o.strip() for o, _ in outs] == [str(i) for i in range(RUNS)]
    time.sleep(0.3)
    assert processes_with(marker) == []
    assert os.listdir(private_tmp) == []
    assert str(world.root) not in Path("/proc/self/mountinfo").read_text()
