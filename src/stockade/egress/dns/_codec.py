"""The DNS wire format, as much of it as a resolver that only answers needs (RFC 1035).

Strict on purpose: a query is one question of class IN with a plain name (no compression
in the question, labels of at most 63 bytes, at most 255 in all). Anything else gets a
FORMERR or NOTIMP answer when its header can be read, and no answer when it cannot.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CLASS_IN",
    "FORMERR",
    "NOERROR",
    "NOTIMP",
    "NXDOMAIN",
    "REFUSED",
    "SERVFAIL",
    "TYPE_A",
    "TYPE_AAAA",
    "TYPE_PTR",
    "MalformedQuery",
    "Query",
    "encode_name",
    "error_reply",
    "parse_query",
    "reply",
    "type_name",
]

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
TYPE_A, TYPE_PTR, TYPE_AAAA = 1, 12, 28
CLASS_IN = 1
#: Longest name on the wire (RFC 1035 §2.3.4) and longest label.
MAX_NAME = 255
MAX_LABEL = 63
_HEADER = struct.Struct("!HHHHHH")
_QR = 0x8000
_OPCODE = 0x7800
_AA = 0x0400
_RD = 0x0100
_RA = 0x0080
_TYPE_NAMES = {
    1: "A",
    2: "NS",
    5: "CNAME",
    6: "SOA",
    12: "PTR",
    15: "MX",
    16: "TXT",
    28: "AAAA",
    33: "SRV",
    64: "SVCB",
    65: "HTTPS",
    255: "ANY",
}


def type_name(qtype: int) -> str:
    """The usual name of a record type (``TYPE123`` for the rest, as in RFC 3597)."""
    return _TYPE_NAMES.get(qtype, f"TYPE{qtype}")


class MalformedQuery(ValueError):
    """A message that cannot be answered as asked; ``rcode`` says how to answer it."""

    def __init__(self, message: str, rcode: int = FORMERR) -> None:
        super().__init__(message)
        self.rcode = rcode


@dataclass(frozen=True, slots=True)
class Query:
    """One parsed question."""

    id: int
    flags: int
    #: the name in lower case, labels joined by dots, without the root's trailing dot;
    #: bytes outside printable ASCII are kept as latin-1 characters (and then refused),
    #: a dot or backslash inside a label is escaped with a backslash (and then refused)
    name: str
    qtype: int
    qclass: int
    #: the question section exactly as sent, echoed in the answer
    question: bytes


def parse_query(data: bytes) -> Query:
    """Parse a query message; raises :class:`MalformedQuery` for anything else."""
    if len(data) < _HEADER.size:
        raise MalformedQuery("shorter than a DNS header")
    ident, flags, qdcount, _an, _ns, _ar = _HEADER.unpack_from(data)
    if flags & _QR:
        raise MalformedQuery("a response, not a query")
    opcode = (flags >> 11) & 0xF
    if opcode != 0:
        raise MalformedQuery(f"opcode {opcode} is not QUERY", NOTIMP)
    if qdcount != 1:
        raise MalformedQuery(f"{qdcount} questions; exactly one is answered")
    pos = _HEADER.size
    labels: list[str] = []
    total = 0
    while True:
        if pos >= len(data):
            raise MalformedQuery("name runs past the end of the message")
        length = data[pos]
        pos += 1
        if length == 0:
            break
        if length > MAX_LABEL:
            # 0xC0 and up is a compression pointer, which has no place in a question.
            raise MalformedQuery("compressed or over-long label in the question")
        label = data[pos : pos + length]
        if len(label) != length:
            raise MalformedQuery("label runs past the end of the message")
        total += length + 1
        if total > MAX_NAME - 1:
            raise MalformedQuery("name is longer than 255 bytes")
        # A dot (or backslash) inside a label is escaped as in master files: one label
        # "a.b" must never read as the two labels of the host a.b.
        text = label.decode("latin-1").lower().replace("\\", "\\\\").replace(".", "\\.")
        labels.append(text)
        pos += length
    if pos + 4 > len(data):
        raise MalformedQuery("question has no type and class")
    qtype, qclass = struct.unpack_from("!HH", data, pos)
    pos += 4
    # Additional records (an EDNS OPT, say) may follow; they change nothing here.
    return Query(ident, flags, ".".join(labels), qtype, qclass, data[_HEADER.size : pos])


def _header(ident: int, request_flags: int, rcode: int, qdcount: int, ancount: int) -> bytes:
    # The opcode is copied from the request (RFC 1035 §4.1.1): a client drops a NOTIMP
    # answer to its NOTIFY or UPDATE whose opcode does not match, and waits out a timeout.
    flags = _QR | _AA | _RA | (request_flags & (_OPCODE | _RD)) | (rcode & 0xF)
    return _HEADER.pack(ident, flags, qdcount, ancount, 0, 0)


def reply(
    query: Query, rcode: int, records: Sequence[tuple[int, bytes]] = (), ttl: int = 1
) -> bytes:
    """The answer to ``query``: ``rcode`` and ``records`` as ``(type, rdata)`` pairs.

    Every record is for the question's own name (a pointer to it) in class IN.
    """
    out = [_header(query.id, query.flags, rcode, 1, len(records)), query.question]
    for rtype, rdata in records:
        out.append(struct.pack("!HHHIH", 0xC00C, rtype, CLASS_IN, ttl, len(rdata)))
        out.append(rdata)
    return b"".join(out)


def error_reply(data: bytes, rcode: int) -> bytes | None:
    """An answer with no question to a message that could not be parsed; None when even
    its header is unreadable, or when it is itself a response (never answer those: two
    resolvers could bounce errors at each other)."""
    if len(data) < _HEADER.size:
        return None
    ident, flags, *_ = _HEADER.unpack_from(data)
    if flags & _QR:
        return None
    return _header(ident, flags, rcode, 0, 0)


def encode_name(name: str) -> bytes:
    """A dotted ASCII name in wire form (for PTR answers)."""
    out = bytearray()
    for label in name.split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) <= MAX_LABEL:
            raise ValueError(f"{name!r}: a label must be 1 to 63 bytes")
        out.append(len(raw))
        out += raw
    out.append(0)
    if len(out) > MAX_NAME:
        raise ValueError(f"{name!r}: longer than 255 bytes")
    return bytes(out)
