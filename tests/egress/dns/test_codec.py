"""The wire format: queries built with ``struct``, answers read by an independent parser."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from stockade.egress.dns import POOL, DnsServer
from stockade.egress.dns import _codec as codec
from tests.egress.dns import wire
from tests.egress.dns.conftest import ask

OTHER_TYPES = [wire.TXT, wire.MX, wire.SRV, wire.ANY, wire.HTTPS, wire.NS, wire.SOA, 999]


def _header(data: bytes) -> tuple[int, int, int, int, int, int]:
    return struct.unpack_from("!HHHHHH", data)


@pytest.mark.parametrize("flags", [wire.RD, 0])
def test_allowed_a_gets_one_synthetic_address(server: DnsServer, flags: int) -> None:
    message = wire.query("allowed.test", ident=0xBEEF, flags=flags)
    reply = ask(server, message)
    assert reply.ident == 0xBEEF
    assert reply.qr
    assert reply.aa
    assert reply.ra
    assert reply.rd == bool(flags & wire.RD)
    assert reply.opcode == 0
    assert not reply.tc
    assert reply.rcode == wire.NOERROR
    # The question comes back byte for byte.
    assert reply.question_bytes == message[12:]
    assert reply.questions == [("allowed.test", wire.A, 1)]
    assert len(reply.answers) == 1
    (record,) = reply.answers
    assert (record.name, record.rtype, record.rclass) == ("allowed.test", wire.A, 1)
    assert record.ttl > 0
    assert ipaddress.IPv4Address(record.rdata) in POOL
    assert not reply.authority
    assert not reply.additional


def test_question_case_is_echoed_but_the_name_is_folded(server: DnsServer) -> None:
    # 0x20 randomisation (resolvers mix case to check answers) needs the exact echo.
    message = wire.query("AlLoWeD.TeSt")
    reply = ask(server, message)
    assert reply.question_bytes == message[12:]
    assert reply.answers[0].name == "AlLoWeD.TeSt"
    lower = ask(server, wire.query("allowed.test"))
    assert reply.answers[0].rdata == lower.answers[0].rdata


def test_aaaa_is_nodata(server: DnsServer) -> None:
    reply = ask(server, wire.query("allowed.test", wire.AAAA))
    assert reply.rcode == wire.NOERROR
    assert reply.answers == []
    assert reply.authority == []
    assert reply.questions == [("allowed.test", wire.AAAA, 1)]


@pytest.mark.parametrize("qtype", OTHER_TYPES)
def test_other_types_are_nodata(server: DnsServer, qtype: int) -> None:
    reply = ask(server, wire.query("allowed.test", qtype))
    assert reply.rcode == wire.NOERROR
    assert reply.answers == []


@pytest.mark.parametrize("qtype", [wire.A, wire.AAAA, wire.PTR, *OTHER_TYPES])
@pytest.mark.parametrize("name", ["denied.test", "x.attacker.test", "blocked.wild.test"])
def test_denied_name_is_nxdomain_for_every_type(server: DnsServer, name: str, qtype: int) -> None:
    reply = ask(server, wire.query(name, qtype, ident=7))
    assert reply.ident == 7
    assert reply.rcode == wire.NXDOMAIN
    assert reply.answers == []
    assert reply.questions == [(name, qtype, 1)]


def test_edns_opt_record_is_tolerated(server: DnsServer) -> None:
    message = wire.query("allowed.test", edns=True)
    reply = ask(server, message)
    assert reply.rcode == wire.NOERROR
    assert len(reply.answers) == 1
    # The OPT record is not part of the question echo.
    assert reply.question_bytes == wire.question("allowed.test")


def _assert_error(server: DnsServer, message: bytes, rcode: int) -> wire.Message:
    reply = ask(server, message)
    assert reply.ident == _header(message)[0]
    assert reply.qr
    assert reply.rcode == rcode
    assert reply.answers == []
    return reply


@pytest.mark.parametrize("qdcount", [0, 2])
def test_question_count_other_than_one_is_formerr(server: DnsServer, qdcount: int) -> None:
    body = wire.question("allowed.test") * max(qdcount, 1)
    message = struct.pack("!HHHHHH", 9, wire.RD, qdcount, 0, 0, 0) + body
    _assert_error(server, message, wire.FORMERR)


def test_compression_pointer_in_question_is_formerr(server: DnsServer) -> None:
    # "allowed" then a pointer back to the header: no pointers in a question.
    message = struct.pack("!HHHHHH", 9, 0, 1, 0, 0, 0)
    message += b"\x07allowed\xc0\x0c" + struct.pack("!HH", 1, 1)
    _assert_error(server, message, wire.FORMERR)


@pytest.mark.parametrize("length", [64, 0x7F, 0x80, 0xBF])
def test_label_over_63_or_extended_label_type_is_formerr(server: DnsServer, length: int) -> None:
    message = struct.pack("!HHHHHH", 9, 0, 1, 0, 0, 0)
    message += bytes([length]) + b"a" * length + b"\x04test\x00" + struct.pack("!HH", 1, 1)
    _assert_error(server, message, wire.FORMERR)


def test_name_of_255_bytes_is_read_and_256_is_formerr(server: DnsServer) -> None:
    # Four labels of 63 bytes plus length bytes and root: 4 * 64 + 1 = 257 bytes: too long.
    long_labels = [b"a" * 63] * 4
    _assert_error(server, wire.query(long_labels), wire.FORMERR)
    # 3 * 64 + 62 (61 bytes + length) + 1 = 255: the longest legal name is parsed
    # (and refused as a name the policy does not allow).
    legal = [b"a" * 63] * 3 + [b"b" * 61]
    assert len(wire.wire_name(legal)) == 255
    assert ask(server, wire.query(legal)).rcode == wire.NXDOMAIN
    over = [b"a" * 63] * 3 + [b"b" * 62]
    assert len(wire.wire_name(over)) == 256
    _assert_error(server, wire.query(over), wire.FORMERR)


@pytest.mark.parametrize("cut", range(12, len(wire.query("allowed.test"))))
def test_truncated_question_is_formerr(server: DnsServer, cut: int) -> None:
    _assert_error(server, wire.query("allowed.test")[:cut], wire.FORMERR)


@pytest.mark.parametrize("cut", range(12))
def test_unreadable_header_gets_no_answer(server: DnsServer, cut: int) -> None:
    assert server.answer(wire.query("allowed.test")[:cut]) is None


@pytest.mark.parametrize("opcode", [1, 2, 4, 5, 15])
def test_opcode_other_than_query_is_notimp(server: DnsServer, opcode: int) -> None:
    message = wire.query("allowed.test", flags=(opcode << 11) | wire.RD)
    reply = _assert_error(server, message, wire.NOTIMP)
    assert reply.rd
    # The opcode is copied (RFC 1035 §4.1.1), so the client matches the answer.
    assert reply.opcode == opcode


@pytest.mark.parametrize("name", ["allowed.test", "denied.test"])
def test_a_response_gets_no_answer(server: DnsServer, name: str) -> None:
    assert server.answer(wire.query(name, flags=0x8000 | wire.RD)) is None
    # Not even an error for a malformed response.
    assert server.answer(wire.query(name, flags=0x8000, qdcount=3)) is None


@pytest.mark.parametrize("qclass", [3, 4, 254, 255])
def test_class_other_than_in_is_notimp(server: DnsServer, qclass: int) -> None:
    reply = ask(server, wire.query("allowed.test", qclass=qclass))
    assert reply.rcode == wire.NOTIMP
    assert reply.questions == [("allowed.test", wire.A, qclass)]
    assert reply.answers == []


def test_parse_query_fields() -> None:
    message = wire.query("Foo.Example", wire.AAAA, ident=0xFFFF, edns=True)
    query = codec.parse_query(message)
    assert query.id == 0xFFFF
    assert query.name == "foo.example"
    assert (query.qtype, query.qclass) == (wire.AAAA, 1)
    assert query.question == wire.question("Foo.Example", wire.AAAA)


@pytest.mark.parametrize(
    ("labels", "name"),
    [
        ([b"a.b", b"test"], "a\\.b.test"),
        ([b"a\\", b"b"], "a\\\\.b"),
        ([b"a\\.b"], "a\\\\\\.b"),
        ([b"A", b"B"], "a.b"),
    ],
)
def test_parse_query_keeps_labels_apart(labels: list[bytes], name: str) -> None:
    assert codec.parse_query(wire.query(labels)).name == name


def test_encode_name_round_trips_and_refuses_bad_names() -> None:
    assert codec.encode_name("a.example") == b"\x01a\x07example\x00"
    with pytest.raises(ValueError):
        codec.encode_name("a..b")
    with pytest.raises(ValueError):
        codec.encode_name("a" * 64)
    with pytest.raises(ValueError):
        codec.encode_name(".".join(["a" * 63] * 4))


def test_type_names() -> None:
    assert codec.type_name(1) == "A"
    assert codec.type_name(65) == "HTTPS"
    assert codec.type_name(4242) == "TYPE4242"
