"""The byte relay of an opaque tunnel: asyncio buffered protocols with flow control.

Measured on this host (bench/egress.py), buffered protocols reading straight into a
preallocated buffer and writing it to the peer transport move bytes faster than
``sock_recv_into``/``sock_sendall`` loops: no future per read, no copy when the peer socket
takes the whole chunk. Memory is bounded by the buffer plus the peer's high-water mark:
when the peer cannot keep up, reading from this side pauses.

Half-close: an EOF from one side becomes a ``shutdown(SHUT_WR)`` towards the other, and the
tunnel ends when both directions have finished (or either side fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import cast

__all__ = ["RELAY_BUFFER", "relay"]

#: Read size per direction; large reads keep the per-byte Python overhead low.
RELAY_BUFFER = 256 * 1024
#: Peer write-buffer high-water mark; above it the reading side pauses.
_HIGH_WATER = 1024 * 1024


class _Half(asyncio.BufferedProtocol):
    """One socket of the tunnel; what it reads goes to ``peer``'s transport."""

    def __init__(self, tunnel: _Tunnel, size: int) -> None:
        self.tunnel = tunnel
        self.size = size
        self.buffer = memoryview(bytearray(size))
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.count = 0
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_HIGH_WATER)
        # Nothing may be read before the peer exists to receive it.
        self.transport.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.count += nbytes
        peer = self.peer
        if peer is None or peer.transport is None or peer.lost:
            return
        peer.transport.write(self.buffer[:nbytes])
        if peer.transport.get_write_buffer_size():
            # The transport may keep a view of an unsent tail (newer asyncio does not copy),
            # so the next read must not overwrite it.
            self.buffer = memoryview(bytearray(self.size))

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if (
            peer is not None
            and peer.transport is not None
            and not peer.lost
            and peer.transport.can_write_eof()
        ):
            peer.transport.write_eof()
        self.tunnel.check_done()
        # Keep our transport open: the other direction may still be sending to it.
        return True

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.eof:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.tunnel.half_lost(self, exc)


class _Tunnel:
    def __init__(self, size: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.client = _Half(self, size)
        self.upstream = _Half(self, size)
        self.client.peer = self.upstream
        self.upstream.peer = self.client
        self.done = self.loop.create_future()
        self.error: Exception | None = None

    def close(self, abort: bool) -> None:
        for half in (self.client, self.upstream):
            if half.transport is not None and not half.lost:
                if abort:
                    half.transport.abort()
                else:
                    half.transport.close()

    def check_done(self) -> None:
        if self.client.eof and self.upstream.eof:
            # Both directions finished; close() flushes what is still buffered.
            self.close(abort=False)

    def half_lost(self, half: _Half, exc: Exception | None) -> None:
        if exc is not None and self.error is None:
            self.error = exc
        if not (self.client.lost and self.upstream.lost):
            # One side is gone without a clean two-way finish: nothing more can flow.
            self.close(abort=exc is not None)
        if self.client.lost and self.upstream.lost and not self.done.done():
            self.done.set_result(None)


async def relay(
    client: socket.socket,
    upstream: socket.socket,
    first_up: bytes = b"",
    buffer_size: int = RELAY_BUFFER,
) -> tuple[int, int]:
    """Relay bytes both ways until both directions end; returns (bytes up, bytes down).

    ``first_up`` is sent upstream first (bytes the client sent before the tunnel opened).
    Both sockets are owned by the relay from here on and are closed when it returns, also
    when the calling task is cancelled.
    """
    loop = asyncio.get_running_loop()
    tunnel = _Tunnel(buffer_size)
    transports: list[asyncio.BaseTransport] = []
    finished = False
    try:
        for sock in (client, upstream):
            if _is_tcp(sock):
                # Interactive protocols through the tunnel must not wait for Nagle.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        half_c = tunnel.client
        half_u = tunnel.upstream
        transport, _ = await loop.connect_accepted_socket(lambda: half_c, sock=client)
        transports.append(transport)
        transport, _ = await loop.create_connection(lambda: half_u, sock=upstream)
        transports.append(transport)
        assert half_c.transport is not None
        assert half_u.transport is not None
        if first_up:
            half_u.transport.write(first_up)
            half_c.count += len(first_up)
        half_c.transport.resume_reading()
        half_u.transport.resume_reading()
        await tunnel.done
        finished = True
    finally:
        # Not tunnel.done.done(): cancelling the task cancels the future it waits on.
        if not finished:
            tunnel.close(abort=True)
            # Sockets that never got a transport are still ours to close.
            if not transports:
                client.close()
            if len(transports) < 2:
                upstream.close()
            if transports:
                # abort() finishes on the next loop turn; give it that turn so that a
                # proxy shutting down does not leave transports half-closed.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
    return tunnel.client.count, tunnel.upstream.count


def _is_tcp(sock: socket.socket) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
