"""HTTP/1.1 checks for inspected requests (pure functions; h11 does the parsing).

Three things are decided here before any rule sees a request:

* **agreement** — on an inspected tunnel the CONNECT authority, the TLS SNI and the
  ``Host`` header of *every* request must name the same host (and port); otherwise 421.
  A client that opened a tunnel to an allowed host cannot then talk to another virtual
  host behind the same address (domain fronting, Host-header bypass).
* **framing** — a request whose length could be read two ways (``Content-Length`` and
  ``Transfer-Encoding`` together, two lengths, two ``Host`` headers) is refused, not
  guessed at, so the proxy and the server always agree where a request ends.
* **the request target** — refused when it could be read differently by the rules and by
  the server: dot segments, encoded dots, slashes, backslashes or control bytes, a
  literal backslash, NUL or fragment, empty segments, an absolute form naming another
  host. The path is then normalised once (percent-decoding of unreserved characters,
  upper-case hex elsewhere) and that spelling is both what the rules match and what is
  forwarded upstream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stockade.egress._http import HOP_BY_HOP as _HOP_BY_HOP
from stockade.policy import Reason

Headers = Sequence[tuple[bytes, bytes]]

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# Encoded bytes that change how a server splits or reads the path: dot, slash,
# backslash, NUL and other controls, DEL.
_AMBIGUOUS_ENCODED = frozenset([0x2E, 0x5C, 0x7F, *range(0x20)])
#: An encoded slash is kept encoded (npm names scoped packages ``/@scope%2Fname``); the
#: inspector then refuses it only when reading it as "/" would change the rules' decision.
_SLASH = 0x2F

#: headers never forwarded from an inspected request: the hop-by-hop set every path
#: uses, and Expect (the tunnel answers 100-continue itself)
HOP_BY_HOP = _HOP_BY_HOP | {b"expect"}


class Refusal(Exception):
    """A request refused before it goes anywhere: HTTP ``status`` and ``reason``.

    A plain exception class, not a frozen dataclass: Python sets ``__traceback__`` on
    exceptions as they propagate (through ``contextlib`` managers, for one), which a
    frozen dataclass refuses.
    """

    def __init__(self, status: int, reason: Reason, detail: str) -> None:
        super().__init__(status, reason, detail)
        self.status = status
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Target:
    """A request target, normalised: ``path`` (rules match it) and ``query`` (raw)."""

    path: str
    query: str

    @property
    def slash_decoded(self) -> str | None:
        """The path with each ``%2F`` read as ``/``: the other way a server may route it.

        None when the path has no encoded slash. Rules must decide the same on both.
        """
        return self.path.replace("%2F", "/") if "%2F" in self.path else None

    @property
    def forwarded(self) -> bytes:
        """The origin-form target sent upstream."""
        return (self.path + ("?" + self.query if self.query else "")).encode("ascii")


def _ambiguous(detail: str) -> Refusal:
    return Refusal(400, Reason.AMBIGUOUS_PATH, detail)


def split_authority(text: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` too) → lower-case host without a trailing dot, port."""
    text = text.strip().lower()
    port: int | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed [")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ValueError("bad port")
            port = int(rest[1:])
    elif ":" in text:
        host, _, digits = text.rpartition(":")
        if not digits.isdigit() or ":" in host:
            raise ValueError("bad port")
        port = int(digits)
    else:
        host = text
    if port is not None and not 0 < port < 65536:
        raise ValueError("port out of range")
    host = host[:-1] if host.endswith(".") else host
    if not host:
        raise ValueError("empty host")
    return host, port


def authority_agrees(value: str, host: str, port: int) -> bool:
    """True when a ``Host`` value (or an absolute-form authority) names ``host:port``.

    A value without a port names the HTTPS default, 443.
    """
    try:
        name, given = split_authority(value)
    except ValueError:
        return False
    return name == host and (given if given is not None else 443) == port


def check_framing(headers: Headers) -> None:
    """Refuse a request whose end could be read two ways, or that names two hosts."""
    lengths = [v for n, v in headers if n == b"content-length"]
    chunked = any(n == b"transfer-encoding" for n, _ in headers)
    if chunked and lengths:
        raise Refusal(400, Reason.BAD_REQUEST, "both Content-Length and Transfer-Encoding")
    if len(lengths) > 1:
        raise Refusal(400, Reason.BAD_REQUEST, "more than one Content-Length")
    if sum(1 for n, _ in headers if n == b"host") != 1:
        raise Refusal(400, Reason.BAD_REQUEST, "a request needs exactly one Host header")


def normalise_target(raw: bytes, host: str, port: int) -> Target:
    """Check and normalise a request target; raise :class:`Refusal` when ambiguous."""
    if any(b < 0x21 or b > 0x7E for b in raw):
        raise _ambiguous("control, space or non-ASCII byte in the target")
    if b"\\" in raw:
        raise _ambiguous("backslash in the target")
    if b"#" in raw:
        raise _ambiguous("fragment in the target")
    text = raw.decode("ascii")
    lowered = text[:8].lower()
    if lowered.startswith(("http://", "https://")):
        # Absolute form inside a tunnel: allowed only when it names the tunnel's host,
        # over TLS, without userinfo (which some servers would read as the host).
        scheme, _, rest = text.partition("://")
        if scheme.lower() != "https":
            raise _ambiguous("absolute-form http:// target inside a TLS tunnel")
        slash = rest.find("/")
        authority, text = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
        if "@" in authority:
            raise _ambiguous("userinfo in the target")
        if not authority_agrees(authority, host, port):
            raise Refusal(421, Reason.HOST_MISMATCH, f"absolute-form target names {authority}")
    if not text.startswith("/"):
        raise _ambiguous("only origin-form targets (starting with /) are accepted")
    path, _, query = text.partition("?")
    return Target(_normalise_path(path), query)


def _normalise_path(path: str) -> str:
    data = path.encode("ascii")
    out = bytearray()
    i = 0
    while i < len(data):
        b = data[i]
        if b == 0x25:  # %
            pair = data[i + 1 : i + 3]
            if len(pair) != 2 or not all(c in _HEX for c in pair):
                raise _ambiguous("malformed percent-encoding")
            value = int(pair, 16)
            if value == _SLASH:
                out += b"%2F"
                i += 3
                continue
            if value in _AMBIGUOUS_ENCODED:
                raise _ambiguous(f"encoded %{value:02X} in the path")
            if value in _UNRESERVED:
                out.append(value)
            else:
                out += b"%" + pair.upper()
            i += 3
            continue
        out.append(b)
        i += 1
    text = out.decode("ascii")
    # Both readings of an encoded slash must be free of dot and empty segments.
    for reading in {text, text.replace("%2F", "/")}:
        segments = reading.split("/")
        for index, segment in enumerate(segments[1:], start=1):
            if segment in (".", ".."):
                raise _ambiguous("dot segment in the path")
            if segment == "" and index != len(segments) - 1:
                raise _ambiguous("empty path segment (//)")
    return text


def header_values(headers: Headers, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower-case), in order."""
    return [v for n, v in headers if n == name]


def connection_tokens(headers: Headers) -> set[bytes]:
    """Header names listed in ``Connection`` (they are hop-by-hop too)."""
    tokens: set[bytes] = set()
    for value in header_values(headers, b"connection"):
        tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def end_to_end(headers: Headers, drop: Iterable[bytes] = ()) -> list[tuple[bytes, bytes]]:
    """``headers`` without hop-by-hop ones, those named in ``Connection``, and ``drop``."""
    skip = HOP_BY_HOP | connection_tokens(headers) | set(drop)
    return [(n, v) for n, v in headers if n not in skip]
