"""The tunnel relay keeps bytes (and an end of stream) read before the peer is ready.

Python 3.11.2 (Debian 12's) adds a transport's reader after ``connection_made`` even when
the protocol paused reading there, so a client that wrote before the relay started (every
captured connection does) is read before the upstream transport exists. Those bytes were
dropped; the capture path then hung. The same relay must carry them on every Python.
"""

from __future__ import annotations

import asyncio
import socket

from stockade.egress._relay import _Tunnel, relay


def test_bytes_and_eof_read_before_the_peer_exists_are_passed_on() -> None:
    async def body() -> None:
        tunnel = _Tunnel(4096)
        tunnel.client.shared.view[:5] = b"early"
        tunnel.client.buffer_updated(5)
        tunnel.client.eof_received()
        assert bytes(tunnel.client.early) == b"early"
        assert tunnel.client.early_eof
        tunnel.close(abort=True)

    asyncio.run(body())


def test_a_client_that_wrote_and_closed_before_the_relay_is_served_whole() -> None:
    async def body() -> bytes:
        client_side, client = socket.socketpair()
        upstream, upstream_side = socket.socketpair()
        # The client's whole request, and its end, are there before the relay starts.
        client_side.sendall(b"request")
        client_side.shutdown(socket.SHUT_WR)
        for sock in (client, upstream, client_side, upstream_side):
            sock.setblocking(False)
        loop = asyncio.get_running_loop()
        task = loop.create_task(relay(client, upstream))
        received = b""
        while True:
            data = await loop.sock_recv(upstream_side, 100)
            if not data:
                break
            received += data
        await loop.sock_sendall(upstream_side, b"answer")
        upstream_side.shutdown(socket.SHUT_WR)
        answer = b""
        while data := await loop.sock_recv(client_side, 100):
            answer += data
        up, down = await asyncio.wait_for(task, 5)
        assert (up, down) == (7, 6)
        for sock in (client_side, upstream_side):
            sock.close()
        return received + b"|" + answer

    async def bounded() -> bytes:
        async with asyncio.timeout(10):  # lost bytes would leave the reads waiting
            return await body()

    assert asyncio.run(bounded()) == b"request|answer"
