"""Fixtures for the resolver tests: a :class:`DnsServer` with recorded events, and one
serving real UDP and TCP sockets on 127.0.0.1 from a background event loop."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from stockade.egress import EgressRules
from stockade.egress.dns import AddressPool, DnsServer
from stockade.policy import Decision
from tests.egress.dns import wire

TIMEOUT = 5.0

#: The policy most tests answer from.
RULES = EgressRules(
    allow=("allowed.test", "*.wild.test", "db.test:5432", "evil.test"),
    deny=("evil.test:25", "blocked.wild.test", "*.attacker.test"),
    hosts={"pinned.test": "10.0.0.5"},
    local=frozenset(),
)


@dataclass
class Events:
    """Every event the server emitted, in order."""

    items: list[tuple[str, Decision, dict[str, Any]]] = field(default_factory=list)

    def __call__(self, name: str, decision: Decision, fields: dict[str, Any]) -> None:
        self.items.append((name, decision, dict(fields)))

    def __len__(self) -> int:
        return len(self.items)

    def for_name(self, name: str) -> list[tuple[Decision, dict[str, Any]]]:
        return [(d, f) for _, d, f in self.items if f.get("name") == name]


def make_server(
    rules: EgressRules = RULES, pool: AddressPool | None = None
) -> tuple[DnsServer, Events]:
    events = Events()
    return DnsServer(rules, pool if pool is not None else AddressPool(), events), events


def ask(server: DnsServer, message: bytes) -> wire.Message:
    """The server's answer to ``message``, parsed; fails when there is none."""
    data = server.answer(message)
    assert data is not None, "no answer"
    return wire.parse(data)


@pytest.fixture
def server() -> DnsServer:
    return make_server()[0]


class DnsHarness:
    """A :class:`DnsServer` answering on UDP and TCP sockets bound to 127.0.0.1."""

    def __init__(self, rules: EgressRules = RULES, pool: AddressPool | None = None) -> None:
        self.server, self.events = make_server(rules, pool)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        self.udp_address: tuple[str, int] = udp.getsockname()
        self.tcp_address: tuple[str, int] = tcp.getsockname()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        future = asyncio.run_coroutine_threadsafe(self.server.serve(udp, tcp), self.loop)
        future.result(TIMEOUT)

    def udp(self, message: bytes, timeout: float = TIMEOUT) -> bytes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout)
            sock.sendto(message, self.udp_address)
            data, peer = sock.recvfrom(65535)
            assert peer == self.udp_address
            return data

    def tcp(self) -> socket.socket:
        sock = socket.create_connection(self.tcp_address, timeout=TIMEOUT)
        return sock

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(TIMEOUT)
        # Let every connection handler finish before the loop goes away.
        pending = asyncio.run_coroutine_threadsafe(_drain(), self.loop)
        pending.result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


async def _drain() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    if tasks:
        await asyncio.wait(tasks, timeout=TIMEOUT)


def send_framed(sock: socket.socket, message: bytes) -> None:
    sock.sendall(struct.pack("!H", len(message)) + message)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def recv_framed(sock: socket.socket) -> bytes:
    (length,) = struct.unpack("!H", recv_exact(sock, 2))
    return recv_exact(sock, length)


@pytest.fixture
def dns_harness() -> Iterator[DnsHarness]:
    harness = DnsHarness()
    yield harness
    harness.stop()
