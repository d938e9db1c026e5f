"""DNS on the wire for the tests, with the standard library only: queries built with
``struct``, answers read by a small strict parser of our own (RFC 1035, with compression
pointers), independent of :mod:`stockade.egress.dns._codec`.

``dnspython`` is not a dependency, so this parser is the independent check. It refuses
anything a real stub resolver would: a truncated record, trailing bytes, a pointer loop.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

A, NS, CNAME, SOA, PTR, MX, TXT, AAAA, SRV, OPT, HTTPS, ANY = (
    1,
    2,
    5,
    6,
    12,
    15,
    16,
    28,
    33,
    41,
    65,
    255,
)
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
RD = 0x0100


class ParseError(ValueError):
    """Not a well-formed DNS message."""


def labels_of(name: str) -> list[bytes]:
    return [label.encode("latin-1") for label in name.split(".")] if name else []


def wire_name(labels: Sequence[bytes]) -> bytes:
    """A name in wire form from raw labels (no checks: tests build bad names too)."""
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\x00"


def question(name: str | Sequence[bytes], qtype: int = A, qclass: int = 1) -> bytes:
    labels = labels_of(name) if isinstance(name, str) else name
    return wire_name(labels) + struct.pack("!HH", qtype, qclass)


def query(
    name: str | Sequence[bytes],
    qtype: int = A,
    *,
    ident: int = 0x1234,
    flags: int = RD,
    qclass: int = 1,
    qdcount: int = 1,
    edns: bool = False,
) -> bytes:
    """A query message; ``edns`` appends an OPT record (4096-byte UDP payload, DO clear)."""
    body = question(name, qtype, qclass)
    arcount = 0
    if edns:
        body += b"\x00" + struct.pack("!HHIH", OPT, 4096, 0, 0)
        arcount = 1
    return struct.pack("!HHHHHH", ident, flags, qdcount, 0, 0, arcount) + body


@dataclass
class Record:
    name: str
    rtype: int
    rclass: int
    ttl: int
    rdata: bytes
    #: for PTR/CNAME/NS: the target name, decompressed
    target: str = ""


@dataclass
class Message:
    ident: int
    flags: int
    questions: list[tuple[str, int, int]] = field(default_factory=list)
    answers: list[Record] = field(default_factory=list)
    authority: list[Record] = field(default_factory=list)
    additional: list[Record] = field(default_factory=list)
    #: raw bytes of the question section
    question_bytes: bytes = b""

    @property
    def qr(self) -> bool:
        return bool(self.flags & 0x8000)

    @property
    def opcode(self) -> int:
        return (self.flags >> 11) & 0xF

    @property
    def aa(self) -> bool:
        return bool(self.flags & 0x0400)

    @property
    def tc(self) -> bool:
        return bool(self.flags & 0x0200)

    @property
    def rd(self) -> bool:
        return bool(self.flags & 0x0100)

    @property
    def ra(self) -> bool:
        return bool(self.flags & 0x0080)

    @property
    def rcode(self) -> int:
        return self.flags & 0xF


def _name(data: bytes, pos: int) -> tuple[str, int]:
    """Read a (possibly compressed) name at ``pos``; returns it and the position after."""
    labels: list[str] = []
    end = -1
    seen: set[int] = set()
    total = 0
    while True:
        if pos >= len(data):
            raise ParseError("name runs past the end")
        length = data[pos]
        if length & 0xC0 == 0xC0:
            if pos + 1 >= len(data):
                raise ParseError("truncated pointer")
            target = ((length & 0x3F) << 8) | data[pos + 1]
            if end < 0:
                end = pos + 2
            if target in seen or target >= pos:
                raise ParseError("pointer loop or forward pointer")
            seen.add(target)
            pos = target
            continue
        if length & 0xC0:
            raise ParseError("reserved label type")
        pos += 1
        if length == 0:
            break
        label = data[pos : pos + length]
        if len(label) != length:
            raise ParseError("label runs past the end")
        total += length + 1
        if total > 254:
            raise ParseError("name longer than 255 bytes")
        labels.append(label.decode("latin-1"))
        pos += length
    return ".".join(labels), (end if end >= 0 else pos)


def _records(data: bytes, pos: int, count: int) -> tuple[list[Record], int]:
    out = []
    for _ in range(count):
        name, pos = _name(data, pos)
        if pos + 10 > len(data):
            raise ParseError("record header runs past the end")
        rtype, rclass, ttl, rdlength = struct.unpack_from("!HHIH", data, pos)
        pos += 10
        rdata = data[pos : pos + rdlength]
        if len(rdata) != rdlength:
            raise ParseError("rdata runs past the end")
        target = ""
        if rtype in (PTR, CNAME, NS):
            target, after = _name(data, pos)
            if after != pos + rdlength:
                raise ParseError("name in rdata does not fill it")
        elif rtype == A and rdlength != 4:
            raise ParseError("A rdata is not 4 bytes")
        elif rtype == AAAA and rdlength != 16:
            raise ParseError("AAAA rdata is not 16 bytes")
        pos += rdlength
        out.append(Record(name, rtype, rclass, ttl, rdata, target))
    return out, pos


def parse(data: bytes) -> Message:
    """Parse a whole message strictly: every count honoured, no trailing bytes."""
    if len(data) < 12:
        raise ParseError("shorter than a header")
    ident, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", data)
    message = Message(ident, flags)
    pos = 12
    for _ in range(qd):
        name, pos = _name(data, pos)
        if pos + 4 > len(data):
            raise ParseError("question runs past the end")
        qtype, qclass = struct.unpack_from("!HH", data, pos)
        pos += 4
        message.questions.append((name, qtype, qclass))
    message.question_bytes = data[12:pos]
    message.answers, pos = _records(data, pos, an)
    message.authority, pos = _records(data, pos, ns)
    message.additional, pos = _records(data, pos, ar)
    if pos != len(data):
        raise ParseError(f"{len(data) - pos} trailing bytes")
    return message
