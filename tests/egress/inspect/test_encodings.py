"""Labelled data in its common encodings: base64 (three alignments), base64url, hex, percent.

The pure part checks the scanner (every spelling, split at every byte, nothing of it
released early, unrelated base64 and hex untouched); the end-to-end part sends each
spelling in each part of a request over real TLS through the inspect layer and checks
the upstream never saw it, and that an unrelated blob in the same place gets through.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from stockade.egress.inspect import (
    Inspector,
    Pattern,
    PatternSet,
    StreamScanner,
    base64_cores,
    encodings,
    with_encodings,
)
from stockade.egress.inspect._secrets import MIN_ENCODED_BITS, Found
from tests.egress.inspect.harness import LABELLED, harness

VALUE = LABELLED.encode()
#: a value whose base64 holds "+" and "/", so base64url spells it differently
BINARY = b"\xfb\xff\xbe-key-\xfe\xef\xff-material"


def spellings(value: bytes) -> dict[str, bytes]:
    """The value as an attacker would send it: inside larger encoded data, every way."""
    out: dict[str, bytes] = {}
    for k, pre in enumerate((b"", b"x", b"xy")):
        # The value starts at byte offset k inside a larger base64 stream.
        out[f"base64@{k}"] = base64.b64encode(pre + value + b"!tail")
        out[f"base64url@{k}"] = base64.urlsafe_b64encode(b"\xff" * 3 + pre + value).rstrip(b"=")
    out["hex"] = value.hex().encode()
    out["HEX"] = value.hex().upper().encode()
    out["percent-every-byte"] = "".join(f"%{c:02X}" for c in value).encode()
    out["percent-every-byte-lower"] = "".join(f"%{c:02x}" for c in value).encode()
    out["percent-quote"] = quote(value, safe="").encode()
    out["percent-base64"] = quote(base64.b64encode(b"x" + value), safe="").encode()
    return out


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


# -- pure ----------------------------------------------------------------------------------


def test_base64_cores_are_in_every_alignment_of_every_neighbourhood() -> None:
    rng = random.Random(16)
    for length in range(8, 41):
        value = rng.randbytes(length)
        cores = base64_cores(value)
        urlsafe = [c.translate(bytes.maketrans(b"+/", b"-_")) for c in cores]
        for pre_len in range(6):
            for post_len in range(4):
                data = rng.randbytes(pre_len) + value + rng.randbytes(post_len)
                # The value's own alignment's core is in it, whatever the neighbours are.
                assert cores[pre_len % 3] in base64.b64encode(data)
                assert urlsafe[pre_len % 3] in base64.urlsafe_b64encode(data)


def test_encodings_of_a_value_and_the_minimum_length() -> None:
    found = {p.encoding for p in encodings(Pattern(BINARY, "env:K", "label"))}
    assert found == {"raw", "base64", "base64url", "hex"}
    # A value whose base64 has no "+" or "/" has one spelling for both alphabets.
    plain = [p.encoding for p in encodings(Pattern(VALUE, "file:.env", "label"))]
    assert plain.count("base64") == 3
    assert "base64url" not in plain
    # A short canary's cores would match unrelated data: only the raw value is searched.
    short = encodings(Pattern(b"tok-1", "canary[0]", "label"))
    assert [p.encoding for p in short] == ["raw"]
    # The shortest token taken from a file (8 bytes) gets every spelling.
    assert len(encodings(Pattern(b"8-bytes!", "file:f", "label"))) == 5
    for p in encodings(Pattern(VALUE, "file:.env", "label"))[1:]:
        assert len(p.value) * (4 if p.encoding == "hex" else 6) >= MIN_ENCODED_BITS
    spaced = encodings(Pattern(b"a bare line long enough", "file:f", "label"))
    assert Pattern(b"a+bare+line+long+enough", "file:f", "label", "form") in spaced


@pytest.mark.parametrize("value", [VALUE, BINARY], ids=["text", "binary"])
def test_every_spelling_is_found_split_at_every_byte(value: bytes) -> None:
    patterns = PatternSet(with_encodings([Pattern(value, "file:.env", "label")]))
    for name, spelled in spellings(value).items():
        data = b'{"note": "' + spelled + b'"}'
        assert patterns.search(data) is not None, name
        start = data.index(spelled)
        for cut in range(1, len(data)):
            scanner = StreamScanner(patterns)
            try:
                released = scanner.feed(data[:cut])
            except Found as found:  # the whole spelling was in the first chunk
                released, label = b"", found.pattern.label
            else:
                with pytest.raises(Found) as info:
                    scanner.feed(data[cut:])
                label = info.value.pattern.label
            assert label == "file:.env", (name, cut)
            # Nothing past the spelling's first two characters (a base64 edge character
            # holds bits of its neighbour too) went out before the match was known.
            assert len(released) <= start + 2, (name, cut)


def test_unrelated_base64_and_hex_pass_byte_for_byte() -> None:
    rng = random.Random(7)
    values = [rng.randbytes(24).hex().encode() for _ in range(10)]
    patterns = PatternSet(
        with_encodings(Pattern(v, f"canary[{i}]", "label") for i, v in enumerate(values))
    )
    blobs = [
        base64.b64encode(os.urandom(300_000)),
        base64.urlsafe_b64encode(os.urandom(300_000)),
        os.urandom(300_000).hex().encode(),
        os.urandom(300_000).hex().upper().encode(),
        quote(os.urandom(100_000), safe="").encode(),
    ]
    for blob in blobs:
        scanner = StreamScanner(patterns)
        out = b"".join(scanner.feed(blob[i : i + 8191]) for i in range(0, len(blob), 8191))
        assert out + scanner.finish() == blob
        assert scanner.max_buffered <= 8191 + scanner.keep


def test_held_back_tail_covers_the_widest_spelling() -> None:
    patterns = PatternSet(with_encodings([Pattern(VALUE, "file:.env", "label")]))
    # Percent-encoded, a match takes up to three raw bytes per byte it decodes to.
    widest = max(3 * len(p.value) for p in patterns.exact)
    assert StreamScanner(patterns).keep == widest - 1 >= 3 * len(VALUE) - 1
    # A plain list is searched as given: exact bytes, the old tail.
    assert StreamScanner([Pattern(VALUE, "file:.env", "label")]).keep == len(VALUE) - 1


def test_exact_only_inspector_misses_what_encodings_catch() -> None:
    labels = [Pattern(VALUE, "file:.env", "label")]
    on, off = Inspector(labels=labels), Inspector(labels=labels, encodings=False)
    spelled = spellings(VALUE)["base64@1"]
    assert on.scans("h.test", 443).body.search(spelled) is not None
    assert off.scans("h.test", 443).body.search(spelled) is None
    # The event may say which encoding, never the value.
    found = on.scans("h.test", 443).body.search(spelled)
    assert found is not None
    assert found.where == "file:.env (base64)"


# -- end to end ------------------------------------------------------------------------------


def _request(part: str, spelled: bytes) -> dict[str, Any]:
    """The request carrying ``spelled`` in ``part`` (the keyword arguments of ``call``)."""
    text = spelled.decode()
    # In a URL, base64's "+", "/" and "=" travel percent-encoded, as clients send them.
    in_url = quote(text, safe="%")
    if part == "path":
        return {"method": "GET", "target": f"/files/{in_url}/raw"}
    if part == "query":
        return {"method": "GET", "target": f"/search?q={in_url}&page=2"}
    if part == "header":
        return {"method": "GET", "target": "/", "headers": [("x-trace", f"id={text};v=1")]}
    body = b'{"data": "' + spelled + b'"}'
    if part == "body":
        return {"method": "POST", "target": "/paste", "body": body}
    half = body.index(spelled) + len(spelled) // 2
    return {"method": "POST", "target": "/paste", "body": [body[:half], body[half:]]}


PARTS = ["path", "query", "header", "body", "body-split"]


@pytest.mark.parametrize("part", PARTS)
def test_every_encoding_in_every_part_is_refused(tmp_path: Path, part: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            for name, spelled in spellings(VALUE).items():
                kw = _request(part, spelled)
                r = await h.call("other.test", kw.pop("method"), kw.pop("target"), **kw)
                assert r.status == 403, (name, r.status, r.body)
                assert r.headers["x-stockade-reason"] == "labelled-data", name
            assert h.upstream.received == []
            await h.settle()
            events = h.events()
            assert len(events) == len(spellings(VALUE))
            for event in events:
                assert event["reason"] == "labelled-data"
                assert event["label"].endswith(".env")
                # The normalised path would carry the value decoded: it is withheld.
                expected = {"path": "[withheld: labelled-data]", "query": "/search"}
                assert event["path"] == expected.get(part, event["path"])
            details = " ".join(str(e.get("detail", "")) for e in events)
            assert "(base64)" in details
            assert "(hex)" in details
            # Never the value, in any spelling.
            dump = str(h.audit.events)
            assert LABELLED not in dump
            assert all(s.decode() not in dump for s in spellings(VALUE).values())

    run(go())


def _unambiguous(encode: Callable[[bytes], bytes]) -> bytes:
    """Random bytes ``encode``d, drawn again while the text has "//" or begins or ends
    with "/": base64's "/" travels as %2F, and in a path such a value is an empty segment
    once decoded, which the proxy refuses (ambiguous-path, a rule of its own with tests
    of its own). One draw in about twenty did, and the path case then failed."""
    while True:
        text = encode(os.urandom(90))
        if b"//" not in text and not text.startswith(b"/") and not text.endswith(b"/"):
            return text


@pytest.mark.parametrize("part", PARTS)
def test_unrelated_base64_and_hex_in_every_part_pass(tmp_path: Path, part: str) -> None:
    blobs = {
        "base64": _unambiguous(base64.b64encode),
        "base64url": base64.urlsafe_b64encode(os.urandom(90)),
        "hex": os.urandom(40).hex().encode(),
        # Printable text: encoded controls are refused in a path whatever they carry.
        "percent": quote("café & crème: " + os.urandom(20).hex(), safe="").encode(),
    }

    async def go() -> None:
        async with harness(tmp_path) as h:
            for name, blob in blobs.items():
                kw = _request(part, blob)
                r = await h.call("other.test", kw.pop("method"), kw.pop("target"), **kw)
                assert r.status == 200, (name, r.status, r.body)
            assert len(h.upstream.received) == len(blobs)
            for seen, blob in zip(h.upstream.received, blobs.values(), strict=True):
                if part.startswith("body"):
                    assert blob in seen.body
                elif part == "header":
                    assert blob.decode() in seen.headers["x-trace"]

    run(go())
