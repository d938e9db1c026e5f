"""TLS for the inspect layer: the proxy's server side, the verified upstream side, a pool.

* :class:`ServerContexts` — one server ``SSLContext`` per intercepted host, holding the
  leaf the CA minted for it (ALPN ``http/1.1``; ``h2`` too for a tunnel whose upstream
  speaks HTTP/2, when ``[inspect] http2`` allows it: :mod:`._h2`);
  its ``sni_callback`` records the name the client asked for so the tunnel can check
  it against the CONNECT authority.
* :func:`upstream_context` — a client context that verifies the real server against
  the system roots (or ``network.tls.upstream_ca``), hostname included.
* :class:`TLSStream` — TLS over a non-blocking socket with ``ssl.MemoryBIO``. Using BIOs
  instead of ``loop.start_tls`` lets the tunnel start from bytes the egress proxy has
  already read (the ClientHello it peeked at for the SNI check).
* :class:`UpstreamPool` — idle verified upstream connections keyed by
  ``(host, port, address)``, reused across client connections: a client opening a fresh
  TLS connection per request then costs one handshake (with the proxy), not two.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from stockade.egress._rules import parse_address
from stockade.egress.inspect._ca import CertificateAuthority
from stockade.egress.upstream import dial

_READ = 256 * 1024
ALPN = ["http/1.1"]
#: offered where HTTP/2 may be spoken (the client, and the upstream it is relayed to)
ALPN_H2 = ["h2", "http/1.1"]
_SNI_ATTR = "stockade_sni"


def _memfd(name: str, data: bytes) -> int:
    """A file descriptor holding ``data`` that exists only in memory (never on disk)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


class ServerContexts:
    """Per-host server contexts presenting leaves from ``ca`` (an LRU of ``size``)."""

    def __init__(self, ca: CertificateAuthority, size: int = 256) -> None:
        self.ca = ca
        self.size = size
        # The shared leaf key is loaded from memory; ``load_cert_chain`` wants a path.
        self._key_fd = _memfd("stockade-leaf-key", ca.leaf_key_pem)
        self._contexts: OrderedDict[tuple[str, bool], ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release the in-memory key file."""
        with contextlib.suppress(OSError):
            os.close(self._key_fd)

    def get(self, host: str, *, h2: bool = False) -> ssl.SSLContext:
        """The server context for ``host`` (offering ALPN ``h2`` too when ``h2``); built
        (and its leaf minted) on first use."""
        key = (host, h2)
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is not None:
                self._contexts.move_to_end(key)
                return ctx
        ctx = self._build(host, ALPN_H2 if h2 else ALPN)
        with self._lock:
            self._contexts[key] = ctx
            while len(self._contexts) > self.size:
                self._contexts.popitem(last=False)
        return ctx

    def _build(self, host: str, alpn: list[str]) -> ssl.SSLContext:
        leaf = self.ca.leaf(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        fd = _memfd("stockade-leaf", leaf.chain_pem)
        try:
            ctx.load_cert_chain(f"/proc/self/fd/{fd}", f"/proc/self/fd/{self._key_fd}")
        finally:
            os.close(fd)
        ctx.set_alpn_protocols(alpn)

        def record_sni(obj: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
            # Only recorded here: the tunnel compares it with the CONNECT authority and
            # answers 421 to every request, which tells the client more than an alert.
            setattr(obj, _SNI_ATTR, name)

        ctx.sni_callback = record_sni
        return ctx


def upstream_context(
    cafile: Path | None = None, extra: Sequence[Path] = (), alpn: Sequence[str] = ALPN
) -> ssl.SSLContext:
    """A client context verifying the upstream against system roots or ``cafile``, and
    the ``extra`` bundles too (the caller's own trust: a company CA that intercepts);
    ``alpn``: the protocols offered (:data:`ALPN_H2` to ask for HTTP/2)."""
    ctx = ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)
    for bundle in extra:
        try:
            ctx.load_verify_locations(cafile=str(bundle))
        except (OSError, ssl.SSLError):
            # The caller's variable names something unusable; its clients would not
            # have trusted it either. The system roots still apply.
            continue
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(list(alpn))
    # verify_mode CERT_REQUIRED and check_hostname come from create_default_context.
    return ctx


class TLSClosed(Exception):
    """The peer closed the connection (with or without a TLS close_notify)."""


class TLSStream:
    """TLS over a non-blocking socket driven by memory BIOs on the running loop."""

    def __init__(
        self,
        sock: socket.socket,
        obj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
    ) -> None:
        self.sock = sock
        self.obj = obj
        self._in = incoming
        self._out = outgoing
        self._loop = asyncio.get_running_loop()
        self.idle_since = 0.0

    @classmethod
    async def server(
        cls, sock: socket.socket, ctx: ssl.SSLContext, initial: bytes = b""
    ) -> TLSStream:
        """Complete a server-side handshake on ``sock``; ``initial`` = bytes already read."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=True)
        stream = cls(sock, obj, incoming, outgoing)
        if initial:
            incoming.write(initial)
        await stream._handshake()
        return stream

    @classmethod
    async def client(
        cls, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: str
    ) -> TLSStream:
        """Complete a verified client-side handshake to ``server_hostname`` on ``sock``."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=False, server_hostname=server_hostname)
        stream = cls(sock, obj, incoming, outgoing)
        await stream._handshake()
        return stream

    @property
    def alpn(self) -> str | None:
        """The protocol ALPN selected (``"h2"``, ``"http/1.1"``), None without ALPN."""
        return self.obj.selected_alpn_protocol()

    @property
    def sni(self) -> str | None:
        """The server name the client sent (server side only)."""
        value = getattr(self.obj, _SNI_ATTR, None)
        return value if isinstance(value, str) else None

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            await self._loop.sock_sendall(self.sock, data)

    async def _fill(self) -> None:
        data = await self._loop.sock_recv(self.sock, _READ)
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()

    async def _handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
        await self._flush()

    async def recv(self, size: int = _READ) -> bytes:
        """Up to ``size`` bytes of plaintext; ``b""`` when the peer closed."""
        while True:
            try:
                data = self.obj.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            if self._out.pending:
                await self._flush()
            return data

    async def send(self, data: bytes | bytearray | memoryview, *, flush: bool = True) -> None:
        """Send all of ``data``; with ``flush=False`` it waits for the next flushing send."""
        if data:
            self.obj.write(data)
        if flush:
            await self._flush()

    def pending(self) -> bool:
        """True when decrypted or undecrypted bytes are waiting (not idle)."""
        return bool(self.obj.pending() or self._in.pending)

    def usable(self) -> bool:
        """True when an idle connection is still open and has nothing unread."""
        if self.sock.fileno() < 0 or self.pending():
            return False
        try:
            peek = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        # EOF, or bytes the server sent unasked (an alert): not reusable either way.
        del peek
        return False

    def close(self) -> None:
        """Close the socket (no close_notify: the connection is being abandoned)."""
        self.sock.close()


#: opens a TCP connection for ``(host, port, address)`` (directly or through a proxy)
Opener = Callable[[str, int, str], Awaitable[socket.socket]]


class UpstreamPool:
    """Idle verified TLS connections to upstreams, keyed by ``(host, port, address)``.

    ``opener`` makes the TCP connection under the TLS (the egress proxy's transport, so
    that an operator's upstream proxy carries it); without one, ``address`` is dialled.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        *,
        opener: Opener | None = None,
        connect_timeout: float = 10.0,
        idle_timeout: float = 30.0,
        max_idle_per_key: int = 16,
        max_idle: int = 256,
    ) -> None:
        self.context = context
        self.opener = opener
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.max_idle_per_key = max_idle_per_key
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int, str], list[TLSStream]] = {}
        self._count = 0
        self.opened = 0
        self.reused = 0

    async def acquire(self, host: str, port: int, address: str) -> tuple[TLSStream, bool]:
        """An idle connection (``reused`` True) or a new verified one to ``address``."""
        key = (host, port, address)
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            stream = idle.pop()
            self._count -= 1
            if now - stream.idle_since < self.idle_timeout and stream.usable():
                self.reused += 1
                return stream, True
            stream.close()
        return await self.connect(host, port, address), False

    async def connect(
        self, host: str, port: int, address: str, context: ssl.SSLContext | None = None
    ) -> TLSStream:
        """A new connection to ``address``:``port``, TLS verified for ``host`` (with
        ``context`` instead of the pool's: one offering HTTP/2, say)."""
        if self.opener is not None:
            sock = await self.opener(host, port, address)
        else:
            # The one dialler (egress.upstream.dial): exactly the vetted literal, never a
            # name, never 0.0.0.0; the address crossed as text and is parsed back here.
            sock = await dial(parse_address(address), port, self.connect_timeout)
        try:
            async with asyncio.timeout(self.connect_timeout):
                stream = await TLSStream.client(sock, context or self.context, host)
        except BaseException:
            sock.close()
            raise
        self.opened += 1
        return stream

    def release(self, host: str, port: int, address: str, stream: TLSStream) -> None:
        """Give back a connection whose last exchange completed cleanly."""
        key = (host, port, address)
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle_per_key or self._count >= self.max_idle:
            stream.close()
            return
        stream.idle_since = time.monotonic()
        idle.append(stream)
        self._count += 1

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for stream in idle:
                stream.close()
        self._idle.clear()
        self._count = 0
