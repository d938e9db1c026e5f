"""Garbage on the listener: a clean close, no traceback, no hang, one event each."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.egress import EgressRules
from tests.egress.conftest import ProxyHarness

TEMPLATES = [
    b"GET http://allowed.test:9/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
    b"POST http://allowed.test:9/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    b"\x05\x01\x00\x05\x01\x00\x03\x0callowed.test\x00\x09",
    b"\x05\x02\x00\x02\x05\x01\x00\x01\x7f\x00\x00\x01\x01\xbb",
    b"\x05\x01\x00\x05\x03\x00\x04" + bytes(16) + b"\x00\x35",
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(TEMPLATES)))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        where = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if action == "flip":
            data[where] = draw(st.integers(0, 255))
        elif action == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del data[where]
        else:
            del data[where:]
    return bytes(data)


@pytest.fixture(scope="module")
def fuzz_proxy() -> Iterator[ProxyHarness]:
    # Port 9 (discard) on loopback is closed: an allowed request fails upstream, cleanly.
    rules = EgressRules(allow=("allowed.test",), hosts={"allowed.test": "127.0.0.1"})
    harness = ProxyHarness(rules, handshake_timeout=1.0, connect_timeout=1.0)
    yield harness
    harness.stop()


def _exchange(proxy: ProxyHarness, payload: bytes) -> None:
    before = len(proxy.named("net_connect"))
    sock = proxy.connect()
    sock.settimeout(4)
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass  # until the proxy closes: a hang fails on the timeout
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    events = proxy.wait_events("net_connect", before + 1)
    assert len(events) == before + 1


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.binary(min_size=1, max_size=300) | mutated())
def test_garbage_gets_a_clean_close(
    fuzz_proxy: ProxyHarness, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stockade.egress"):
        _exchange(fuzz_proxy, payload)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert fuzz_proxy.error is None
