"""Decoded views of request data: what labels and detectors also search, without knowing
the value.

The label scanner (:mod:`._secrets`) knows each labelled value and searches for its
standard spellings; it cannot undo a layered encoding, and a credential nobody listed has
no spelling to search for. So the inspect layer also *decodes*: :func:`views` returns the
data decoded every way it can be, and decoded again, up to :data:`MAX_DEPTH` steps:

* **percent** — ``unquote_to_bytes``; applied again on its result, so ``%2541``
  (twice) and ``%252541`` (three times) decode to ``A``;
* **escapes** — JSON and C-style string escapes: ``\\u`` and four hex digits (with surrogate pairs),
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

Percent, escapes and quoted-printable are text encodings: in data of which over a
quarter is outside printable ASCII (an image, an archive, decoded random bytes) they are
not looked for. They are undone in the token around each escape (to the nearest
line break, ``&``, ``;``, ``,``, quote or bracket, at most :data:`REGION_MARGIN` bytes either
side), so their cost follows the escapes, not the size.

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
#: base64 runs longer than this are decoded at one offset only (see _offsets)
LONG_RUN = 64 * 1024
#: percent and escape decoding is applied to the token around each escape, up to
#: REGION_MARGIN bytes either side, rather than to the whole data
REGION_MARGIN = 512
#: most raw bytes one decoded byte takes through one chain of decoders within the
#: documented depth (``%252541`` for ``A``); a stream holds back this many times the
#: widest match
EXPANSION = 7

_HEX_SEPARATED = re.compile(rb"[0-9A-Fa-f]{2}(?:[:\-, ][0-9A-Fa-f]{2}){7,}")
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


_PERCENT = re.compile(rb"%[0-9A-Fa-f]{2}")
_BACKSLASH = re.compile(rb"\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\[\\/\"'bfnrt]")


#: bytes that end a token: line breaks, query and cookie separators, quotes, brackets
#: (not spaces: a PEM header line holds some)
_SEPARATORS = bytes(1 if c in b"\r\n&;,\"'<>()[]{}" else 0 for c in range(256))


def _regions(data: bytes, escape: re.Pattern[bytes]) -> bytes | None:
    """The tokens holding an escape (widened to the separators around them, at most
    :data:`REGION_MARGIN` bytes either side), joined by newlines; None when there is
    none. Decoding costs per escape, not per byte, and the view holds only what the
    decoding changed (the rest was searched as it is)."""
    mask = data.translate(_SEPARATORS)
    spans: list[list[int]] = []
    for m in escape.finditer(data):
        if spans and m.start() < spans[-1][1]:
            continue
        floor = max(m.start() - REGION_MARGIN, 0)
        lo = mask.rfind(b"\x01", floor, m.start()) + 1 or floor
        hi = mask.find(b"\x01", m.end(), m.end() + REGION_MARGIN)
        if hi < 0:
            hi = min(m.end() + REGION_MARGIN, len(data))
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = hi
        else:
            spans.append([lo, hi])
    if not spans:
        return None
    return b"\n".join(data[lo:hi] for lo, hi in spans)


_TEXT = bytes(range(0x20, 0x7F)) + b"\t\n\r"


def _binary(data: bytes) -> bool:
    """True for data of which over a quarter is outside printable ASCII (an image, an
    archive, a decoded base64 run that was not text): text escapes are not looked for."""
    return len(data) >= MIN_RUN_BYTES and len(data.translate(None, _TEXT)) * 4 > len(data)


def _percent(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
    if b"%" in data and not _binary(data):
        region = _regions(data, _PERCENT)
        if region is not None:
            yield unquote_to_bytes(region)


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


def _escapes(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
    if b"\\" in data and not _binary(data):
        region = _regions(data, _BACKSLASH)
        if region is not None:
            yield _ESCAPE.sub(_unescape_one, region)


def _runs(data: bytes, table: bytes, shortest: int) -> list[bytes]:
    # Runs of one alphabet, found in C: the alphabet becomes 1 and the rest 0, then
    # ``find`` jumps from long run to long run. (A regular expression such as
    # [0-9a-f]{16,} steps through every byte at about 10 MB/s in ``re``.)
    mask = data.translate(table)
    needle = b"\x01" * shortest
    out: list[bytes] = []
    at = mask.find(needle)
    while at >= 0:
        end = mask.find(b"\x00", at + shortest)
        if end < 0:
            end = len(data)
        out.append(data[at:end])
        at = mask.find(needle, end)
    return out


def _table(alphabet: bytes) -> bytes:
    return bytes(1 if c in alphabet else 0 for c in range(256))


_HEX_CHARS = b"0123456789abcdefABCDEF"
_HEX_TABLE = _table(_HEX_CHARS)
_B64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
_B64_TABLE = _table(_B64_CHARS)
#: hex digits to "h", the separators to "s", the rest to "."; eight separated bytes
_SEP_TABLE = bytes(0x68 if c in _HEX_CHARS else 0x73 if c in b":-, " else 0x2E for c in range(256))
_SEP_RUN = b"hhs" * 7 + b"hh"


def _hex(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
    pieces: list[bytes] = []
    for run in _runs(data, _HEX_TABLE, 2 * MIN_RUN_BYTES):
        # Both alignments: the run may start on the second nibble of a byte.
        if run in seen:
            continue  # the same run in another view (the percent-decoded one)
        seen.add(run)
        for start in (0, 1):
            part = run[start:]
            pieces.append(binascii.unhexlify(part[: len(part) // 2 * 2]))
    shape = data.translate(_SEP_TABLE)
    at = shape.find(_SEP_RUN)
    while at >= 0:
        m = _HEX_SEPARATED.match(data, at)
        if m is None:  # pragma: no cover - the shape guarantees a match
            break
        pieces.append(_unsep(m.group(0)))
        at = shape.find(_SEP_RUN, m.end())
    if pieces:
        yield b"\n".join(pieces)


def _unsep(run: bytes) -> bytes:
    return binascii.unhexlify(b"".join(run[i : i + 2] for i in range(0, len(run), 3)))


def _looks_base64(run: bytes) -> bool:
    # Encoded data mixes cases and digits; a long word or a hex digest does not (a hex
    # run is the hex decoder's, and 16 base64 characters that are all hex digits are
    # improbable: (22/64)**16).
    if run.translate(None, _HEX_CHARS) == b"":
        return False
    return run.lower() != run and run.upper() != run


def _offsets(run: bytes) -> range | tuple[int]:
    # A run cut out of a larger stream, or behind a few junk characters, may start
    # anywhere in a 4-character quantum: a short run is decoded at all four offsets. A
    # long one (an image, a file) is decoded once, as it stands: four decodings of it
    # would cost four times the search, and a key hidden by misaligning a run of over
    # LONG_RUN characters is the documented gap.
    return range(4) if len(run) <= LONG_RUN else (0,)


def _base64(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
    # Line-wrapped base64 (MIME, PEM) is one run once the line breaks are gone.
    flat = data.replace(b"\r", b"").replace(b"\n", b"") if b"\n" in data else data
    pieces: list[bytes] = []
    size = 0
    for raw in _runs(flat, _B64_TABLE, 16):
        if raw in seen or not _looks_base64(raw):
            continue
        seen.add(raw)
        run = raw.translate(_TO_STD)
        for start in _offsets(run):
            part = run[start:]
            if len(part) < 4 * -(-MIN_RUN_BYTES // 3):
                break
            rem = len(part) % 4
            # The padding is not part of a run: put it back (one spare character is
            # never a whole byte, so it goes).
            part = part[:-1] if rem == 1 else part + b"=" * (-rem % 4)
            decoded = binascii.a2b_base64(part)
            pieces.append(decoded)
            size += len(decoded)
        if size > budget:
            break
    if pieces:
        yield b"\n".join(pieces)


_QP_BREAK = re.compile(rb"=\r?\n")


def _quoted_printable(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
    if _binary(data):
        return
    if b"quoted-printable" in data.lower():
        yield binascii.a2b_qp(data)
    elif b"=\n" in data or b"=\r\n" in data:
        region = _regions(data, _QP_BREAK)
        if region is not None:
            yield binascii.a2b_qp(region)


def _inflate_at(data: bytes, budget: int) -> bytes:
    decoder = zlib.decompressobj(47)  # gzip or zlib header, detected
    try:
        return decoder.decompress(data, max(budget, 1))
    except zlib.error:
        return b""


def _compressed(data: bytes, budget: int, seen: set[bytes]) -> Iterator[bytes]:
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


_DECODERS: tuple[tuple[str, Callable[[bytes, int, set[bytes]], Iterator[bytes]]], ...] = (
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
    runs: set[bytes] = set()
    frontier: list[tuple[str, bytes]] = [("", data)]
    for _ in range(depth):
        following: list[tuple[str, bytes]] = []
        for chain, view in frontier:
            for name, decoder in _DECODERS:
                for decoded in decoder(view, budget, runs):
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
