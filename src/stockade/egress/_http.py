"""Strict HTTP/1.1 pieces of the forward proxy: request heads, targets, headers, replies.

h11 parses the header fields, but it is lenient where a proxy must not be: it accepts bare
LF line ends, obs-fold continuation lines and ``Content-Length`` next to
``Transfer-Encoding`` (it keeps both). A proxy and the server behind it that frame one
message differently is request smuggling, so those are refused here before h11 sees them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import h11

__all__ = [
    "MAX_HEAD",
    "BadRequest",
    "ForwardTarget",
    "PlainRequest",
    "PlainResponse",
    "check_head",
    "error_response",
    "filter_headers",
    "find_head_end",
    "parse_authority",
    "parse_forward_target",
    "parse_plain_request",
    "parse_plain_response",
    "reason_phrase",
    "refusal_parts",
    "request_framing",
]

#: Largest request or response head accepted.
MAX_HEAD = 64 * 1024

#: Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus the proxy's own:
#: the one set for every path (plain forward, captured port 80, inspected tunnels).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
#: what the plain path drops besides: h11 re-frames the body (see request_framing)
_REFRAMED = frozenset({b"content-length"})

_BAD_HEAD_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")
_REQUEST_START = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]")
_DIGITS = re.compile(rb"[0-9]{1,18}\Z")
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/(1\.[01])")
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) ([\t\x20-\x7e\x80-\xff]*)")
# A field value: visible bytes (and obs-text), inner blanks, no blanks at either end.
_FIELD = re.compile(
    rb"(" + _TOKEN + rb"):[ \t]*((?:[\x21-\x7e\x80-\xff](?:[ \t]*[\x21-\x7e\x80-\xff])*)?)[ \t]*"
)
# Request fields that take a request off the plain path: a body, or an exchange in steps.
_NOT_PLAIN = frozenset({b"content-length", b"transfer-encoding", b"expect", b"upgrade"})


class BadRequest(ValueError):
    """The request is malformed or ambiguous; the client gets 400."""


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """An absolute-form ``http://`` request target split for forwarding."""

    host: str  #: as written (normalised later, once)
    port: int
    path: bytes  #: origin-form: path and query, never empty


@dataclass(frozen=True, slots=True)
class PlainRequest:
    """A request without a body, parsed without h11 (the attributes are h11.Request's).

    Most proxied requests are this; h11 costs about 100 us for each, which is most of what
    the proxy adds to a small request. Anything else goes through h11.
    """

    method: bytes
    target: bytes
    #: names lower-cased, values without surrounding blanks
    headers: list[tuple[bytes, bytes]]
    http_version: bytes


@dataclass(frozen=True, slots=True)
class PlainResponse:
    """A final response whose body is exactly ``length`` bytes, parsed without h11."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    length: int


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]] | None:
    headers = []
    for line in lines:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        headers.append((field[1].lower(), field[2]))
    return headers


def parse_plain_request(head: bytes) -> PlainRequest | None:
    """The request in ``head`` when it is a plain one; None sends it through h11.

    ``head`` is complete and has passed :func:`find_head_end` and :func:`check_head`.
    Plain means: a request line and fields of the strict grammar, HTTP/1.0 or 1.1, not
    CONNECT, no body (no ``Content-Length`` or ``Transfer-Encoding``), no ``Expect`` or
    ``Upgrade``, at most one ``Host`` (exactly one for HTTP/1.1). What is plain, h11 would read the
    same way; the rest (including what h11 refuses) is h11's to read.
    """
    lines = head[:-4].split(b"\r\n")
    start = _REQUEST_LINE.fullmatch(lines[0])
    if start is None or start[1] == b"CONNECT":
        return None
    headers = _fields(lines[1:])
    if headers is None or any(name in _NOT_PLAIN for name, _ in headers):
        return None
    version = start[3]
    hosts = sum(name == b"host" for name, _ in headers)
    if hosts > 1 or (version == b"1.1" and hosts == 0):
        return None
    return PlainRequest(start[1], start[2], headers, version)


def parse_plain_response(head: bytes, method: bytes) -> PlainResponse | None:
    """The response in ``head`` (complete, CRLF-terminated) when it is a plain one.

    Plain means: no control bytes, bare CR or LF, or folded lines; a final status (not
    1xx, 204 or 304) to a request other than HEAD; exactly one ``Content-Length``; no
    ``Transfer-Encoding``. None hands the response to h11 (chunked, read-to-close,
    interim responses, and what it refuses).
    """
    if method == b"HEAD" or _BAD_HEAD_BYTES.search(head):
        return None
    lines = head[:-4].split(b"\r\n")
    start = _STATUS_LINE.fullmatch(lines[0])
    if start is None:
        return None
    status = int(start[1])
    if status < 200 or status in (204, 304):
        return None
    headers = _fields(lines[1:])
    if headers is None:
        return None
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if length is not None or not _DIGITS.match(value):
                return None
            length = int(value)
    if length is None:
        return None
    return PlainResponse(status, start[2], headers, length)


def find_head_end(buffer: bytes | bytearray) -> int:
    """Index just past the blank line ending the head, or -1 when more bytes are needed.

    Raises :class:`BadRequest` as soon as the bytes so far cannot start a valid head, so a
    client sending garbage is answered at once rather than after a timeout.
    """
    if buffer and not _REQUEST_START.match(buffer):
        raise BadRequest("the request does not start with a method")
    end = buffer.find(b"\r\n\r\n")
    scan = buffer if end < 0 else buffer[: end + 4]
    # A lone CR at the very end may be the first half of CRLF still in flight.
    probe = scan[:-1] if end < 0 and scan.endswith(b"\r") else scan
    if _BAD_HEAD_BYTES.search(probe):
        raise BadRequest("control character, bare CR or bare LF in the request head")
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise BadRequest("request head too large")
        return -1
    if end + 4 > MAX_HEAD:
        raise BadRequest("request head too large")
    return end + 4


def check_head(head: bytes) -> None:
    """Refuse obs-fold lines and ambiguous framing in a complete head (CRLF-terminated)."""
    lines = head[:-4].split(b"\r\n")
    content_lengths = 0
    transfer_encoding = False
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise BadRequest("obsolete line folding in a header")
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"content-length":
            content_lengths += 1
            if not _DIGITS.match(value.strip(b" \t")):
                raise BadRequest("Content-Length is not a single number")
        elif name == b"transfer-encoding":
            transfer_encoding = True
    if content_lengths > 1:
        raise BadRequest("more than one Content-Length")
    if content_lengths and transfer_encoding:
        raise BadRequest("both Content-Length and Transfer-Encoding")


def parse_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """Split ``host[:port]`` / ``[v6][:port]``; the port is required when no default."""
    if not authority:
        raise BadRequest("empty authority")
    if "@" in authority or "\\" in authority:
        # Userinfo makes "http://allowed.test@evil.test/" read differently by different
        # parsers; a proxy request never needs it.
        raise BadRequest("user information in the authority")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest("unbalanced '[' in the authority")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise BadRequest("bytes after ']' in the authority")
        port_text = rest[1:] if rest else None
    elif ":" in authority:
        host, port_text = authority.rsplit(":", 1)
    else:
        host, port_text = authority, None
    if port_text is None:
        if default_port is None:
            raise BadRequest("the authority has no port")
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise BadRequest("the port is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise BadRequest("the port is out of range")
    return host, port


def parse_forward_target(target: bytes) -> ForwardTarget:
    """Parse an absolute-form ``http://authority/path`` target (h11 checked the bytes)."""
    if target[:7].lower() != b"http://":
        if target[:8].lower() == b"https://":
            raise BadRequest("https:// in a forward request; use CONNECT")
        raise BadRequest("not an absolute http:// target; this is a proxy")
    rest = target[7:]
    cut = len(rest)
    for mark in (b"/", b"?", b"#"):
        index = rest.find(mark)
        if 0 <= index < cut:
            cut = index
    authority = rest[:cut].decode("ascii", "strict")
    host, port = parse_authority(authority, 80)
    path = rest[cut:].split(b"#", 1)[0]
    if not path.startswith(b"/"):
        path = b"/" + path
    return ForwardTarget(host, port, path)


def filter_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Drop hop-by-hop headers, the ones ``Connection`` names, and ``Host``."""
    named: set[bytes] = set()
    for name, value in headers:
        if name == b"connection" or name == b"proxy-connection":
            named.update(token.strip().lower() for token in value.split(b","))
    return [
        (name, value)
        for name, value in headers
        if name not in HOP_BY_HOP
        and name not in _REFRAMED
        and name not in named
        and name != b"host"
    ]


def request_framing(request: h11.Request | PlainRequest) -> list[tuple[bytes, bytes]]:
    """The framing header to send upstream for this request's body (h11 re-frames it)."""
    for name, _ in request.headers:
        if name == b"transfer-encoding":
            return [(b"transfer-encoding", b"chunked")]
    for name, value in request.headers:
        if name == b"content-length":
            return [(b"content-length", value)]
    return []


def reason_phrase(status: int) -> str:
    """The standard reason phrase of ``status`` (``403`` -> ``Forbidden``); every
    refusal's status line carries one, never ``HTTP/1.1 403 `` with nothing after it."""
    import http

    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def refusal_parts(
    reason: str, detail: str, *, close: bool
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of every refusal stockade writes, on every path (the forward
    proxy, CONNECT, the inspected tunnel, the gateway): ``X-Stockade-Reason`` names the
    reason (docs/inspect.md), the one-line body says ``stockade: REASON: DETAIL``."""
    text = f"stockade: {reason}" + (f": {detail}" if detail else "") + "\n"
    body = text.encode("ascii", "backslashreplace")
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"x-stockade-reason", str(reason).encode("ascii", "backslashreplace")),
    ]
    if close:
        headers.append((b"connection", b"close"))
    return headers, body


_CANONICAL = {
    b"content-type": "Content-Type",
    b"content-length": "Content-Length",
    b"x-stockade-reason": "X-Stockade-Reason",
    b"connection": "Connection",
}


def error_response(status: int, reason: str, detail: str = "") -> bytes:
    """A complete short response that closes the connection: the body names the reason."""
    headers, body = refusal_parts(reason, detail, close=True)
    head = f"HTTP/1.1 {status} {reason_phrase(status)}\r\n" + "".join(
        f"{_CANONICAL[name]}: {value.decode('ascii')}\r\n" for name, value in headers
    )
    return (head + "\r\n").encode("ascii") + body
