"""Random and mutated messages: the resolver never raises, and what it answers is a
well-formed response to the same id that a strict parser reads."""

from __future__ import annotations

import contextlib
import socket
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.egress.dns import DnsServer
from tests.egress.dns import wire
from tests.egress.dns.conftest import DnsHarness, make_server

TEMPLATES = [
    wire.query("allowed.test"),
    wire.query("Allowed.Test", wire.AAAA, edns=True),
    wire.query("a.wild.test", wire.HTTPS),
    wire.query("x.attacker.test", wire.TXT),
    wire.query("pinned.test"),
    wire.query("localhost", wire.AAAA),
    wire.query("1.0.64.127.in-addr.arpa", wire.PTR),
    wire.query("1.0.0.127.in-addr.arpa", wire.PTR),
    wire.query([b"a" * 63] * 3 + [b"b" * 61]),
    wire.query("allowed.test", flags=2 << 11),
]

# One server for every example: state (pool, events) accumulates as in a real run.
SERVER, EVENTS = make_server()
SERVER.answer(wire.query("allowed.test"))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(TEMPLATES)))
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        where = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "bit", "insert", "delete", "truncate", "count"]))
        if action == "flip":
            data[where] = draw(st.integers(0, 255))
        elif action == "bit":
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del data[where]
        elif action == "truncate":
            del data[where:]
        elif len(data) >= 12:
            # a header count (QD, AN, NS or AR) set to anything
            field = draw(st.integers(2, 5))
            struct.pack_into("!H", data, 2 * field, draw(st.integers(0, 0xFFFF)))
    return bytes(data)


@st.composite
def random_names(draw: st.DrawFn) -> bytes:
    labels = draw(st.lists(st.binary(min_size=1, max_size=63), min_size=0, max_size=6))
    qtype = draw(st.sampled_from([1, 12, 28, 16, 65, 255, 0, 0xFFFF]))
    return wire.query(labels, qtype, ident=draw(st.integers(0, 0xFFFF)))


def check(server: DnsServer, message: bytes) -> None:
    data = server.answer(message)
    if data is None:
        # Only a message whose header is unreadable, or a response, goes unanswered.
        assert len(message) < 12 or message[2] & 0x80
        return
    reply = wire.parse(data)
    assert reply.ident == struct.unpack_from("!H", message)[0]
    assert reply.qr
    assert not reply.tc
    assert len(data) <= 512
    assert reply.rcode in (
        wire.NOERROR,
        wire.FORMERR,
        wire.NXDOMAIN,
        wire.NOTIMP,
        wire.REFUSED,
    )
    if reply.rcode != wire.NOERROR:
        assert reply.answers == []
    if reply.questions:
        # An answer with a question echoes the one asked, byte for byte.
        assert reply.question_bytes == message[12 : 12 + len(reply.question_bytes)]


@settings(max_examples=1500, deadline=None)
@given(message=st.binary(min_size=0, max_size=600))
def test_random_bytes(message: bytes) -> None:
    check(SERVER, message)


@settings(max_examples=1500, deadline=None)
@given(message=mutated())
def test_mutated_queries(message: bytes) -> None:
    check(SERVER, message)


@settings(max_examples=1000, deadline=None)
@given(message=random_names())
def test_random_names(message: bytes) -> None:
    check(SERVER, message)
    # Whatever the labels, only a valid host name the policy allows gets an address.
    reply = wire.parse(SERVER.answer(message) or b"")
    for record in reply.answers:
        assert record.rtype in (wire.A, wire.AAAA, wire.PTR)


def test_events_stay_printable_after_fuzzing() -> None:
    for message in TEMPLATES:
        check(SERVER, message)
    for _, _, fields in EVENTS.items:
        assert all(ch.isprintable() for ch in fields["name"])


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(mutated() | st.binary(max_size=64), min_size=1, max_size=5))
def test_garbage_over_tcp_never_stops_the_server(messages: list[bytes]) -> None:
    harness = _TCP_HARNESS
    data = b""
    with harness.tcp() as sock:
        # The server closes a connection at a message it does not answer (an unreadable
        # header), so a later write or read may find the connection reset.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError, OSError):
            for message in messages:
                sock.sendall(struct.pack("!H", len(message)) + message)
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    pos = 0
    while pos + 2 <= len(data):
        (length,) = struct.unpack_from("!H", data, pos)
        if pos + 2 + length > len(data):
            break  # cut short by a reset
        reply = wire.parse(data[pos + 2 : pos + 2 + length])
        assert reply.qr
        pos += 2 + length
    assert wire.parse(harness.udp(wire.query("allowed.test", ident=1))).ident == 1


_TCP_HARNESS = DnsHarness()


def teardown_module() -> None:
    _TCP_HARNESS.stop()
