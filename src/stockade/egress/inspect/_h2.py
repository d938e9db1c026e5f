"""HTTP/2 on an inspected tunnel: each stream checked exactly as an HTTP/1.1 request.

Imported only when a client negotiated ``h2`` by ALPN (the ``h2`` library costs ~0.1 s to
import). The tunnel offers ``h2`` only when the upstream speaks it too, so streams are
relayed as HTTP/2 streams end to end (gRPC needs its response trailers, which an
HTTP/1.1 hop would drop); HTTP/1.1 clients keep the HTTP/1.1 path.

Each client stream becomes the head the HTTP/1.1 path checks (``:authority`` as the
``Host``, which must agree with the SNI and the CONNECT host; ``:path`` as the target)
and goes through the same :meth:`~._inspector.Inspector.head`, the same body scanner
over its DATA frames, the same trailer check. A refusal answers that stream alone (the
HTTP/1.1 path's 403 with ``x-stockade-reason``, or RST_STREAM once its answer has
begun); sibling streams go on. One ``net_request`` event is written per stream.

Both connections are sans-IO (:class:`h2.connection.H2Connection`); two readers feed
them and every handler runs to completion before the next await, so the state of both
sides changes together. Flow control gives back-pressure end to end: received DATA is
acknowledged to its sender only once the other side has taken it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from stockade.egress._http import refusal_parts
from stockade.egress._rules import parse_address
from stockade.egress.inspect._body import check_encoded_size, finish, scan, scan_encoded
from stockade.egress.inspect._content import ContentScanner
from stockade.egress.inspect._http import Refusal, end_to_end, header_values
from stockade.egress.inspect._inspector import Inspector, RequestPlan, RequestRecord
from stockade.egress.inspect._rules import LAYER
from stockade.egress.inspect._secrets import StreamReplacer
from stockade.egress.inspect._tls import TLSStream, UpstreamPool
from stockade.egress.upstream import Transport
from stockade.policy import Decision, Reason

Headers = list[tuple[bytes, bytes]]


class _Stats(Protocol):
    requests: int
    refused: int
    max_buffered: int


class _Layer(Protocol):
    """What the session uses of the :class:`~._tunnel.InspectLayer` (named by shape:
    the tunnel module imports this one only when a client negotiates ``h2``)."""

    @property
    def inspector(self) -> Inspector: ...
    @property
    def pool(self) -> UpstreamPool: ...
    @property
    def h2_context(self) -> ssl.SSLContext: ...
    @property
    def speaks_h2(self) -> dict[tuple[str, int, str], bool]: ...
    @property
    def transport(self) -> Transport | None: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def response_timeout(self) -> float: ...
    @property
    def max_encoded_body(self) -> int: ...
    @property
    def max_decoded_body(self) -> int: ...


class InspectingTunnel(Protocol):
    """What the session uses of the :class:`~._tunnel.InspectingTunnel` it serves."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def address(self) -> str: ...
    @property
    def layer(self) -> _Layer: ...
    @property
    def stats(self) -> _Stats: ...
    def emit_request(self, decision: Decision, record: RequestRecord) -> None: ...


_MAX_HEAD = 64 * 1024
_MAX_STREAMS = 100
#: a client resetting this many unfinished streams, most of those it opened, is
#: flooding (each reset stream cost an upstream stream: the "rapid reset" attack,
#: CVE-2023-44487); the connection is ended with GOAWAY ENHANCE_YOUR_CALM
_MAX_RESETS = 100
#: connection-specific fields HTTP/2 forbids (RFC 9113 8.2.2), never forwarded
_FORBIDDEN = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)


@dataclass(slots=True)
class _Side:
    """One direction's bytes waiting for the receiver's flow-control window."""

    data: bytearray = field(default_factory=bytearray)
    #: end the stream once ``data`` is out (with these trailers when not None)
    end: bool = False
    trailers: Headers | None = None
    #: flow-controlled bytes received from the sender, acknowledged once sent on
    unacked: int = 0
    closed: bool = False


@dataclass(slots=True)
class _Exchange:
    """One client stream and the upstream stream it is relayed on."""

    cid: int
    record: RequestRecord
    plan: RequestPlan | None = None
    scanner: ContentScanner | None = None
    uid: int | None = None
    #: a gzip/deflate body, held whole to be decoded and scanned
    held: bytearray | None = None
    up: _Side = field(default_factory=_Side)
    down: _Side = field(default_factory=_Side)
    redactor: StreamReplacer | None = None
    client_ended: bool = False
    answered: bool = False
    refused: bool = False
    done: bool = False
    emitted: bool = False
    #: the client asked ``te: trailers`` (gRPC does), passed on upstream
    te: bool = False
    trailers_in: Headers = field(default_factory=list)


async def serve_h2(tunnel: InspectingTunnel, client: TLSStream, upstream: TLSStream | None) -> None:
    """Serve an HTTP/2 tunnel whose client negotiated ``h2`` (``upstream``: the HTTP/2
    connection that showed the upstream speaks it, or None to open one)."""
    layer = tunnel.layer
    try:
        if upstream is None:
            try:
                upstream = await layer.pool.connect(
                    tunnel.host, tunnel.port, tunnel.address, layer.h2_context
                )
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                upstream = None
                failure = f"cannot reach {tunnel.host}: {exc or type(exc).__name__}"
            else:
                failure = ""
        else:
            failure = ""
        if upstream is not None and upstream.alpn != "h2":
            # It spoke HTTP/2 before; the next client connection will be offered HTTP/1.1.
            layer.speaks_h2[(tunnel.host, tunnel.port, tunnel.address)] = False
            upstream.close()
            upstream = None
            failure = f"{tunnel.host} no longer speaks HTTP/2; reconnect"
        session = _Session(tunnel, client, upstream, failure)
        await session.run()
    finally:
        if upstream is not None:
            upstream.close()
        client.close()


class _Session:
    def __init__(
        self,
        tunnel: InspectingTunnel,
        client: TLSStream,
        upstream: TLSStream | None,
        failure: str,
    ) -> None:
        self.tunnel = tunnel
        self.layer = tunnel.layer
        self.client = client
        self.upstream = upstream
        #: why no stream can be relayed (the upstream could not be reached)
        self.failure = failure
        self.c = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.u = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.streams: dict[int, _Exchange] = {}
        self.by_uid: dict[int, _Exchange] = {}
        self._locks = (asyncio.Lock(), asyncio.Lock())
        self.closing = False
        #: streams the client reset before their answer ended (see _MAX_RESETS)
        self.resets = 0
        #: the operator's upstream proxy the connection goes through (its URL), for events
        self.via = ""
        transport = self.layer.transport
        if transport is not None and transport.upstream is not None:
            proxy = transport.via(tunnel.host, tunnel.port, parse_address(tunnel.address))
            self.via = proxy.url if proxy is not None else ""

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        self.c.initiate_connection()
        self.c.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEAD,
            }
        )
        if self.upstream is not None:
            self.u.initiate_connection()
        await self._flush()
        readers = [asyncio.ensure_future(self._read_client())]
        if self.upstream is not None:
            readers.append(asyncio.ensure_future(self._read_upstream()))
        try:
            await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for ex in list(self.streams.values()):
                if not ex.done:
                    self._finish(
                        ex,
                        Decision.deny(
                            LAYER,
                            Reason.UPSTREAM_FAILED,
                            ex.record.rule,
                            "connection closed before the stream ended",
                        ),
                    )

    async def _read_client(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.layer.idle_timeout):
                    data = await self.client.recv()
            except TimeoutError:
                if any(not ex.done for ex in self.streams.values()):
                    continue
                return
            except (OSError, ssl.SSLError):
                return
            if not data:
                return
            try:
                events = self.c.receive_data(data)
            except h2.exceptions.ProtocolError:
                with contextlib.suppress(OSError, ssl.SSLError):
                    await self._flush()
                return
            for event in events:
                self._client_event(event)
            await self._flush()
            if self.closing:
                return

    async def _read_upstream(self) -> None:
        assert self.upstream is not None
        while True:
            try:
                async with asyncio.timeout(self.layer.response_timeout):
                    data = await self.upstream.recv()
            except TimeoutError:
                if any(not ex.done for ex in self.streams.values()):
                    self._upstream_gone("upstream response timed out")
                    await self._flush()
                    return
                continue
            except (OSError, ssl.SSLError) as exc:
                data = b""
                why = f"upstream connection: {exc}"
            else:
                why = "upstream closed the connection"
            if not data:
                self._upstream_gone(why)
                await self._flush()
                return
            try:
                events = self.u.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self._upstream_gone(f"upstream HTTP/2 error: {exc}")
                await self._flush()
                return
            for event in events:
                self._upstream_event(event)
            await self._flush()

    async def _flush(self) -> None:
        """Send what both connections have queued (each side's writes in order)."""
        for lock, conn, stream in (
            (self._locks[0], self.c, self.client),
            (self._locks[1], self.u, self.upstream),
        ):
            if stream is None:
                continue
            async with lock:
                data = conn.data_to_send()
                if data:
                    await stream.send(data)

    # -- the client's side ---------------------------------------------------------------

    def _client_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, list(event.headers or []), bool(event.stream_ended))
        elif isinstance(event, h2.events.DataReceived):
            self._data(event.stream_id, event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.TrailersReceived):
            ex = self.streams.get(event.stream_id or 0)
            if ex is not None and not ex.refused:
                ex.trailers_in = list(event.headers or [])
        elif isinstance(event, h2.events.StreamEnded):
            self._request_ended(event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            ex = self.streams.get(event.stream_id or 0)
            if ex is not None and not ex.done:
                self.resets += 1
                if self.resets > _MAX_RESETS and self.resets * 2 > self.tunnel.stats.requests:
                    with contextlib.suppress(h2.exceptions.ProtocolError):
                        self.c.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                    self.closing = True
                self._reset_upstream(ex)
                ex.down.closed = True
                detail = "stream reset by the client"
                decision = ex.plan.decision if ex.plan is not None and not ex.refused else None
                self._finish(
                    ex,
                    decision or Decision.deny(LAYER, Reason.BAD_REQUEST, ex.record.rule, detail),
                    detail,
                )
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for ex in list(self.streams.values()):
                self._pump_down(ex)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closing = True

    def _request(self, cid: int, headers: Headers, ended: bool) -> None:
        self.tunnel.stats.requests += 1
        record = RequestRecord(host=self.tunnel.host, port=self.tunnel.port, sni=self.client.sni)
        if self.via and self.upstream is not None:
            # The connection was opened by a 2xx answer to its CONNECT, as a pooled one.
            record.upstream, record.upstream_status = self.via, 200
        ex = _Exchange(cid, record, client_ended=ended)
        self.streams[cid] = ex
        try:
            target, h1 = _as_http1(record, headers)
            if self.failure:
                raise Refusal(502, Reason.UPSTREAM_FAILED, self.failure)
            # The one decision path: the checks the HTTP/1.1 path makes, in its order.
            plan = self.layer.inspector.head(record, self.client.sni, target, h1)
        except Refusal as refusal:
            self._refuse(ex, refusal)
            return
        ex.plan = plan
        ex.redactor = StreamReplacer(plan.redact)
        ex.te = b"trailers" in header_values(headers, b"te")
        if plan.encoding is not None:
            ex.held = bytearray()
        else:
            ex.scanner = self.layer.inspector.body_scanner(plan)
            if not self._open_upstream(ex, end=ended):
                return
        if not ended and b"100-continue" in header_values(headers, b"expect"):
            self.c.send_headers(cid, [(b":status", b"100")])
        # The end of a request without a body comes as its own StreamEnded event.

    def _open_upstream(self, ex: _Exchange, *, end: bool) -> bool:
        assert ex.plan is not None
        plan = ex.plan
        method = ex.record.method.encode("latin-1")
        headers: Headers = [
            (b":method", method),
            (b":scheme", b"https"),
            (b":authority", plan.headers[0][1]),
            (b":path", plan.target.forwarded),
        ]
        headers += [(n, v) for n, v in plan.headers if n != b"host" and n not in _FORBIDDEN]
        if ex.te:
            # gRPC servers ask for it; it is the one TE value HTTP/2 allows.
            headers.append((b"te", b"trailers"))
        try:
            uid = self.u.get_next_available_stream_id()
            self.u.send_headers(uid, headers, end_stream=end)
        except (h2.exceptions.ProtocolError, h2.exceptions.NoAvailableStreamIDError) as exc:
            self._refuse(ex, Refusal(502, Reason.UPSTREAM_FAILED, f"upstream stream: {exc}"))
            return False
        ex.uid = uid
        self.by_uid[uid] = ex
        if end:
            ex.up.end = ex.up.closed = True
        return True

    def _data(self, cid: int, data: bytes, flow: int) -> None:
        ex = self.streams.get(cid)
        if ex is None or ex.refused or ex.done or ex.plan is None:
            # Refused or reset: dropped, and its window given back.
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.c.acknowledge_received_data(flow, cid)
            return
        ex.record.bytes_up += len(data)
        try:
            if ex.held is not None:
                ex.held += data
                check_encoded_size(self.layer.max_encoded_body, ex.plan.encoding, len(ex.held))
                self.c.acknowledge_received_data(flow, cid)
                return
            assert ex.scanner is not None
            clean = scan(ex.scanner, data, ex.record)
        except Refusal as refusal:
            self._refuse(ex, refusal)
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.c.acknowledge_received_data(flow, cid)
            return
        stats = self.tunnel.stats
        stats.max_buffered = max(stats.max_buffered, len(data) + ex.scanner.keep)
        ex.up.data += clean
        ex.up.unacked += flow
        self._pump_up(ex)

    def _request_ended(self, cid: int) -> None:
        ex = self.streams.get(cid)
        if ex is None:
            return
        ex.client_ended = True
        if ex.refused or ex.done or ex.plan is None:
            return
        try:
            trailers = self.layer.inspector.trailers(ex.record, ex.trailers_in)
            if ex.held is not None:
                scan_encoded(
                    self.layer.inspector.body_scanner(ex.plan),
                    ex.plan.encoding,
                    ex.record,
                    bytes(ex.held),
                    self.layer.max_decoded_body,
                )
                body, ex.held = bytes(ex.held), None
                if not self._open_upstream(ex, end=not body and not trailers):
                    return
                ex.up.data += body
            else:
                assert ex.scanner is not None
                ex.up.data += finish(ex.scanner, ex.record)
        except Refusal as refusal:
            self._refuse(ex, refusal)
            return
        ex.up.end = True
        ex.up.trailers = trailers or None
        self._pump_up(ex)

    # -- the upstream's side -------------------------------------------------------------

    def _upstream_event(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        ex = self.by_uid.get(sid) if sid else None
        if isinstance(event, h2.events.ResponseReceived):
            if ex is None or ex.done or ex.refused:
                return
            self._respond(ex, list(event.headers or []))
        elif isinstance(event, h2.events.DataReceived):
            flow = event.flow_controlled_length or 0
            if ex is None or ex.done or ex.down.closed or ex.redactor is None:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.u.acknowledge_received_data(flow, sid or 0)
                return
            data = event.data or b""
            ex.record.bytes_down += len(data)
            ex.down.data += ex.redactor.feed(data)
            ex.down.unacked += flow
            self._pump_down(ex)
        elif isinstance(event, h2.events.TrailersReceived):
            if ex is not None and ex.redactor is not None and not ex.done:
                redact = ex.redactor.replace_all
                trailers = [(n, redact(v)) for n, v in end_to_end(list(event.headers or []))]
                ex.down.trailers = trailers or None
        elif isinstance(event, h2.events.StreamEnded):
            if ex is not None and not ex.done and ex.answered and ex.redactor is not None:
                ex.down.data += ex.redactor.finish()
                ex.down.end = True
                self._pump_down(ex)
        elif isinstance(event, h2.events.StreamReset):
            if ex is not None and not ex.done:
                ex.up.closed = True
                detail = f"upstream reset the stream (error {event.error_code})"
                if not ex.answered:
                    self._refuse(ex, Refusal(502, Reason.UPSTREAM_FAILED, detail))
                else:
                    self._reset_client(ex, int(event.error_code or 0))
                    self._finish(
                        ex, Decision.deny(LAYER, Reason.UPSTREAM_FAILED, ex.record.rule, detail)
                    )
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for other in list(self.streams.values()):
                self._pump_up(other)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._upstream_gone(f"upstream ended the connection (GOAWAY {event.error_code})")

    def _respond(self, ex: _Exchange, headers: Headers) -> None:
        assert ex.redactor is not None
        status = b"".join(v for n, v in headers if n == b":status")
        regular = end_to_end([(n, v) for n, v in headers if not n.startswith(b":")])
        if ex.redactor.mapping:
            regular = [(n, ex.redactor.replace_all(v)) for n, v in regular]
            # The body may change length when a value is replaced.
            regular = [(n, v) for n, v in regular if n != b"content-length"]
        ex.record.status = int(status or b"0")
        ex.answered = True
        self.c.send_headers(ex.cid, [(b":status", status), *regular])

    def _upstream_gone(self, why: str) -> None:
        """The upstream connection is over: every open stream fails; no new ones."""
        self.failure = why
        for ex in list(self.streams.values()):
            if ex.done or ex.refused:
                continue
            ex.up.closed = True
            if not ex.answered:
                self._refuse(ex, Refusal(502, Reason.UPSTREAM_FAILED, why))
            elif not (ex.down.end and not ex.down.data):
                self._reset_client(ex, h2.errors.ErrorCodes.CANCEL)
                self._finish(ex, Decision.deny(LAYER, Reason.UPSTREAM_FAILED, ex.record.rule, why))
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.c.close_connection()
        self.closing = True

    # -- sending within the windows ------------------------------------------------------

    def _pump_up(self, ex: _Exchange) -> None:
        if ex.uid is None or ex.up.closed:
            return
        side, uid = ex.up, ex.uid
        try:
            sent = _send_within(self.u, uid, side)
        except h2.exceptions.ProtocolError:
            return
        if sent and side.unacked and not side.data:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.c.acknowledge_received_data(side.unacked, ex.cid)
            side.unacked = 0

    def _pump_down(self, ex: _Exchange) -> None:
        if ex.done or ex.down.closed or not ex.answered:
            return
        side = ex.down
        try:
            sent = _send_within(self.c, ex.cid, side)
        except h2.exceptions.ProtocolError:
            return
        if sent and side.unacked and ex.uid is not None and not side.data:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.u.acknowledge_received_data(side.unacked, ex.uid)
            side.unacked = 0
        if side.closed:
            if ex.refused:
                if not ex.client_ended:
                    # The whole answer is out; the rest of the request is not wanted
                    # (RFC 9113 8.1: RST_STREAM NO_ERROR after a complete response).
                    with contextlib.suppress(h2.exceptions.ProtocolError):
                        self.c.reset_stream(ex.cid, h2.errors.ErrorCodes.NO_ERROR)
                self._forget(ex)
                return
            detail = ""
            if ex.redactor is not None and ex.redactor.replaced:
                detail = f"redacted {ex.redactor.replaced} echoed secret value(s)"
            assert ex.plan is not None
            self._finish(ex, ex.plan.decision, detail)

    # -- refusals and events -------------------------------------------------------------

    def _refuse(self, ex: _Exchange, refusal: Refusal) -> None:
        """Answer one stream with the HTTP/1.1 path's refusal (RST_STREAM once its
        answer has begun); the connection and the other streams go on."""
        self.tunnel.stats.refused += 1
        ex.refused = True
        ex.record.status = refusal.status
        self._reset_upstream(ex)
        if not ex.answered and not ex.down.closed:
            # The one refusal writer's parts (egress/_http.py), as the HTTP/1.1 path's.
            headers, body = refusal_parts(refusal.reason, refusal.detail, close=False)
            ex.answered = True
            try:
                self.c.send_headers(ex.cid, [(b":status", str(refusal.status).encode()), *headers])
            except h2.exceptions.ProtocolError:
                ex.down.closed = True
            else:
                ex.down = _Side(bytearray(body), end=True)
        else:
            self._reset_client(ex, h2.errors.ErrorCodes.CANCEL)
        decision = Decision.deny(LAYER, refusal.reason, ex.record.rule, refusal.detail)
        self._emit(ex, decision)
        self._pump_down(ex)

    def _reset_upstream(self, ex: _Exchange) -> None:
        if ex.uid is not None and not ex.up.closed:
            ex.up.closed = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.u.reset_stream(ex.uid, h2.errors.ErrorCodes.CANCEL)

    def _reset_client(self, ex: _Exchange, code: int) -> None:
        if not ex.down.closed:
            ex.down.closed = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.c.reset_stream(ex.cid, code)

    def _finish(self, ex: _Exchange, decision: Decision, detail: str = "") -> None:
        """The stream is over: its event (unless written already), and forgotten."""
        if ex.done:
            return
        if detail:
            ex.record.detail = detail
        self._emit(ex, decision)
        self._forget(ex)

    def _forget(self, ex: _Exchange) -> None:
        ex.done = True
        self.streams.pop(ex.cid, None)
        if ex.uid is not None:
            self.by_uid.pop(ex.uid, None)

    def _emit(self, ex: _Exchange, decision: Decision) -> None:
        """The stream's one ``net_request`` event (a refused stream's is written when
        it is refused; nothing after)."""
        if ex.emitted:
            return
        ex.emitted = True
        self.tunnel.emit_request(decision, ex.record)


def _send_within(conn: h2.connection.H2Connection, sid: int, side: _Side) -> bool:
    """Send as much of ``side`` as the window allows, then its end; True when any
    DATA went out (or nothing was waiting)."""
    sent = not side.data
    while side.data:
        window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
        if window <= 0:
            return sent
        piece = bytes(side.data[:window])
        del side.data[:window]
        conn.send_data(sid, piece)
        sent = True
    if side.end and not side.closed:
        if side.trailers:
            conn.send_headers(sid, side.trailers, end_stream=True)
        else:
            conn.end_stream(sid)
        side.closed = True
    return sent


def _as_http1(record: RequestRecord, headers: Headers) -> tuple[bytes, Headers]:
    """The stream's target and an HTTP/1.1 head for the checks: ``:authority`` as the
    one ``Host`` (a ``Host`` field too must say the same)."""
    pseudo: dict[bytes, bytes] = {}
    regular: Headers = []
    for name, value in headers:
        if name.startswith(b":"):
            if name in pseudo:
                raise Refusal(400, Reason.BAD_REQUEST, f"{name.decode('latin-1')} twice")
            pseudo[name] = value
        else:
            regular.append((name, value))
    record.method = pseudo.get(b":method", b"").decode("ascii", "replace")
    target = pseudo.get(b":path", b"")
    record.path = target.decode("latin-1")[:200]
    if not record.method or not target:
        raise Refusal(400, Reason.BAD_REQUEST, "a request needs :method and :path")
    if pseudo.get(b":scheme", b"") != b"https":
        raise Refusal(400, Reason.BAD_REQUEST, "only :scheme https inside a TLS tunnel")
    hosts = header_values(regular, b"host")
    authority = pseudo.get(b":authority")
    if authority is None:
        if len(hosts) != 1:
            raise Refusal(400, Reason.BAD_REQUEST, "a request needs :authority")
        authority = hosts[0]
    elif any(h != authority for h in hosts):
        raise Refusal(
            421,
            Reason.HOST_MISMATCH,
            f"Host {hosts[0].decode('latin-1')[:80]!r} is not :authority",
        )
    return target, [(b"host", authority), *((n, v) for n, v in regular if n != b"host")]
