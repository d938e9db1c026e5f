"""Real TLS end to end: an upstream h11 server with a trustme CA, the tunnel, a client.

Everything runs on 127.0.0.1 with names under ``.test``. The client is a real blocking
``ssl`` client (run in a thread) trusting the trust bundle the inspect layer writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trustme

from stockade.audit import AuditLog
from stockade.egress.inspect import (
    CertificateAuthority,
    InspectLayer,
    SecretStore,
    TunnelStats,
    write_trust_bundle,
)
from stockade.policy import parse_policy_text

HOSTS = ("api.test", "registry.test", "other.test", "xn--strae-oqa.test")


@dataclass
class Received:
    """One request as the upstream saw it."""

    method: str
    target: str
    headers: dict[str, str]
    body_len: int
    body: bytes
    #: trailer fields of a chunked request
    trailers: dict[str, str] = field(default_factory=dict)


@dataclass
class Upstream:
    """An HTTPS server on 127.0.0.1 answering for every name in HOSTS."""

    ca: trustme.CA
    port: int = 0
    received: list[Received] = field(default_factory=list)
    server: asyncio.Server | None = None
    connections: int = 0

    async def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*HOSTS).configure_cert(ctx)
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self.server.wait_closed()

    def seen(self, needle: str) -> bool:
        """True when any received request carried ``needle`` anywhere."""
        raw = needle.encode()
        for r in self.received:
            if needle in r.target or any(needle in v for v in r.headers.values()):
                return True
            if needle in r.method or any(needle in v for v in r.trailers.values()):
                return True
            if raw in r.body:
                return True
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                req: h11.Request | None = None
                trailers: dict[str, str] = {}
                body = bytearray()
                size = 0
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(262144)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        req = event
                    elif isinstance(event, h11.Data):
                        size += len(event.data)
                        if len(body) < 1 << 20:
                            body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        trailers = {n.decode(): v.decode() for n, v in event.headers}
                        break
                    else:
                        return
                assert req is not None
                headers = {n.decode(): v.decode() for n, v in req.headers}
                self.received.append(
                    Received(
                        req.method.decode(),
                        req.target.decode(),
                        headers,
                        size,
                        bytes(body),
                        trailers,
                    )
                )
                if req.target == b"/echo-headers":
                    text = "\n".join(f"{n}: {v}" for n, v in headers.items()).encode()
                else:
                    text = f"ok {req.method.decode()} {req.target.decode()} {size}".encode()
                out = conn.send(
                    h11.Response(
                        status_code=200, headers=[(b"content-length", str(len(text)).encode())]
                    )
                )
                out = (out or b"") + (conn.send(h11.Data(data=text)) or b"")
                out += conn.send(h11.EndOfMessage()) or b""
                writer.write(out)
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, ssl.SSLError):
            return
        finally:
            writer.close()


@dataclass
class Response:
    """What the client got back."""

    status: int
    headers: dict[str, str]
    body: bytes


class Client:
    """A real blocking TLS client over one end of a socket pair (use from a thread)."""

    def __init__(
        self, sock: socket.socket, cafile: Path, sni: str | None, *, check_hostname: bool = True
    ) -> None:
        ctx = ssl.create_default_context(cafile=str(cafile))
        ctx.check_hostname = check_hostname and sni is not None
        sock.setblocking(True)
        sock.settimeout(30)
        self.tls = ctx.wrap_socket(sock, server_hostname=sni)
        self.conn = h11.Connection(h11.CLIENT)

    def request(
        self,
        method: str,
        target: str,
        *,
        host: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | Iterable[bytes] = b"",
        pause: float = 0.0,
        trailers: Sequence[tuple[str, str]] = (),
    ) -> Response:
        """Send one request (a list of chunks is sent chunked, ``pause`` between them,
        then ``trailers``)."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        hs = [("host", host), *headers]
        chunks: list[bytes] | None = None
        if isinstance(body, bytes):
            if body or method in ("POST", "PUT"):
                hs.append(("content-length", str(len(body))))
        else:
            chunks = list(body)
            hs.append(("transfer-encoding", "chunked"))
        self._send(h11.Request(method=method, target=target, headers=hs))
        if chunks is None:
            if isinstance(body, bytes) and body:
                self._send(h11.Data(data=body))
        else:
            for chunk in chunks:
                self._send(h11.Data(data=chunk))
                if pause:
                    time.sleep(pause)
        self._send(h11.EndOfMessage(headers=list(trailers)))
        return self.read_response()

    def stream(self, method: str, target: str, *, host: str, size: int, piece: int) -> Response:
        """Upload ``size`` bytes (Content-Length) written ``piece`` bytes at a time."""
        self._send(
            h11.Request(
                method=method,
                target=target,
                headers=[("host", host), ("content-length", str(size))],
            )
        )
        block = b"x" * piece
        sent = 0
        while sent < size:
            n = min(piece, size - sent)
            self._send(h11.Data(data=block[:n]))
            sent += n
        self._send(h11.EndOfMessage())
        return self.read_response()

    def _send(self, event: Any) -> None:
        data = self.conn.send(event)
        if data:
            self.tls.sendall(data)

    def read_response(self) -> Response:
        status, headers, body = 0, {}, bytearray()
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.tls.recv(262144))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {n.decode(): v.decode() for n, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return Response(status, headers, bytes(body))

    def raw(self, data: bytes) -> int:
        """Send raw bytes as a request; return the status code of the answer."""
        self.tls.sendall(data)
        buf = b""
        while b"\r\n" not in buf:
            chunk = self.tls.recv(65536)
            if not chunk:
                return 0
            buf += chunk
        return int(buf.split(b" ", 2)[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.tls.close()


POLICY = """
[network]
allow = ["api.test", "registry.test", "other.test"]
tls = {{ upstream_ca = "{ca}" }}

[[network.rules]]
host = "registry.test"
methods = ["GET", "HEAD"]
paths = ["/**"]

[[network.rules]]
host = "registry.test"
methods = ["POST"]
paths = ["/-/report/*"]
action = "report"

[secrets.API_KEY]
from = "env:REAL_API_KEY"
hosts = ["api.test"]
header = "x-api-key"

[labels]
secret_files = [".env"]
canaries = ["CANARY-7f3a9c1e-token"]
"""

REAL_KEY = "sk-real-0123456789abcdef0123456789abcdef"
LABELLED = "hunter2-very-secret-db-password"


@dataclass
class Harness:
    """Upstream, inspect layer and audit log, all in one event loop."""

    tmp: Path
    policy_text: str = POLICY
    upstream: Upstream = field(init=False)
    layer: InspectLayer = field(init=False)
    audit: AuditLog = field(init=False)
    store: SecretStore = field(init=False)
    bundle: Path = field(init=False)
    tasks: list[asyncio.Task[TunnelStats]] = field(default_factory=list)

    async def __aenter__(self) -> Harness:
        upstream_ca = trustme.CA()
        ca_file = self.tmp / "upstream-ca.pem"
        upstream_ca.cert_pem.write_to_path(str(ca_file))
        workspace = self.tmp / "ws"
        workspace.mkdir(exist_ok=True)
        (workspace / ".env").write_text(f"DB_PASSWORD={LABELLED}\nDEBUG=1\n")
        policy = parse_policy_text(
            self.policy_text.format(ca=ca_file), "test.toml", workspace=workspace
        )
        self.upstream = Upstream(upstream_ca)
        await self.upstream.start()
        self.audit = AuditLog("test-run", None)
        ca = CertificateAuthority.ephemeral()
        self.bundle = write_trust_bundle(ca, self.tmp / "bundle.pem")
        self.store = SecretStore.resolve(policy.secrets, {"REAL_API_KEY": REAL_KEY})
        self.layer = InspectLayer.from_policy(policy, ca, self.audit, secrets=self.store)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.layer.close()
        await self.upstream.stop()

    @property
    def placeholder(self) -> str:
        return self.store.environment()["API_KEY"]

    def open(self, host: str, sni: str | None = "") -> socket.socket:
        """Start a tunnel to ``host`` and return the client's end of the socket pair."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        task = asyncio.get_running_loop().create_task(
            self.layer.serve(ours, host, self.upstream.port, "127.0.0.1")
        )
        self.tasks.append(task)
        return theirs

    async def call(
        self,
        host: str,
        method: str,
        target: str,
        *,
        sni: str | None = "",
        host_header: str | None = None,
        **kw: Any,
    ) -> Response:
        """One request on a fresh tunnel to ``host`` (``sni`` "" means = host)."""
        sock = self.open(host)
        server_name = host if sni == "" else sni

        def go() -> Response:
            client = Client(sock, self.bundle, server_name, check_hostname=server_name == host)
            try:
                header = host_header or f"{host}:{self.upstream.port}"
                return client.request(method, target, host=header, **kw)
            finally:
                client.close()

        return await asyncio.to_thread(go)

    def host_header(self, host: str) -> str:
        return f"{host}:{self.upstream.port}"

    def events(self, event: str = "net_request") -> list[dict[str, Any]]:
        return [e for e in self.audit.events if e["event"] == event]

    async def settle(self) -> None:
        """Let tunnel tasks write their events."""
        for _ in range(50):
            if all(t.done() for t in self.tasks):
                return
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def harness(tmp: Path, policy: str = POLICY) -> AsyncIterator[Harness]:
    async with Harness(tmp, policy) as h:
        yield h
