"""Opening a vetted destination: dialled directly, or through the operator's upstream.

This is a transport under the decisions, nothing more: by the time a :class:`Transport`
is asked, the proxy has decided the name, resolved it and classified the address. A
destination that the upstream's ``no_proxy`` does not send direct is never dialled
directly, whatever happens to the upstream: its refusal is :class:`UpstreamRefused`,
its absence :class:`UpstreamUnreachable`, and the caller refuses the client.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.egress._addr import IPAddress
from stockade.egress._rules import parse_address
from stockade.egress.upstream._config import Upstream
from stockade.policy._hosts import ip_literal

#: most bytes of an upstream's answer head read (OpenShell uses the same budget)
MAX_REPLY_HEAD = 8 * 1024
#: how long the upstream's name stays resolved
_UPSTREAM_TTL = 30.0


class UpstreamRefused(OSError):
    """The upstream answered, and not with a tunnel (``status`` is its answer, 0 if none)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UpstreamUnreachable(OSError):
    """The upstream could not be reached (or went away before it answered)."""


@dataclass(slots=True)
class Route:
    """An opened destination.

    ``sock`` reaches the destination (directly or inside the upstream's tunnel) or, for
    a forward request through the upstream, the upstream itself. ``initial`` holds bytes
    the destination sent that arrived with the upstream's answer (a server that speaks
    first); ``upstream`` is the proxy in the way and ``status`` its answer.
    """

    sock: socket.socket
    initial: bytes = b""
    upstream: Upstream | None = None
    status: int = 0


#: The address of a name only the upstream resolves (``connect_by = "name"`` and no
#: answer here): never dialled, and never matches a range; the upstream is asked by name.
UNRESOLVED = ipaddress.IPv4Address("0.0.0.0")  # noqa: S104 - a marker, never bound or dialled


async def dial(address: IPAddress, port: int, timeout: float) -> socket.socket:
    """A non-blocking TCP connection to exactly ``address``:``port`` (no name involved)."""
    if address.is_unspecified:
        # 0.0.0.0 would reach this host's own services; it only ever stands for a name
        # left to the upstream (UNRESOLVED), so a direct dial of it is a bug: refuse.
        raise OSError(errno.EHOSTUNREACH, f"{address} is not an address to dial")
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # loop.sock_connect would parse the vetted address again (and could resolve a
        # name); this connects to exactly the literal that passed the checks.
        error = sock.connect_ex((str(address), port))
        if error == errno.EINPROGRESS:
            loop = asyncio.get_running_loop()
            writable: asyncio.Future[None] = loop.create_future()

            def ready() -> None:
                if not writable.done():
                    writable.set_result(None)

            loop.add_writer(sock.fileno(), ready)
            try:
                async with asyncio.timeout(timeout):
                    await writable
            finally:
                loop.remove_writer(sock.fileno())
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            raise OSError(error, os.strerror(error))
    except BaseException:
        sock.close()
        raise
    return sock


class Transport:
    """Opens vetted destinations for one proxy: directly, or through ``upstream``.

    Timeouts are in seconds: ``connect_timeout`` for each TCP connection,
    ``reply_timeout`` for the upstream's answer to a CONNECT (it connects onward first).
    """

    def __init__(
        self,
        upstream: Upstream | None = None,
        *,
        connect_timeout: float = 10.0,
        reply_timeout: float = 30.0,
    ) -> None:
        self.upstream = upstream
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self._addresses: tuple[float, Sequence[IPAddress]] | None = None

    def resolves_by_name(self, host: str, port: int) -> bool:
        """True when a name this host cannot resolve may be left to the upstream: one is
        set, asked by name (``connect_by = "name"``), and ``host:port`` is not direct."""
        upstream = self.upstream
        return (
            upstream is not None
            and upstream.connect_by == "name"
            and not upstream.direct(host, port, UNRESOLVED)
        )

    def via(self, host: str, port: int, address: IPAddress) -> Upstream | None:
        """The upstream ``host:port`` (vetted to ``address``) goes through; None: direct."""
        upstream = self.upstream
        if upstream is None or upstream.direct(host, port, address):
            return None
        return upstream

    async def tunnel(self, host: str, port: int, address: IPAddress) -> Route:
        """A byte stream to the destination: a direct connection, or a CONNECT tunnel."""
        upstream = self.via(host, port, address)
        if upstream is None:
            return Route(await dial(address, port, self.connect_timeout))
        sock = await self._reach(upstream)
        try:
            status, initial = await self._connect(sock, upstream, host, port, address)
        except BaseException:
            sock.close()
            raise
        return Route(sock, initial, upstream, status)

    async def forward(self, host: str, port: int, address: IPAddress) -> Route:
        """Where a plain-HTTP request goes: the origin, or the upstream itself (then the
        request is written in absolute-form, see :meth:`forward_target`)."""
        upstream = self.via(host, port, address)
        if upstream is None:
            return Route(await dial(address, port, self.connect_timeout))
        return Route(await self._reach(upstream), upstream=upstream)

    async def tls_socket(self, host: str, port: int, address: str) -> socket.socket:
        """A connection for the inspect layer's own TLS to ``host`` (it re-originates)."""
        route = await self.tunnel(host, port, parse_address(address))
        if route.initial:
            route.sock.close()
            raise UpstreamRefused(route.status, f"{host}:{port} spoke before TLS started")
        return route.sock

    @staticmethod
    def forward_target(
        route: Route, host: str, port: int, path: bytes
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The request target and extra headers of a forward request on ``route``.

        Through an upstream the target is absolute-form, ``http://host:port/path`` by
        name whatever ``connect_by`` says: the upstream must take the ``Host`` it sends
        from that URL (RFC 9112 §3.2.2), so an address there would reach every
        name-based server as the wrong site. The name was decided and its address
        classified all the same; the upstream resolves it. The upstream's credentials
        go with it. Directly, the origin-form ``path`` as it is.
        """
        upstream = route.upstream
        if upstream is None:
            return path, []
        authority = f"[{host}]" if ":" in host else host
        if port != 80:
            authority += f":{port}"
        headers = []
        if upstream.authorization is not None:
            headers.append((b"proxy-authorization", upstream.authorization))
        return b"http://" + authority.encode("ascii") + path, headers

    async def _reach(self, upstream: Upstream) -> socket.socket:
        try:
            addresses = await self._upstream_addresses(upstream)
        except (OSError, UnicodeError, ValueError) as exc:
            raise UpstreamUnreachable(
                f"the upstream proxy {upstream.url}: cannot resolve {upstream.host}: {exc}"
            ) from None
        error: BaseException | None = None
        for address in addresses:
            try:
                return await dial(address, upstream.port, self.connect_timeout)
            except (OSError, TimeoutError) as exc:
                error = exc
        detail = "timed out" if isinstance(error, TimeoutError) else str(error)
        raise UpstreamUnreachable(f"the upstream proxy {upstream.url}: {detail}")

    async def _upstream_addresses(self, upstream: Upstream) -> Sequence[IPAddress]:
        literal = ip_literal(upstream.host)
        if literal is not None:
            return (literal,)
        now = time.monotonic()
        if self._addresses is not None and self._addresses[0] > now:
            return self._addresses[1]
        # The operator's own proxy: resolved by the host's resolver, and never classified
        # (it is usually on a private address, on purpose).
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            infos = await loop.getaddrinfo(upstream.host, upstream.port, type=socket.SOCK_STREAM)
        out: list[IPAddress] = []
        for info in infos:
            address = parse_address(str(info[4][0]))
            if address not in out:
                out.append(address)
        if not out:
            raise OSError(f"no addresses for {upstream.host}")
        self._addresses = (now + _UPSTREAM_TTL, tuple(out))
        return out

    async def _connect(
        self,
        sock: socket.socket,
        upstream: Upstream,
        host: str,
        port: int,
        address: IPAddress | str,
    ) -> tuple[int, bytes]:
        """Ask the upstream for a tunnel; its status and what followed its answer."""
        authority = upstream.authority(host, port, address).encode("ascii")
        request = b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (authority, authority)
        if upstream.authorization is not None:
            request += b"Proxy-Authorization: " + upstream.authorization + b"\r\n"
        loop = asyncio.get_running_loop()
        buffer = bytearray()
        try:
            async with asyncio.timeout(self.reply_timeout):
                await loop.sock_sendall(sock, request + b"\r\n")
                while (end := buffer.find(b"\r\n\r\n")) < 0:
                    if len(buffer) > MAX_REPLY_HEAD:
                        raise UpstreamRefused(0, f"{upstream.url}: answer head over 8 KiB")
                    data = await loop.sock_recv(sock, 16 * 1024)
                    if not data:
                        raise UpstreamUnreachable(
                            f"the upstream proxy {upstream.url} closed the connection "
                            f"without answering CONNECT {authority.decode()}"
                        )
                    buffer += data
        except TimeoutError:
            raise UpstreamUnreachable(
                f"the upstream proxy {upstream.url} did not answer CONNECT "
                f"{authority.decode()} within {self.reply_timeout:g} s"
            ) from None
        except (UpstreamRefused, UpstreamUnreachable):
            raise
        except OSError as exc:
            raise UpstreamUnreachable(f"the upstream proxy {upstream.url}: {exc}") from None
        status, reason = parse_status_line(bytes(buffer[: buffer.find(b"\r\n")]))
        if not 200 <= status < 300:
            what = f"answered {status} {reason}" if status else "did not answer with HTTP"
            raise UpstreamRefused(
                status, f"the upstream proxy {upstream.url} {what} to CONNECT {authority.decode()}"
            )
        return status, bytes(buffer[end + 4 :])


def parse_status_line(line: bytes) -> tuple[int, str]:
    """``(status, reason)`` of an ``HTTP/1.x NNN reason`` line; ``(0, "")`` if it is not one."""
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return 0, ""
    if len(parts[1]) != 3:
        return 0, ""
    reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
    # One safe line: the reason phrase is the upstream's text, headed for the audit log.
    return int(parts[1]), "".join(c if c.isprintable() else "?" for c in reason[:80])


async def answer_status(sock: socket.socket, timeout: float) -> int:
    """The status of the answer arriving on ``sock``, peeked at (left for the reader).

    0 when the peer closed, or sent something that is not an HTTP status line.
    """
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        while True:
            readable: asyncio.Future[None] = loop.create_future()

            def ready(future: asyncio.Future[None] = readable) -> None:
                if not future.done():
                    future.set_result(None)

            loop.add_reader(sock.fileno(), ready)
            try:
                await readable
            finally:
                loop.remove_reader(sock.fileno())
            try:
                head = sock.recv(64, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            if not head or b"\n" in head or len(head) >= 12:
                return parse_status_line(head.split(b"\r\n", 1)[0])[0]
            # A status line split over segments: wait for more to arrive.
            await asyncio.sleep(0.001)
