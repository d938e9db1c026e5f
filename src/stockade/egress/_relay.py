"""The byte relay of an opaque tunnel: asyncio buffered protocols with flow control.

Measured on this host (bench/egress.py), buffered protocols reading straight into a
preallocated buffer and writing it to the peer transport move bytes faster than
``sock_recv_into``/``sock_sendall`` loops: no future per read, no copy when the peer socket
takes the whole chunk. Memory per tunnel is bounded by the peer's high-water mark: when
the peer cannot keep up, reading from this side pauses.

Half-close: an EOF from one side becomes a ``shutdown(SHUT_WR)`` towards the other, and the
tunnel ends when both directions have finished (or either side fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import weakref
from typing import cast

__all__ = ["RELAY_BUFFER", "relay"]

#: Read size; large reads keep the per-byte Python overhead low (one buffer per loop).
RELAY_BUFFER = 1024 * 1024
#: Peer write-buffer high-water mark; above it the reading side pauses, which bounds the
#: memory one slow reader can make the proxy hold.
_HIGH_WATER = 256 * 1024


class _SharedBuffer:
    """One read buffer for every tunnel on the loop.

    The loop is single-threaded and ``buffer_updated`` hands the bytes to the peer
    transport before the next read can start, so tunnels need not own a buffer each:
    500 idle tunnels then cost sockets, not 500 large buffers. When the peer transport
    keeps part of a write (it may hold a view of it), the buffer is replaced, never reused.
    """

    __slots__ = ("size", "view")

    def __init__(self, size: int) -> None:
        self.size = size
        self.view = memoryview(bytearray(size))

    def detach(self) -> None:
        self.view = memoryview(bytearray(self.size))


# Per loop (each proxy thread has its own loop, and buffers must never cross threads).
_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _SharedBuffer]] = (
    weakref.WeakKeyDictionary()
)


def _buffer_for(loop: asyncio.AbstractEventLoop, size: int) -> _SharedBuffer:
    per_loop = _shared.setdefault(loop, {})
    buffer = per_loop.get(size)
    if buffer is None:
        buffer = per_loop[size] = _SharedBuffer(size)
    return buffer


class _Half(asyncio.BufferedProtocol):
    """One socket of the tunnel; what it reads goes to ``peer``'s transport."""

    def __init__(self, tunnel: _Tunnel, shared: _SharedBuffer) -> None:
        self.tunnel = tunnel
        self.shared = shared
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.count = 0
        self.eof = False
        self.lost = False
        #: bytes read before the peer's transport existed, written once it does
        self.early = bytearray()
        self.early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_HIGH_WATER)
        # Nothing may be read before the peer exists to receive it.
        self.transport.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.shared.view

    def buffer_updated(self, nbytes: int) -> None:
        self.count += nbytes
        peer = self.peer
        if peer is not None and (peer.transport is None or self.early):
            # Read before the peer's transport exists: Python 3.11.2's transports add
            # their reader after connection_made even when it paused reading (fixed in
            # later releases), so this happens there. Kept, in order, never dropped;
            # relay() writes it once both transports exist.
            self.early += self.shared.view[:nbytes]
            return
        if peer is None or peer.transport is None or peer.lost:
            return
        peer.transport.write(self.shared.view[:nbytes])
        if peer.transport.get_write_buffer_size():
            # The transport may keep a view of an unsent tail (newer asyncio does not copy),
            # so the next read must not overwrite it.
            self.shared.detach()

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is not None and (peer.transport is None or self.early):
            self.early_eof = True  # passed on after the early bytes (see buffer_updated)
        elif (
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
        shared = _buffer_for(self.loop, size)
        self.client = _Half(self, shared)
        self.upstream = _Half(self, shared)
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
        for half in (half_c, half_u):
            peer = half.peer.transport if half.peer is not None else None
            if peer is None:
                continue
            if half.early:
                peer.write(bytes(half.early))
                half.early.clear()
            if half.early_eof and peer.can_write_eof():
                peer.write_eof()
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
