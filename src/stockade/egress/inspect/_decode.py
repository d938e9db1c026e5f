"""Decoded views of request data: what labels and detectors also search, without knowing
the value.

The label scanner (:mod:`._secrets`) knows each labelled value and searches for its
standard spellings; it cannot undo a layered encoding, and a credential nobody listed has
no spelling to search for. So the inspect layer also *decodes*: :func:`views` returns the
data decoded every way it can be, and decoded again, up to :data:`MAX_DEPTH` steps:

* **percent** — ``unquote_to_bytes``; applied again on its result, so ``%2541``
  (twice) and ``%252541`` (three times) decode to ``A``;
* **escapes** — JSON and C-style string escapes: ``\\uXXXX`` (with surrogate pairs),
  ``\\xXX``, ``\\/``, ``\\n``...;
* **hex** — runs of at least :data:`MIN_RUN_BYTES` bytes, plain (both alignments: a run
  may start on either nibble) or with one separator between bytes (``41:4b``,
  ``41-4b``, ``41 4b``, ``41,4b``);
* **base64** — runs of at least 16 characters of either alphabet (base64url too),
  line-wrapped runs (MIME, PEM: ``\\n`` or ``\\r\\n`` between lines) joined first, each
  decoded at the four character offsets (a run cut out of a larger stream, or prefixed
  with junk, starts anywhere in a quantum);
* **quoted-printable** — data with soft line breaks (``=\\r\\n``) or that names the
  encoding (a MIME part);
* **gzip / zlib** — a gzip member or zlib stream found at the start of a decoded piece
  (base64 of a gzip), or anywhere in the data (a ``.gz`` in a multipart upload),
  decompressed up to the budget.

MIME multipart needs no decoder of its own: a part's bytes are in the body as they are
(searched raw), and its ``Content-Transfer-Encoding`` (base64, quoted-printable) is
undone by the decoders above.

Cost is bounded twice: each call decodes at most :data:`BUDGET_FACTOR` times the input
plus :data:`BUDGET_SLACK` bytes (decompression included) and makes at most
:data:`MAX_VIEWS` views; a request body is decoded up to ``[inspect] decode_limit``
bytes (the inspector's choice, past which it searches raw bytes only or refuses).
"""

from __future__ import annotations

import binascii
import re
import zlib
from collections.abc import Callable, Iterator
from urllib.parse import unquote_to_bytes

#: decoding steps stacked on one view (percent three times, then base64...)
MAX_DEPTH = 4
#: most views of one piece of data
MAX_VIEWS = 24
#: decoded bytes per input byte, at most, over all views of one piece
BUDGET_FACTOR = 6
BUDGET_SLACK = 64 * 1024
#: shortest hex or base64 run decoded (in decoded bytes)
MIN_RUN_BYTES = 8
#: most raw bytes one decoded byte takes through one chain of decoders within the
#: documented depth (``%252541`` for ``A``); a stream holds back this many times the
#: widest match
EXPANSION = 7

_HEX_PLAIN = re.compile(rb"[0-9A-Fa-f]{16,}")
_HEX_SEPARATED = re.compile(rb"[0-9A-Fa-f]{2}(?:[:\-, ][0-9A-Fa-f]{2}){7,}")
_B64_RUN = re.compile(rb"[A-Za-z0-9+/_\-]{16,}(?:(?:\r?\n|\\r\\n|\\n)[A-Za-z0-9+/_\-]{4,})*")
_B64_BREAKS = re.compile(rb"\r?\n|\\r\\n|\\n")
_ESCAPE = re.compile(
    rb"\\u(?:[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|[0-9a-fA-F]{4})"
    rb"|\\x[0-9a-fA-F]{2}|\\[\\/\"'bfnrt]"
)
_SIMPLE_ESCAPES = {
    b"\\\\": b"\\",
    b"\\/": b"/",
    b'\\"': b'"',
    b"\\'": b"'",
    b"\\b": b"\b",
    b"\\f": b"\f",
    b"\\n": b"\n",
    b"\\r": b"\r",
    b"\\t": b"\t",
}
_TO_STD = bytes.maketrans(b"-_", b"+/")
_GZIP_MAGIC = b"\x1f\x8b\x08"
#: most compressed streams tried per piece (a stray 1f 8b in binary data costs one try)
_MAX_INFLATE_TRIES = 4


def _percent(data: bytes, budget: int) -> Iterator[bytes]:
    if b"%" in data:
        yield unquote_to_bytes(data)


def _unescape_one(m: re.Match[bytes]) -> bytes:
    text = m.group(0)
    if text[1:2] == b"u":
        try:
            return (
                text.decode("unicode_escape")
                .encode("utf-16", "surrogatepass")
                .decode("utf-16")
                .encode("utf-8", "replace")
            )
        except UnicodeError:
            return text
    if text[1:2] == b"x":
        return bytes((int(text[2:], 16),))
    return _SIMPLE_ESCAPES.get(text, text)


def _escapes(data: bytes, budget: int) -> Iterator[bytes]:
    if b"\\" in data:
        yield _ESCAPE.sub(_unescape_one, data)


def _hex(data: bytes, budget: int) -> Iterator[bytes]:
    pieces: list[bytes] = []
    for m in _HEX_PLAIN.finditer(data):
        run = m.group(0)
        # Both alignments: the run may start on the second nibble of a byte.
        for start in (0, 1):
            part = run[start:]
            pieces.append(binascii.unhexlify(part[: len(part) // 2 * 2]))
    for m in _HEX_SEPARATED.finditer(data):
        run = m.group(0)
        pieces.append(_unsep(run))
    if pieces:
        yield b"\n".join(pieces)


def _unsep(run: bytes) -> bytes:
    return binascii.unhexlify(b"".join(run[i : i + 2] for i in range(0, len(run), 3)))


def _base64(data: bytes, budget: int) -> Iterator[bytes]:
    pieces: list[bytes] = []
    size = 0
    for m in _B64_RUN.finditer(data):
        run = _B64_BREAKS.sub(b"", m.group(0)).translate(_TO_STD)
        for start in range(4):
            part = run[start:]
            part = part[: len(part) // 4 * 4]
            if len(part) < 4 * -(-MIN_RUN_BYTES // 3):
                break
            decoded = binascii.a2b_base64(part)
            pieces.append(decoded)
            size += len(decoded)
        if size > budget:
            break
    if pieces:
        yield b"\n".join(pieces)


def _quoted_printable(data: bytes, budget: int) -> Iterator[bytes]:
    if b"=\r\n" in data or b"=\n" in data or b"quoted-printable" in data.lower():
        yield binascii.a2b_qp(data)


def _inflate_at(data: bytes, budget: int) -> bytes:
    decoder = zlib.decompressobj(47)  # gzip or zlib header, detected
    try:
        return decoder.decompress(data, max(budget, 1))
    except zlib.error:
        return b""


def _compressed(data: bytes, budget: int) -> Iterator[bytes]:
    starts: list[int] = []
    at = data.find(_GZIP_MAGIC)
    while at >= 0 and len(starts) < _MAX_INFLATE_TRIES:
        starts.append(at)
        at = data.find(_GZIP_MAGIC, at + 1)
    # A zlib stream is recognised only at the start of a piece: its two-byte header
    # is too common in binary data to be looked for everywhere.
    if len(data) > 2 and data[0] == 0x78 and (data[0] << 8 | data[1]) % 31 == 0:
        starts.insert(0, 0)
    for start in starts:
        out = _inflate_at(data[start:], budget)
        if out:
            budget -= len(out)
            yield out
        if budget <= 0:
            return


_DECODERS: tuple[tuple[str, Callable[[bytes, int], Iterator[bytes]]], ...] = (
    ("percent", _percent),
    ("escapes", _escapes),
    ("hex", _hex),
    ("base64", _base64),
    ("quoted-printable", _quoted_printable),
    ("gzip", _compressed),
)


def views(data: bytes, *, depth: int = MAX_DEPTH) -> list[tuple[str, bytes]]:
    """The decoded views of ``data`` (``data`` itself not included).

    Each is ``(chain, bytes)``: ``chain`` names the decoders applied in order
    (``"base64>hex"``), for the audit event. Views equal to one already made are
    dropped; the budget and :data:`MAX_VIEWS` bound the work.
    """
    budget = BUDGET_FACTOR * len(data) + BUDGET_SLACK
    out: list[tuple[str, bytes]] = []
    seen = {data}
    frontier: list[tuple[str, bytes]] = [("", data)]
    for _ in range(depth):
        following: list[tuple[str, bytes]] = []
        for chain, view in frontier:
            for name, decoder in _DECODERS:
                for decoded in decoder(view, budget):
                    if not decoded or decoded in seen:
                        continue
                    budget -= len(decoded)
                    if budget < 0 or len(out) >= MAX_VIEWS:
                        return out
                    seen.add(decoded)
                    step = (f"{chain}>{name}" if chain else name, decoded)
                    out.append(step)
                    following.append(step)
        if not following:
            break
        frontier = following
    return out
