"""The resolver on real sockets: UDP datagrams, length-prefixed TCP, and a query flood."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time

import pytest

from stockade.egress.dns import POOL
from stockade.egress.dns import _server as server_module
from tests.egress.dns import wire
from tests.egress.dns.conftest import (
    TIMEOUT,
    DnsHarness,
    recv_framed,
    send_framed,
)

# -- UDP ---------------------------------------------------------------------------------


def test_udp_allowed_denied_and_localhost(dns_harness: DnsHarness) -> None:
    allowed = wire.parse(dns_harness.udp(wire.query("allowed.test", ident=1)))
    assert allowed.ident == 1
    assert ipaddress.IPv4Address(allowed.answers[0].rdata) in POOL
    denied = wire.parse(dns_harness.udp(wire.query("x.attacker.test", ident=2)))
    assert (denied.ident, denied.rcode) == (2, wire.NXDOMAIN)
    local = wire.parse(dns_harness.udp(wire.query("localhost", ident=3)))
    assert local.answers[0].rdata == bytes([127, 0, 0, 1])
    assert [f["name"] for _, _, f in dns_harness.events.items] == [
        "allowed.test",
        "x.attacker.test",
    ]


def test_udp_unanswerable_datagrams_get_nothing_and_the_server_goes_on(
    dns_harness: DnsHarness,
) -> None:
    for junk in (b"", b"\x00", b"\x12\x34\x81", wire.query("allowed.test", flags=0x8000)):
        with pytest.raises(TimeoutError):
            dns_harness.udp(junk, timeout=0.2)
    # A readable header with a bad question gets FORMERR over UDP too.
    formerr = wire.parse(dns_harness.udp(wire.query("allowed.test")[:20]))
    assert formerr.rcode == wire.FORMERR
    assert wire.parse(dns_harness.udp(wire.query("allowed.test"))).rcode == wire.NOERROR


# -- TCP ---------------------------------------------------------------------------------


def test_tcp_two_queries_on_one_connection(dns_harness: DnsHarness) -> None:
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test", ident=10))
        first = wire.parse(recv_framed(sock))
        send_framed(sock, wire.query("denied.test", wire.AAAA, ident=11))
        second = wire.parse(recv_framed(sock))
        # and two pipelined in one write
        sock.sendall(
            struct.pack("!H", 30) + wire.query("allowed.test", ident=12)
            + struct.pack("!H", 29) + wire.query("a.wild.test", ident=13)
        )  # fmt: skip
        third, fourth = wire.parse(recv_framed(sock)), wire.parse(recv_framed(sock))
    assert (first.ident, first.rcode, len(first.answers)) == (10, wire.NOERROR, 1)
    assert (second.ident, second.rcode) == (11, wire.NXDOMAIN)
    assert (third.ident, fourth.ident) == (12, 13)
    assert third.answers[0].rdata == first.answers[0].rdata
    assert fourth.answers[0].rdata != first.answers[0].rdata


def test_tcp_half_close_after_a_query_gets_the_answer_then_eof(dns_harness: DnsHarness) -> None:
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test", ident=5))
        sock.shutdown(socket.SHUT_WR)
        assert wire.parse(recv_framed(sock)).ident == 5
        assert sock.recv(1) == b""


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xff" + b"x" * 100,  # a length longer than what follows, then EOF
        b"\x00\x00",  # an empty message
        b"\x00\x05hello",  # shorter than a header: no answer, so the connection ends
        b"\x00",  # half a length
        wire.query("allowed.test", flags=0x8000),  # a response with no length prefix
    ],
)
def test_tcp_garbage_is_a_clean_close(dns_harness: DnsHarness, payload: bytes) -> None:
    with dns_harness.tcp() as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536) == b""
    # The server goes on serving.
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test", ident=99))
        assert wire.parse(recv_framed(sock)).ident == 99


def test_tcp_formerr_keeps_the_connection(dns_harness: DnsHarness) -> None:
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test", ident=1, qdcount=2))
        assert wire.parse(recv_framed(sock)).rcode == wire.FORMERR
        send_framed(sock, wire.query("allowed.test", ident=2))
        assert wire.parse(recv_framed(sock)).rcode == wire.NOERROR


def test_tcp_client_that_closes_is_forgotten(dns_harness: DnsHarness) -> None:
    for _ in range(3 * server_module._MAX_TCP):
        sock = dns_harness.tcp()
        send_framed(sock, wire.query("allowed.test"))
        recv_framed(sock)
        sock.close()
    # Each closed connection gave its slot back: a new one is still served.
    deadline = time.monotonic() + TIMEOUT
    while dns_harness.server._tcp and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not dns_harness.server._tcp
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test", ident=3))
        assert wire.parse(recv_framed(sock)).ident == 3


def test_tcp_connections_beyond_the_limit_are_closed(dns_harness: DnsHarness) -> None:
    limit = server_module._MAX_TCP
    held = []
    try:
        for index in range(limit):
            sock = dns_harness.tcp()
            send_framed(sock, wire.query("allowed.test", ident=index))
            assert wire.parse(recv_framed(sock)).ident == index  # registered and served
            held.append(sock)
        with dns_harness.tcp() as extra:
            extra.settimeout(TIMEOUT)
            # closed at once, before anything is read: the query goes unanswered
            send_framed(extra, wire.query("allowed.test"))
            with pytest.raises((EOFError, ConnectionResetError)):
                recv_framed(extra)
        held.pop().close()
        deadline = time.monotonic() + TIMEOUT
        while len(dns_harness.server._tcp) >= limit and time.monotonic() < deadline:
            time.sleep(0.01)
        with dns_harness.tcp() as sock:
            send_framed(sock, wire.query("allowed.test", ident=777))
            assert wire.parse(recv_framed(sock)).ident == 777
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow
def test_tcp_idle_client_is_closed_after_the_timeout(dns_harness: DnsHarness) -> None:
    idle = server_module._TCP_IDLE
    with dns_harness.tcp() as sock:
        send_framed(sock, wire.query("allowed.test"))
        recv_framed(sock)
        start = time.monotonic()
        sock.settimeout(idle + TIMEOUT)
        # half a message, then silence: the timeout covers a stalled message too
        sock.sendall(b"\x00\x1e\x12")
        assert sock.recv(1) == b""
        waited = time.monotonic() - start
    assert idle - 0.5 <= waited <= idle + TIMEOUT


def test_close_stops_answering() -> None:
    harness = DnsHarness()
    try:
        assert wire.parse(harness.udp(wire.query("allowed.test"))).rcode == wire.NOERROR
        held = harness.tcp()
        send_framed(held, wire.query("allowed.test"))
        recv_framed(held)
    finally:
        harness.stop()
    with held:
        held.settimeout(TIMEOUT)
        assert held.recv(1) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(harness.tcp_address, timeout=TIMEOUT).close()


# -- flood -------------------------------------------------------------------------------


def _flood_messages(count: int) -> list[bytes]:
    out = []
    for index in range(count):
        ident = index & 0xFFFF
        kind = index % 4
        if kind == 0:
            out.append(wire.query(f"n{index}.denied.test", ident=ident))
        elif kind == 1:
            out.append(wire.query(f"{index:064x}"[:63] + ".attacker.test", ident=ident))
        elif kind == 2:
            out.append(wire.query(f"w{index % 500}.wild.test", wire.AAAA, ident=ident))
        else:
            out.append(wire.query("allowed.test", ident=ident)[: 12 + index % 20])
    return out


def test_flood_of_ten_thousand_udp_queries() -> None:
    harness = DnsHarness()
    try:
        messages = _flood_messages(10_000)
        answers: list[bytes] = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.connect(harness.udp_address)
            sock.settimeout(1.0)
            done = threading.Event()

            def receive() -> None:
                while True:
                    try:
                        answers.append(sock.recv(65535))
                    except TimeoutError:
                        if done.is_set():
                            return

            reader = threading.Thread(target=receive)
            reader.start()
            start = time.monotonic()
            for message in messages:
                sock.send(message)
            sent = time.monotonic() - start
            done.set()
            reader.join(30)
        # The kernel drops datagrams the server had no time to read (how many depends on
        # the machine's load); every answer that came back is a well-formed response.
        assert answers, sent
        for data in answers:
            reply = wire.parse(data)
            assert reply.qr
            assert reply.rcode in (wire.NOERROR, wire.NXDOMAIN, wire.FORMERR)
        # Paced so that the kernel drops nothing: every one of 10,000 is answered.
        lost = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(harness.udp_address)
            sock.settimeout(TIMEOUT)
            for window in range(0, len(messages), 50):
                batch = messages[window : window + 50]
                for message in batch:
                    sock.send(message)
                for _ in batch:
                    try:
                        wire.parse(sock.recv(65535))
                    except TimeoutError:
                        lost += 1
                        break
        assert lost == 0
        # Still answering afterwards, at once.
        after = wire.parse(harness.udp(wire.query("allowed.test", ident=4242)))
        assert (after.ident, after.rcode) == (4242, wire.NOERROR)
        # Memory stays bounded: events capped, one address per distinct allowed name.
        assert len(harness.events) <= server_module.MAX_EVENTS + 1
        assert len(harness.server._logged) <= server_module.MAX_EVENTS
        assert len(harness.server.pool) <= 501
    finally:
        harness.stop()
