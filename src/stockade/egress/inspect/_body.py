"""Request bodies, as both HTTP paths scan them (HTTP/1.1 in :mod:`._tunnel`, HTTP/2 in
:mod:`._h2`): a piece through the rolling scanner, its end, and a gzip/deflate body held
whole, decoded with a cap and scanned. One body path for both protocols."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from stockade.egress.inspect._content import ContentScanner, Detected
from stockade.egress.inspect._http import Refusal
from stockade.egress.inspect._inspector import RequestRecord, note_hit
from stockade.egress.inspect._secrets import Found
from stockade.policy import Reason


def check_encoded_size(cap: int, encoding: str | None, size: int) -> None:
    """Refuse (413) a gzip/deflate body held for scanning once it passes ``cap``."""
    if size > cap:
        raise Refusal(
            413,
            Reason.BODY_TOO_LARGE,
            f"{encoding} body over {cap} bytes cannot be scanned; send it uncompressed",
        )


def scan_encoded(
    scanner: ContentScanner, encoding: str | None, record: RequestRecord, body: bytes, cap: int
) -> None:
    """Decode a whole gzip/deflate body (at most ``cap`` bytes decoded) and scan it
    (raises Refusal)."""
    try:
        for chunk in decode_body(body, encoding, cap):
            scan(scanner, chunk, record)
    except ValueError as exc:
        raise Refusal(400, Reason.BAD_REQUEST, str(exc)) from None
    except OverflowError as exc:
        raise Refusal(413, Reason.BODY_TOO_LARGE, str(exc)) from None
    finish(scanner, record)


def scan(scanner: ContentScanner, data: bytes, record: RequestRecord) -> bytes:
    try:
        clean = scanner.feed(data)
    except Detected as detected:
        note_hit(record, detected.hit)
        raise detected.hit.refusal() from None
    except Found as found:
        record.label = found.pattern.label
        raise Refusal(
            403, found.pattern.reason, f"{found.pattern.where} in the request body"
        ) from None
    for hit in scanner.reports:
        note_hit(record, hit)
    return clean


def finish(scanner: ContentScanner, record: RequestRecord) -> bytes:
    """The scanner's held-back bytes, searched once more as the end of the body."""
    try:
        rest = scanner.finish()
    except Detected as detected:
        note_hit(record, detected.hit)
        raise detected.hit.refusal() from None
    for hit in scanner.reports:
        note_hit(record, hit)
    return rest


def decode_body(body: bytes, encoding: str | None, cap: int) -> Iterator[bytes]:
    """Yield the decoded pieces of a gzip (every member) or deflate body.

    Raises ValueError for a corrupt body or trailing bytes, OverflowError past ``cap``
    decoded bytes. Every byte of ``body`` is decoded: data after a first gzip member
    is another member (servers decode it too), never skipped.
    """
    # zlib-wrapped deflate is the standard; raw deflate is what some clients send.
    wbits = (47,) if encoding == "gzip" else (15, -15)
    total = 0
    for attempt, bits in enumerate(wbits):
        data = body
        try:
            while data:
                decoder = zlib.decompressobj(bits)
                while data and not decoder.eof:
                    chunk = decoder.decompress(data, 256 * 1024)
                    data = decoder.unconsumed_tail
                    total += len(chunk)
                    if total > cap:
                        raise OverflowError(f"decoded body over {cap} bytes")
                    if chunk:
                        yield chunk
                if not decoder.eof:
                    raise ValueError(f"{encoding} body is truncated")
                data = decoder.unused_data
                if data and encoding != "gzip":
                    raise ValueError("bytes after the end of the deflate body")
            return
        except zlib.error as exc:
            if total or attempt + 1 == len(wbits):
                raise ValueError(f"{encoding} body is corrupt: {exc}") from None
