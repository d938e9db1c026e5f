"""Reading the server name out of a TLS ClientHello, without a TLS library.

The tunnel is opaque to the proxy, so the SNI is the only name it can hold the client to:
a tunnel opened to ``allowed.test`` whose ClientHello says ``evil.test`` is domain fronting.
The parser is strict on purpose: anything it cannot read with certainty is refused
(:class:`ClientHelloError`), never passed through.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MAX_CLIENT_HELLO",
    "ClientHello",
    "ClientHelloError",
    "NotTLS",
    "parse_client_hello",
]

#: Largest ClientHello accepted. Post-quantum key shares make real ones ~2 KiB; 64 KiB
#: leaves room for any client while bounding what one connection can make us hold.
MAX_CLIENT_HELLO = 64 * 1024

_RECORD_HANDSHAKE = 0x16
_HANDSHAKE_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
_EXT_ECH = 0xFE0D
_EXT_ALPN = 0x0010
_MAX_RECORD = 16384 + 256


class ClientHelloError(ValueError):
    """The bytes are TLS but not a ClientHello the proxy can vouch for."""


class NotTLS(ClientHelloError):
    """The bytes are not a TLS handshake at all."""


@dataclass(frozen=True, slots=True)
class ClientHello:
    """What the proxy needs from a ClientHello: the server names it carries."""

    server_names: tuple[str, ...]
    has_ech: bool
    #: The number of bytes (records) the ClientHello occupied in the stream.
    length: int
    #: the protocols offered by ALPN, in the client's order (the inspect layer offers
    #: HTTP/2 back only to a client that asked for it)
    alpn: tuple[str, ...] = ()


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ClientHelloError("ClientHello is truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u24(self) -> int:
        return int.from_bytes(self.take(3), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(int.from_bytes(self.take(length_bytes), "big"))

    def done(self) -> bool:
        return self.pos == len(self.data)


def _handshake_bytes(data: bytes | bytearray) -> tuple[bytes, int] | None:
    """Join handshake records until the first handshake message is complete.

    Returns (message, bytes consumed) or None when more bytes are needed.
    """
    message = bytearray()
    pos = 0
    needed: int | None = None
    while True:
        if len(data) < pos + 5:
            if len(data) > pos and data[pos] != _RECORD_HANDSHAKE:
                raise NotTLS("the first bytes are not a TLS handshake record")
            return None
        content_type = data[pos]
        if content_type != _RECORD_HANDSHAKE:
            if pos == 0:
                raise NotTLS("the first bytes are not a TLS handshake record")
            raise ClientHelloError("ClientHello interrupted by a non-handshake record")
        if data[pos + 1] != 3 or data[pos + 2] > 4:
            raise NotTLS("the record version is not TLS")
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0 or length > _MAX_RECORD:
            raise ClientHelloError("TLS record length out of range")
        if len(data) < pos + 5 + length:
            return None
        message += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if needed is None and len(message) >= 4:
            if message[0] != _HANDSHAKE_CLIENT_HELLO:
                raise ClientHelloError("the first handshake message is not a ClientHello")
            needed = 4 + int.from_bytes(message[1:4], "big")
            if needed > MAX_CLIENT_HELLO:
                raise ClientHelloError("ClientHello larger than the proxy accepts")
        if needed is not None and len(message) >= needed:
            if len(message) > needed:
                # Another handshake message shares the record: a client never does this
                # with a ClientHello, and it would hide bytes from the check.
                raise ClientHelloError("data after the ClientHello in its record")
            return bytes(message), pos
        if pos > MAX_CLIENT_HELLO + 5 * 8:
            raise ClientHelloError("ClientHello larger than the proxy accepts")


def parse_client_hello(data: bytes | bytearray) -> ClientHello | None:
    """Parse a ClientHello at the start of ``data``; None when more bytes are needed.

    Raises :class:`NotTLS` for bytes that are not a TLS handshake and
    :class:`ClientHelloError` for a ClientHello that is malformed or ambiguous.
    """
    joined = _handshake_bytes(data)
    if joined is None:
        return None
    message, consumed = joined
    reader = _Reader(message)
    reader.take(4)  # type and length, checked while joining
    version = reader.u16()
    if version >> 8 != 3:
        raise ClientHelloError("ClientHello version is not TLS")
    reader.take(32)  # random
    if len(reader.vector(1)) > 32:
        raise ClientHelloError("session id longer than 32 bytes")
    suites = reader.vector(2)
    if not suites or len(suites) % 2:
        raise ClientHelloError("malformed cipher suite list")
    if not reader.vector(1):
        raise ClientHelloError("empty compression method list")
    names: list[str] = []
    alpn: list[str] = []
    has_ech = False
    if not reader.done():
        extensions = _Reader(reader.vector(2))
        if not reader.done():
            raise ClientHelloError("bytes after the extensions")
        seen: set[int] = set()
        while not extensions.done():
            ext_type = extensions.u16()
            body = extensions.vector(2)
            if ext_type in seen:
                raise ClientHelloError(f"extension {ext_type} appears twice")
            seen.add(ext_type)
            if ext_type == _EXT_ECH:
                has_ech = True
            elif ext_type == _EXT_SERVER_NAME:
                names.extend(_server_names(body))
            elif ext_type == _EXT_ALPN:
                alpn.extend(_protocols(body))
    return ClientHello(tuple(names), has_ech, consumed, tuple(alpn))


def _protocols(body: bytes) -> list[str]:
    reader = _Reader(body)
    entries = _Reader(reader.vector(2))
    if not reader.done():
        raise ClientHelloError("bytes after the ALPN protocol list")
    out: list[str] = []
    while not entries.done():
        out.append(entries.vector(1).decode("ascii", "replace"))
    return out


def _server_names(body: bytes) -> list[str]:
    reader = _Reader(body)
    entries = _Reader(reader.vector(2))
    if not reader.done():
        raise ClientHelloError("bytes after the server name list")
    names: list[str] = []
    while not entries.done():
        name_type = entries.u8()
        value = entries.vector(2)
        if name_type != 0:
            raise ClientHelloError(f"server name of unknown type {name_type}")
        if not value:
            raise ClientHelloError("empty server name")
        try:
            names.append(value.decode("ascii"))
        except UnicodeDecodeError:
            raise ClientHelloError("server name is not ASCII") from None
    if not names:
        raise ClientHelloError("empty server name list")
    return names
