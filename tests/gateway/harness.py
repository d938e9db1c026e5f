"""A fake API server, origins and a gateway, all on loopback, for the gateway tests.

No cluster can run on this machine (no kube-apiserver, kind or k3s; see
research/scale-out.md §6.1), so the API server is an asyncio HTTPS server on 127.0.1.1
with a trustme CA, implementing exactly what the gateway uses: pods list and watch
(real watch-event JSON lines, chunked, with resourceVersion) and TokenReview.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import trustme

from stockade.egress._addr import ClusterRanges
from stockade.gateway import Gateway, GatewayConfig, KubeClient, KubeConfig

API_HOST = "127.0.1.1"
SA_TOKEN = "gateway-sa-token"
T = TypeVar("T")


def pod(
    name: str,
    ip: str,
    *,
    namespace: str = "team",
    policy: str | None = None,
    phase: str = "Running",
    uid: str | None = None,
    claim: str | None = None,
    warm_pool: str | None = None,
    host_ip: str = "127.0.4.1",
    service_account: str = "sandbox",
) -> dict[str, Any]:
    annotations = {}
    labels = {}
    if policy is not None:
        annotations["stockade.dev/policy"] = policy
    if claim is not None:
        # agent-sandbox writes the claim as a label at adoption (research §1.3)
        labels["agents.x-k8s.io/claim-uid"] = claim
    if warm_pool is not None:
        labels["agents.x-k8s.io/warm-pool-sandbox"] = warm_pool
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
            "labels": labels,
        },
        "spec": {"serviceAccountName": service_account},
        "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host_ip},
    }


class FakeApiServer:
    """Pods list/watch and TokenReview, over TLS, with a bearer token required."""

    def __init__(self, cert: trustme.LeafCert) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(self.context)
        self.pods: dict[str, dict[str, Any]] = {}
        #: token -> (pod object, audiences)
        self.tokens: dict[str, tuple[dict[str, Any], list[str]]] = {}
        self.version = 100
        self.port = 0
        self.requests: list[str] = []
        #: seconds each TokenReview takes (a slow API server)
        self.review_delay = 0.0
        self._server: asyncio.Server | None = None
        self._watchers: list[asyncio.Queue[dict[str, Any] | None]] = []
        #: every event with its resourceVersion: a watch from version N replays those after
        #: N, as the real API server does (a change between a list and its watch is kept)
        self.history: list[tuple[int, dict[str, Any]]] = []
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on API_HOST, or on ``sock`` (one made in another network namespace)."""
        if sock is not None:
            self._server = await asyncio.start_server(self._client, sock=sock, ssl=self.context)
        else:
            self._server = await asyncio.start_server(
                self._client, API_HOST, self.port, ssl=self.context, reuse_address=True
            )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """The API server goes away: listener and every open connection closed."""
        assert self._server is not None
        self._server.close()
        for queue in self._watchers:
            queue.put_nowait(None)
        for writer in list(self._writers):
            writer.close()
        self._watchers.clear()
        await self._server.wait_closed()
        self._server = None

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def put(self, obj: dict[str, Any]) -> None:
        kind = "MODIFIED" if obj["metadata"]["uid"] in self.pods else "ADDED"
        obj = self._bump(obj)
        self.pods[obj["metadata"]["uid"]] = obj
        self._notify({"type": kind, "object": obj})

    def delete(self, uid: str) -> None:
        obj = self._bump(self.pods.pop(uid))
        self._notify({"type": "DELETED", "object": obj})

    def _notify(self, event: dict[str, Any]) -> None:
        self.history.append((self.version, event))
        for queue in self._watchers:
            queue.put_nowait(event)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            line = (await reader.readline()).decode()
            headers: dict[str, str] = {}
            while (h := (await reader.readline()).decode().strip()) != "":
                k, _, v = h.partition(":")
                headers[k.strip().lower()] = v.strip()
            method, target, _ = line.split(" ", 2)
            self.requests.append(f"{method} {target}")
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if headers.get("authorization") != f"Bearer {SA_TOKEN}":
                await self._answer(writer, 401, {"kind": "Status", "code": 401})
                return
            path, _, query = target.partition("?")
            if method == "POST" and path == "/apis/authentication.k8s.io/v1/tokenreviews":
                await asyncio.sleep(self.review_delay)
                await self._answer(writer, 201, self._review(json.loads(body)))
            elif method == "GET" and path.endswith("/pods") and "watch=1" in query:
                since = urllib.parse.parse_qs(query).get("resourceVersion", ["0"])[0]
                await self._watch(writer, int(since or "0"))
            elif method == "GET" and path.endswith("/pods"):
                items = [
                    p
                    for p in self.pods.values()
                    if path.startswith("/api/v1/pods")
                    or path == f"/api/v1/namespaces/{p['metadata']['namespace']}/pods"
                ]
                await self._answer(
                    writer,
                    200,
                    {
                        "kind": "PodList",
                        "metadata": {"resourceVersion": str(self.version)},
                        "items": items,
                    },
                )
            else:
                await self._answer(writer, 404, {"kind": "Status", "code": 404})
        except (OSError, asyncio.IncompleteReadError, ValueError, ssl.SSLError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _review(self, review: dict[str, Any]) -> dict[str, Any]:
        spec = review["spec"]
        found = self.tokens.get(spec["token"])
        asked = spec.get("audiences") or []
        status: dict[str, Any]
        if found is None:
            status = {"authenticated": False, "error": "invalid bearer token"}
        else:
            obj, audiences = found
            common = [a for a in asked if a in audiences]
            if not common:
                status = {"authenticated": False, "error": "token audiences is invalid"}
            else:
                meta = obj["metadata"]
                status = {
                    "authenticated": True,
                    "audiences": common,
                    "user": {
                        "username": f"system:serviceaccount:{meta['namespace']}:sandbox",
                        "extra": {
                            "authentication.kubernetes.io/pod-name": [meta["name"]],
                            "authentication.kubernetes.io/pod-uid": [meta["uid"]],
                        },
                    },
                }
        return {**review, "status": status}

    async def _answer(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async def _watch(self, writer: asyncio.StreamWriter, since: int) -> None:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        for version, past in self.history:
            if version > since:
                queue.put_nowait(past)
        self._watchers.append(queue)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # A bookmark first, as a server with allowWatchBookmarks may send at any time.
        queue.put_nowait(
            {
                "type": "BOOKMARK",
                "object": {"kind": "Pod", "metadata": {"resourceVersion": str(self.version)}},
            }
        )
        try:
            while (event := await queue.get()) is not None:
                data = json.dumps(event).encode() + b"\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
        finally:
            with contextlib.suppress(ValueError):
                self._watchers.remove(queue)


class Origin:
    """A TCP server on ``host`` that answers each line or HTTP request with its name."""

    def __init__(self, name: str, host: str = "127.0.0.1") -> None:
        self.name = name
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                data += chunk
                if data.startswith(b"GET ") and b"\r\n\r\n" in data:
                    body = self.name.encode()
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                        % (len(body), body)
                    )
                    return
                if data.endswith(b"\n") and not data.startswith(b"GET "):
                    conn.sendall(b"echo:" + data)
                    data = b""


class Harness:
    """The fake API server and a gateway on one event loop in a background thread."""

    def __init__(
        self,
        tmp: Path,
        policies: dict[str, str],
        *,
        tokens: bool = False,
        default_policy: str | None = None,
        unclaimed: str = "refuse",
        cluster: tuple[str, ...] = (),
    ) -> None:
        import ipaddress

        self.tmp = tmp
        ca = trustme.CA()
        self.ca_file = tmp / "cluster-ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        self.token_file = tmp / "token"
        self.token_file.write_text(SA_TOKEN)
        self.policies = tmp / "policies"
        self.policies.mkdir()
        for name, text in policies.items():
            (self.policies / f"{name}.toml").write_text(text)
        self.events: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.api = FakeApiServer(ca.issue_cert(API_HOST))
        self.call(self.api.start())
        kube = KubeConfig.in_cluster(f"{API_HOST}:{self.api.port}", self.token_file, self.ca_file)
        networks = tuple(ipaddress.ip_network(c) for c in ("169.254.0.0/16", "fe80::/10", *cluster))
        config = GatewayConfig(
            policies=self.policies,
            default_policy=default_policy,
            unclaimed=unclaimed,
            tokens=tokens,
            audience="stockade-gateway",
            cluster=ClusterRanges(networks, frozenset({ipaddress.ip_address(API_HOST)})),
            handshake_timeout=3.0,
            reload_interval=0.1,
        )
        self.gateway = Gateway(
            config,
            KubeClient(kube),
            namespace=None,
            cache_ttl=0.5,
            backoff=(0.05, 0.2),
            audit=self.events.append,
        )
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.metrics_sock = socket.socket()
        self.metrics_sock.bind(("127.0.0.1", 0))
        self.metrics_sock.listen(16)
        self.metrics_port = self.metrics_sock.getsockname()[1]

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def soon(self, fn: Callable[[], Any]) -> None:
        async def run() -> None:
            fn()

        self.call(run())

    def start(self) -> None:
        self.call(self.gateway.start())
        asyncio.run_coroutine_threadsafe(self.gateway.serve_socket(self.listener), self.loop)
        asyncio.run_coroutine_threadsafe(self.gateway.serve_metrics(self.metrics_sock), self.loop)
        self.wait(lambda: self.gateway.is_ready, "the gateway to be ready")

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def close(self) -> None:
        async def stop() -> None:
            self.gateway.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.gateway.wait_closed(), 3.0)
            if self.api._server is not None:
                await self.api.stop()

        with contextlib.suppress(Exception):
            self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
        self.listener.close()
        self.metrics_sock.close()

    # -- clients -------------------------------------------------------------------

    def connect(self, source: str) -> socket.socket:
        sock = socket.socket()
        sock.settimeout(5.0)
        sock.bind((source, 0))  # the pod's address: the gateway's peer
        sock.connect(("127.0.0.1", self.port))
        return sock

    def get(
        self, source: str, url: str, auth: str | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        """A forward-proxy GET; (status, body, headers)."""
        sock = self.connect(source)
        extra = f"Proxy-Authorization: {auth}\r\n" if auth else ""
        host = url.split("/")[2]
        sock.sendall(
            f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()
        )
        return _response(sock)

    def tunnel(
        self, source: str, authority: str, auth: str | None = None
    ) -> tuple[int, socket.socket]:
        sock = self.connect(source)
        extra = f"Proxy-Authorization: {auth}\r\n" if auth else ""
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1]) if head else 0
        return status, sock

    def events_of(self, **match: Any) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if all(e.get(k) == v for k, v in match.items())]


def _response(sock: socket.socket) -> tuple[int, bytes, dict[str, str]]:
    data = b""
    with sock:
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines and lines[0] else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, body, headers
