"""Load: 20 pods x 50 concurrent connections through one ``stockade gateway serve`` process.

The gateway is a real subprocess (its own event loop, audit JSON lines on its stdout)
against the fake API server; the 20 pods are 20 source addresses on 127.0.0.0/8, each
with its own policy allowing one name. Every pod opens 50 CONNECT tunnels at once, half
to its own name (allowed) and half to its neighbour's (denied), all 1,000 held open
together, then each allowed tunnel is used and everything closed. Every decision must be
right and audited with the right pod, twice over, with the gateway's memory bounded and
not growing from the first round to the second.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.harness import pod
from tests.gateway.process import ApiThread, GatewayProcess, raise_nofile

pytestmark = pytest.mark.slow

PODS = 20
PER_POD = 50
SOURCES = [f"127.0.10.{i + 1}" for i in range(PODS)]
#: resident memory the gateway may add while holding 1,000 connections
PEAK_BUDGET_MIB = 64
#: how much the second round's peak may exceed the first's (a leak would grow it)
GROWTH_BUDGET_MIB = 16


def _policy(i: int) -> str:
    return (
        f'[network]\nallow = ["h{i}.test"]\n'
        f'hosts = {{ "h{i}.test" = "127.0.0.1", "h{(i + 1) % PODS}.test" = "127.0.0.1" }}\n'
        '[kubernetes]\nnamespaces = ["team"]\n'
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Load:
    def __init__(self, tmp: Path) -> None:
        raise_nofile()
        self.api = ApiThread(tmp)
        for i, source in enumerate(SOURCES):
            self.api.put(pod(f"pod-{i}", source, policy=f"p{i}"))
        policies = tmp / "policies"
        policies.mkdir()
        for i in range(PODS):
            (policies / f"p{i}.toml").write_text(_policy(i))
        self.port = _free_port()
        self.gateway = GatewayProcess(
            tmp,
            self.api,
            [
                "--listen",
                f"127.0.0.1:{self.port}",
                "--policies",
                str(policies),
                "--namespace",
                "team",
            ],
            metrics=("127.0.0.1", _free_port()),
        )

    def close(self) -> None:
        self.gateway.close()
        self.api.close()


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Load]:
    setup = Load(tmp_path)
    try:
        setup.gateway.wait_ready()
        yield setup
    finally:
        setup.close()


async def _round(load: Load, tag: str) -> tuple[int, int]:
    """Open all 1,000 tunnels, check each answer, use the allowed ones, close all;
    (errors, the gateway's RSS in KiB while all were open)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(b"echo:" + line)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    origin = await asyncio.start_server(echo, "127.0.0.1", 0, backlog=2048)
    origin_port = origin.sockets[0].getsockname()[1]
    errors: list[str] = []
    everyone_open = asyncio.Event()
    opened = 0
    total = PODS * PER_POD

    async def client(i: int, j: int) -> None:
        nonlocal opened
        allowed = j % 2 == 0
        host = f"h{i if allowed else (i + 1) % PODS}.test:{origin_port}"
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", load.port, local_addr=(SOURCES[i], 0)
            )
            writer.write(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status = int(head.split(b" ", 2)[1])
            if status != (200 if allowed else 403):
                errors.append(f"pod {i} {host}: {status}")
            opened += 1
            if opened == total:
                everyone_open.set()
            await asyncio.wait_for(everyone_open.wait(), 60)
            if allowed:
                line = f"{tag}-{i}-{j}\n".encode()
                writer.write(line)
                if await asyncio.wait_for(reader.readline(), 30) != b"echo:" + line:
                    errors.append(f"pod {i} {host}: no echo")
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            errors.append(f"pod {i} {host}: {exc!r}")
            opened += 1
            if opened == total:
                everyone_open.set()
        finally:
            if writer is not None:
                writer.close()

    async def sample() -> int:
        await everyone_open.wait()
        return await asyncio.to_thread(load.gateway.rss_kib)

    peak_task = asyncio.create_task(sample())
    await asyncio.gather(*(client(i, j) for i in range(PODS) for j in range(PER_POD)))
    peak = await peak_task
    origin.close()
    await origin.wait_closed()
    assert not errors, errors[:10]
    return len(errors), peak


def _decisions(load: Load, since: int) -> list[dict[str, object]]:
    return [
        e
        for e in load.gateway.events()[since:]
        if e.get("event") == "net_connect" and e.get("mode") == "gateway"
    ]


def test_thousand_connections_from_twenty_pods(load: Load) -> None:
    baseline = load.gateway.rss_kib()
    peaks = []
    for tag in ("one", "two"):
        before = len(load.gateway.events())
        _, peak = asyncio.run(_round(load, tag))
        peaks.append(peak)
        deadline = time.monotonic() + 30
        while len(_decisions(load, before)) < PODS * PER_POD:
            assert time.monotonic() < deadline, (
                f"{len(_decisions(load, before))} decisions audited: {load.gateway.stderr()}"
            )
            time.sleep(0.1)
        events = _decisions(load, before)
        assert len(events) == PODS * PER_POD
        seen: Counter[tuple[object, ...]] = Counter()
        for event in events:
            i = SOURCES.index(str(event["peer"]))
            assert (event["pod"], event["pod_uid"], event["policy"]) == (
                f"pod-{i}",
                f"uid-pod-{i}",
                f"p{i}",
            )
            assert event["policy_digest"]
            own = event["host"] == f"h{i}.test"
            assert event["verdict"] == ("allow" if own else "deny"), event
            if not own:
                assert event["reason"] == "host-not-allowed"
                assert event["host"] == f"h{(i + 1) % PODS}.test"
            seen[(i, event["verdict"])] += 1
        assert set(seen.values()) == {PER_POD // 2}
        assert len(seen) == 2 * PODS
        # The gateway let go of every connection.
        assert load.gateway.metric("stockade_gateway_open_connections") == 0
    growth = (peaks[0] - baseline) / 1024
    assert growth < PEAK_BUDGET_MIB, f"1,000 connections took {growth:.0f} MiB"
    assert (peaks[1] - peaks[0]) / 1024 < GROWTH_BUDGET_MIB, peaks
    allowed = 'stockade_gateway_decisions_total{policy="p0",verdict="allow",reason="allowed"}'
    assert load.gateway.metric(allowed) == PER_POD  # 25 per round, two rounds
    print(f"gateway RSS: {baseline} KiB idle, peaks {peaks} KiB with 1,000 open")
