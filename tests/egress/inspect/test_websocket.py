"""WebSocket through an inspected host: a real ``websockets`` client and echo server over
real TLS, the inspect layer between them.

The upgrade goes through and messages echo (text, binary, fragmented, with and without
permessage-deflate); a message carrying a label or a credential closes the socket with
1008 before the server sees it, and the event names the message number; where the rules
do not allow WebSocket the upgrade is refused with 403 and an event, never downgraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("websockets")

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from stockade.egress.inspect._websocket import FrameReader, close_frame
from tests.egress.inspect.harness import POLICY, Harness, harness

CANARY = "CANARY-7f3a9c1e-token"
GHP = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
WS_POLICY = POLICY + (
    '\n[[network.rules]]\nhost = "registry.test"\nmethods = ["WEBSOCKET"]\npaths = ["/ws"]\n'
)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


class Echo:
    """A TLS WebSocket echo server on 127.0.0.1 for the harness's names."""

    def __init__(self) -> None:
        self.received: list[str | bytes] = []
        self.port = 0

    async def handler(self, ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                self.received.append(message)
                await ws.send(message)


@contextlib.asynccontextmanager
async def echo_server(h: Harness) -> AsyncIterator[Echo]:
    echo = Echo()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    h.upstream.ca.issue_cert("api.test", "registry.test", "other.test").configure_cert(ctx)
    async with serve(echo.handler, "127.0.0.1", 0, ssl=ctx) as server:
        echo.port = next(iter(server.sockets)).getsockname()[1]
        yield echo


@contextlib.asynccontextmanager
async def client(
    h: Harness, echo: Echo, host: str, path: str = "/ws", **kw: Any
) -> AsyncIterator[Any]:
    import socket

    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    task = asyncio.get_running_loop().create_task(h.layer.serve(ours, host, echo.port, "127.0.0.1"))
    h.tasks.append(task)
    ctx = ssl.create_default_context(cafile=str(h.bundle))
    uri = f"wss://{host}:{echo.port}{path}"
    async with connect(uri, sock=theirs, ssl=ctx, server_hostname=host, **kw) as ws:
        yield ws


@pytest.mark.parametrize("compression", ["deflate", None])
def test_echo_through_an_inspected_host(tmp_path: Path, compression: str | None) -> None:
    async def go() -> None:
        async with harness(tmp_path, WS_POLICY) as h, echo_server(h) as echo:
            async with client(h, echo, "other.test", compression=compression) as ws:
                await ws.send("hello")
                assert await ws.recv() == "hello"
                await ws.send(b"\x00\x01binary" * 100)
                assert await ws.recv() == b"\x00\x01binary" * 100
                await ws.send(["frag", "mented ", "text"])  # one message, three frames
                assert await ws.recv() == "fragmented text"
                big = "x" * 300_000
                await ws.send(big)
                assert await ws.recv() == big
            assert echo.received[:3] == ["hello", b"\x00\x01binary" * 100, "fragmented text"]
            await h.settle()
            event = h.events()[-1]
            assert event["method"] == "WEBSOCKET"
            assert event["status"] == 101
            assert event["verdict"] == "allow"

    run(go())


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (CANARY, "labelled-data"),
        (["my token is ", GHP[:10], GHP[10:]], "credential-detected"),
        (f"KEY={GHP}".encode(), "credential-detected"),
    ],
)
@pytest.mark.parametrize("compression", ["deflate", None])
def test_a_message_carrying_data_closes_the_socket(
    tmp_path: Path, payload: Any, reason: str, compression: str | None
) -> None:
    async def go() -> None:
        async with harness(tmp_path, WS_POLICY) as h, echo_server(h) as echo:
            async with client(h, echo, "other.test", compression=compression) as ws:
                await ws.send("first")
                assert await ws.recv() == "first"
                await ws.send(payload)
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1008
            assert reason in closed.value.rcvd.reason
            assert echo.received == ["first"]  # the server never saw the second message
            await h.settle()
            event = h.events()[-1]
            assert event["verdict"] == "deny"
            assert event["reason"] == reason
            assert "message 2" in event["detail"]
            assert CANARY not in str(event)
            assert GHP[4:20] not in str(event)

    run(go())


def test_websocket_refused_where_the_rules_do_not_allow_it(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path, WS_POLICY) as h, echo_server(h) as echo:
            # registry.test allows GET/HEAD and WEBSOCKET on /ws only.
            with pytest.raises(InvalidStatus) as refused:
                async with client(h, echo, "registry.test", path="/other"):
                    pass
            assert refused.value.response.status_code == 403
            assert refused.value.response.headers["x-stockade-reason"] == "no-rule-matched"
            await h.settle()
            event = h.events()[-1]
            assert event["verdict"] == "deny"
            assert "WebSocket not allowed" in event["detail"]
            # The twin: the path the rules allow upgrades.
            async with client(h, echo, "registry.test", path="/ws") as ws:
                await ws.send("ok")
                assert await ws.recv() == "ok"

    run(go())


def test_frame_reader_and_close_frame() -> None:
    frame = close_frame(1008, "stockade: labelled-data", mask=True)
    (parsed,) = FrameReader(masked=True).feed(frame)
    assert parsed.opcode == 8
    assert parsed.payload[:2] == (1008).to_bytes(2, "big")
    assert parsed.payload[2:] == b"stockade: labelled-data"
    # Split at every byte, the same frame comes out once.
    reader = FrameReader(masked=True)
    out = [f for i in range(len(frame)) for f in reader.feed(frame[i : i + 1])]
    assert [f.payload for f in out] == [parsed.payload]
