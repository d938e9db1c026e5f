"""The asyncio shell: an intercepted CONNECT tunnel, served with h11 on both sides.

:class:`InspectLayer` holds what every tunnel of one proxy shares (the CA's server
contexts, the upstream pool, the :class:`~._inspector.Inspector`, the audit sink).
:class:`InspectingTunnel` serves one tunnel: the proxy has accepted the CONNECT (and
vetted the upstream address); the tunnel completes TLS with the client using a leaf for
the CONNECT host, then for each request asks the inspector for a plan and moves bytes:
the request head, the body streamed through the scanner (never buffered whole, except a
gzip/deflate body, held up to a cap so it can be decoded and scanned before any of it
leaves), then the response streamed back through the redactor.

One ``net_request`` event is written per request; a tunnel whose TLS handshake fails
gets one ``net_intercept`` event (a client that pins certificates ends here).

A client that negotiates ``h2`` by ALPN is served by :mod:`._h2` instead (imported only
then): ``h2`` is offered when ``[inspect] http2`` allows it and the upstream itself
speaks HTTP/2 (learnt from one connection per upstream, kept for the tunnel that made it
when it does, given to the HTTP/1.1 pool when it does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11

from stockade.audit._sink import AuditCallback, AuditSink, as_sink
from stockade.egress import _http
from stockade.egress._rules import parse_address
from stockade.egress._tls import MAX_CLIENT_HELLO, ClientHelloError, parse_client_hello
from stockade.egress.inspect._body import check_encoded_size, finish, scan, scan_encoded
from stockade.egress.inspect._body import decode_body as decode_body
from stockade.egress.inspect._ca import CertificateAuthority
from stockade.egress.inspect._http import Refusal, end_to_end, header_values
from stockade.egress.inspect._inspector import (
    Inspector,
    RequestPlan,
    RequestRecord,
    note_hit,
    reported,
)
from stockade.egress.inspect._rules import LAYER
from stockade.egress.inspect._secrets import SecretStore, StreamReplacer
from stockade.egress.inspect._tls import (
    ALPN_H2,
    ServerContexts,
    TLSStream,
    UpstreamPool,
    upstream_context,
)
from stockade.egress.inspect._websocket import (
    MESSAGE_TOO_BIG,
    POLICY_VIOLATION,
    MessageGate,
    close_frame,
)
from stockade.egress.upstream import Transport, UpstreamRefused, UpstreamUnreachable
from stockade.policy import Decision, Policy, Reason

logger = logging.getLogger("stockade.egress.inspect")

#: largest gzip/deflate request body held for scanning
MAX_ENCODED_BODY = 16 * 1024 * 1024
#: largest decoded size of such a body
MAX_DECODED_BODY = 64 * 1024 * 1024
_MAX_HEAD = 64 * 1024
#: how much of a refused request's body is read and dropped to answer it cleanly
_DRAIN_BYTES = 1024 * 1024
_DRAIN_SECONDS = 5.0

# TLS alerts a client sends when it does not accept the certificate it was shown.
_CERT_REFUSALS = (
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV1_ALERT_ACCESS_DENIED",
    "TLSV1_ALERT_DECRYPT_ERROR",
)
PINNING_MESSAGE = "client refused the interception certificate (pinning?)"


class _UpstreamError(Exception):
    """The upstream failed before a response could be relayed (``reason``: why, with
    the operator's upstream proxy's ``status`` when it was the one that refused)."""

    def __init__(
        self, message: str, reason: Reason = Reason.UPSTREAM_FAILED, status: int = 0
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(slots=True)
class TunnelStats:
    """What one tunnel did (for tests and the benchmark)."""

    requests: int = 0
    refused: int = 0
    #: most request-body bytes held by the proxy at once (chunk plus held-back tail)
    max_buffered: int = 0


class InspectLayer:
    """Everything the intercepted tunnels of one proxy share.

    Args:
        inspector: rules, secrets and labels of the policy.
        ca: the interception CA (per user or per run).
        audit: an :class:`~stockade.audit._sink.AuditSink` (an AuditLog, say) or a
            callback ``(decision, fields)``.
        upstream_ca: verify upstreams against this CA file instead of the system roots.
        caller_trust: CA bundles the caller's trust-store variables name, trusted too
            (a company proxy that intercepts TLS presents certificates of its own CA).
        transport: opens the connections under the upstream TLS (the egress proxy's, so
            that an operator's upstream proxy carries them); direct dials when omitted.
    """

    def __init__(
        self,
        inspector: Inspector,
        ca: CertificateAuthority,
        audit: AuditSink | AuditCallback | None = None,
        *,
        upstream_ca: Any = None,
        caller_trust: Sequence[Path] = (),
        transport: Transport | None = None,
        handshake_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        response_timeout: float = 300.0,
        max_encoded_body: int = MAX_ENCODED_BODY,
        max_decoded_body: int = MAX_DECODED_BODY,
    ) -> None:
        self.inspector = inspector
        self.ca = ca
        #: where events go (the proxy's assembly wraps it to close the proxy on failure)
        self.audit: AuditSink | None = as_sink(audit)
        self.contexts = ServerContexts(ca)
        self.transport = transport
        opener = transport.tls_socket if transport is not None and transport.upstream else None
        self.pool = UpstreamPool(upstream_context(upstream_ca, caller_trust), opener=opener)
        #: offer HTTP/2 to clients whose upstream speaks it (``[inspect] http2``)
        self.http2 = inspector.inspect_policy.http2
        self.h2_context = upstream_context(upstream_ca, caller_trust, ALPN_H2)
        #: (host, port, address) -> whether that upstream answered ALPN h2
        self.speaks_h2: dict[tuple[str, int, str], bool] = {}
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.response_timeout = response_timeout
        self.max_encoded_body = max_encoded_body
        self.max_decoded_body = max_decoded_body

    @classmethod
    def from_policy(
        cls,
        policy: Policy,
        ca: CertificateAuthority,
        audit: AuditSink | AuditCallback | None = None,
        *,
        secrets: SecretStore | None = None,
        environ: Mapping[str, str] | None = None,
        caller_trust: Sequence[Path] = (),
        transport: Transport | None = None,
    ) -> InspectLayer:
        """The layer for ``policy`` (``secrets``: the store whose placeholders the
        sandbox was given; resolved from ``environ`` when omitted)."""
        inspector = Inspector.from_policy(policy, environ, secrets=secrets)
        return cls(
            inspector,
            ca,
            audit,
            upstream_ca=policy.network.upstream_ca,
            caller_trust=caller_trust,
            transport=transport,
        )

    def inspects(self, host: str, port: int) -> bool:
        """True when a TLS tunnel to ``host:port`` must be intercepted."""
        return self.inspector.inspects(host, port)

    def check_name(self, host: str) -> Decision | None:
        """A refusal for a host name that carries a label, a secret or a credential
        (:mod:`._names`), asked before the name is resolved or looked up; None if clean."""
        found = self.inspector.names.check(host)
        if found is None:
            return None
        return Decision.deny(LAYER, found.reason, "", found.detail)

    async def serve(
        self, sock: socket.socket, host: str, port: int, address: str, initial: bytes = b""
    ) -> TunnelStats:
        """Serve one accepted tunnel (see :class:`InspectingTunnel`)."""
        return await InspectingTunnel(self, host, port, address).run(sock, initial)

    def emit(self, event: str, decision: Decision, fields: dict[str, Any]) -> None:
        """Write one event."""
        if decision.rule:
            fields.setdefault("rule", decision.rule)
        if decision.detail:
            fields.setdefault("detail", decision.detail)
        if self.audit is not None:
            self.audit(event, decision, fields)

    def close(self) -> None:
        """Close pooled upstream connections and release the in-memory key."""
        self.pool.close()
        self.contexts.close()


class InspectingTunnel:
    """One intercepted tunnel to ``host:port``, whose upstream is the vetted ``address``."""

    def __init__(self, layer: InspectLayer, host: str, port: int, address: str) -> None:
        self.layer = layer
        self.host = host
        self.port = port
        self.address = address
        self.stats = TunnelStats()

    async def run(self, sock: socket.socket, initial: bytes = b"") -> TunnelStats:
        """Serve the tunnel on ``sock`` (after ``200`` to CONNECT) until it closes.

        ``initial`` holds bytes the proxy already read from the client (the ClientHello
        it peeked at). The socket is closed when this returns.
        """
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Small request/response pieces must not wait for delayed ACKs (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream: TLSStream | None = None
        try:
            offer = False
            if self.layer.http2:
                initial, alpn = await _client_alpn(sock, initial, self.layer.handshake_timeout)
                if "h2" in alpn:
                    offer, upstream = await self._upstream_h2()
            stream = await self._handshake(sock, initial, offer)
            if stream is None:
                return self.stats
            if stream.alpn == "h2":
                from stockade.egress.inspect._h2 import serve_h2

                await serve_h2(self, stream, upstream)
                upstream = None
            else:
                await self._serve(stream)
        finally:
            if upstream is not None:
                upstream.close()
            sock.close()
        return self.stats

    async def _upstream_h2(self) -> tuple[bool, TLSStream | None]:
        """Whether to offer ``h2`` to a client that asked for it, and the upstream
        connection that showed the upstream speaks it (asked once per upstream, before
        the client's handshake completes: later tunnels know)."""
        layer = self.layer
        key = (self.host, self.port, self.address)
        known = layer.speaks_h2.get(key)
        if known is not None:
            return known, None
        try:
            async with asyncio.timeout(layer.handshake_timeout):
                upstream = await layer.pool.connect(*key, layer.h2_context)
        except (OSError, TimeoutError, ssl.SSLError, UpstreamRefused, UpstreamUnreachable):
            # The HTTP/1.1 path tells the client why, request by request.
            return False, None
        speaks = upstream.alpn == "h2"
        layer.speaks_h2[key] = speaks
        if speaks:
            return True, upstream
        layer.pool.release(*key, upstream)
        return False, None

    async def _handshake(
        self, sock: socket.socket, initial: bytes, h2: bool = False
    ) -> TLSStream | None:
        ctx = self.layer.contexts.get(self.host, h2=h2)
        fields: dict[str, Any] = {"host": self.host, "port": self.port}
        try:
            async with asyncio.timeout(self.layer.handshake_timeout):
                return await TLSStream.server(sock, ctx, initial)
        except ssl.SSLError as exc:
            text = f"{exc.reason or ''} {exc}"
            if any(code in text for code in _CERT_REFUSALS) or isinstance(exc, ssl.SSLEOFError):
                decision = Decision.deny(LAYER, Reason.CLIENT_REFUSED_CERT, "", PINNING_MESSAGE)
                logger.warning("inspect: %s: %s (%s)", self.host, PINNING_MESSAGE, exc.reason)
            else:
                decision = Decision.deny(LAYER, Reason.NOT_TLS, "", f"TLS handshake: {exc}")
        except TimeoutError:
            decision = Decision.deny(LAYER, Reason.NOT_TLS, "", "no TLS handshake in time")
        except OSError as exc:
            decision = Decision.deny(LAYER, Reason.NOT_TLS, "", f"client connection: {exc}")
        self.layer.emit("net_intercept", decision, fields)
        return None

    async def _serve(self, stream: TLSStream) -> None:
        client = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        try:
            while True:
                try:
                    event = await _next(client, stream, self.layer.idle_timeout)
                except h11.RemoteProtocolError as exc:
                    record = RequestRecord(host=self.host, port=self.port, sni=stream.sni)
                    refusal = Refusal(400, Reason.BAD_REQUEST, f"malformed HTTP: {exc}")
                    await self._refuse(client, stream, record, refusal, drain=False)
                    return
                if not isinstance(event, h11.Request):
                    return
                keep = await self._exchange(client, stream, event)
                if not keep or client.our_state is not h11.DONE:
                    return
                if client.their_state is not h11.DONE:
                    return
                client.start_next_cycle()
        except (TimeoutError, OSError, ssl.SSLError, h11.ProtocolError):
            return
        finally:
            stream.close()

    # -- one request ------------------------------------------------------------------

    async def _exchange(self, client: h11.Connection, stream: TLSStream, req: h11.Request) -> bool:
        self.stats.requests += 1
        record = RequestRecord(
            method=req.method.decode("ascii", "replace"),
            host=self.host,
            port=self.port,
            path=req.target.decode("latin-1")[:200],
            sni=stream.sni,
        )
        try:
            plan = self.layer.inspector.head(record, stream.sni, req.target, list(req.headers))
        except Refusal as refusal:
            return await self._refuse(client, stream, record, refusal, drain=True)
        if plan.websocket:
            return await self._websocket(client, stream, req, plan, record)
        if client.they_are_waiting_for_100_continue:
            await _send(client, stream, h11.InformationalResponse(status_code=100, headers=[]))
        try:
            if plan.encoding is not None:
                body = await self._read_encoded(client, stream, plan, record)
                upstream, up = await self._send_request(plan, req, body, record)
            elif _has_body(req):
                upstream, up = await self._send_request(plan, req, None, record)
                try:
                    await self._stream_body(client, stream, upstream, up, plan, record)
                except BaseException:
                    upstream.close()
                    raise
            else:
                # The head was the whole request; consume its end so the tunnel can
                # take the next request on the same connection.
                end = await _next(client, stream, self.layer.idle_timeout)
                if not isinstance(end, h11.EndOfMessage):
                    raise Refusal(400, Reason.BAD_REQUEST, "body on a request without length")
                upstream, up = await self._send_request(plan, req, b"", record)
        except Refusal as refused:
            return await self._refuse(client, stream, record, refused, drain=True)
        except _UpstreamError as exc:
            record.upstream_status = exc.status
            failed = Refusal(502, exc.reason, str(exc))
            return await self._refuse(client, stream, record, failed, drain=False)
        return await self._relay_response(client, stream, upstream, up, plan, record)

    def _trailers(
        self, plan: RequestPlan, record: RequestRecord, end: h11.EndOfMessage
    ) -> list[tuple[bytes, bytes]]:
        """The trailer fields to forward, checked as the head was (raises Refusal)."""
        if not plan.chunked:
            return []
        return self.layer.inspector.trailers(record, list(end.headers))

    async def _read_encoded(
        self, client: h11.Connection, stream: TLSStream, plan: RequestPlan, record: RequestRecord
    ) -> bytes:
        """Read a gzip/deflate body up to the cap, decode it with a cap and scan it."""
        body = bytearray()
        while True:
            event = await _next(client, stream, self.layer.idle_timeout)
            if isinstance(event, h11.Data):
                body += event.data
                record.bytes_up += len(event.data)
                check_encoded_size(self.layer.max_encoded_body, plan.encoding, len(body))
            elif isinstance(event, h11.EndOfMessage):
                # Checked like the rest; not forwarded (the body is re-framed whole).
                self._trailers(plan, record, event)
                break
        self.stats.max_buffered = max(self.stats.max_buffered, len(body))
        scan_encoded(
            self.layer.inspector.body_scanner(plan),
            plan.encoding,
            record,
            bytes(body),
            self.layer.max_decoded_body,
        )
        return bytes(body)

    async def _send_request(
        self, plan: RequestPlan, req: h11.Request, body: bytes | None, record: RequestRecord
    ) -> tuple[TLSStream, h11.Connection]:
        """Send the head (and ``body`` when known) upstream; retry once on a stale pool hit."""
        request = h11.Request(method=req.method, target=plan.target.forwarded, headers=plan.headers)
        transport = self.layer.transport
        if transport is not None and transport.upstream is not None:
            via = transport.via(self.host, self.port, parse_address(self.address))
            if via is not None:
                record.upstream = via.url
        for attempt in (0, 1):
            try:
                upstream, reused = await self.layer.pool.acquire(self.host, self.port, self.address)
                if record.upstream:
                    # Pooled connections were all opened by a 2xx answer to their CONNECT.
                    record.upstream_status = 200
            except UpstreamRefused as exc:
                raise _UpstreamError(str(exc), Reason.UPSTREAM_REFUSED, exc.status) from None
            except UpstreamUnreachable as exc:
                raise _UpstreamError(str(exc), Reason.UPSTREAM_UNREACHABLE) from None
            except ssl.SSLCertVerificationError as exc:
                raise _UpstreamError(
                    f"upstream certificate not trusted: {exc.verify_message}"
                ) from None
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                raise _UpstreamError(
                    f"cannot reach {self.host}: {exc or type(exc).__name__}"
                ) from None
            up = h11.Connection(h11.CLIENT)
            try:
                await _send(up, upstream, request, flush=body is None)
                if body is not None:
                    if body:
                        await _send(up, upstream, h11.Data(data=body), flush=False)
                    await _send(up, upstream, h11.EndOfMessage())
                return upstream, up
            except (OSError, ssl.SSLError, h11.ProtocolError) as exc:
                upstream.close()
                if not reused or attempt:
                    raise _UpstreamError(f"upstream write failed: {exc}") from None
        raise _UpstreamError("upstream unavailable")

    async def _stream_body(
        self,
        client: h11.Connection,
        stream: TLSStream,
        upstream: TLSStream,
        up: h11.Connection,
        plan: RequestPlan,
        record: RequestRecord,
    ) -> None:
        scanner = self.layer.inspector.body_scanner(plan)
        while True:
            event = await _next(client, stream, self.layer.idle_timeout)
            if isinstance(event, h11.Data):
                record.bytes_up += len(event.data)
                clean = scan(scanner, bytes(event.data), record)
                self.stats.max_buffered = max(
                    self.stats.max_buffered, len(event.data) + scanner.keep
                )
                if clean:
                    await _send(up, upstream, h11.Data(data=clean))
            elif isinstance(event, h11.EndOfMessage):
                rest = finish(scanner, record)
                if rest:
                    await _send(up, upstream, h11.Data(data=rest))
                trailers = self._trailers(plan, record, event)
                await _send(up, upstream, h11.EndOfMessage(headers=trailers))
                return
            else:
                raise h11.RemoteProtocolError("unexpected event in a request body")

    async def _relay_response(
        self,
        client: h11.Connection,
        stream: TLSStream,
        upstream: TLSStream,
        up: h11.Connection,
        plan: RequestPlan,
        record: RequestRecord,
    ) -> bool:
        redactor = StreamReplacer(plan.redact)
        started = False
        try:
            while True:
                event = await _next(up, upstream, self.layer.response_timeout)
                if isinstance(event, h11.InformationalResponse):
                    continue  # 100 (Expect was answered by the proxy) and hints
                if isinstance(event, h11.Response):
                    headers = end_to_end(event.headers)
                    if redactor.mapping:
                        headers = [(n, redactor.replace_all(v)) for n, v in headers]
                        if _response_has_body(record.method, event.status_code):
                            # The body may change length; let h11 re-frame it.
                            headers = [(n, v) for n, v in headers if n != b"content-length"]
                    record.status = event.status_code
                    started = True
                    head = h11.Response(
                        status_code=event.status_code, headers=headers, reason=event.reason
                    )
                    # Sent with the first body piece (one TCP write for small answers).
                    await _send(client, stream, head, flush=False)
                elif isinstance(event, h11.Data):
                    out = redactor.feed(bytes(event.data))
                    record.bytes_down += len(event.data)
                    if out:
                        # Flushed now unless the rest of the answer is already here.
                        await _send(
                            client, stream, h11.Data(data=out), flush=_drained(up, upstream)
                        )
                elif isinstance(event, h11.EndOfMessage):
                    rest = redactor.finish()
                    if rest:
                        await _send(client, stream, h11.Data(data=rest))
                    await _send(client, stream, h11.EndOfMessage())
                    break
                else:
                    raise _UpstreamError("upstream closed before the response ended")
        except (
            _UpstreamError,
            OSError,
            ssl.SSLError,
            h11.RemoteProtocolError,
            TimeoutError,
        ) as exc:
            upstream.close()
            if not started:
                refusal = Refusal(502, Reason.UPSTREAM_FAILED, f"upstream response: {exc}")
                return await self._refuse(client, stream, record, refusal, drain=False)
            self.emit_request(
                Decision.deny(LAYER, Reason.UPSTREAM_FAILED, record.rule, f"response cut: {exc}"),
                record,
            )
            return False
        if up.our_state is h11.DONE and up.their_state is h11.DONE:
            self.layer.pool.release(self.host, self.port, self.address, upstream)
        else:
            upstream.close()
        if redactor.replaced:
            record.detail = f"redacted {redactor.replaced} echoed secret value(s)"
        self.emit_request(plan.decision, record)
        return True

    # -- WebSocket ---------------------------------------------------------------------

    async def _websocket(
        self,
        client: h11.Connection,
        stream: TLSStream,
        req: h11.Request,
        plan: RequestPlan,
        record: RequestRecord,
    ) -> bool:
        """An allowed upgrade: ask upstream; on 101 relay frames, the client's searched
        whole (:mod:`._websocket`); any other answer is relayed and the tunnel closed."""
        record.method = "WEBSOCKET"
        try:
            end = await _next(client, stream, self.layer.idle_timeout)
            if not isinstance(end, h11.EndOfMessage):
                raise Refusal(400, Reason.BAD_REQUEST, "a WebSocket upgrade has no body")
            upstream, up = await self._send_request(plan, req, b"", record)
        except Refusal as refused:
            return await self._refuse(client, stream, record, refused, drain=False)
        except _UpstreamError as exc:
            record.upstream_status = exc.status
            failed = Refusal(502, exc.reason, str(exc))
            return await self._refuse(client, stream, record, failed, drain=False)
        try:
            while True:
                event = await _next(up, upstream, self.layer.response_timeout)
                if isinstance(event, h11.InformationalResponse) and event.status_code != 101:
                    continue
                break
        except (OSError, ssl.SSLError, h11.ProtocolError, TimeoutError) as exc:
            upstream.close()
            refusal = Refusal(502, Reason.UPSTREAM_FAILED, f"upstream response: {exc}")
            return await self._refuse(client, stream, record, refusal, drain=False)
        if not isinstance(event, h11.InformationalResponse):
            # The server declined the upgrade (or answered otherwise): relay its answer.
            record.method = "GET"
            try:
                return await self._relay_declined(client, stream, upstream, up, event, record)
            finally:
                upstream.close()
        record.status = 101
        headers = [
            *end_to_end(event.headers),
            (b"connection", b"Upgrade"),
            (b"upgrade", b"websocket"),
        ]
        extensions = b",".join(header_values(list(event.headers), b"sec-websocket-extensions"))
        deflate = b"permessage-deflate" in extensions.lower()
        gate = MessageGate(
            plan.scan,
            plan.content,
            deflate=deflate,
            reset_each_message=b"client_no_context_takeover" in extensions.lower(),
        )
        try:
            await _send(client, stream, h11.InformationalResponse(status_code=101, headers=headers))
        except (OSError, ssl.SSLError, h11.ProtocolError):
            upstream.close()
            return False
        from_client = client.trailing_data[0]
        from_upstream = up.trailing_data[0]
        ended: list[Decision] = []
        try:
            await self._relay_frames(
                stream, upstream, gate, from_client, from_upstream, record, ended
            )
        finally:
            upstream.close()
        record.detail = record.detail or f"websocket closed after {gate.messages} message(s)"
        self.emit_request(ended[0] if ended else plan.decision, record)
        return False

    async def _relay_frames(
        self,
        stream: TLSStream,
        upstream: TLSStream,
        gate: MessageGate,
        from_client: bytes,
        from_upstream: bytes,
        record: RequestRecord,
        ended: list[Decision],
    ) -> None:
        async def client_to_upstream() -> None:
            data = from_client
            while True:
                if data:
                    record.bytes_up += len(data)
                    verdict = gate.feed(data)
                    for hit in verdict.reports:
                        note_hit(record, hit)
                    if verdict.forward:
                        await upstream.send(verdict.forward)
                    if verdict.refused is not None or verdict.close_code:
                        code = POLICY_VIOLATION if verdict.refused else verdict.close_code
                        why = verdict.refused.detail if verdict.refused else verdict.close_reason
                        record.detail = f"closed ({code}) at message {gate.messages}: {why}"
                        reason_code = Reason.BAD_REQUEST
                        if verdict.refused is not None:
                            note_hit(record, verdict.refused)
                            reason_code = verdict.refused.reason
                        elif code == MESSAGE_TOO_BIG:
                            reason_code = Reason.BODY_TOO_LARGE
                        ended.append(Decision.deny(LAYER, reason_code, record.rule, record.detail))
                        reason = f"stockade: {verdict.refused.reason}" if verdict.refused else why
                        with contextlib.suppress(OSError, ssl.SSLError):
                            await stream.send(close_frame(code, reason, mask=False))
                            await upstream.send(close_frame(1001, "", mask=True))
                        return
                async with asyncio.timeout(self.layer.idle_timeout):
                    data = await stream.recv()
                if not data:
                    return

        async def upstream_to_client() -> None:
            data = from_upstream
            while True:
                if data:
                    record.bytes_down += len(data)
                    await stream.send(data)
                async with asyncio.timeout(self.layer.idle_timeout):
                    data = await upstream.recv()
                if not data:
                    return

        tasks = [
            asyncio.ensure_future(client_to_upstream()),
            asyncio.ensure_future(upstream_to_client()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay_declined(
        self,
        client: h11.Connection,
        stream: TLSStream,
        upstream: TLSStream,
        up: h11.Connection,
        event: Any,
        record: RequestRecord,
    ) -> bool:
        if not isinstance(event, h11.Response):
            refusal = Refusal(502, Reason.UPSTREAM_FAILED, "upstream closed the upgrade")
            return await self._refuse(client, stream, record, refusal, drain=False)
        record.status = event.status_code
        headers = [*end_to_end(event.headers), (b"connection", b"close")]
        with contextlib.suppress(OSError, ssl.SSLError, h11.ProtocolError, TimeoutError):
            await _send(
                client, stream, h11.Response(status_code=event.status_code, headers=headers)
            )
            while True:
                part = await _next(up, upstream, self.layer.response_timeout)
                if isinstance(part, h11.Data):
                    record.bytes_down += len(part.data)
                    await _send(client, stream, h11.Data(data=part.data))
                else:
                    await _send(client, stream, h11.EndOfMessage())
                    break
        self.emit_request(
            Decision.allow(LAYER, record.rule, "WebSocket upgrade declined upstream"), record
        )
        return False

    # -- refusals and events ----------------------------------------------------------

    async def _refuse(
        self,
        client: h11.Connection,
        stream: TLSStream,
        record: RequestRecord,
        refusal: Refusal,
        *,
        drain: bool,
    ) -> bool:
        self.stats.refused += 1
        record.status = refusal.status
        keep = False
        if drain and client.their_state is h11.SEND_BODY:
            keep = await self._drain(client, stream)
        if client.our_state is h11.SEND_RESPONSE:
            # The one refusal writer's parts (egress/_http.py), with its reason phrase.
            headers, body = _http.refusal_parts(refusal.reason, refusal.detail, close=not keep)
            response = h11.Response(
                status_code=refusal.status,
                headers=headers,
                reason=_http.reason_phrase(refusal.status).encode(),
            )
            try:
                await _send(client, stream, response)
                await _send(client, stream, h11.Data(data=body))
                await _send(client, stream, h11.EndOfMessage())
            except (OSError, ssl.SSLError, h11.ProtocolError):
                keep = False
        else:
            keep = False
        self.emit_request(Decision.deny(LAYER, refusal.reason, record.rule, refusal.detail), record)
        return keep

    async def _drain(self, client: h11.Connection, stream: TLSStream) -> bool:
        """Read and drop the rest of a refused request's body, up to a cap.

        A client writes its body before it reads the answer; closing on it mid-body
        would turn a clear 403 into a connection reset. Past the cap (or a client that
        waits for ``100 Continue``) the connection is closed after the answer instead.
        """
        if client.they_are_waiting_for_100_continue:
            return False
        dropped = 0
        try:
            async with asyncio.timeout(_DRAIN_SECONDS):
                while dropped <= _DRAIN_BYTES:
                    event = await _next(client, stream, _DRAIN_SECONDS)
                    if isinstance(event, h11.EndOfMessage):
                        return True
                    if not isinstance(event, h11.Data):
                        return False
                    dropped += len(event.data)
        except (TimeoutError, OSError, ssl.SSLError, h11.ProtocolError):
            return False
        return False

    def emit_request(self, decision: Decision, record: RequestRecord) -> None:
        """Write a request's (or an HTTP/2 stream's) ``net_request`` event."""
        decision = reported(decision, record)
        fields = record.fields()
        if record.detail and not decision.detail:
            fields["detail"] = record.detail
        self.layer.emit("net_request", decision, fields)


# -- helpers -------------------------------------------------------------------------------


async def _client_alpn(
    sock: socket.socket, initial: bytes, timeout: float
) -> tuple[bytes, tuple[str, ...]]:
    """The ClientHello's bytes (``initial`` and what more had to be read of it) and the
    protocols it offers by ALPN; ``()`` when it cannot be read (the handshake that
    follows then fails or goes on as HTTP/1.1)."""
    data = bytearray(initial)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while True:
                hello = parse_client_hello(data)
                if hello is not None:
                    return bytes(data), hello.alpn
                if len(data) > MAX_CLIENT_HELLO + 1024:
                    break
                more = await loop.sock_recv(sock, 65536)
                if not more:
                    break
                data += more
    except (ClientHelloError, TimeoutError, OSError):
        pass
    return bytes(data), ()


def _has_body(req: h11.Request) -> bool:
    if header_values(list(req.headers), b"transfer-encoding"):
        return True
    lengths = header_values(list(req.headers), b"content-length")
    return bool(lengths) and lengths[0].strip() != b"0"


def _response_has_body(method: str, status: int) -> bool:
    return method != "HEAD" and status not in (204, 304) and status >= 200


async def _next(conn: h11.Connection, stream: TLSStream, timeout: float) -> Any:
    """The next h11 event, reading from ``stream`` as needed."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        async with asyncio.timeout(timeout):
            data = await stream.recv()
        conn.receive_data(data)


async def _send(conn: h11.Connection, stream: TLSStream, event: Any, *, flush: bool = True) -> None:
    """Send an h11 event; ``flush=False`` leaves it in the TLS buffer for the next send."""
    data = conn.send(event)
    if data or flush:
        await stream.send(data or b"", flush=flush)


def _drained(up: h11.Connection, upstream: TLSStream) -> bool:
    """True when no more of the response is buffered (so what was written must go now)."""
    return not up.trailing_data[0] and not upstream.pending()
