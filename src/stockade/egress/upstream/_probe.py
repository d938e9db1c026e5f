"""``stockade doctor``'s question to the upstream: does it answer a CONNECT, and how."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from stockade.egress._addr import IPAddress
from stockade.egress.upstream._config import Upstream
from stockade.egress.upstream._transport import Transport, UpstreamRefused, UpstreamUnreachable


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What the upstream said: ``ok``, a one-line ``detail`` and the ``fix`` when not ok."""

    ok: bool
    detail: str
    fix: str = ""
    status: int = 0


def probe(
    upstream: Upstream,
    host: str,
    port: int,
    address: IPAddress | None = None,
    *,
    timeout: float = 5.0,
) -> ProbeResult:
    """Ask ``upstream`` for a tunnel to ``host:port`` (by ``address`` when known and
    ``connect_by`` says so, else by name), close it at once, and say what happened."""
    if address is None:
        upstream = dataclasses.replace(upstream, connect_by="name")
    target: IPAddress | str = address if address is not None else host
    transport = Transport(upstream, connect_timeout=timeout, reply_timeout=timeout)

    async def ask() -> int:
        sock = await transport._reach(upstream)
        try:
            status, _ = await transport._connect(sock, upstream, host, port, target)
        finally:
            sock.close()
        return status

    where = upstream.authority(host, port, target)
    try:
        status = asyncio.run(ask())
    except UpstreamUnreachable as exc:
        return ProbeResult(
            False,
            str(exc),
            f"check that {upstream.source} names the proxy's host and port, and that the "
            "proxy runs and is reachable from this host",
        )
    except UpstreamRefused as exc:
        if exc.status == 407:
            fix = (
                f"the proxy refused the credentials in {upstream.auth_file}; correct the "
                "user:password line there"
                if upstream.auth_file is not None
                else "the proxy wants credentials: write user:password to a file, chmod 600 "
                "it, and name it in network.upstream.auth_file"
            )
            return ProbeResult(False, str(exc), fix, exc.status)
        if exc.status:
            # It answered, and took the credentials: the proxy works. That destination
            # was refused or unavailable there, which its status says.
            return ProbeResult(
                True,
                f"{exc} (the proxy answers; the destination is its business)",
                "",
                exc.status,
            )
        return ProbeResult(
            False,
            str(exc),
            "the proxy did not answer with HTTP: check that the URL names an HTTP proxy",
        )
    return ProbeResult(True, f"{upstream.url} answers CONNECT {where} with {status}", "", status)


def reach(upstream: Upstream, *, timeout: float = 5.0) -> ProbeResult:
    """Open a TCP connection to ``upstream`` and close it: whether the proxy is there,
    for when there is no host to ask a CONNECT for (a real connection, never a guess)."""
    transport = Transport(upstream, connect_timeout=timeout, reply_timeout=timeout)

    async def ask() -> None:
        sock = await transport._reach(upstream)
        sock.close()

    try:
        asyncio.run(ask())
    except UpstreamUnreachable as exc:
        return ProbeResult(
            False,
            str(exc),
            f"check that {upstream.source} names the proxy's host and port, and that the "
            "proxy runs and is reachable from this host",
        )
    return ProbeResult(True, f"{upstream.url} accepts connections")
