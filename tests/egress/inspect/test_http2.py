"""HTTP/2 on an inspected host: real clients (httpx with http2, curl --http2, a raw ``h2``
client for trailers and concurrent streams) through the egress proxy, real TLS with
the test CAs, to an HTTP/2 upstream on 127.0.0.1 built on the ``h2`` library.

Every stream is checked as an HTTP/1.1 request is; a refusal answers that stream alone
(403 with ``x-stockade-reason``) while its siblings complete; one event per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h11
import pytest
import trustme

from stockade.audit import AuditLog
from stockade.egress import EgressProxy, EgressRules
from stockade.egress.inspect import (
    CertificateAuthority,
    InspectLayer,
    SecretStore,
    write_trust_bundle,
)
from stockade.policy import parse_policy_text
from tests.egress.inspect.harness import LABELLED, REAL_KEY

httpx = pytest.importorskip("httpx")
pytest.importorskip("h2")

NAMES = ("api.test", "registry.test", "other.test")
POLICY = """
[network]
allow = ["api.test", "registry.test", "other.test"]
hosts = {{ "api.test" = "127.0.0.1", "registry.test" = "127.0.0.1", "other.test" = "127.0.0.1" }}
tls_ports = [{port}]
tls = {{ upstream_ca = "{ca}" }}

[[network.rules]]
host = "registry.test"
methods = ["GET", "HEAD"]

[secrets.API_KEY]
from = "env:REAL_API_KEY"
hosts = ["api.test"]
header = "x-api-key"

[labels]
secret_files = [".env"]
"""
GHP = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def _text(headers: Any) -> dict[str, str]:
    """Header fields as text (the connections here decode them; typed as bytes)."""
    return {
        (n.decode() if isinstance(n, bytes) else n): (v.decode() if isinstance(v, bytes) else v)
        for n, v in headers or []
    }


@dataclass
class Seen:
    """One stream as the upstream saw it."""

    method: str
    path: str
    authority: str
    headers: dict[str, str]
    body: bytes
    trailers: dict[str, str]


@dataclass
class H2Upstream:
    """An HTTPS server speaking HTTP/2 (ALPN h2) on 127.0.0.1 for every name in NAMES.

    It answers ``ok METHOD PATH LENGTH`` with response trailers (as gRPC does); a path
    starting ``/slow`` is answered after ``release`` is set.
    """

    ca: trustme.CA
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*NAMES).configure_cert(ctx)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def saw(self, needle: str) -> bool:
        for s in self.seen:
            text = " ".join([s.method, s.path, *s.headers.values(), *s.trailers.values()])
            if needle in text or needle.encode() in s.body:
                return True
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if writer.get_extra_info("ssl_object").selected_alpn_protocol() != "h2":
            await self._http1(reader, writer)
            return
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        heads: dict[int, dict[str, str]] = {}
        bodies: dict[int, bytearray] = {}
        trailers: dict[int, dict[str, str]] = {}
        pending: list[asyncio.Task[None]] = []
        windows = asyncio.Event()

        async def answer(sid: int) -> None:
            head = heads[sid]
            if head[":path"].startswith("/slow"):
                await self.release.wait()
            body = f"ok {head[':method']} {head[':path']} {len(bodies[sid])}".encode()
            if head[":path"].startswith("/download"):
                body = bytes(range(256)) * 4096  # 1 MiB: many windows' worth
            conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
            while body:
                window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if window <= 0:
                    writer.write(conn.data_to_send())
                    await writer.drain()
                    await windows.wait()
                    windows.clear()
                    continue
                conn.send_data(sid, body[:window])
                body = body[window:]
            conn.send_headers(sid, [("x-outcome", "done")], end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()

        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        heads[event.stream_id] = _text(event.headers)
                        bodies[event.stream_id] = bytearray()
                    elif isinstance(event, h2.events.DataReceived):
                        bodies[event.stream_id] += event.data or b""
                        conn.acknowledge_received_data(
                            event.flow_controlled_length or 0, event.stream_id or 0
                        )
                    elif isinstance(event, h2.events.TrailersReceived):
                        trailers[event.stream_id or 0] = _text(event.headers)
                    elif isinstance(event, h2.events.WindowUpdated):
                        windows.set()
                    elif isinstance(event, h2.events.StreamEnded):
                        sid = event.stream_id or 0
                        head = heads[sid]
                        self.seen.append(
                            Seen(
                                head[":method"],
                                head[":path"],
                                head.get(":authority", ""),
                                {k: v for k, v in head.items() if not k.startswith(":")},
                                bytes(bodies[sid]),
                                trailers.get(sid, {}),
                            )
                        )
                        pending.append(asyncio.ensure_future(answer(sid)))
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
            return
        finally:
            for task in pending:
                task.cancel()
            writer.close()

    async def _http1(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 for a client that did not ask for h2 (answers ``... via h1``)."""
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(event, h11.Request):
                    req = event
                elif isinstance(event, h11.EndOfMessage):
                    text = f"ok {req.method.decode()} {req.target.decode()} via h1".encode()
                    out = (
                        conn.send(
                            h11.Response(
                                status_code=200, headers=[("content-length", str(len(text)))]
                            )
                        )
                        or b""
                    )
                    out += (conn.send(h11.Data(data=text)) or b"") + (
                        conn.send(h11.EndOfMessage()) or b""
                    )
                    writer.write(out)
                    await writer.drain()
                    conn.start_next_cycle()
                elif not isinstance(event, h11.Data):
                    return
        except (ConnectionError, ssl.SSLError, h11.ProtocolError):
            return
        finally:
            writer.close()


@dataclass
class Setup:
    upstream: H2Upstream
    proxy_port: int
    bundle: Path
    audit: AuditLog
    store: SecretStore
    layer: InspectLayer

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    def client(self, **kw: Any) -> Any:
        ctx = ssl.create_default_context(cafile=str(self.bundle))
        return httpx.AsyncClient(http2=True, proxy=self.proxy, verify=ctx, timeout=30, **kw)

    def events(self) -> list[dict[str, Any]]:
        return [e for e in self.audit.events if e["event"] == "net_request"]

    async def settle(self, count: int) -> list[dict[str, Any]]:
        for _ in range(100):
            if len(self.events()) >= count:
                break
            await asyncio.sleep(0.02)
        return self.events()


@contextlib.asynccontextmanager
async def setup(tmp: Path, extra: str = "") -> AsyncIterator[Setup]:
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = H2Upstream(ca)
    await upstream.start()
    (tmp / ".env").write_text(f"DB_PASSWORD={LABELLED}\n")
    policy = parse_policy_text(
        POLICY.format(port=upstream.port, ca=ca_file) + extra, "t.toml", workspace=tmp
    )
    audit = AuditLog("run", None)
    interception = CertificateAuthority.ephemeral()
    bundle = write_trust_bundle(interception, tmp / "bundle.pem")
    store = SecretStore.resolve(policy.secrets, {"REAL_API_KEY": REAL_KEY})
    layer = InspectLayer.from_policy(policy, interception, audit, secrets=store)
    proxy = EgressProxy(EgressRules.from_policy(policy.network), audit, inspect=layer)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    serving = asyncio.get_running_loop().create_task(proxy.serve_socket(listener))
    try:
        yield Setup(upstream, listener.getsockname()[1], bundle, audit, store, layer)
    finally:
        upstream.release.set()
        proxy.close()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(serving, 5)
        layer.close()
        await upstream.stop()


# -- a raw HTTP/2 client (trailers, an :authority of its choosing, streams in parallel) ---


class RawH2:
    """An ``h2`` client over a CONNECT tunnel through the proxy."""

    def __init__(self, s: Setup, host: str) -> None:
        self.s = s
        self.host = host
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.responses: dict[int, dict[str, Any]] = {}

    async def open(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.s.proxy_port)
        target = f"{self.host}:{self.s.upstream.port}"
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        ctx = ssl.create_default_context(cafile=str(self.s.bundle))
        ctx.set_alpn_protocols(["h2"])
        await writer.start_tls(ctx, server_hostname=self.host)
        ssl_obj = writer.get_extra_info("ssl_object")
        assert ssl_obj.selected_alpn_protocol() == "h2"
        self.reader, self.writer = reader, writer
        self.conn.initiate_connection()
        await self._flush()

    async def _flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def send(
        self,
        method: str,
        path: str,
        *,
        headers: list[tuple[str, str]] = (),  # type: ignore[assignment]
        body: list[bytes] = (),  # type: ignore[assignment]
        trailers: list[tuple[str, str]] = (),  # type: ignore[assignment]
        authority: str | None = None,
    ) -> int:
        sid = self.conn.get_next_available_stream_id()
        head = [
            (":method", method),
            (":scheme", "https"),
            (":authority", authority or f"{self.host}:{self.s.upstream.port}"),
            (":path", path),
            *headers,
        ]
        ends_now = not body and not trailers
        self.conn.send_headers(sid, head, end_stream=ends_now)
        for i, piece in enumerate(body):
            last = i == len(body) - 1 and not trailers
            self.conn.send_data(sid, piece, end_stream=last)
        if trailers:
            self.conn.send_headers(sid, list(trailers), end_stream=True)
        self.responses[sid] = {"status": 0, "headers": {}, "body": b"", "trailers": {}}
        await self._flush()
        return sid

    async def wait(self, sid: int) -> dict[str, Any]:
        """Read until stream ``sid`` ended or was reset."""
        async with asyncio.timeout(30):
            while not self.responses[sid].get("ended"):
                data = await self.reader.read(65536)
                assert data, "the tunnel closed"
                for event in self.conn.receive_data(data):
                    sid_e = getattr(event, "stream_id", 0)
                    r = self.responses.get(sid_e)
                    if r is None:
                        continue
                    if isinstance(event, h2.events.ResponseReceived):
                        h = _text(event.headers)
                        r["status"] = int(h.pop(":status"))
                        r["headers"] = h
                    elif isinstance(event, h2.events.DataReceived):
                        r["body"] += event.data
                        self.conn.acknowledge_received_data(
                            event.flow_controlled_length or 0, sid_e
                        )
                    elif isinstance(event, h2.events.TrailersReceived):
                        r["trailers"] = _text(event.headers)
                    elif isinstance(event, h2.events.StreamEnded):
                        r["ended"] = True
                    elif isinstance(event, h2.events.StreamReset):
                        r["ended"] = True
                        r["reset"] = event.error_code
                await self._flush()
        return self.responses[sid]

    def close(self) -> None:
        self.writer.close()


# -- httpx with http2 ------------------------------------------------------------------


def test_get_allowed_put_refused_on_one_connection(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            r = await c.get(s.url("registry.test", "/left-pad"))
            assert r.status_code == 200
            assert r.http_version == "HTTP/2"
            assert r.text == "ok GET /left-pad 0"
            r = await c.put(s.url("registry.test", "/left-pad"), content=b'{"name":"x"}')
            assert r.status_code == 403
            assert r.headers["x-stockade-reason"] == "no-rule-matched"
            assert r.text.startswith("stockade: no-rule-matched")
            # The refusal answered that stream only: the connection goes on.
            r = await c.get(s.url("registry.test", "/after"))
            assert r.status_code == 200
            assert [x.method for x in s.upstream.seen] == ["GET", "GET"]
            events = await s.settle(3)
            assert [e["method"] for e in events] == ["GET", "PUT", "GET"]
            assert [e["verdict"] for e in events] == ["allow", "deny", "allow"]
            assert events[1]["reason"] == "no-rule-matched"
            assert events[0]["path"] == "/left-pad"
            assert events[0]["status"] == 200

    run(go())


def test_a_label_in_a_header_or_the_body_is_refused_and_the_twin_passes(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            url = s.url("other.test", "/upload")
            r = await c.get(url, headers={"x-note": LABELLED})
            assert r.status_code == 403
            assert r.headers["x-stockade-reason"] == "labelled-data"

            async def pieces(value: str) -> AsyncIterator[bytes]:
                # Split across DATA frames: the scanner holds the join back.
                blob = f"password={value}&x=1".encode()
                for i in range(0, len(blob), 7):
                    yield blob[i : i + 7]

            r = await c.post(url, content=pieces(LABELLED))
            assert r.status_code == 403
            assert r.headers["x-stockade-reason"] == "labelled-data"
            assert not s.upstream.saw(LABELLED[:12])
            # The twins: the same requests without the value.
            r = await c.get(url, headers={"x-note": "harmless"})
            assert r.status_code == 200
            r = await c.post(url, content=pieces("not-the-password"))
            assert r.status_code == 200
            assert s.upstream.seen[-1].body == b"password=not-the-password&x=1"
            events = await s.settle(4)
            assert LABELLED not in str(events)

    run(go())


def test_a_foreign_bearer_is_refused_and_the_bound_placeholder_is_injected(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            placeholder = s.store.environment()["API_KEY"]
            r = await c.get(
                s.url("api.test", "/v1/models"),
                headers={"authorization": "Bearer ATTACKER-KEY-000111222333"},
            )
            assert r.status_code == 403
            assert r.headers["x-stockade-reason"] == "foreign-credential"
            r = await c.get(s.url("api.test", "/v1/models"), headers={"x-api-key": placeholder})
            assert r.status_code == 200
            assert s.upstream.seen[-1].headers["x-api-key"] == REAL_KEY
            assert not s.upstream.saw("ATTACKER")

    run(go())


def test_a_gzip_body_is_decoded_and_scanned(tmp_path: Path) -> None:
    """A gzip body is held whole, decoded and scanned (the HTTP/1.1 path's rule); a
    credential inside is refused, the clean twin reaches the upstream unchanged."""

    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            url = s.url("other.test", "/gz")
            gz = {"content-encoding": "gzip"}
            r = await c.post(url, content=gzip.compress(f"token={GHP}".encode()), headers=gz)
            assert r.status_code == 403
            assert r.headers["x-stockade-reason"] == "credential-detected"
            clean = gzip.compress(b"token=none" * 1000)
            r = await c.post(url, content=clean, headers=gz)
            assert r.status_code == 200
            assert s.upstream.seen[-1].body == clean
            assert [x.path for x in s.upstream.seen] == ["/gz"]

    run(go())


def test_large_bodies_both_ways_go_through_the_windows(tmp_path: Path) -> None:
    """1 MiB up and 1 MiB down: many flow-control windows' worth each way, byte exact."""

    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            up = bytes(range(251)) * 4200
            r = await c.post(s.url("other.test", "/upload"), content=up)
            assert r.status_code == 200
            assert r.text == f"ok POST /upload {len(up)}"
            assert s.upstream.seen[-1].body == up
            r = await c.get(s.url("other.test", "/download"))
            assert r.status_code == 200
            assert r.content == bytes(range(256)) * 4096
            events = await s.settle(2)
            assert [e["bytes_up"] for e in events] == [len(up), 0]
            assert events[1]["bytes_down"] == 1 << 20

    run(go())


def test_two_concurrent_streams_one_refused_one_completes(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s, s.client() as c:
            slow = asyncio.ensure_future(c.get(s.url("registry.test", "/slow")))
            await asyncio.sleep(0.2)
            refused = await c.post(s.url("registry.test", "/publish"), content=b"{}")
            assert refused.status_code == 403
            assert not slow.done()
            s.upstream.release.set()
            r = await slow
            assert r.status_code == 200
            assert r.http_version == "HTTP/2"
            assert r.text == "ok GET /slow 0"
            # One connection carried both (httpx multiplexes on HTTP/2).
            assert s.layer.speaks_h2

    run(go())


def test_http1_clients_and_policy_off_keep_http1(tmp_path: Path) -> None:
    """The twin of HTTP/2: a client that offers only HTTP/1.1 is served HTTP/1.1; with
    ``[inspect] http2 = false`` an h2-capable client is too, and both work."""

    async def go() -> None:
        async with setup(tmp_path, "\n[inspect]\nhttp2 = false\n") as s, s.client() as c:
            r = await c.get(s.url("registry.test", "/x"))
            assert r.http_version == "HTTP/1.1"
            assert r.status_code == 200
            assert r.text == "ok GET /x via h1"
            r = await c.put(s.url("registry.test", "/x"), content=b"{}")
            assert r.status_code == 403
        async with setup(tmp_path) as s:
            async with s.client() as c:
                r = await c.get(s.url("registry.test", "/x"))
                assert r.http_version == "HTTP/2"
            ctx = ssl.create_default_context(cafile=str(s.bundle))
            async with httpx.AsyncClient(proxy=s.proxy, verify=ctx, timeout=30) as c1:
                r = await c1.get(s.url("registry.test", "/x"))
                assert r.http_version == "HTTP/1.1"
                assert r.text == "ok GET /x via h1"

    run(go())


# -- the raw client: trailers, :authority, RST ------------------------------------------


def test_trailers_are_checked_and_forwarded(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s:
            raw = RawH2(s, "other.test")
            await raw.open()
            try:
                bad = await raw.send("POST", "/t", body=[b"a"], trailers=[("x-note", LABELLED)])
                ghp = await raw.send("POST", "/t", body=[b"a"], trailers=[("x-sig", GHP)])
                ok = await raw.send("POST", "/t", body=[b"ab", b"cd"], trailers=[("x-sum", "9")])
                r_bad, r_ghp, r_ok = [await raw.wait(i) for i in (bad, ghp, ok)]
                assert r_bad["status"] == 403
                assert r_bad["headers"]["x-stockade-reason"] == "labelled-data"
                assert r_ghp["status"] == 403
                assert r_ghp["headers"]["x-stockade-reason"] == "credential-detected"
                assert r_ok["status"] == 200
                assert r_ok["body"] == b"ok POST /t 4"
                # Response trailers come back end to end (gRPC's grpc-status rides there).
                assert r_ok["trailers"] == {"x-outcome": "done"}
                assert s.upstream.seen[-1].trailers == {"x-sum": "9"}
                assert not s.upstream.saw(LABELLED[:12])
                assert not s.upstream.saw(GHP[:12])
                events = await s.settle(3)
                detected = [e for e in events if e.get("detector")]
                assert [e["found_in"] for e in detected] == ["trailer x-sig"]
            finally:
                raw.close()

    run(go())


def test_authority_mismatch_is_refused_per_stream(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s:
            raw = RawH2(s, "other.test")
            await raw.open()
            try:
                wrong = await raw.send("GET", "/x", authority=f"api.test:{s.upstream.port}")
                right = await raw.send("GET", "/x")
                r_wrong, r_right = [await raw.wait(i) for i in (wrong, right)]
                assert r_wrong["status"] == 421
                assert r_wrong["headers"]["x-stockade-reason"] == "host-mismatch"
                assert r_right["status"] == 200
                assert [x.authority for x in s.upstream.seen] == [f"other.test:{s.upstream.port}"]
            finally:
                raw.close()
            # A Host field that disagrees with :authority is malformed HTTP/2 (RFC 9113
            # 8.3.1): the h2 library ends that connection with a protocol error.
            raw = RawH2(s, "other.test")
            raw.conn = h2.connection.H2Connection(
                h2.config.H2Configuration(
                    client_side=True, header_encoding="utf-8", validate_outbound_headers=False
                )
            )
            await raw.open()
            try:
                sid = await raw.send("GET", "/y", headers=[("host", f"api.test:{s.upstream.port}")])
                with pytest.raises(AssertionError, match="the tunnel closed"):
                    await raw.wait(sid)
                assert [x.path for x in s.upstream.seen] == ["/x"]
            finally:
                raw.close()

    run(go())


def test_a_refused_body_stream_is_answered_while_a_sibling_uploads(tmp_path: Path) -> None:
    """A body refused mid-stream: its stream gets the 403 (and RST_STREAM NO_ERROR, the
    rest not wanted); a sibling stream's upload on the same connection completes."""

    async def go() -> None:
        async with setup(tmp_path) as s:
            raw = RawH2(s, "other.test")
            await raw.open()
            try:
                sid_ok = raw.conn.get_next_available_stream_id()
                raw.conn.send_headers(
                    sid_ok,
                    [
                        (":method", "POST"),
                        (":scheme", "https"),
                        (":authority", f"other.test:{s.upstream.port}"),
                        (":path", "/big"),
                    ],
                )
                for _ in range(3):
                    raw.conn.send_data(sid_ok, b"x" * 10000)
                raw.responses[sid_ok] = {"status": 0, "headers": {}, "body": b"", "trailers": {}}
                bad = raw.conn.get_next_available_stream_id()
                raw.conn.send_headers(
                    bad,
                    [
                        (":method", "POST"),
                        (":scheme", "https"),
                        (":authority", f"other.test:{s.upstream.port}"),
                        (":path", "/leak"),
                    ],
                )
                # Not ended: more of the body would follow (the scanner decides as soon
                # as what follows the token shows where it ends).
                raw.conn.send_data(bad, f"key={GHP}&rest=".encode() + b"z" * 4000)
                raw.responses[bad] = {"status": 0, "headers": {}, "body": b"", "trailers": {}}
                await raw._flush()
                r_bad = await raw.wait(bad)
                assert r_bad["status"] == 403
                for i in range(3):
                    raw.conn.send_data(sid_ok, b"y" * 10000, end_stream=i == 2)
                await raw._flush()
                r_ok = await raw.wait(sid_ok)
                assert r_ok["status"] == 200
                assert r_ok["body"] == b"ok POST /big 60000"
                assert not s.upstream.saw(GHP[:12])
                assert [x.path for x in s.upstream.seen] == ["/big"]
            finally:
                raw.close()

    run(go())


def test_a_flood_of_reset_streams_ends_the_connection(tmp_path: Path) -> None:
    """Rapid reset (CVE-2023-44487): a client that opens and resets stream after stream
    gets GOAWAY ENHANCE_YOUR_CALM; the twin, a client whose streams complete, is served
    as long as it likes (more streams than the reset limit)."""

    async def go() -> None:
        async with setup(tmp_path) as s:
            raw = RawH2(s, "other.test")
            await raw.open()
            try:
                for _ in range(150):
                    sid = await raw.send("GET", "/slow", body=[b"x"])
                    raw.conn.reset_stream(sid)
                    await raw._flush()
                ended = None
                async with asyncio.timeout(30):
                    while ended is None:
                        data = await raw.reader.read(65536)
                        if not data:
                            break
                        for event in raw.conn.receive_data(data):
                            if isinstance(event, h2.events.ConnectionTerminated):
                                ended = event.error_code
                assert ended == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            finally:
                raw.close()
            s.upstream.release.set()
            raw = RawH2(s, "other.test")
            await raw.open()
            try:
                for i in range(120):
                    r = await raw.wait(await raw.send("GET", f"/n{i}"))
                    assert r["status"] == 200
            finally:
                raw.close()

    run(go())


# -- curl --http2 ------------------------------------------------------------------------


def _curl_has_http2() -> bool:
    import subprocess

    curl = shutil.which("curl")
    if curl is None:
        return False
    out = subprocess.run([curl, "-V"], capture_output=True, text=True, check=False).stdout
    return "HTTP2" in out


@pytest.mark.skipif(not _curl_has_http2(), reason="curl here has no HTTP/2")
def test_curl_http2(tmp_path: Path) -> None:
    async def go() -> None:
        async with setup(tmp_path) as s:

            async def curl(*args: str) -> tuple[str, str]:
                proc = await asyncio.create_subprocess_exec(
                    "curl",
                    "-sS",
                    "--http2",
                    "--proxy",
                    s.proxy,
                    "--cacert",
                    str(s.bundle),
                    "-o",
                    "-",
                    "-w",
                    "\n%{http_version} %{http_code}",
                    *args,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                out, _ = await proc.communicate()
                body, _, status = out.decode().rpartition("\n")
                return body, status

            body, status = await curl(s.url("registry.test", "/pkg"))
            assert status == "2 200", body
            assert body == "ok GET /pkg 0"
            body, status = await curl("-X", "PUT", "-d", "{}", s.url("registry.test", "/pkg"))
            assert status == "2 403", body
            assert body.startswith("stockade: no-rule-matched")

    run(go())


def events_reasons(s: Setup) -> list[str]:
    return [e["reason"] for e in s.events() if e["verdict"] == "deny"]


# -- gRPC -------------------------------------------------------------------------------

GRPC_RULES = """
[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/stockade.Echo/Say"]
"""


def test_grpc_through_an_inspected_host(tmp_path: Path) -> None:
    """A real grpcio client and server (TLS, the client's CONNECT through the proxy): the
    allowed method answers (its status rides in the response trailers), a method no rule
    allows is refused (HTTP 403, which gRPC reports as PERMISSION_DENIED), a label in the
    message is refused, and the twin without it passes."""
    grpc = pytest.importorskip("grpc")

    async def go() -> None:
        ca = trustme.CA()
        seen: list[bytes] = []

        def say(request: bytes, context: Any) -> bytes:
            seen.append(request)
            return b"echo:" + request

        handler = grpc.method_handlers_generic_handler(
            "stockade.Echo",
            {
                "Say": grpc.unary_unary_rpc_method_handler(say),
                "Publish": grpc.unary_unary_rpc_method_handler(say),
            },
        )
        server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(2))
        server.add_generic_rpc_handlers((handler,))
        cert = ca.issue_cert(*NAMES)
        creds = grpc.ssl_server_credentials(
            [(cert.private_key_pem.bytes(), cert.cert_chain_pems[0].bytes())]
        )
        grpc_port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        try:
            ca_file = tmp_path / "grpc-ca.pem"
            ca.cert_pem.write_to_path(str(ca_file))
            async with setup(tmp_path, GRPC_RULES) as s:
                # The policy's tls_ports and upstream CA are the H2Upstream's: point a
                # second layer at the gRPC server instead.
                text = POLICY.replace("tls_ports = [{port}]", f"tls_ports = [{grpc_port}]")
                policy = parse_policy_text(
                    text.format(port=grpc_port, ca=ca_file) + GRPC_RULES,
                    "g.toml",
                    workspace=tmp_path,
                )
                layer = InspectLayer.from_policy(
                    policy, CertificateAuthority.ephemeral(), s.audit, secrets=s.store
                )
                bundle = write_trust_bundle(layer.ca, tmp_path / "grpc-bundle.pem")
                proxy = EgressProxy(EgressRules.from_policy(policy.network), s.audit, inspect=layer)
                listener = socket.socket()
                listener.bind(("127.0.0.1", 0))
                listener.listen(16)
                serving = asyncio.get_running_loop().create_task(proxy.serve_socket(listener))
                try:

                    def calls() -> list[Any]:
                        channel = grpc.secure_channel(
                            f"api.test:{grpc_port}",
                            grpc.ssl_channel_credentials(bundle.read_bytes()),
                            options=[
                                ("grpc.http_proxy", f"http://127.0.0.1:{listener.getsockname()[1]}")
                            ],
                        )
                        out: list[Any] = []
                        with channel:
                            for method, message in (
                                ("Say", b"hello"),
                                ("Publish", b"hello"),
                                ("Say", LABELLED.encode()),
                                ("Say", b"twin"),
                            ):
                                call = channel.unary_unary(f"/stockade.Echo/{method}")
                                try:
                                    out.append(call(message, timeout=20))
                                except grpc.RpcError as exc:
                                    out.append(exc.code())
                        return out

                    results = await asyncio.to_thread(calls)
                finally:
                    proxy.close()
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(serving, 5)
                    layer.close()
            assert results[0] == b"echo:hello"
            assert results[1] == grpc.StatusCode.PERMISSION_DENIED
            assert results[2] == grpc.StatusCode.PERMISSION_DENIED
            assert results[3] == b"echo:twin"
            assert seen == [b"hello", b"twin"]
            assert events_reasons(s) == ["no-rule-matched", "labelled-data"]
            events = s.events()
            assert [e["path"] for e in events] == [
                "/stockade.Echo/Say",
                "/stockade.Echo/Publish",
            ] + ["/stockade.Echo/Say"] * 2
            assert [e["verdict"] for e in events] == ["allow", "deny", "deny", "allow"]
        finally:
            server.stop(0)

    run(go())


def test_h2_is_imported_only_when_a_connection_negotiates_it() -> None:
    """The CLI's start-up budget: importing the inspect layer does not load ``h2``."""
    import subprocess
    import sys

    code = (
        "import sys, stockade.egress.inspect, stockade.egress.inspect._tunnel;"
        "print('h2' in sys.modules, 'stockade.egress.inspect._h2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_client_hellos_alpn_is_read() -> None:
    """What decides whether the upstream is asked about HTTP/2: the protocols a real
    ClientHello offers (none, http/1.1 only, h2 first)."""
    from stockade.egress._tls import parse_client_hello

    for offered in ([], ["http/1.1"], ["h2", "http/1.1"]):
        ctx = ssl.create_default_context()
        if offered:
            ctx.set_alpn_protocols(offered)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_hostname="api.test")
        with pytest.raises(ssl.SSLWantReadError):
            obj.do_handshake()
        hello = parse_client_hello(outgoing.read())
        assert hello is not None
        assert hello.alpn == tuple(offered)
        assert hello.server_names == ("api.test",)
