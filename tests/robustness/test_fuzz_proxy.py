"""Fuzzing the proxy's HTTP, CONNECT and SOCKS5 parsing with a real allowed upstream.

Random bytes and mutated valid requests (forward proxy with bodies and keep-alive,
CONNECT, SOCKS5 with every address type), sent whole or in pieces: each connection ends
with a clean close or a clean error, in bounded time, with exactly one ``net_connect``
event, no warning or traceback in the log or on stderr, and no descriptor left open.
Unlike tests/egress/test_fuzz.py, the allowed name is pinned to a live origin, so mutated
valid requests get past the decision and into the relay and body framing code.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.egress import EgressRules
from tests.egress.conftest import ProxyHarness, RecordingHTTPServer, _serve
from tests.robustness.conftest import count_example

HANDSHAKE = 1.0
IDLE = 1.5
#: the longest one exchange may take: every timeout once, plus scheduling slack
BOUND = HANDSHAKE + IDLE + 1.0 + 2.0


@dataclass
class Rig:
    proxy: ProxyHarness
    origin: RecordingHTTPServer
    port: int


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    origin = RecordingHTTPServer(("127.0.0.1", 0))
    _serve(origin)
    rules = EgressRules(
        allow=("allowed.test", "127.0.0.1"),
        hosts={"allowed.test": "127.0.0.1"},
        local=frozenset(),
    )
    proxy = ProxyHarness(
        rules,
        handshake_timeout=HANDSHAKE,
        connect_timeout=1.0,
        idle_timeout=IDLE,
        dns_timeout=0.5,
    )
    yield Rig(proxy, origin, origin.port)
    proxy.stop()
    origin.shutdown()
    origin.server_close()


def templates(port: int) -> list[bytes]:
    p = str(port).encode()
    host = b"allowed.test:" + p
    pb = struct.pack(">H", port)
    return [
        b"GET http://" + host + b"/a?q=1 HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
        b"GET http://" + host + b"/a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET http://" + host + b"/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"POST http://" + host + b"/p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"POST http://" + host + b"/p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        b"HEAD http://127.0.0.1:" + p + b"/ HTTP/1.0\r\n\r\n",
        b"PUT http://" + host + b"/big HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Content-Length: 3\r\n\r\nabc",
        b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n",
        b"CONNECT " + host + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05hello",
        b"CONNECT [::1]:" + p + b" HTTP/1.1\r\n\r\n",
        b"\x05\x01\x00\x05\x01\x00\x03\x0callowed.test" + pb + b"GET / HTTP/1.0\r\n\r\n",
        b"\x05\x02\x00\x02\x05\x01\x00\x01\x7f\x00\x00\x01" + pb + b"GET / HTTP/1.0\r\n\r\n",
        b"\x05\x01\x00\x05\x01\x00\x04" + bytes(15) + b"\x01" + pb,
        b"\x05\x01\x00\x05\x02\x00\x03\x0callowed.test" + pb,  # BIND
        b"\x05\x01\x02\x01\x01u\x01p",  # user/password only
    ]


OPS = ("flip", "insert", "delete", "truncate", "duplicate")


@dataclass
class Case:
    template: int | None  # None: random bytes
    data: bytes
    ops: list[tuple[str, float, bytes]]
    pieces: list[float]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    if draw(st.integers(0, 4)) == 0:
        return Case(None, draw(st.binary(min_size=1, max_size=400)), [], [])
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(OPS),
                st.floats(0, 1, exclude_max=True),
                st.binary(min_size=1, max_size=8),
            ),
            max_size=4,
        )
    )
    pieces = draw(st.lists(st.floats(0, 1), max_size=3))
    return Case(draw(st.integers(0, 14)), b"", ops, pieces)


def build(case: Case, port: int) -> tuple[bytes, list[int]]:
    if case.template is None:
        return case.data, []
    data = bytearray(templates(port)[case.template])
    for op, where_f, blob in case.ops:
        if not data:
            break
        where = int(where_f * len(data))
        if op == "flip":
            data[where] = blob[0]
        elif op == "insert":
            data[where:where] = blob
        elif op == "delete":
            del data[where : where + len(blob)]
        elif op == "truncate":
            del data[where:]
        else:
            data[where:where] = data[where : where + 16]
    cuts = sorted({int(f * len(data)) for f in case.pieces})
    return bytes(data), cuts


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _exchange(rig: Rig, payload: bytes, cuts: list[int]) -> None:
    sock = rig.proxy.connect()
    sock.settimeout(BOUND)
    try:
        start = 0
        for cut in [*cuts, len(payload)]:
            if cut > start:
                sock.sendall(payload[start:cut])
                start = cut
                time.sleep(0.002)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass  # until the proxy closes: a hang fails on the timeout
    except TimeoutError:
        raise  # a hang
    except OSError:
        pass  # reset, broken pipe, not connected: the proxy cut us off, a clean error
    finally:
        sock.close()


def _settle(baseline: set[str], deadline: float) -> set[str]:
    """Descriptors opened since ``baseline`` that are still open at ``deadline``."""
    while True:
        extra = _fds() - baseline
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.01)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_proxy_parsing(
    rig: Rig, case: Case, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    count_example("proxy: HTTP/CONNECT/SOCKS5 bytes")
    payload, cuts = build(case, rig.port)
    proxy = rig.proxy
    baseline = _fds()
    before = len(proxy.named("net_connect"))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        _exchange(rig, payload, cuts)
        events = proxy.wait_events("net_connect", before + 1, timeout=BOUND)
    elapsed = time.monotonic() - started
    assert len(events) == before + 1, f"{len(events) - before} net_connect events"
    assert elapsed < BOUND, f"{elapsed:.1f}s for one connection"
    assert proxy.proxy.active_connections == 0
    # Upstream sockets of the proxy and the origin's side close within a moment.
    assert not _settle(baseline, time.monotonic() + 2.0), "descriptor left open"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err
    assert proxy.error is None
    event = events[-1]
    assert event.fields["protocol"] in ("http", "connect", "socks5", "unknown", "")


def test_many_garbage_connections_at_once(rig: Rig) -> None:
    """Concurrent garbage: still one event per connection and nothing left open."""
    count_example("proxy: concurrent garbage connections")
    baseline = _fds()
    before = len(rig.proxy.named("net_connect"))
    socks = [rig.proxy.connect() for _ in range(100)]
    for i, sock in enumerate(socks):
        data = os.urandom(1 + i % 50) if i % 2 else templates(rig.port)[i % 15][: 1 + i % 40]
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    for sock in socks:
        sock.settimeout(BOUND)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            raise
        except OSError:
            pass
        sock.close()
    events = rig.proxy.wait_events("net_connect", before + 100, timeout=BOUND)
    assert len(events) == before + 100
    assert not _settle(baseline, time.monotonic() + 3.0)


@pytest.mark.slow
@settings(
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_proxy_parsing_many(rig: Rig, case: Case) -> None:
    count_example("proxy: HTTP/CONNECT/SOCKS5 bytes (slow)")
    payload, cuts = build(case, rig.port)
    before = len(rig.proxy.named("net_connect"))
    _exchange(rig, payload, cuts)
    assert len(rig.proxy.wait_events("net_connect", before + 1, timeout=BOUND)) == before + 1
    assert rig.proxy.error is None
