"""WebSocket on inspected hosts: frames parsed, client messages scanned (pure).

After an upgrade the inspect layer relays frames (:mod:`._tunnel` moves the bytes). What
the client sends is read by :class:`FrameReader` (RFC 6455 framing, masked) and gathered
by :class:`MessageGate` into whole messages — text or binary, fragmented or not,
``permessage-deflate`` inflated when it was negotiated — each searched for labels,
secrets not bound to the host and credential detectors, decoded views included, before
any frame of it is forwarded. Control frames (ping, pong, close) are searched too (their
payloads can carry 125 bytes each). A message over :data:`MAX_MESSAGE` bytes (inflated)
is refused: it could not be searched whole. What the server sends is relayed as it is.

A refusal closes the socket with a close frame (1008 *policy violation*, or 1009 *message
too big*) whose reason names the finding, never the value; the event names the message
number.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

from stockade.egress.inspect._content import ContentCheck, Hit
from stockade.egress.inspect._secrets import PatternSet

#: largest message (after inflating) searched; a larger one closes the socket (1009)
MAX_MESSAGE = 16 * 1024 * 1024
#: largest frame header plus payload buffered while a frame is incomplete
_MAX_FRAME = MAX_MESSAGE + 14

OP_CONTINUATION, OP_TEXT, OP_BINARY = 0, 1, 2
OP_CLOSE, OP_PING, OP_PONG = 8, 9, 10
#: close codes
POLICY_VIOLATION = 1008
MESSAGE_TOO_BIG = 1009
PROTOCOL_ERROR = 1002


class FrameError(ValueError):
    """The peer broke the framing (RFC 6455 §5); the socket is closed with 1002."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: its header bits, the unmasked payload and the bytes as received."""

    fin: bool
    rsv1: bool
    opcode: int
    payload: bytes
    raw: bytes


def _unmask(payload: bytes, key: bytes) -> bytes:
    # XOR with the 4-byte key as one big integer: C speed, not a Python loop per byte.
    n = len(payload)
    if not n:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


class FrameReader:
    """Frames out of a byte stream (``masked``: the client's frames must be)."""

    def __init__(self, *, masked: bool) -> None:
        self.masked = masked
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The frames completed by ``data``. Raises :class:`FrameError`."""
        self._buf += data
        frames: list[Frame] = []
        while True:
            frame = self._one()
            if frame is None:
                break
            frames.append(frame)
        if len(self._buf) > _MAX_FRAME:
            raise FrameError("frame too large")
        return frames

    def _one(self) -> Frame | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        opcode = b0 & 0x0F
        if b0 & 0x30:
            raise FrameError("RSV2/RSV3 set without an extension")
        masked = bool(b1 & 0x80)
        if masked != self.masked:
            raise FrameError("a client frame must be masked" if self.masked else "masked frame")
        length = b1 & 0x7F
        at = 2
        if length == 126:
            if len(buf) < 4:
                return None
            (length,) = struct.unpack_from("!H", buf, 2)
            at = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            (length,) = struct.unpack_from("!Q", buf, 2)
            at = 10
        if length > MAX_MESSAGE:
            raise FrameError("frame over the message limit")
        if opcode >= 8 and (length > 125 or not b0 & 0x80):
            raise FrameError("control frames are short and never fragmented")
        if opcode not in (0, 1, 2, 8, 9, 10):
            raise FrameError(f"unknown opcode {opcode}")
        key = b""
        if masked:
            if len(buf) < at + 4:
                return None
            key = bytes(buf[at : at + 4])
            at += 4
        if len(buf) < at + length:
            return None
        payload = bytes(buf[at : at + length])
        raw = bytes(buf[: at + length])
        del buf[: at + length]
        if masked:
            payload = _unmask(payload, key)
        return Frame(bool(b0 & 0x80), bool(b0 & 0x40), opcode, payload, raw)


def close_frame(code: int, reason: str, *, mask: bool) -> bytes:
    """A close frame (``mask``: as a client sends it)."""
    payload = struct.pack("!H", code) + reason.encode("utf-8", "replace")[:120]
    head = bytes((0x88, (0x80 if mask else 0) | len(payload)))
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _unmask(payload, key)


@dataclass(slots=True)
class Verdict:
    """What to do with the bytes fed to :meth:`MessageGate.feed`."""

    #: frames to forward (whole messages that passed, control frames)
    forward: bytes = b""
    #: a deny finding (close with 1008), or None
    refused: Hit | None = None
    #: close with this code instead (1002 framing, 1009 too big), and why
    close_code: int = 0
    close_reason: str = ""
    #: report findings
    reports: list[Hit] = field(default_factory=list)


class MessageGate:
    """The client's side of a WebSocket: frames in, searched whole messages out."""

    def __init__(
        self,
        patterns: PatternSet,
        check: ContentCheck | None,
        *,
        deflate: bool = False,
        reset_each_message: bool = False,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self.patterns = patterns
        self.check = check
        self.deflate = deflate
        self.reset_each_message = reset_each_message
        self.max_message = max_message
        self.reader = FrameReader(masked=True)
        self.messages = 0
        self._inflater = zlib.decompressobj(-15)
        self._raw: list[bytes] = []
        self._payload: list[bytes] = []
        self._size = 0
        self._compressed = False
        self._opcode = 0

    def _search(self, data: bytes, where: str) -> Hit | None:
        found = self.patterns.search(data) if self.patterns else None
        if found is not None:
            return Hit(found.kind, found.label, "deny", where)
        if self.check:
            return self.check.search(data, where)
        return None

    def feed(self, data: bytes) -> Verdict:
        """Read ``data`` from the client; say what to forward or why to close."""
        out = Verdict()
        try:
            frames = self.reader.feed(data)
        except FrameError as exc:
            out.close_code, out.close_reason = PROTOCOL_ERROR, str(exc)
            return out
        forward = bytearray()
        for frame in frames:
            if frame.opcode >= 8:
                hit = (
                    self._search(
                        frame.payload, f"websocket control frame after message {self.messages}"
                    )
                    if frame.payload
                    else None
                )
                if hit is not None and hit.action == "deny":
                    out.refused = hit
                    break
                if hit is not None:
                    out.reports.append(hit)
                forward += frame.raw
                continue
            if frame.opcode == OP_CONTINUATION and not self._raw:
                out.close_code, out.close_reason = PROTOCOL_ERROR, "continuation without a start"
                break
            if frame.opcode != OP_CONTINUATION and self._raw:
                out.close_code, out.close_reason = PROTOCOL_ERROR, "new message inside a message"
                break
            if not self._raw:
                self._compressed = self.deflate and frame.rsv1
                self._opcode = frame.opcode
            self._raw.append(frame.raw)
            self._payload.append(frame.payload)
            self._size += len(frame.payload)
            if self._size > self.max_message:
                out.close_code = MESSAGE_TOO_BIG
                out.close_reason = f"message over {self.max_message} bytes cannot be scanned"
                break
            if not frame.fin:
                continue
            self.messages += 1
            message = b"".join(self._payload)
            raw = b"".join(self._raw)
            self._raw, self._payload, self._size = [], [], 0
            if self._compressed:
                try:
                    message = self._inflate(message)
                except (zlib.error, OverflowError) as exc:
                    out.close_code = MESSAGE_TOO_BIG if isinstance(exc, OverflowError) else 1007
                    out.close_reason = f"message {self.messages}: {exc}"
                    break
            hit = self._search(message, f"websocket message {self.messages}")
            if hit is not None and hit.action == "deny":
                out.refused = hit
                break
            if hit is not None:
                out.reports.append(hit)
            forward += raw
        out.forward = bytes(forward)
        return out

    def _inflate(self, payload: bytes) -> bytes:
        if self.reset_each_message:
            self._inflater = zlib.decompressobj(-15)
        # RFC 7692 §7.2.2: the sender removed the final empty block's 00 00 ff ff.
        out = self._inflater.decompress(payload + b"\x00\x00\xff\xff", self.max_message + 1)
        if len(out) > self.max_message or self._inflater.unconsumed_tail:
            raise OverflowError(f"inflated message over {self.max_message} bytes")
        return out
