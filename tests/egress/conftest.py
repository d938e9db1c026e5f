"""Fixtures for the egress tests: a real proxy on 127.0.0.1 and real upstream servers.

The proxy runs in its own thread with its own event loop, so tests use plain blocking
sockets, ``http.client`` and ``ssl`` as a sandboxed client would. Upstream servers record
every connection they accept, so "the upstream saw nothing" is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from stockade.egress import EgressProxy, EgressRules
from stockade.egress._addr import IPAddress
from stockade.policy import Decision
from tests.conftest import require

TIMEOUT = 5.0


def must_work_or_skip(reason: str) -> None:
    """Skip a kernel test with a reason, or fail when STOCKADE_MUST_WORK=1."""
    if os.environ.get("STOCKADE_MUST_WORK") == "1":
        pytest.fail(f"STOCKADE_MUST_WORK=1 but: {reason}")
    pytest.skip(reason)


@dataclass
class Event:
    decision: Decision
    fields: dict[str, Any]

    @property
    def reason(self) -> str:
        return str(self.decision.reason)

    @property
    def name(self) -> str:
        return str(self.fields["event"])


class ProxyHarness:
    """An :class:`EgressProxy` serving a 127.0.0.1 listener from a background thread."""

    def __init__(
        self,
        rules: EgressRules,
        resolver: Callable[[str, int], Any] | None = None,
        **options: Any,
    ) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self.proxy = EgressProxy(rules, self._record, resolver=resolver, **options)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port: int = self.listener.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="egress-proxy", daemon=True)
        self.thread.start()

    def _record(self, decision: Decision, fields: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(Event(decision, fields))

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.proxy.serve_socket(self.listener))
        except BaseException as exc:
            self.error = exc
        finally:
            self.loop.close()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.proxy.close)
            self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "proxy did not stop"
        assert self.error is None, f"proxy failed: {self.error!r}"

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)

    def named(self, name: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.name == name]

    def wait_events(self, name: str, count: int, timeout: float = TIMEOUT) -> list[Event]:
        """Wait until ``count`` events called ``name`` were written (then a little longer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.named(name)
            if len(found) >= count:
                time.sleep(0.05)  # a surplus event would show up now
                return self.named(name)
            time.sleep(0.01)
        return self.named(name)

    def last(self, name: str = "net_connect") -> Event:
        found = self.wait_events(name, 1)
        assert found, f"no {name} event"
        return found[-1]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        if self.path.startswith("/big/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.write(b"x" * size)
            return
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        reply = f"{self.command} {self.path} host={self.headers.get('Host')} body={len(body)}"
        data = reply.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, fmt: str, *args: Any) -> None:
        return


class RecordingHTTPServer(http.server.ThreadingHTTPServer):
    """An origin server that counts connections and records requests."""

    daemon_threads = True
    request_queue_size = 1024  # the default of 5 drops SYNs when many tunnels open at once

    def __init__(self, address: tuple[str, int], family: int = socket.AF_INET) -> None:
        self.address_family = family
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A request the proxy cut short is expected in some tests; keep stderr quiet.
        self.errors = getattr(self, "errors", 0) + 1


def _serve(server: socketserver.BaseServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def origin() -> Iterator[RecordingHTTPServer]:
    server = RecordingHTTPServer(("127.0.0.1", 0))
    _serve(server)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def origin6() -> Iterator[RecordingHTTPServer]:
    try:
        server = RecordingHTTPServer(("::1", 0), socket.AF_INET6)
    except OSError as exc:
        require(False, f"no IPv6 loopback: {exc}")
    _serve(server)
    yield server
    server.shutdown()
    server.server_close()


class SinkServer:
    """A TCP listener that records every connection and byte it receives."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(128)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self.data = bytearray()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                self.data += conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    server = SinkServer()
    yield server
    server.close()


@dataclass
class TLSServer:
    """A TLS echo server for ``allowed.test`` with a certificate from a test CA."""

    ca: trustme.CA
    port: int = 0
    connections: int = 0
    received: list[bytes] = field(default_factory=list)
    sock: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        cert = self.ca.issue_cert("allowed.test", "127.0.0.1")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.context = context
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(TIMEOUT)
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                data = tls.recv(65536)
                self.received.append(data)
                tls.sendall(b"echo:" + data)
        except (OSError, ssl.SSLError):
            conn.close()

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def close(self) -> None:
        self._stop.set()
        if self.sock is not None:
            self.sock.close()


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_server(ca: trustme.CA) -> Iterator[TLSServer]:
    server = TLSServer(ca)
    server.start()
    yield server
    server.close()


@pytest.fixture
def make_proxy() -> Iterator[Callable[..., ProxyHarness]]:
    harnesses: list[ProxyHarness] = []

    def make(
        allow: Sequence[str] = ("allowed.test",),
        deny: Sequence[str] = (),
        hosts: dict[str, str] | None = None,
        tls_ports: Sequence[int] = (443,),
        resolver: Callable[[str, int], Any] | None = None,
        **options: Any,
    ) -> ProxyHarness:
        rules = EgressRules(
            allow=tuple(allow),
            deny=tuple(deny),
            hosts={"allowed.test": "127.0.0.1"} if hosts is None else hosts,
            tls_ports=tuple(tls_ports),
        )
        harness = ProxyHarness(rules, resolver, **options)
        harnesses.append(harness)
        return harness

    yield make
    for harness in harnesses:
        harness.stop()


def static_resolver(answers: dict[str, Sequence[str]]) -> Callable[[str, int], Any]:
    """A resolver answering from a table (for names that must resolve to given addresses)."""
    import ipaddress

    asked: list[str] = []

    async def resolve(host: str, port: int) -> list[IPAddress]:
        asked.append(host)
        if host not in answers:
            raise OSError(f"{host}: name not known")
        return [ipaddress.ip_address(a) for a in answers[host]]

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


def read_head(sock: socket.socket) -> bytes:
    """What ``sock`` sends until the end of an HTTP head (and what came with it), or EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def read_http_response(sock: socket.socket) -> tuple[int, bytes]:
    """Read one response with a Content-Length body (what the proxy's errors have)."""
    data = read_head(sock)
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return out
        if not chunk:
            return out
        out += chunk


def socks_connect(
    sock: socket.socket, atyp: int, address: bytes, port: int, command: int = 1
) -> int:
    """Do a SOCKS5 no-auth handshake and request; returns the reply code."""
    sock.sendall(b"\x05\x01\x00")
    assert sock.recv(2) == b"\x05\x00"
    body = bytes((len(address),)) + address if atyp == 3 else address
    sock.sendall(bytes((5, command, 0, atyp)) + body + port.to_bytes(2, "big"))
    reply = b""
    while len(reply) < 10:
        chunk = sock.recv(10 - len(reply))
        if not chunk:
            break
        reply += chunk
    assert len(reply) == 10, reply
    return reply[1]


HERE = Path(__file__).parent
