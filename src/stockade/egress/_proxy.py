"""The egress proxy: one listener, HTTP forward proxy, CONNECT and SOCKS5, TLS SNI check.

Each accepted connection goes: sniff the first byte (0x05 is SOCKS5, anything else is
parsed as HTTP) → parse the request strictly → decide the name (no DNS for a denied name)
→ resolve once → classify each address → open the vetted address (never the name) → relay.
Opening is the one seam under every path (:meth:`EgressProxy._open`): a direct dial, or,
with an operator's upstream proxy, a tunnel or a forward request through it
(:mod:`stockade.egress.upstream`); the decisions above it are the same either way.
Every connection produces exactly one ``net_connect`` audit event, and every forward-proxy
request one ``net_request`` event, whatever happened (refused, failed, cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h11

from stockade._exceptions import SandboxError
from stockade.audit._sink import AuditCallback, AuditSink, FailClosed, as_sink
from stockade.egress import _http, _socks
from stockade.egress._addr import IPAddress
from stockade.egress._relay import RELAY_BUFFER, relay
from stockade.egress._rules import LAYER, AddressVerdict, EgressRules, parse_address
from stockade.egress._tls import MAX_CLIENT_HELLO, ClientHelloError, NotTLS, parse_client_hello
from stockade.egress.approval._broker import RuleSet, RunGate
from stockade.egress.dns._pool import AddressPool
from stockade.egress.upstream import (
    UNRESOLVED,
    Route,
    Transport,
    UpstreamRefused,
    UpstreamUnreachable,
    answer_status,
)
from stockade.policy._decision import Decision, Reason, Verdict
from stockade.policy._hosts import ip_literal, normalize_host, sni_disagreement
from stockade.policy._inspect import echo_refusal
from stockade.policy._text import printable as _printable  # hostile names: one safe line

__all__ = ["AuditCallback", "EgressProxy", "Interceptor", "Resolver"]

logger = logging.getLogger("stockade.egress")

#: Resolves a normalised name to addresses (the default uses ``loop.getaddrinfo``).
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]


class Interceptor(Protocol):
    """The inspect layer as the proxy sees it (:class:`stockade.egress.inspect.InspectLayer`)."""

    def inspects(self, host: str, port: int) -> bool:
        """True when tunnels to ``host:port`` are intercepted instead of relayed."""
        ...

    async def serve(
        self, sock: socket.socket, host: str, port: int, address: str, initial: bytes
    ) -> object:
        """Serve an accepted, SNI-checked tunnel until it closes (closes ``sock``)."""
        ...


_READ = 64 * 1024
#: accept() errors that pass: too many files, no memory, a client gone before accept
#: names and addresses whose decisions are remembered (then forgotten all at once)
_DECISION_CACHE = 4096
_TRANSIENT_ACCEPT = frozenset(
    {
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOBUFS,
        errno.ENOMEM,
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.EPERM,
        errno.EINTR,
        errno.EAGAIN,
    }
)
_UPSTREAM_READ = 256 * 1024
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"

_STATUS = {
    Reason.BAD_HOSTNAME: 400,
    Reason.BAD_REQUEST: 400,
    Reason.UNSUPPORTED_PROTOCOL: 400,
    Reason.RESOLVE_FAILED: 502,
    Reason.UPSTREAM_FAILED: 502,
    Reason.UPSTREAM_REFUSED: 502,
    Reason.UPSTREAM_UNREACHABLE: 502,
    Reason.CONNECTION_LIMIT: 503,
    Reason.HANDSHAKE_TIMEOUT: 400,
}
_SOCKS_CODE = {
    Reason.BAD_HOSTNAME: _socks.REPLY_FAILURE,
    Reason.BAD_REQUEST: _socks.REPLY_FAILURE,
    Reason.RESOLVE_FAILED: _socks.REPLY_HOST_UNREACHABLE,
    Reason.UPSTREAM_FAILED: _socks.REPLY_HOST_UNREACHABLE,
    Reason.UPSTREAM_REFUSED: _socks.REPLY_FAILURE,
    Reason.UPSTREAM_UNREACHABLE: _socks.REPLY_NETWORK_UNREACHABLE,
}


def _deny(reason: Reason, detail: str = "", rule: str = "") -> Decision:
    return Decision.deny(LAYER, reason, rule=rule, detail=detail)


@dataclass
class _Record:
    """What one audit event says; filled in as the connection or request progresses."""

    protocol: str = ""
    host: str = ""
    port: int = 0
    address: str = ""
    address_class: str = ""
    decision: Decision | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "protocol": self.protocol,
            "host": self.host,
            "port": self.port,
            "address": self.address,
            "address_class": self.address_class,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration": round(time.monotonic() - self.started, 6),
        }
        out.update(self.extra)
        return out


def _http_refusal(decision: Decision, host: str) -> bytes:
    """The HTTP answer to a refused destination (CONNECT and forward alike): 403 naming
    the host for a policy refusal, else the status of the reason with its detail."""
    status = _STATUS.get(decision.reason, 403)
    detail = host if status == 403 else decision.detail
    return _http.error_response(status, decision.reason, _printable(detail))


class _Closed(Exception):
    """The client closed its side before the proxy had what it needed."""


class _Client:
    """The accepted socket plus the bytes read from it that nobody consumed yet."""

    __slots__ = ("buffer", "loop", "sock")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.buffer = bytearray()

    async def read(self) -> None:
        data = await self.loop.sock_recv(self.sock, _READ)
        if not data:
            raise _Closed
        self.buffer += data

    def take_head(self) -> bytes | None:
        """The complete request head at the front of the buffer, removed from it; or None."""
        end = _http.find_head_end(self.buffer)
        if end < 0:
            return None
        head = bytes(self.buffer[:end])
        del self.buffer[:end]
        return head

    def read_ready(self) -> bool:
        """Take what has already arrived, without waiting; False when nothing had."""
        try:
            data = self.sock.recv(_READ)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            raise _Closed
        self.buffer += data
        return True

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)


class EgressProxy:
    """The stockade egress proxy for one sandbox (one policy, one or more listeners).

    ``audit`` is an :class:`~stockade.audit._sink.AuditSink` (an
    :class:`~stockade.audit.AuditLog`, say) or a callback taking ``(decision, fields)``; ``resolver`` replaces ``getaddrinfo`` (it is only ever asked
    about names the rules allow); ``transport`` opens vetted destinations (directly when
    omitted; through the operator's upstream proxy when it has one). Timeouts are in
    seconds.
    """

    def __init__(
        self,
        rules: EgressRules,
        audit: AuditSink | AuditCallback | None = None,
        *,
        resolver: Resolver | None = None,
        handshake_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        dns_timeout: float = 5.0,
        idle_timeout: float = 120.0,
        max_connections: int = 4096,
        relay_buffer: int = RELAY_BUFFER,
        inspect: Interceptor | None = None,
        pool: AddressPool | None = None,
        transport: Transport | None = None,
        gate: RunGate | None = None,
    ) -> None:
        self._rules = rules
        #: the run's approval gate (live rules, asks); None: ``rules`` for the proxy's life
        self.gate = gate
        self._ruleset: RuleSet | None = None
        #: what each open connection's task was let through to, for revocation
        self._targets: dict[asyncio.Task[None], tuple[str, int]] = {}
        #: connections closed on purpose, with the decision their event records
        self._revoked: dict[asyncio.Task[None], Decision] = {}
        #: where vetted destinations are opened: directly, or through an upstream proxy
        self.transport = transport or Transport(connect_timeout=connect_timeout)
        #: the synthetic addresses of stockade's resolver (transparent capture), if any
        self.pool = pool
        #: the inspect layer; tunnels to the hosts it names are intercepted, not relayed
        self.inspect = inspect
        sink = as_sink(audit)
        #: every event goes here; a write that fails closes the proxy (never unaudited)
        self._audit = FailClosed(sink, self.close, "egress") if sink is not None else None
        self._resolver = resolver
        self.handshake_timeout = handshake_timeout
        self.connect_timeout = connect_timeout
        self.dns_timeout = dns_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections
        self.relay_buffer = relay_buffer
        self._closed = False
        # Decisions are pure functions of the (immutable) rules: a name or an address
        # asked for again is not worked out again. Resolution is never cached.
        self._names: dict[tuple[str, int], tuple[str, Decision]] = {}
        self._verdicts: dict[tuple[str, int, IPAddress], AddressVerdict] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._accept_tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[socket.socket] = []

    @property
    def rules(self) -> EgressRules:
        """The rules this proxy decides by now: fixed for its life without a gate; with
        one, the gate's current rule set (a live change swaps it, see :meth:`_current`)."""
        if self.gate is not None:
            return self.gate.current().rules
        return self._rules

    def _current(self) -> RuleSet | None:
        """The gate's rule set for one decision; a new generation empties the caches
        first, so that no decision of the old rules outlives them."""
        if self.gate is None:
            return None
        ruleset = self.gate.current()
        if ruleset is not self._ruleset:
            self._names.clear()
            self._verdicts.clear()
            self._ruleset = ruleset
        return ruleset

    def close_failing(self) -> None:
        """Close open connections whose ``host:port`` the current rules no longer pass
        (``host-revoked``); called on the proxy's loop after a live change."""
        ruleset = self._current()
        if ruleset is None:
            return
        for task, (host, port) in list(self._targets.items()):
            if task.done() or ruleset.check_name(host, port).allowed:
                continue
            self.revoke(task, _deny(Reason.HOST_REVOKED, f"{host}:{port} was revoked"))

    def revoke(self, task: asyncio.Task[None], decision: Decision) -> None:
        """Close the connection served by ``task`` (from :meth:`adopt`), its event
        recording ``decision``: an identity that no longer holds (the gateway's pod
        deleted), or a host no longer allowed. Called on the proxy's loop."""
        if task.done() or task not in self._tasks:
            return
        self._revoked[task] = decision
        task.cancel()

    def forget_decisions(self) -> None:
        """Drop remembered name and address decisions (the addresses the rules refuse
        grew: the gateway learnt a node address)."""
        self._names.clear()
        self._verdicts.clear()

    def adopt(
        self, sock: socket.socket, initial: bytes = b"", *, socks_greeted: bool = False
    ) -> asyncio.Task[None] | None:
        """Serve a connection accepted elsewhere (the gateway's listener), exactly as one
        accepted here: ``initial`` is what was already read from it (a request head, or
        what followed a SOCKS5 negotiation the caller completed when ``socks_greeted``).

        Returns the connection's task (for :meth:`revoke`), or None when it was refused
        at once (connection limit, proxy closed; its event is written). Must be called on
        the proxy's loop; the task inherits the caller's context (the gateway's identity
        of the connection, read by its audit callback).
        """
        loop = asyncio.get_running_loop()
        if self._closed:
            sock.close()
            record = _Record(protocol="unknown")
            record.decision = _deny(Reason.BAD_REQUEST, "proxy closed")
            self._emit("net_connect", record)
            return None

        async def handler(conn: socket.socket) -> None:
            await self._guarded(
                conn, _Record(), self._serve_explicit, initial=initial, greeted=socks_greeted
            )

        return self._start(sock, loop, handler)

    # -- serving ------------------------------------------------------------------------

    async def serve_socket(self, sock: socket.socket) -> None:
        """Accept connections on an already-listening socket until :meth:`close`.

        The socket is owned by the proxy from now on and closed when serving stops; open
        connections are closed and their audit events written before this returns.
        """
        await self._serve_listener(sock, self._handle)

    async def serve_capture(self, sock: socket.socket) -> None:
        """Accept transparently captured connections on ``sock`` until :meth:`close`.

        ``sock`` listens inside the sandbox's network namespace on a wildcard address;
        each connection's local address (the synthetic address the client dialled, see
        :class:`~stockade.egress.dns.AddressPool`) says which name and port it was meant
        for, and it is then decided exactly as a CONNECT to that name and port would be.
        """
        await self._serve_listener(sock, self._handle_capture)

    async def _serve_listener(
        self, sock: socket.socket, handler: Callable[[socket.socket], Coroutine[Any, Any, None]]
    ) -> None:
        if self._closed:
            sock.close()
            raise SandboxError("the egress proxy is closed; create a new one")
        sock.setblocking(False)
        self._listeners.append(sock)
        loop = asyncio.get_running_loop()
        inner = loop.create_task(
            accept_forever(
                sock, lambda conn, _: self._start(conn, loop, handler), lambda: self._closed
            )
        )
        self._accept_tasks.add(inner)
        try:
            await inner
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not (inner.cancelled() and self.closed) or (
                current is not None and current.cancelling()
            ):
                inner.cancel()
                raise
        finally:
            self._accept_tasks.discard(inner)
            sock.close()
            if self.closed:
                await self.wait_closed()

    async def serve(self, listen: str) -> None:
        """Listen on ``unix:PATH`` or ``tcp:127.0.0.1:PORT`` and serve until :meth:`close`."""
        sock, path = bind_listener(listen)
        try:
            await self.serve_socket(sock)
        finally:
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()

    def close(self) -> None:
        """Stop accepting and close every connection (their events are still written)."""
        self._closed = True
        for task in list(self._accept_tasks):
            task.cancel()
        for task in list(self._tasks):
            task.cancel()
        close_listeners(self._listeners)

    async def wait_closed(self) -> None:
        """Wait until every connection task has finished and written its event."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def active_connections(self) -> int:
        """Connections being handled right now."""
        return len(self._tasks)

    def _start(
        self,
        conn: socket.socket,
        loop: asyncio.AbstractEventLoop,
        handler: Callable[[socket.socket], Coroutine[Any, Any, None]],
    ) -> asyncio.Task[None] | None:
        """Handle one accepted connection in a task of its own, within the cap."""
        if len(self._tasks) >= self.max_connections:
            record = _Record(protocol="unknown")
            record.decision = _deny(Reason.CONNECTION_LIMIT, f"{self.max_connections} open")
            conn.close()
            self._emit("net_connect", record)
            return None
        task = loop.create_task(handler(conn))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._targets.pop(task, None)
        self._revoked.pop(task, None)

    # -- audit ---------------------------------------------------------------------------

    def _emit(self, event: str, record: _Record) -> None:
        decision = record.decision or _deny(Reason.BAD_REQUEST, "no decision was reached")
        if self._audit is not None:
            # FailClosed: an event that cannot be written closes the proxy.
            self._audit(event, decision, record.fields())

    # -- one connection -------------------------------------------------------------------

    async def _handle(self, sock: socket.socket) -> None:
        await self._guarded(sock, _Record(), self._serve_explicit)

    async def _handle_capture(self, sock: socket.socket) -> None:
        record = _Record()
        record.extra["mode"] = "transparent"
        await self._guarded(sock, record, self._serve_captured)

    async def _serve_explicit(
        self, client: _Client, record: _Record, greeted: bool = False
    ) -> None:
        if greeted:
            await self._serve_socks(client, record, greeted=True)
            return
        if not client.buffer and not client.read_ready():
            async with asyncio.timeout(self.handshake_timeout):
                await client.read()
        if client.buffer[0] == _socks.VERSION:
            await self._serve_socks(client, record)
        else:
            await self._serve_http(client, record)

    async def _serve_captured(self, client: _Client, record: _Record) -> None:
        """A captured connection: its destination is the address the client dialled."""
        local = client.sock.getsockname()
        address: IPAddress = parse_address(str(local[0]))
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        port = int(local[1])
        name = self.pool.name_of(address) if self.pool is not None else None
        # An address stockade did not issue (an IP literal, a host-file entry) is decided
        # as a CONNECT to that literal would be: refused unless the policy names it.
        host = name if name is not None else str(address)
        if self.rules.is_tls_port(port):
            record.protocol = "tls"
        elif port == 80:
            await self._serve_http(client, record, origin=(host, port))
            return
        else:
            record.protocol = "tcp"

        async def nothing(*_: object) -> None:
            # The client already believes it is connected: there is no reply to send,
            # and a refusal is the connection closing.
            return

        await self._tunnel(client, record, host, port, nothing, nothing)

    async def _guarded(
        self,
        sock: socket.socket,
        record: _Record,
        serve: Callable[..., Awaitable[None]],
        *,
        initial: bytes = b"",
        greeted: bool = False,
    ) -> None:
        """Serve one accepted connection; whatever happens, exactly one event."""
        loop = asyncio.get_running_loop()
        try:
            sock.setblocking(False)
            if sock.family != socket.AF_UNIX:
                # Replies go out as soon as they are written, not after the client's ACK.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _Client(sock, loop)
            client.buffer += initial
            if greeted:
                await serve(client, record, True)
            else:
                await serve(client, record)
        except _Closed:
            if record.decision is None:
                record.decision = _deny(Reason.BAD_REQUEST, "client closed before a request")
        except TimeoutError:
            if record.decision is None:
                record.decision = _deny(Reason.HANDSHAKE_TIMEOUT, "no complete request in time")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task in self._revoked:
                # Closed by a live change (a host revoked, the gateway's pod gone): the
                # connection no longer passes. Not a shutdown: the cancellation ends here.
                record.decision = self._revoked[task]
                task.uncancel()
                return
            if record.decision is None:
                record.decision = _deny(Reason.BAD_REQUEST, "proxy closed")
            raise
        except OSError as exc:
            if record.decision is None:
                record.decision = _deny(Reason.BAD_REQUEST, f"client connection: {exc}")
        except Exception as exc:
            # A bug must not become a traceback per connection nor an unaudited one.
            logger.error("egress: internal error: %s: %s", type(exc).__name__, exc)
            if record.decision is None or record.decision.allowed:
                record.decision = _deny(Reason.BAD_REQUEST, f"internal error: {exc}")
        finally:
            sock.close()
            self._emit("net_connect", record)

    async def _vet(self, host_raw: str, port: int, record: _Record) -> IPAddress | None:
        """Decide, resolve and classify; the address to dial, or None (record says why)."""
        if self.pool is not None and len(self.pool):
            # A client that resolved through stockade's resolver and then asked the proxy
            # for the address (socks5://, some CONNECT clients) means the name.
            host_raw = self._issued_name(host_raw) or host_raw
        ruleset = self._current()
        rules = self.rules if ruleset is None else ruleset.rules
        named = self._names.get((host_raw, port))
        if named is None:
            try:
                host = normalize_host(host_raw)
            except ValueError as exc:
                record.host = _printable(host_raw)
                record.port = port
                record.decision = _deny(Reason.BAD_HOSTNAME, str(exc))
                return None
            if len(self._names) >= _DECISION_CACHE:
                self._names.clear()
            check = rules.check_name if ruleset is None else ruleset.check_name
            named = self._names[(host_raw, port)] = (host, check(host, port))
        host, decision = named
        record.host, record.port = host, port
        if not 1 <= port <= 65535:
            record.decision = _deny(Reason.BAD_REQUEST, f"port {port} is out of range")
            return None
        if (
            ruleset is not None
            and self.gate is not None
            and decision.reason is Reason.HOST_NOT_ALLOWED
        ):
            # An allow-list miss, and only that, may be asked about: before any DNS
            # lookup (the name leaves nothing behind until someone allowed it). Not
            # cached: the answer changes the generation, and a deny is the gate's to keep.
            decision = await self.gate.decide(host, port, _scheme(record, port, rules), ruleset)
            if decision.rule.startswith("ask:"):
                record.extra["ask_id"] = decision.rule[4:]
        if not decision.allowed:
            record.decision = decision
            return None
        refused = self.check_name(host)
        if refused is not None:
            # Data in the name itself: refused before any lookup (docs/inspect.md).
            record.decision = refused
            return None
        literal = ip_literal(host)
        pin = rules.pin(host)
        if literal is not None:
            addresses: Sequence[IPAddress] = (literal,)
        elif pin is not None:
            addresses = (pin,)
        else:
            try:
                async with asyncio.timeout(self.dns_timeout):
                    addresses = await self._resolve(host, port)
            except (OSError, TimeoutError, UnicodeError, ValueError) as exc:
                addresses = ()
                failure = str(exc) or type(exc).__name__
            else:
                failure = "no addresses"
            if not addresses:
                if self.transport.resolves_by_name(host, port):
                    # A company network whose names only its proxy resolves: the operator
                    # chose connect_by = "name", so the upstream resolves this allowed
                    # name. A name that does resolve here is still classified below.
                    record.address_class = "resolved-by-upstream"
                    record.decision = (
                        decision
                        if decision.verdict is Verdict.REPORT
                        else Decision(
                            Verdict.ALLOW,
                            LAYER,
                            Reason.ALLOWED,
                            decision.rule,
                            "resolved by the upstream",
                        )
                    )
                    return UNRESOLVED
                record.decision = _deny(Reason.RESOLVE_FAILED, failure)
                return None
        first_denied = None
        for address in addresses:
            verdict = self._verdicts.get((host, port, address))
            if verdict is None:
                if len(self._verdicts) >= _DECISION_CACHE:
                    self._verdicts.clear()
                verdict = rules.check_address(host, port, address)
                self._verdicts[(host, port, address)] = verdict
            if verdict.decision.allowed:
                if self.gate is not None:
                    task = asyncio.current_task()
                    if task is not None:
                        self._targets[task] = (host, port)
                record.address = str(address)
                record.address_class = str(verdict.address_class)
                rule = decision.rule
                detail = "" if not verdict.decision.rule else f"address by {verdict.decision.rule}"
                if decision.verdict is Verdict.REPORT:
                    # let through by a grace period: logged as what it would have been
                    record.decision = decision
                else:
                    record.decision = Decision(Verdict.ALLOW, LAYER, Reason.ALLOWED, rule, detail)
                return address
            if first_denied is None:
                first_denied = verdict
        assert first_denied is not None
        record.address = str(first_denied.address)
        record.address_class = str(first_denied.address_class)
        record.decision = first_denied.decision
        return None

    def check_name(self, host: str) -> Decision | None:
        """The inspect layer's refusal of a name that carries data (a label, a secret,
        a credential), asked before any lookup; None when clean or not inspecting."""
        check = getattr(self.inspect, "check_name", None)
        if check is None or ip_literal(host) is not None:
            return None
        decision: Decision | None = check(host)
        return decision

    def _issued_name(self, host_raw: str) -> str | None:
        assert self.pool is not None
        if not host_raw[:1].isdigit() and not host_raw.startswith(("[", ":")):
            return None
        try:
            address = parse_address(host_raw.removeprefix("[").removesuffix("]"))
        except ValueError:
            return None
        return self.pool.name_of(address)

    async def _resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        if self._resolver is not None:
            return await self._resolver(host, port)
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        out: list[IPAddress] = []
        for info in infos:
            address = parse_address(str(info[4][0]))
            if address not in out:
                out.append(address)
        return out

    async def _open(
        self, record: _Record, address: IPAddress, port: int, *, forward: bool = False
    ) -> Route | None:
        """Open the vetted ``address``: the one seam under CONNECT, SOCKS5, captures and
        forward requests. None when it cannot be (``record`` says why); a destination
        meant for the upstream is then refused, never dialled directly."""
        transport = self.transport
        upstream = transport.via(record.host, port, address)
        if upstream is not None:
            record.extra["upstream"] = upstream.url
        try:
            if forward:
                route = await transport.forward(record.host, port, address)
            else:
                route = await transport.tunnel(record.host, port, address)
        except UpstreamRefused as exc:
            record.extra["upstream_status"] = exc.status
            record.decision = _deny(Reason.UPSTREAM_REFUSED, str(exc))
            return None
        except UpstreamUnreachable as exc:
            record.decision = _deny(Reason.UPSTREAM_UNREACHABLE, str(exc))
            return None
        except (OSError, TimeoutError) as exc:
            record.decision = _deny(Reason.UPSTREAM_FAILED, str(exc) or type(exc).__name__)
            return None
        if route.status:
            record.extra["upstream_status"] = route.status
        return route

    # -- tunnels (CONNECT and SOCKS5) ---------------------------------------------------

    async def _tunnel(
        self,
        client: _Client,
        record: _Record,
        host_raw: str,
        port: int,
        accept: Callable[[], Awaitable[None]],
        refuse: Callable[[Decision], Awaitable[None]],
    ) -> None:
        address = await self._vet(host_raw, port, record)
        if address is None:
            assert record.decision is not None
            await refuse(record.decision)
            return
        accepted = False
        inspected = self.inspect is not None and self.inspect.inspects(record.host, port)
        if inspected and not self.rules.is_tls_port(port):
            # An opaque tunnel would carry what the inspect layer must see; fail closed.
            record.decision = _deny(
                Reason.UNSUPPORTED_PROTOCOL, f"{record.host} is inspected: only TLS ports reach it"
            )
            await refuse(record.decision)
            return
        route: Route | None = None
        if not inspected and self.transport.via(record.host, port, address) is not None:
            # Through an upstream the tunnel is asked for before the client hears that it
            # is open, so that a refusal is still a clear 502; nothing is sent through it
            # before the SNI check below.
            route = await self._open(record, address, port)
            if route is None:
                assert record.decision is not None
                await refuse(record.decision)
                return
        try:
            if self.rules.is_tls_port(port):
                # The ClientHello only comes after the client hears the tunnel is open; a
                # direct destination is dialled only once its SNI has been checked.
                await accept()
                accepted = True
                if not await self._check_client_hello(client, record):
                    return
                if inspected and self.inspect is not None:
                    record.extra["inspected"] = True
                    first = bytes(client.buffer)
                    client.buffer.clear()
                    await self.inspect.serve(client.sock, record.host, port, str(address), first)
                    return
            if route is None:
                route = await self._open(record, address, port)
                if route is None:
                    if not accepted:
                        assert record.decision is not None
                        await refuse(record.decision)
                    return
            if not accepted:
                await accept()
            if route.initial:
                await client.send(route.initial)  # a server that spoke first, via the upstream
                record.bytes_down += len(route.initial)
            first = bytes(client.buffer)
            client.buffer.clear()
            opened, route = route, None  # the relay owns (and closes) it from here on
        finally:
            if route is not None:
                route.sock.close()
        up, down = await relay(client.sock, opened.sock, first, self.relay_buffer)
        record.bytes_up += up
        record.bytes_down += down

    async def _check_client_hello(self, client: _Client, record: _Record) -> bool:
        try:
            async with asyncio.timeout(self.handshake_timeout):
                while True:
                    try:
                        hello = parse_client_hello(client.buffer)
                    except NotTLS as exc:
                        record.decision = _deny(Reason.NOT_TLS, str(exc))
                        return False
                    except ClientHelloError as exc:
                        record.decision = _deny(Reason.SNI_MISMATCH, f"unreadable: {exc}")
                        return False
                    if hello is not None:
                        break
                    if len(client.buffer) > MAX_CLIENT_HELLO + 1024:
                        record.decision = _deny(Reason.SNI_MISMATCH, "ClientHello too large")
                        return False
                    await client.read()
        except TimeoutError:
            record.decision = _deny(Reason.HANDSHAKE_TIMEOUT, "no ClientHello in time")
            return False
        except _Closed:
            record.decision = _deny(Reason.NOT_TLS, "closed before a ClientHello")
            return False
        if hello.has_ech:
            # Encrypted ClientHello hides the real name behind the outer one.
            record.decision = _deny(Reason.SNI_MISMATCH, "encrypted ClientHello hides the name")
            return False
        names = hello.server_names
        if len(names) == 1:
            # the name as the audit shows it: the canonical spelling when it has one
            try:
                record.extra["sni"] = normalize_host(names[0])
            except ValueError:
                record.extra["sni"] = _printable(names[0])
        disagreement = sni_disagreement(names, record.host)
        if disagreement is not None:
            record.decision = _deny(*disagreement)
            return False
        return True

    # -- SOCKS5 ----------------------------------------------------------------------------

    async def _serve_socks(self, client: _Client, record: _Record, greeted: bool = False) -> None:
        """SOCKS5; ``greeted``: the method negotiation (and the gateway's username and
        password authentication) already happened, the request comes next."""
        record.protocol = "socks5"
        try:
            async with asyncio.timeout(self.handshake_timeout):
                if not greeted:
                    while (greeting := _socks.parse_greeting(client.buffer)) is None:
                        await client.read()
                    offered, used = greeting
                    del client.buffer[:used]
                    await client.send(_socks.method_reply(offered))
                    if not offered:
                        record.decision = _deny(
                            Reason.UNSUPPORTED_PROTOCOL,
                            "only the no-authentication method is served",
                        )
                        return
                while (request := _socks.parse_request(client.buffer)) is None:
                    await client.read()
        except _socks.SocksError as exc:
            if exc.code is not None:
                await client.send(_socks.reply(exc.code))
            reason = (
                Reason.UNSUPPORTED_PROTOCOL
                if exc.code == _socks.REPLY_ADDRESS_TYPE
                else Reason.BAD_REQUEST
            )
            record.decision = _deny(reason, str(exc))
            return
        del client.buffer[: request.length]
        if request.command != _socks.CMD_CONNECT:
            name = {2: "BIND", 3: "UDP ASSOCIATE"}.get(request.command, str(request.command))
            record.host = _printable(request.host)
            record.port = request.port
            await client.send(_socks.reply(_socks.REPLY_COMMAND))
            record.decision = _deny(Reason.UNSUPPORTED_PROTOCOL, f"SOCKS {name} is not served")
            return

        async def accept() -> None:
            await client.send(_socks.reply(_socks.REPLY_OK))

        async def refuse(decision: Decision) -> None:
            code = _SOCKS_CODE.get(decision.reason, _socks.REPLY_NOT_ALLOWED)
            if decision.reason is Reason.UPSTREAM_FAILED and "refused" in decision.detail:
                code = _socks.REPLY_REFUSED
            await client.send(_socks.reply(code))

        await self._tunnel(client, record, request.host, request.port, accept, refuse)

    # -- HTTP: CONNECT and the forward proxy -------------------------------------------------

    async def _serve_http(
        self, client: _Client, record: _Record, origin: tuple[str, int] | None = None
    ) -> None:
        """Serve HTTP requests: as a proxy, or for ``origin`` (a captured ``name, port``)
        as the origin server the client thinks it reached."""
        record.protocol = "http"
        first = True
        while True:
            request_record = _Record(protocol="http")
            try:
                head = await self._read_head(client, first)
                if head is None:
                    return
                _http.check_head(head)
                event: h11.Request | _http.PlainRequest | None = _http.parse_plain_request(head)
                conn = None
                if event is None:
                    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_http.MAX_HEAD)
                    conn.receive_data(head)
                    parsed = conn.next_event()
                    if not isinstance(parsed, h11.Request):
                        raise _http.BadRequest("incomplete request head")
                    event = parsed
            except (_http.BadRequest, h11.RemoteProtocolError) as exc:
                decision = _deny(Reason.BAD_REQUEST, str(exc))
                with contextlib.suppress(OSError):
                    await client.send(_http.error_response(400, Reason.BAD_REQUEST, str(exc)))
                if first:
                    record.decision = decision
                else:
                    request_record.decision = decision
                    self._emit("net_request", request_record)
                return
            first = False
            if event.method == b"CONNECT" and origin is not None:
                record.decision = _deny(Reason.BAD_REQUEST, "CONNECT to an origin server")
                await client.send(_http.error_response(400, Reason.BAD_REQUEST, "not a proxy"))
                return
            if event.method == b"CONNECT":
                record.protocol = "connect"
                await self._connect(client, record, event)
                return
            if record.decision is None:
                # A forward-proxy connection is itself allowed; each request carries its own
                # decision in its net_request event.
                record.decision = Decision.allow(LAYER, detail="forward proxy")
            keep = False
            try:
                keep = await self._forward(client, conn, event, request_record, origin)
            finally:
                record.bytes_up += request_record.bytes_up
                record.bytes_down += request_record.bytes_down
                record.extra["requests"] = record.extra.get("requests", 0) + 1
                allowed = request_record.decision is not None and request_record.decision.allowed
                if not record.host and allowed:
                    # The connection names the first host it reached; a refused request
                    # is in its own net_request event, not presented as allowed here.
                    record.host, record.port = request_record.host, request_record.port
                self._emit("net_request", request_record)
            if not keep:
                return

    async def _read_head(self, client: _Client, first: bool) -> bytes | None:
        head = client.take_head()
        if head is not None:  # usually so: the head came in the first read; no timer to set
            return head
        timeout = self.handshake_timeout if first else self.idle_timeout
        async with asyncio.timeout(timeout):
            while True:
                head = client.take_head()
                if head is not None:
                    return head
                try:
                    await client.read()
                except _Closed:
                    if not first and not client.buffer:
                        return None  # a clean close between keep-alive requests
                    raise

    async def _connect(
        self, client: _Client, record: _Record, request: h11.Request | _http.PlainRequest
    ) -> None:
        try:
            host, port = _http.parse_authority(request.target.decode("ascii"), None)
        except (_http.BadRequest, UnicodeDecodeError) as exc:
            record.decision = _deny(Reason.BAD_REQUEST, str(exc))
            await client.send(_http.error_response(400, Reason.BAD_REQUEST, str(exc)))
            return

        async def accept() -> None:
            await client.send(_ESTABLISHED)

        async def refuse(decision: Decision) -> None:
            await client.send(_http_refusal(decision, record.host))

        await self._tunnel(client, record, host, port, accept, refuse)

    async def _forward(
        self,
        client: _Client,
        conn: h11.Connection | None,
        request: h11.Request | _http.PlainRequest,
        record: _Record,
        origin: tuple[str, int] | None = None,
    ) -> bool:
        """Serve one absolute-form request (or, for a captured ``origin``, an origin-form
        one whose Host names it); True when the client connection stays open."""
        record.extra["method"] = request.method.decode("ascii", "replace")
        if origin is not None:
            record.extra["mode"] = "transparent"
            # Named from the start: a refused request (a Host naming another host) is
            # audited with the address's name, not an empty host.
            record.host, record.port = origin
        try:
            if origin is None:
                target = _http.parse_forward_target(request.target)
            else:
                target = _origin_target(request, *origin)
        except (_http.BadRequest, UnicodeDecodeError) as exc:
            record.decision = _deny(Reason.BAD_REQUEST, str(exc))
            await client.send(_http.error_response(400, Reason.BAD_REQUEST, str(exc)))
            return False
        # The path without the query: queries often carry tokens that must not be logged.
        record.extra["path"] = _printable(target.path.split(b"?", 1)[0].decode("latin-1"), 256)
        echo = echo_refusal(record.extra["method"], (n for n, _ in request.headers))
        if echo is not None:
            # Before any decision, lookup or dial: nothing of it reaches a hop that
            # could answer with it (the upstream proxy's credentials included).
            if origin is None:
                record.host, record.port = _printable(target.host), target.port
            record.decision = _deny(Reason.BAD_REQUEST, echo)
            await client.send(_http.error_response(405, Reason.BAD_REQUEST, echo))
            return False
        address = await self._vet(target.host, target.port, record)
        if (
            address is not None
            and self.inspect is not None
            and self.inspect.inspects(record.host, target.port)
        ):
            # Plain HTTP to an inspected host would bypass its rules and binding.
            record.decision = _deny(
                Reason.UNSUPPORTED_PROTOCOL, f"{record.host} is inspected: use https://"
            )
            address = None
        if address is None:
            assert record.decision is not None
            await client.send(_http_refusal(record.decision, record.host))
            return False
        route = await self._open(record, address, target.port, forward=True)
        if route is None:
            assert record.decision is not None
            reason = record.decision.reason
            detail = "" if reason is Reason.UPSTREAM_FAILED else record.decision.detail
            await client.send(_http.error_response(502, reason, _printable(detail, 300)))
            return False
        upstream = route.sock
        try:
            return await self._exchange(client, conn, request, target, record, route)
        except (_http.BadRequest, h11.RemoteProtocolError) as exc:
            # Malformed body framing (a bad chunk size, say): the upstream request is cut
            # short by closing, and the client told why.
            record.decision = _deny(Reason.BAD_REQUEST, str(exc))
            with contextlib.suppress(OSError):
                await client.send(_http.error_response(400, Reason.BAD_REQUEST, str(exc)))
            return False
        finally:
            upstream.close()

    async def _exchange(
        self,
        client: _Client,
        conn: h11.Connection | None,
        request: h11.Request | _http.PlainRequest,
        target: _http.ForwardTarget,
        record: _Record,
        route: Route,
    ) -> bool:
        """Send the request upstream and relay the response; True to keep the client."""
        loop = asyncio.get_running_loop()
        upstream = route.sock
        host = record.host if ":" not in record.host else f"[{record.host}]"
        authority = host if target.port == 80 else f"{host}:{target.port}"
        # Through the operator's proxy: absolute-form, with its credentials (the client's
        # own Proxy-Authorization never passes: filter_headers drops it).
        path, via = Transport.forward_target(route, record.host, target.port, target.path)
        headers = [
            (b"host", authority.encode("ascii")),
            *_http.filter_headers(list(request.headers)),
            *_http.request_framing(request),
            # One request per upstream connection: the upstream side stays simple and the
            # vetted address is never reused for another host.
            (b"connection", b"close"),
            *via,
        ]
        keep = request.http_version == b"1.1" and not _wants_close(request.headers)
        if conn is None:
            # A plain request (no body): written out directly, and the response read
            # the plain way unless it needs h11 (see _relay_plain).
            out = b"%s %s HTTP/1.1\r\n" % (request.method, path) + _header_block(headers)
            await loop.sock_sendall(upstream, out)
            record.bytes_up += len(out)
            if route.upstream is not None and not await self._upstream_answer(
                client, record, route
            ):
                return False
            return await self._relay_plain(client, request, target, headers, record, upstream, keep)
        up = h11.Connection(h11.CLIENT)
        out = up.send(h11.Request(method=request.method, target=path, headers=headers))
        assert out is not None
        await loop.sock_sendall(upstream, out)
        record.bytes_up += len(out)
        # Request body: h11 decodes the client's framing, and re-frames it upstream.
        if client.buffer:
            # Never an empty feed: h11 reads b"" as the client closing.
            conn.receive_data(bytes(client.buffer))
            client.buffer.clear()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(self.idle_timeout):
                    data = await loop.sock_recv(client.sock, _UPSTREAM_READ)
                if not data:
                    raise _Closed
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                out = up.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                out = up.send(h11.EndOfMessage())
            else:
                raise _http.BadRequest(f"unexpected {type(event).__name__} in a request body")
            if out:
                await loop.sock_sendall(upstream, out)
                record.bytes_up += len(out)
            if isinstance(event, h11.EndOfMessage):
                break
        leftover, _ = conn.trailing_data
        client.buffer += leftover
        if route.upstream is not None and not await self._upstream_answer(client, record, route):
            return False
        return await self._relay_response(client, request, record, upstream, up, keep)

    async def _upstream_answer(self, client: _Client, record: _Record, route: Route) -> bool:
        """Note the upstream proxy's status for a forwarded request; False (the client
        told) when it is the proxy's own refusal (407) rather than the origin's answer."""
        assert route.upstream is not None
        status = await answer_status(route.sock, self.idle_timeout)
        record.extra["upstream_status"] = status
        if status != 407:
            return True
        detail = f"the upstream proxy {route.upstream.url} answered 407 (credentials)"
        record.decision = _deny(Reason.UPSTREAM_REFUSED, detail)
        await client.send(_http.error_response(502, Reason.UPSTREAM_REFUSED, detail))
        return False

    async def _relay_plain(
        self,
        client: _Client,
        request: h11.Request | _http.PlainRequest,
        target: _http.ForwardTarget,
        headers: list[tuple[bytes, bytes]],
        record: _Record,
        upstream: socket.socket,
        keep: bool,
    ) -> bool:
        """Relay a response with a Content-Length body without h11; else hand it to h11."""
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        closed = False
        end = -1
        async with asyncio.timeout(self.idle_timeout):
            while len(buffer) <= _http.MAX_HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end >= 0:
                    break
                received = await loop.sock_recv(upstream, _UPSTREAM_READ)
                if not received:
                    closed = True
                    break
                record.bytes_down += len(received)
                buffer += received
        response = None
        if end >= 0:
            response = _http.parse_plain_response(bytes(buffer[: end + 4]), request.method)
        if response is None:
            # Anything else (chunked, read-to-close, 1xx, HEAD, a malformed head): h11
            # reads it, told what was sent so that it frames the response right.
            up = h11.Connection(h11.CLIENT)
            up.send(h11.Request(method=request.method, target=target.path, headers=headers))
            up.send(h11.EndOfMessage())
            if buffer:
                up.receive_data(bytes(buffer))
            if closed:
                up.receive_data(b"")
            return await self._relay_response(client, request, record, upstream, up, keep)
        out_headers = [
            *_http.filter_headers(response.headers),
            (b"content-length", b"%d" % response.length),
            (b"connection", b"keep-alive" if keep else b"close"),
        ]
        head = _status_line(response.status, response.reason)
        body = bytes(buffer[end + 4 : end + 4 + response.length])
        # Head and the first body bytes in one write, one segment.
        await client.send(head + _header_block(out_headers) + body)
        left = response.length - len(body)
        while left > 0:
            async with asyncio.timeout(self.idle_timeout):
                received = await loop.sock_recv(upstream, min(_UPSTREAM_READ, left))
            if not received:
                return False  # cut short: the client sees a short body and a close
            record.bytes_down += len(received)
            left -= len(received)
            await client.send(received)
        return keep

    async def _relay_response(
        self,
        client: _Client,
        request: h11.Request | _http.PlainRequest,
        record: _Record,
        upstream: socket.socket,
        up: h11.Connection,
        keep: bool,
    ) -> bool:
        loop = asyncio.get_running_loop()
        chunked = False
        started = False
        pending = b""
        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError as exc:
                record.decision = _deny(Reason.UPSTREAM_FAILED, f"bad response: {exc}")
                if not started:
                    await client.send(_http.error_response(502, Reason.UPSTREAM_FAILED))
                return False
            if event is h11.NEED_DATA:
                if pending:
                    await client.send(pending)
                    pending = b""
                async with asyncio.timeout(self.idle_timeout):
                    received = await loop.sock_recv(upstream, _UPSTREAM_READ)
                record.bytes_down += len(received)
                up.receive_data(received)
                continue
            if isinstance(event, h11.InformationalResponse):
                if request.http_version == b"1.1":
                    await client.send(
                        _status_line(event.status_code, event.reason) + _header_block(event.headers)
                    )
                continue
            if isinstance(event, h11.Response):
                started = True
                no_body = (
                    request.method == b"HEAD"
                    or event.status_code in (204, 304)
                    or event.status_code < 200
                )
                length = _header(event.headers, b"content-length")
                framing: list[tuple[bytes, bytes]] = []
                if length is not None and (no_body or length.isdigit()):
                    framing = [(b"content-length", length)]
                elif not no_body:
                    if request.http_version == b"1.1":
                        chunked = True
                        framing = [(b"transfer-encoding", b"chunked")]
                    else:
                        keep = False  # HTTP/1.0 client: the body ends when we close
                connection = b"keep-alive" if keep else b"close"
                headers = [
                    *_http.filter_headers(list(event.headers)),
                    *framing,
                    (b"connection", connection),
                ]
                # Held back to go out with the first body bytes: one write, one segment.
                pending = _status_line(event.status_code, event.reason) + _header_block(headers)
                continue
            if isinstance(event, h11.Data):
                data = event.data
                if chunked:
                    data = b"%x\r\n" % len(data) + data + b"\r\n"
                if pending:
                    data, pending = pending + data, b""
                await client.send(data)
                continue
            if isinstance(event, h11.EndOfMessage):
                tail = b"0\r\n\r\n" if chunked else b""
                if pending or tail:
                    await client.send(pending + tail)
                return keep
            # ConnectionClosed before the end of a response: the client sees a cut body.
            return False


def _scheme(record: _Record, port: int, rules: EgressRules) -> str:
    """How a connection being asked about will be used: ``http``, ``https`` or ``tcp``."""
    if record.protocol == "http":
        return "http"
    return "https" if rules.is_tls_port(port) else "tcp"


def _origin_target(
    request: h11.Request | _http.PlainRequest, name: str, port: int
) -> _http.ForwardTarget:
    """The target of a captured plain-HTTP request to ``name:port``.

    Its Host header must name the same host (and port) the client's address was issued
    for: a request whose Host says otherwise is the Host-header bypass, refused.
    """
    if not request.target.startswith(b"/"):
        raise _http.BadRequest("a request to an origin server needs an origin-form target")
    value = _header(request.headers, b"host")
    if value is not None:
        host, host_port = _http.parse_authority(value.decode("ascii"), 80)
        try:
            host = normalize_host(host)
        except ValueError as exc:
            raise _http.BadRequest(f"Host: {exc}") from None
        if not _same_host(host, name) or host_port != port:
            raise _http.BadRequest(
                f"Host {_printable(host)}:{host_port} is not {name}:{port}, the address's name"
            )
    return _http.ForwardTarget(name, port, request.target)


def _same_host(a: str, b: str) -> bool:
    """Two normalised hosts are one: equal names, or literals of one address (an
    IPv4-mapped IPv6 spelling is its IPv4 address, as the capture listener sees it)."""
    if a == b:
        return True
    x, y = ip_literal(a), ip_literal(b)
    if x is None or y is None:
        return False
    if isinstance(x, ipaddress.IPv6Address) and x.ipv4_mapped is not None:
        x = x.ipv4_mapped
    if isinstance(y, ipaddress.IPv6Address) and y.ipv4_mapped is not None:
        y = y.ipv4_mapped
    return x == y


def _wants_close(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name in (b"connection", b"proxy-connection") and b"close" in value.lower():
            return True
    return False


def _header(headers: Sequence[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    for name, value in headers:
        if name == wanted:
            return bytes(value)
    return None


def _status_line(status: int, reason: bytes) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, bytes(reason))


def _header_block(headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    return b"".join(b"%s: %s\r\n" % (bytes(n), bytes(v)) for n, v in headers) + b"\r\n"


def bind_listener(listen: str) -> tuple[socket.socket, Path | None]:
    """Create the listening socket for ``unix:PATH`` or ``tcp:HOST:PORT`` (loopback only).

    Returns the socket and, for a unix socket, its path (to remove when done).
    Raises ValueError for a malformed or non-loopback address.
    """
    kind, _, rest = listen.partition(":")
    if kind == "unix" and rest:
        path = Path(rest)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise ValueError(f"{path} exists and is not a socket; choose another path")
            path.unlink()  # a stale socket from an earlier run
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            # The socket is the sandbox's identity: only its owner may connect.
            os.chmod(path, 0o600)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
        return sock, path
    if kind == "tcp" and rest:
        host, sep, port_text = rest.rpartition(":")
        if not sep or not port_text.isdigit() or int(port_text) > 65535:
            raise ValueError(f"{listen!r}: write tcp:127.0.0.1:PORT")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{listen!r}: the host must be a loopback IP address") from None
        if not address.is_loopback:
            raise ValueError(
                f"{listen!r}: the proxy listens on loopback only (127.0.0.1 or ::1); "
                "anything else would open it to the network"
            )
        return tcp_listener(address, int(port_text)), None
    raise ValueError(f"{listen!r}: write unix:PATH or tcp:127.0.0.1:PORT")


def tcp_listener(address: IPAddress, port: int, backlog: int = 1024) -> socket.socket:
    """A TCP socket listening on ``address:port`` (the caller decided the address may
    be served); OSError when it cannot be bound."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((str(address), port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


async def accept_forever(
    sock: socket.socket,
    accepted: Callable[[socket.socket, Any], object],
    closed: Callable[[], bool],
) -> None:
    """Hand every connection of the listening ``sock`` to ``accepted(conn, address)``,
    from a reader callback that stays registered for the listener's life.

    ``loop.sock_accept`` would register and unregister the listener with epoll for every
    connection; a proxy for short requests spends a measurable part of each one on that.
    Returns only by cancellation (close); raises :class:`SandboxError` when the listener
    itself is broken. ``closed`` says the owner is closing (accept errors are expected).
    """
    loop = asyncio.get_running_loop()
    broken: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def acceptable() -> None:
        for _ in range(64):  # what is pending, within reason: others wait their turn
            try:
                conn, address = sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if closed() or broken.done():
                    return
                loop.remove_reader(fd)
                if exc.errno not in _TRANSIENT_ACCEPT:
                    # The listener itself is broken (shut down, closed under us): no
                    # connection will ever be accepted again. Fail, so that the caller
                    # reports it (proxy_failed), rather than spin.
                    broken.set_exception(
                        SandboxError(f"the proxy's listener failed: {exc.strerror or exc}")
                    )
                    return
                # EMFILE/ENFILE/ENOBUFS: back off instead of spinning; the pending
                # connection waits in the backlog.
                logger.warning("egress: accept failed: %s", exc.strerror or exc)
                loop.call_later(0.05, resume)
                return
            accepted(conn, address)

    def resume() -> None:
        if not closed() and not broken.done():
            loop.add_reader(fd, acceptable)

    loop.add_reader(fd, acceptable)
    try:
        await broken
    finally:
        if not broken.done() or broken.exception() is None:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(fd)


def close_listeners(listeners: list[socket.socket]) -> None:
    """Close listening sockets, each taken off the running loop's epoll first (before
    its descriptor number can be reused)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    for sock in listeners:
        if loop is not None and sock.fileno() >= 0:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(sock.fileno())
        sock.close()
