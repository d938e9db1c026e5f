"""A minimal Kubernetes API client: raw asyncio HTTPS with the service account's token.

Only what the gateway needs: GET a list, WATCH a list (a stream of JSON lines, with
``resourceVersion`` and bookmarks), and POST a TokenReview. No client library: the
gateway's dependency surface stays what the proxy already has (h11), and every request is
visible here. The bearer token is re-read for every request, since the kubelet rotates a
projected service-account token in place.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11

__all__ = ["SERVICE_ACCOUNT_DIR", "KubeClient", "KubeConfig", "KubeError"]

#: where the kubelet mounts the pod's service-account token and the cluster CA
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_MAX_BODY = 64 * 1024 * 1024  # a pod list of a large namespace, with room
_MAX_LINE = 4 * 1024 * 1024  # one watch event (a pod object)


class KubeError(Exception):
    """The API server could not be reached or answered with an error (``status``)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate to it."""

    host: str
    port: int
    token_file: Path
    ca_file: Path
    timeout: float = 10.0

    @classmethod
    def in_cluster(
        cls,
        api: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> KubeConfig:
        """The in-cluster configuration (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the
        mounted service account), each part overridable (``api`` as ``HOST:PORT``)."""
        env = os.environ if environ is None else environ
        if api is None:
            host = env.get("KUBERNETES_SERVICE_HOST", "")
            port_text = env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(
                    "KUBERNETES_SERVICE_HOST is not set (not running in a pod?); "
                    "pass --api HOST:PORT"
                )
        else:
            host, sep, port_text = api.removeprefix("https://").rpartition(":")
            if not sep:
                host, port_text = port_text, "443"
        host = host.removeprefix("[").removesuffix("]")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"API server port {port_text!r} is not a port number")
        return cls(
            host,
            int(port_text),
            token_file or SERVICE_ACCOUNT_DIR / "token",
            ca_file or SERVICE_ACCOUNT_DIR / "ca.crt",
        )


class KubeClient:
    """Requests to one API server over TLS verified against the cluster's CA."""

    def __init__(self, config: KubeConfig) -> None:
        self.config = config
        self._context: ssl.SSLContext | None = None

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            # The cluster CA only: the system roots have no say over who the API server is.
            context = ssl.create_default_context(cafile=str(self.config.ca_file))
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            self._context = context
        return self._context

    def _token(self) -> str:
        try:
            return self.config.token_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise KubeError(f"cannot read the service-account token: {exc}") from None

    async def _open(
        self, method: str, path: str, body: bytes | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection, h11.Response]:
        config = self.config
        try:
            async with asyncio.timeout(config.timeout):
                reader, writer = await asyncio.open_connection(
                    config.host, config.port, ssl=self._ssl(), server_hostname=config.host
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise KubeError(f"API server {config.host}:{config.port}: {exc or 'timeout'}") from None
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_LINE)
        host = f"[{config.host}]" if ":" in config.host else config.host
        headers = [
            ("host", f"{host}:{config.port}"),
            ("authorization", f"Bearer {self._token()}"),
            ("accept", "application/json"),
            ("user-agent", "stockade-gateway"),
        ]
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        try:
            writer.write(conn.send(h11.Request(method=method, target=path, headers=headers)) or b"")
            if body is not None:
                writer.write(conn.send(h11.Data(data=body)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            async with asyncio.timeout(config.timeout):
                await writer.drain()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Response):
                        return reader, writer, conn, event
                    if isinstance(event, h11.ConnectionClosed):
                        raise KubeError("the API server closed the connection")
        except BaseException as exc:
            writer.close()
            if isinstance(exc, OSError | TimeoutError | h11.ProtocolError | ssl.SSLError):
                raise KubeError(f"API server: {exc or type(exc).__name__}") from None
            raise

    async def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One request; the decoded JSON object of a 2xx answer, else :class:`KubeError`."""
        payload = None if body is None else json.dumps(body).encode()
        reader, writer, conn, response = await self._open(method, path, payload)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.timeout):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(65536))
                        continue
                    if isinstance(event, h11.Data):
                        size += len(event.data)
                        if size > _MAX_BODY:
                            raise KubeError("the API server's answer is too large")
                        chunks.append(bytes(event.data))
                        continue
                    break
        except (OSError, TimeoutError, h11.ProtocolError, ssl.SSLError) as exc:
            raise KubeError(f"API server: {exc or type(exc).__name__}") from None
        finally:
            writer.close()
        text = b"".join(chunks)
        if not 200 <= response.status_code < 300:
            raise KubeError(
                f"{method} {path.split('?')[0]}: HTTP {response.status_code}: {text[:200]!r}",
                response.status_code,
            )
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise KubeError(f"{method} {path}: not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise KubeError(f"{method} {path}: expected a JSON object")
        return value

    async def watch(self, path: str, idle_timeout: float) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a watch (``path`` carries ``watch=1`` and its parameters), one
        decoded object per line, until the server ends the stream; nothing heard for
        ``idle_timeout`` seconds (a silently dead connection) raises :class:`KubeError`."""
        reader, writer, conn, response = await self._open("GET", path, None)
        try:
            if response.status_code != 200:
                raise KubeError(f"watch {path.split('?')[0]}: HTTP {response.status_code}")
            pending = b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        async with asyncio.timeout(idle_timeout):
                            data = await reader.read(65536)
                    except (OSError, TimeoutError, ssl.SSLError) as exc:
                        raise KubeError(f"watch: {exc or 'nothing heard in time'}") from None
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Data):
                    pending += bytes(event.data)
                    *lines, pending = pending.split(b"\n")
                    if len(pending) > _MAX_LINE:
                        raise KubeError("watch: an event is too large")
                    for line in lines:
                        if line.strip():
                            try:
                                item = json.loads(line)
                            except ValueError as exc:
                                raise KubeError(f"watch: not JSON: {exc}") from None
                            if isinstance(item, dict):
                                yield item
                    continue
                return  # EndOfMessage or ConnectionClosed: the server ended the watch
        except h11.ProtocolError as exc:
            raise KubeError(f"watch: {exc}") from None
        finally:
            writer.close()
