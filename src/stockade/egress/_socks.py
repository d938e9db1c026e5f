"""SOCKS5 (RFC 1928, RFC 1929) message parsing and replies, without sockets.

The one SOCKS5 codec: the egress proxy serves the "no authentication" method and the
CONNECT command (a per-sandbox listener is the sandbox's identity, and UDP ASSOCIATE or
BIND would open paths around the allow-list); the gateway, which must learn who is
asking, negotiates username/password (RFC 1929) with the same functions first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = [
    "REPLY_ADDRESS_TYPE",
    "REPLY_COMMAND",
    "REPLY_FAILURE",
    "REPLY_HOST_UNREACHABLE",
    "REPLY_NOT_ALLOWED",
    "REPLY_OK",
    "REPLY_REFUSED",
    "SocksError",
    "SocksRequest",
    "method_reply",
    "method_selected",
    "parse_greeting",
    "parse_methods",
    "parse_request",
    "parse_userpass",
    "reply",
    "userpass_reply",
]

VERSION = 5
METHOD_NONE = 0x00
METHOD_USERPASS = 0x02
METHOD_UNACCEPTABLE = 0xFF
CMD_CONNECT = 1

REPLY_OK = 0x00
REPLY_FAILURE = 0x01
REPLY_NOT_ALLOWED = 0x02
REPLY_NETWORK_UNREACHABLE = 0x03
REPLY_HOST_UNREACHABLE = 0x04
REPLY_REFUSED = 0x05
REPLY_COMMAND = 0x07
REPLY_ADDRESS_TYPE = 0x08


class SocksError(ValueError):
    """A malformed or unsupported SOCKS message; ``code`` is the reply to send (or None)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class SocksRequest:
    """A parsed request: ``host`` is text as sent (a name, or an IP literal)."""

    command: int
    host: str
    port: int
    length: int  #: bytes the request occupied


def parse_methods(data: bytes | bytearray) -> tuple[bytes, int] | None:
    """(the methods a greeting offers, bytes used) or None when more bytes are needed."""
    if len(data) < 2:
        return None
    if data[0] != VERSION:
        raise SocksError("not SOCKS version 5", None)
    count = data[1]
    if len(data) < 2 + count:
        return None
    return bytes(data[2 : 2 + count]), 2 + count


def parse_greeting(data: bytes | bytearray) -> tuple[bool, int] | None:
    """(no-auth offered, bytes used) or None when more bytes are needed."""
    parsed = parse_methods(data)
    if parsed is None:
        return None
    methods, used = parsed
    if not methods:
        raise SocksError("no authentication methods offered", None)
    return METHOD_NONE in methods, used


def parse_userpass(data: bytes | bytearray) -> tuple[str, int] | None:
    """(password, bytes used) of an RFC 1929 request; None when more bytes are needed.

    Raises ValueError for a malformed one.
    """
    if len(data) < 2:
        return None
    if data[0] != 1:
        raise ValueError("not an RFC 1929 username/password request")
    ulen = data[1]
    if len(data) < 2 + ulen + 1:
        return None
    plen = data[2 + ulen]
    end = 3 + ulen + plen
    if len(data) < end:
        return None
    try:
        password = bytes(data[3 + ulen : end]).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the SOCKS5 password is not UTF-8") from None
    return password, end


def parse_request(data: bytes | bytearray) -> SocksRequest | None:
    """The CONNECT request, or None when more bytes are needed."""
    if len(data) < 5:
        return None
    version, command, reserved, address_type = data[0], data[1], data[2], data[3]
    if version != VERSION or reserved != 0:
        raise SocksError("malformed SOCKS request header", REPLY_FAILURE)
    if address_type == 1:
        end = 4 + 4
        if len(data) < end + 2:
            return None
        host = str(ipaddress.IPv4Address(bytes(data[4:end])))
    elif address_type == 4:
        end = 4 + 16
        if len(data) < end + 2:
            return None
        host = "[" + ipaddress.IPv6Address(bytes(data[4:end])).compressed + "]"
    elif address_type == 3:
        size = data[4]
        if size == 0:
            raise SocksError("empty host name", REPLY_FAILURE)
        end = 5 + size
        if len(data) < end + 2:
            return None
        try:
            host = bytes(data[5:end]).decode("utf-8")
        except UnicodeDecodeError:
            raise SocksError("host name is not UTF-8", REPLY_FAILURE) from None
    else:
        raise SocksError(f"address type {address_type} is not supported", REPLY_ADDRESS_TYPE)
    port = int.from_bytes(data[end : end + 2], "big")
    return SocksRequest(command, host, port, end + 2)


def method_reply(accepted: bool) -> bytes:
    """The method-selection reply."""
    return bytes((VERSION, METHOD_NONE if accepted else METHOD_UNACCEPTABLE))


def method_selected(method: int) -> bytes:
    """The method-selection reply choosing ``method`` (0xFF: none acceptable)."""
    return bytes((VERSION, method))


def userpass_reply(ok: bool) -> bytes:
    """RFC 1929's status reply: success, or failure (the client must then close)."""
    return b"\x01\x00" if ok else b"\x01\x01"


def reply(code: int) -> bytes:
    """A request reply; the bound address is left as 0.0.0.0:0 so nothing is disclosed."""
    return bytes((VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0))
