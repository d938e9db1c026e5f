"""stockade's resolver inside the sandbox: answers from the policy, never forwards.

Served on a UDP and a TCP socket made inside the sandbox's network namespace (at
127.0.0.1:53, named by the sandbox's ``/etc/resolv.conf``) by the proxy's own event loop,
like the proxy listener: no process inside the sandbox serves it.

* a name the policy allows (or pins) gets a synthetic address from the run's
  :class:`~stockade.egress.dns.AddressPool` for ``A`` and an empty answer (NODATA) for any
  other type, so clients fall back to IPv4 without an error;
* any other name gets NXDOMAIN at once. Nothing is ever looked up upstream at query time,
  so a query cannot carry data out (``<secret>.attacker.example``); the proxy resolves an
  allowed name only when a connection to it is made;
* ``localhost`` answers loopback; PTR of an issued address answers its name;
* malformed messages get FORMERR or NOTIMP when their header is readable, else nothing.

Every name decided gets one ``dns_query`` event per (name, verdict) for the run; after
:data:`MAX_EVENTS` of them a single note says that further ones are not written, so a
flood of queries cannot flood the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import socket
import struct
from collections.abc import Callable
from typing import Any

from stockade.audit._sink import AuditSink
from stockade.egress._rules import LAYER, EgressRules
from stockade.egress.dns import _codec as dns
from stockade.egress.dns._pool import AddressPool
from stockade.policy._decision import Decision, Reason
from stockade.policy._hosts import ip_literal, normalize_host
from stockade.policy._text import printable

__all__ = ["MAX_EVENTS", "DnsServer", "EmitCallback"]

logger = logging.getLogger("stockade.egress")

#: Writes one event: its name, the decision and the event's fields (the audit sink).
EmitCallback = AuditSink

#: Distinct (name, verdict) events written per run before the resolver stops logging.
MAX_EVENTS = 2000
#: Seconds an answer may be cached; the mapping is stable for the run anyway.
TTL = 60
#: TCP: open connections at once, and how long one may sit idle.
_MAX_TCP = 64
_TCP_IDLE = 10.0
_LABEL = re.compile(r"^[a-z0-9_-]{1,63}$")
_LOOPBACK_V4 = ipaddress.IPv4Address("127.0.0.1").packed
_LOOPBACK_V6 = ipaddress.IPv6Address("::1").packed


def _printable(text: str) -> str:
    # A queried name goes into the audit log: one safe line, as long as a DNS name can be.
    return printable(text, 253)


class DnsServer:
    """The resolver of one run; answers with :meth:`answer` (pure but for the pool)."""

    def __init__(
        self,
        rules: EgressRules,
        pool: AddressPool,
        emit: EmitCallback,
        *,
        live: Callable[[], tuple[EgressRules, Callable[[str], bool]]] | None = None,
    ) -> None:
        self.rules = rules
        #: with asking or live changes: the current rules, and whether a name not on the
        #: allow-list would be asked about (such a name gets an address too, so that a
        #: client ignoring proxy variables reaches the ask when it connects)
        self.live = live
        #: set by the runtime: the inspect layer's refusal of a name carrying data (asked
        #: before an address is issued, so no client connects and nothing looks it up)
        self.check_name: Callable[[str], Decision | None] | None = None
        self.pool = pool
        self._emit = emit
        self._logged: set[tuple[str, str]] = set()
        self._silenced = False
        self._transports: list[asyncio.BaseTransport] = []
        self._servers: list[asyncio.Server] = []
        self._tcp: set[asyncio.StreamWriter] = set()

    # -- answering ---------------------------------------------------------------------

    def answer(self, data: bytes) -> bytes | None:
        """The answer to one message, or None when it gets none."""
        try:
            query = dns.parse_query(data)
        except dns.MalformedQuery as exc:
            self._event("", 0, Decision.deny(LAYER, Reason.BAD_REQUEST, detail=str(exc)))
            return dns.error_reply(data, exc.rcode)
        if query.qclass != dns.CLASS_IN:
            return dns.reply(query, dns.NOTIMP)
        name = query.name
        if name == "localhost" or name.endswith(".localhost"):
            return self._localhost(query)
        if name.endswith((".in-addr.arpa", ".ip6.arpa")):
            return self._reverse(query)
        if not name or not all(_LABEL.match(label) for label in name.split(".")):
            return self._nxdomain(query, Reason.BAD_HOSTNAME, "not a host name")
        try:
            host = normalize_host(name)
        except ValueError as exc:
            return self._nxdomain(query, Reason.BAD_HOSTNAME, str(exc))
        if ip_literal(host) is not None:
            # Resolvers never ask for a literal; one that does gets no address to capture.
            return self._nxdomain(query, Reason.BAD_HOSTNAME, "an IP literal is not a name")
        if self.live is None:
            decision = self.rules.check_lookup(host)
        else:
            rules, askable = self.live()
            decision = rules.check_lookup(host)
            if decision.reason is Reason.HOST_NOT_ALLOWED and askable(host):
                # Still no lookup upstream: the ask, and any DNS, wait for the connection.
                decision = Decision.allow(LAYER, rule="ask")
        if decision.allowed and self.check_name is not None:
            decision = self.check_name(host) or decision
        if not decision.allowed:
            return self._nxdomain(query, decision.reason, decision.detail, decision.rule)
        address = self.pool.issue(host)
        if address is None:
            # Full: names already issued keep working; a new one is refused, not reused.
            self._event(
                host,
                query.qtype,
                Decision.deny(LAYER, Reason.CONNECTION_LIMIT, detail="synthetic pool is full"),
            )
            return dns.reply(query, dns.REFUSED)
        self._event(host, query.qtype, decision, address=str(address))
        if query.qtype == dns.TYPE_A:
            return dns.reply(query, dns.NOERROR, [(dns.TYPE_A, address.packed)], TTL)
        # AAAA and every other type: NODATA, never an error, so that clients asking for
        # both families (glibc, musl, Node) go on with the A answer.
        return dns.reply(query, dns.NOERROR)

    def _localhost(self, query: dns.Query) -> bytes:
        if query.qtype == dns.TYPE_A:
            return dns.reply(query, dns.NOERROR, [(dns.TYPE_A, _LOOPBACK_V4)], TTL)
        if query.qtype == dns.TYPE_AAAA:
            return dns.reply(query, dns.NOERROR, [(dns.TYPE_AAAA, _LOOPBACK_V6)], TTL)
        return dns.reply(query, dns.NOERROR)

    def _reverse(self, query: dns.Query) -> bytes:
        if query.qtype not in (dns.TYPE_PTR, 255):
            return dns.reply(query, dns.NOERROR)
        parts = query.name.removesuffix(".in-addr.arpa").split(".")
        name = None
        if query.name.endswith(".in-addr.arpa") and len(parts) == 4:
            with contextlib.suppress(ValueError):
                address = ipaddress.IPv4Address(".".join(reversed(parts)))
                name = (
                    "localhost" if address.is_loopback and address.packed == _LOOPBACK_V4 else None
                )
                name = self.pool.name_of(address) or name
        if name is None:
            # Never forwarded: a reverse lookup of a real address would leak the query.
            return dns.reply(query, dns.NXDOMAIN)
        return dns.reply(query, dns.NOERROR, [(dns.TYPE_PTR, dns.encode_name(name))], TTL)

    def _nxdomain(self, query: dns.Query, reason: Reason, detail: str, rule: str = "") -> bytes:
        self._event(query.name, query.qtype, Decision.deny(LAYER, reason, rule, detail))
        return dns.reply(query, dns.NXDOMAIN)

    def _event(self, name: str, qtype: int, decision: Decision, **extra: Any) -> None:
        key = (name, str(decision.reason))
        if key in self._logged or self._silenced:
            return
        if len(self._logged) >= MAX_EVENTS:
            self._silenced = True
            note = Decision.deny(
                LAYER,
                Reason.CONNECTION_LIMIT,
                detail=f"{MAX_EVENTS} names logged; later queries are answered but not logged",
            )
            self._emit("dns_query", note, {"name": "", "type": ""})
            return
        self._logged.add(key)
        fields: dict[str, Any] = {"name": _printable(name), "type": dns.type_name(qtype)}
        fields.update(extra)
        self._emit("dns_query", decision, fields)

    # -- serving -----------------------------------------------------------------------

    async def serve(self, udp: socket.socket, tcp: socket.socket | None) -> None:
        """Answer on ``udp`` (and ``tcp``) until :meth:`close`; takes both sockets over."""
        loop = asyncio.get_running_loop()
        udp.setblocking(False)
        transport, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self), sock=udp)
        self._transports.append(transport)
        if tcp is not None:
            tcp.setblocking(False)
            server = await asyncio.start_server(self._serve_stream, sock=tcp)
            self._servers.append(server)

    async def _serve_stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(self._tcp) >= _MAX_TCP:
            writer.close()
            return
        self._tcp.add(writer)
        try:
            while True:
                async with asyncio.timeout(_TCP_IDLE):
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    message = await reader.readexactly(length)
                try:
                    response = self.answer(message)
                except Exception as exc:
                    # As on UDP: a bug ends this connection, never the resolver.
                    logger.error("egress: resolver: %s: %s", type(exc).__name__, exc)
                    break
                if response is None:
                    break
                writer.write(struct.pack("!H", len(response)) + response)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        finally:
            self._tcp.discard(writer)
            writer.close()

    def close(self) -> None:
        """Stop answering; close every socket."""
        for transport in self._transports:
            transport.close()
        for server in self._servers:
            server.close()
        for writer in list(self._tcp):
            writer.close()
        self._tcp.clear()
        self._transports.clear()
        self._servers.clear()


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, server: DnsServer) -> None:
        self.server = server
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The selector loop's datagram transport is not a DatagramTransport subclass.
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            response = self.server.answer(data)
        except Exception as exc:
            # A bug must not stop the resolver: the query goes unanswered, once.
            logger.error("egress: resolver: %s: %s", type(exc).__name__, exc)
            return
        if response is not None and self.transport is not None:
            self.transport.sendto(response, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors for a client that left: nothing to do.
        pass
