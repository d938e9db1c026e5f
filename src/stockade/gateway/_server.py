"""``stockade gateway serve``: the egress proxy as a multi-tenant service in a cluster.

Each accepted connection is attributed to a pod before anything else: its peer address
through the pod watch (:mod:`._pods`), and, with ``--identity peer-ip,tokenreview``, a
projected service-account token that TokenReview must tie to that same pod UID. The
pod's ``stockade.dev/policy`` annotation (or ``--default-policy``) names its policy,
which must permit the pod's namespace and service account (``[kubernetes]``). The
connection is then handed, with the bytes already read, to the
:class:`~stockade.egress.EgressProxy` of that policy's current generation
(:meth:`~stockade.egress.EgressProxy.adopt`): from there on it is decided by the very
code that decides a local sandbox's connections. Nothing here decides a destination.

The connection's identity travels in a context variable, inherited by the proxy's task,
and every audit event (the proxy's and the inspect layer's) is written with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.egress import EgressProxy, _socks
from stockade.egress import _http as http
from stockade.egress._addr import ClusterRanges, IPAddress
from stockade.egress._assemble import build_proxy
from stockade.egress._proxy import Resolver, accept_forever, close_listeners
from stockade.egress._rules import LAYER
from stockade.gateway._identity import TokenReviewer, basic_password
from stockade.gateway._kube import KubeClient
from stockade.gateway._metrics import Metrics
from stockade.gateway._pods import POLICY_ANNOTATION, Pod, PodCache
from stockade.gateway._policies import Generation, PolicyDirectory
from stockade.policy import Decision, Policy, Reason
from stockade.policy._addresses import LINK_LOCAL_RANGES
from stockade.policy._inspect import wants_inspection

__all__ = ["Gateway", "GatewayConfig"]

logger = logging.getLogger("stockade.gateway")

#: one JSON encoder for every audit line (``json.dumps`` with options builds one per call)
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a handed-over connection is, as its audit events say it.

    ``fields`` (peer, namespace, pod, pod_uid, claim, policy, policy_digest, generation,
    and ``service_account_user`` with tokens) is never modified once made; ``json`` is
    the same fields and ``"mode":"gateway"`` serialised once, for the stdout writer to
    splice into each event's line instead of encoding them again per event.
    """

    fields: Mapping[str, Any]
    json: str
    keys: frozenset[str]

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> Identity:
        """The identity of ``fields`` (plus ``mode``, which identity fields override)."""
        full = {"mode": "gateway", **fields}
        return cls(full, _ENCODER.encode(full)[1:-1], frozenset(full))


#: the identity of the connection being served, inherited by the proxy's task
IDENTITY: contextvars.ContextVar[Identity] = contextvars.ContextVar("stockade_gateway_id")

_READ = 64 * 1024
_STATUS = {
    Reason.IDENTITY_STALE: 503,
    Reason.CREDENTIAL_MISSING: 407,
    Reason.CREDENTIAL_INVALID: 407,
}
#: link-local is refused by a gateway whatever its flags say (the metadata endpoints
#: live there, and a pod's neighbours' link-local services)
LINK_LOCAL = LINK_LOCAL_RANGES


@dataclass
class GatewayConfig:
    """What ``stockade gateway serve`` was told."""

    policies: Path
    default_policy: str | None = None
    #: agent-sandbox warm-pool pods not yet claimed: "refuse" them (no task runs there
    #: yet, so nothing needed is lost) or "serve" them by their policy like any pod
    unclaimed: str = "refuse"
    tokens: bool = False
    audience: str = "stockade-gateway"
    cluster: ClusterRanges = field(default_factory=ClusterRanges)
    ca_dir: Path | None = None
    secrets_dir: Path | None = None
    handshake_timeout: float = 10.0
    reload_interval: float = 1.0
    resolver: Resolver | None = None


def _placeholder(name: str, value: bytes, directory: Path) -> bytes:
    """The placeholder pods carry for secret ``name``: ``NAME.placeholder`` in the
    secrets directory, else one derived from the value (the same on every replica and
    every reload, and revealing nothing of the value)."""
    from stockade.egress.inspect._secrets import PLACEHOLDER_PREFIX

    path = directory / f"{name}.placeholder"
    with contextlib.suppress(OSError):
        text = path.read_bytes().strip()
        if text:
            return text
    digest = hmac.new(value, b"stockade placeholder:" + name.encode(), hashlib.sha256)
    return PLACEHOLDER_PREFIX.encode() + digest.hexdigest()[:32].encode()


class Gateway:
    """The multi-tenant proxy: identity per connection, one EgressProxy per policy."""

    def __init__(
        self,
        config: GatewayConfig,
        kube: KubeClient,
        *,
        namespace: str | None,
        cache_ttl: float = 10.0,
        backoff: tuple[float, float] = (0.5, 10.0),
        audit: Callable[[dict[str, Any]], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self._write = audit or _stdout
        #: the stdout writer takes lines with the identity spliced in (see Identity)
        self._line: Callable[[str], None] | None = _stdout_line if audit is None else None
        #: decision counter labels by (policy, verdict, reason): made once, not per event
        self._labels: dict[tuple[str, str, str], tuple[tuple[str, str], ...]] = {}
        self.pods = PodCache(
            kube,
            namespace,
            ttl=cache_ttl,
            on_change=self._pod_changed,
            on_node=self._node_seen,
            backoff=backoff,
        )
        self.reviewer = TokenReviewer(kube, config.audience) if config.tokens else None
        watched = (config.secrets_dir, config.ca_dir)
        self.store = PolicyDirectory(
            config.policies, self._build, watch=[d for d in watched if d is not None]
        )
        #: open connections per pod UID: task -> (proxy, policy name)
        self._open: dict[str, dict[asyncio.Task[None], tuple[EgressProxy, str]]] = {}
        self._open_count = 0
        #: peer address -> (pod, generation, policy name, identity), see _identity
        self._identities: dict[str, tuple[Pod, Generation, str, Identity]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._listeners: list[socket.socket] = []
        self._closed = False
        self.ready = asyncio.Event()

    # -- policies ------------------------------------------------------------------------

    def _secret_env(self) -> dict[str, str]:
        """``env:NAME`` sources of a gateway read the file NAME of ``--secrets``."""
        directory = self.config.secrets_dir
        if directory is None or not directory.is_dir():
            return {}
        out = {}
        for entry in directory.iterdir():
            if entry.name.startswith(".") or not entry.is_file():
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                out[entry.name] = entry.read_text(encoding="utf-8").strip()
        return out

    def _build(self, policies: Mapping[str, Policy]) -> dict[str, Any]:
        """One EgressProxy per policy (the shared assembly, :func:`build_proxy`), sharing
        the cluster's refused addresses; each honours its policy's ``[network.upstream]``."""
        serving: dict[str, Any] = {}
        env: dict[str, str] | None = None
        ca: Any = None
        for name, policy in policies.items():
            store = None
            if wants_inspection(policy) and self.config.ca_dir is not None:
                from stockade.egress.inspect import SecretStore, load_ca
                from stockade.egress.inspect._secrets import ResolvedSecret

                if ca is None:  # read again for every generation: it may have rotated
                    ca = load_ca(self.config.ca_dir)
                env = self._secret_env() if env is None else env
                store = SecretStore.resolve(policy.secrets, env)
                if self.config.secrets_dir is not None:
                    directory = self.config.secrets_dir
                    store = SecretStore(
                        [
                            ResolvedSecret(
                                s.name,
                                s.value,
                                _placeholder(s.name, s.value, directory),
                                s.hosts,
                                s.header,
                            )
                            for s in store.secrets
                        ]
                    )
            serving[name] = build_proxy(
                policy,
                self._event(name),
                caller=f"gateway policy {name}",
                ca_fix="mount the CA Secret and pass --ca DIR",
                ca=ca if store is not None else None,
                secrets=store,
                environ=env,
                cluster=self.config.cluster,
                resolver=self.config.resolver,
                handshake_timeout=self.config.handshake_timeout,
            )
        return serving

    def _swap(self, old: Generation | None, new: Generation) -> None:
        """Make ``new`` current: new connections use it; open inspected tunnels check
        each further request with the new rules; a policy gone closes its tunnels."""
        self.metrics.set("stockade_gateway_policy_generation", new.number)
        self._emit(
            "policy_loaded",
            Decision.allow(LAYER, detail=f"generation {new.number}"),
            {"generation": new.number, "policies": dict(sorted(new.digests.items()))},
        )
        # Identities name a generation (and so hold its proxies): none outlives it.
        self._identities.clear()
        if old is None:
            return
        for name, proxy in old.serving.items():
            fresh = new.serving.get(name)
            if fresh is not None and proxy.inspect is not None and fresh.inspect is not None:
                proxy.inspect.inspector = fresh.inspect.inspector
            if fresh is None:
                for tasks in self._open.values():
                    for task, (owner, _) in list(tasks.items()):
                        if owner is proxy:
                            owner.revoke(
                                task,
                                Decision.deny(
                                    LAYER, Reason.POLICY_UNKNOWN, detail=f"policy {name} removed"
                                ),
                            )
            self._background.append(asyncio.get_running_loop().create_task(self._retire(proxy)))

    async def _retire(self, proxy: EgressProxy) -> None:
        # An old generation serves its open connections to their end, then goes.
        await proxy.wait_closed()
        proxy.close()
        if proxy.inspect is not None:
            close = getattr(proxy.inspect, "close", None)
            if close is not None:
                close()

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reload_interval)
            old = self.store.current
            error = self.store.last_error
            try:
                new = self.store.poll()
            except Exception as exc:  # only on a first load, which start() did
                new, self.store.last_error = None, str(exc)
            if new is not None:
                self._swap(old, new)
            elif self.store.last_error and self.store.last_error != error:
                self.metrics.inc("stockade_gateway_policy_reload_failures_total")
                self._emit(
                    "policy_reload_failed",
                    Decision.deny(LAYER, Reason.BAD_REQUEST, detail=self.store.last_error),
                    {"generation": old.number if old else 0},
                )

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load the policies (raising on a bad one) and start the watch and reloads."""
        generation = self.store.poll()
        assert generation is not None
        self._swap(None, generation)
        loop = asyncio.get_running_loop()
        synced = asyncio.Event()
        self._background.append(loop.create_task(self.pods.run(synced)))
        self._background.append(loop.create_task(self._reload_loop()))

        async def mark_ready() -> None:
            await synced.wait()
            self.ready.set()

        self._background.append(loop.create_task(mark_ready()))

    @property
    def is_ready(self) -> bool:
        """Ready: the first pod list synced, policies loaded, the cache fresh."""
        return self.ready.is_set() and self.store.current is not None and self.pods.fresh()

    async def serve_socket(self, sock: socket.socket) -> None:
        """Accept on a listening socket until :meth:`close`."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._listeners.append(sock)
        current = asyncio.current_task()
        if current is not None:
            self._background.append(current)  # close() cancels it
        try:
            # The listener stays registered with the loop for its whole life, as the
            # local proxy's does (one accept loop for both).
            await accept_forever(
                sock,
                lambda conn, address: self._accepted(conn, address, loop),
                lambda: self._closed,
            )
        finally:
            close_listeners([sock])

    async def serve_metrics(self, sock: socket.socket) -> None:
        """Serve ``/healthz``, ``/readyz`` and ``/metrics`` on a listening socket."""
        sock.setblocking(False)
        server = await asyncio.start_server(self._metrics_client, sock=sock)
        self._listeners.append(sock)
        current = asyncio.current_task()
        if current is not None:
            self._background.append(current)
        async with server:
            await server.serve_forever()

    async def _metrics_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            async with asyncio.timeout(5.0):
                line = await reader.readline()
                while (await reader.readline()).strip():
                    pass  # the headers say nothing these endpoints need
            parts = line.split()
            path = parts[1].split(b"?")[0] if len(parts) >= 2 else b""
            status, body, kind = 404, b"not found\n", "text/plain"
            if path == b"/healthz":
                status, body = 200, b"ok\n"
            elif path == b"/readyz":
                if self.is_ready:
                    status, body = 200, b"ready\n"
                else:
                    why = self.pods.last_error or "the first pod list has not synced"
                    status, body = 503, f"not ready: {why}\n".encode()
            elif path == b"/metrics":
                self.metrics.set("stockade_gateway_pods", len(self.pods.pods))
                status, body = 200, self.metrics.render().encode()
                kind = "text/plain; version=0.0.4; charset=utf-8"
            head = (
                f"HTTP/1.1 {status} {http.reason_phrase(status)}\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (OSError, TimeoutError, ValueError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        """Stop accepting, stop the watch, close every connection."""
        self._closed = True
        for task in self._background:
            task.cancel()
        for task in list(self._tasks):
            task.cancel()
        close_listeners(self._listeners)
        current = self.store.current
        if current is not None:
            for proxy in current.serving.values():
                proxy.close()

    async def wait_closed(self) -> None:
        """Wait for the connections and background tasks to end."""
        me = asyncio.current_task()
        others = [t for t in (*self._tasks, *self._background) if t is not me]
        await asyncio.gather(*others, return_exceptions=True)
        current = self.store.current
        if current is not None:
            for proxy in current.serving.values():
                await proxy.wait_closed()

    # -- pods --------------------------------------------------------------------------

    def _node_seen(self, ip: str) -> None:
        with contextlib.suppress(ValueError):
            address: IPAddress = ipaddress.ip_address(ip)
            if self.config.cluster.add(address):
                # Remembered verdicts could name the address as allowed: forget them.
                current = self.store.current
                for proxy in current.serving.values() if current else ():
                    proxy.forget_decisions()

    def _pod_changed(self, before: Pod | None, after: Pod | None) -> None:
        if before is None:
            return
        for ip in before.ips:
            self._identities.pop(ip, None)
        if (
            after is not None
            and after.running
            and after.ips == before.ips
            and after.annotations.get(POLICY_ANNOTATION)
            == before.annotations.get(POLICY_ANNOTATION)
            and after.claim == before.claim
        ):
            return
        if after is None:
            detail = f"{before.namespace}/{before.name} was deleted"
        elif not after.running:
            detail = f"{before.namespace}/{before.name} is no longer running"
        elif after.ips != before.ips:
            detail = f"{before.namespace}/{before.name} changed address"
        elif after.claim != before.claim:
            # Its connections were made for another claim (or for none): another task's.
            detail = f"{before.namespace}/{before.name} changed claim"
        else:
            detail = f"{before.namespace}/{before.name} was given another policy"
        decision = Decision.deny(LAYER, Reason.POD_GONE, detail=detail)
        for task, (proxy, _) in list(self._open.get(before.uid, {}).items()):
            proxy.revoke(task, decision)

    # -- audit and metrics -------------------------------------------------------------

    def _emit(
        self,
        event: str,
        decision: Decision,
        fields: Mapping[str, Any],
        identity: Identity | None = None,
    ) -> None:
        record: dict[str, Any] = {
            "time": time.time(),
            "event": event,
            "layer": decision.layer,
            "verdict": str(decision.verdict),
            "reason": str(decision.reason),
        }
        if decision.rule:
            record["rule"] = decision.rule
        if decision.detail:
            record["detail"] = decision.detail
        record.update(fields)
        if identity is None:
            self._write(record)
            return
        if not identity.keys.isdisjoint(record):
            for key in identity.keys:  # the identity's word wins, as it always has
                record.pop(key, None)
        if self._line is not None:
            self._line(_ENCODER.encode(record)[:-1] + "," + identity.json + "}")
        else:
            record.update(identity.fields)
            self._write(record)

    def _event(self, policy: str) -> Callable[[Decision, dict[str, Any]], None]:
        """The audit callback of a policy's proxy and inspect layer."""
        fallback = Identity.of({"policy": policy})

        def callback(decision: Decision, fields: dict[str, Any]) -> None:
            identity = IDENTITY.get(fallback)
            event = fields.pop("event", "net_connect")
            name = str(identity.fields.get("policy", policy))
            self._count(name, decision)
            if event == "net_connect":
                labels = (("policy", name),)
                self.metrics.inc(
                    "stockade_gateway_bytes_total",
                    (*labels, ("direction", "up")),
                    float(fields.get("bytes_up") or 0),
                )
                self.metrics.inc(
                    "stockade_gateway_bytes_total",
                    (*labels, ("direction", "down")),
                    float(fields.get("bytes_down") or 0),
                )
            self._emit(event, decision, fields, identity)

        return callback

    def _count(self, policy: str, decision: Decision) -> None:
        key = (policy, decision.verdict, decision.reason)
        labels = self._labels.get(key)
        if labels is None:
            # Bounded: policies x the fixed verdict and reason vocabularies.
            labels = self._labels[key] = (
                ("policy", policy),
                ("verdict", str(decision.verdict)),
                ("reason", str(decision.reason)),
            )
        self.metrics.inc("stockade_gateway_decisions_total", labels)

    # -- one connection ----------------------------------------------------------------

    def _accepted(self, sock: socket.socket, address: Any, loop: asyncio.AbstractEventLoop) -> None:
        """A connection just accepted (in the listener's callback).

        With peer-address identity alone, the address names the pod: when it is a
        Running pod whose policy admits it, the connection is handed to that policy's
        proxy here and now, before a byte is read from it (so none can go upstream
        before the identity was checked), and the proxy's task is its only task, as a
        local sandbox's connection is. Everything else (a token to read and review, a
        refusal, which needs the first bytes to answer in the client's protocol) is
        served by a task of the gateway's.
        """
        started = time.monotonic()
        self.metrics.inc("stockade_gateway_connections_total")
        peer = str(address[0])
        if self.reviewer is None:
            pod = self.pods.lookup(peer)[0]
            if pod is not None:
                chosen = self._resolve(pod)
                if isinstance(chosen, _Chosen):
                    identity = self._identity(peer, pod, chosen)
                    self._hand(chosen, sock, b"", False, pod, identity, started)
                    return
        task = loop.create_task(self._connection(sock, peer, started))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _resolve(self, pod: Pod) -> _Chosen | _Refused:
        """The policy that serves ``pod`` now: its annotation (or the default), which
        must exist in the current generation and admit the pod's namespace and service
        account; else why not."""
        if pod.unclaimed and self.config.unclaimed == "refuse":
            return _Refused(
                Reason.POD_UNCLAIMED,
                f"{pod.namespace}/{pod.name} is a warm-pool pod no claim has adopted yet "
                "(gateway --unclaimed refuse)",
            )
        generation = self.store.current
        name = pod.annotations.get(POLICY_ANNOTATION) or self.config.default_policy
        if not name:
            return _Refused(
                Reason.POLICY_UNKNOWN, f"no {POLICY_ANNOTATION} annotation and no default policy"
            )
        if generation is None or name not in generation.policies:
            return _Refused(Reason.POLICY_UNKNOWN, f"no policy named {name!r}", name)
        if not generation.policies[name].kubernetes.permits(pod.namespace, pod.service_account):
            return _Refused(
                Reason.POLICY_NOT_PERMITTED,
                f"policy {name} does not list namespace {pod.namespace} "
                f"(service account {pod.service_account}) in [kubernetes]",
                name,
                generation,
            )
        return _Chosen(generation, name)

    def _identity(self, peer: str, pod: Pod, chosen: _Chosen) -> Identity:
        """The identity of a connection from ``peer``: made (and serialised) once per
        address while its pod object, policy name and generation stay the same; a
        pod-cache update replaces the pod object, a reload the generation, so a stale
        identity is never reused."""
        hit = self._identities.get(peer)
        if (
            hit is not None
            and hit[0] is pod
            and hit[1] is chosen.generation
            and hit[2] == chosen.name
        ):
            return hit[3]
        generation, name = chosen.generation, chosen.name
        fields: dict[str, Any] = {
            "peer": peer,
            "namespace": pod.namespace,
            "pod": pod.name,
            "pod_uid": pod.uid,
            "claim": pod.claim or None,
            "policy": name,
            "policy_digest": generation.digests[name],
            "generation": generation.number,
        }
        identity = Identity.of(fields)
        if len(self._identities) >= 2 * len(self.pods.pods) + 256:
            self._identities.clear()  # addresses of pods long gone; rebuilt on demand
        self._identities[peer] = (pod, generation, name, identity)
        return identity

    def _hand(
        self,
        chosen: _Chosen,
        sock: socket.socket,
        initial: bytes,
        greeted: bool,
        pod: Pod,
        identity: Identity,
        started: float,
    ) -> None:
        """Give the connection to the proxy of its policy, the identity in its context."""
        proxy: EgressProxy = chosen.generation.serving[chosen.name]
        self.metrics.observe(time.monotonic() - started, (("policy", chosen.name),))
        # The proxy's task copies the context it is created in: a context of its own
        # carries this connection's identity to every audit event of the connection.
        context = contextvars.copy_context()
        context.run(IDENTITY.set, identity)
        task = context.run(proxy.adopt, sock, initial, socks_greeted=greeted)
        if task is None:
            return
        self._open.setdefault(pod.uid, {})[task] = (proxy, chosen.name)
        self._open_count += 1
        self.metrics.set("stockade_gateway_open_connections", self._open_count)
        task.add_done_callback(functools.partial(self._handed_done, pod.uid))

    def _handed_done(self, uid: str, task: asyncio.Task[None]) -> None:
        owned = self._open.get(uid)
        if owned is not None and owned.pop(task, None) is not None:
            self._open_count -= 1
            if not owned:
                del self._open[uid]
        self.metrics.set("stockade_gateway_open_connections", self._open_count)

    async def _connection(self, sock: socket.socket, peer: str, started: float) -> None:
        loop = asyncio.get_running_loop()
        handed = False
        identity: dict[str, Any] = {"peer": peer}
        try:
            sock.setblocking(False)
            buffer = bytearray()
            handed = await self._identify(sock, loop, buffer, identity, started)
        except (OSError, TimeoutError, ValueError) as exc:
            self._deny_event(identity, Reason.BAD_REQUEST, f"client: {exc or type(exc).__name__}")
        finally:
            if not handed:
                sock.close()

    def _deny_event(self, identity: dict[str, Any], reason: Reason, detail: str) -> None:
        decision = Decision.deny(LAYER, reason, detail=detail)
        self._count(str(identity.get("policy", "")), decision)
        fields = {"protocol": identity.pop("protocol", ""), "host": "", "port": 0}
        self._emit("net_connect", decision, {**fields, "mode": "gateway", **identity})

    async def _read_more(self, sock: socket.socket, buffer: bytearray) -> bool:
        try:
            data = sock.recv(_READ)  # usually there already: no timer, no reader to add
        except (BlockingIOError, InterruptedError):
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.config.handshake_timeout):
                data = await loop.sock_recv(sock, _READ)
        buffer += data
        return bool(data)

    async def _identify(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        buffer: bytearray,
        identity: dict[str, Any],
        started: float,
    ) -> bool:
        """Attribute the connection and hand it to its policy's proxy; True once handed."""
        if not await self._read_more(sock, buffer):
            self._deny_event(identity, Reason.BAD_REQUEST, "closed before a request")
            return False
        socks = buffer[0] == _socks.VERSION
        identity["protocol"] = "socks5" if socks else "http"
        head_end = -1
        if not socks:
            while (head_end := http.find_head_end(buffer)) < 0:
                if len(buffer) > http.MAX_HEAD or not await self._read_more(sock, buffer):
                    self._deny_event(identity, Reason.BAD_REQUEST, "no complete request head")
                    return False

        async def refuse(
            reason: Reason, detail: str, socks_reply: bytes = _socks.method_reply(False)
        ) -> bool:
            # SOCKS5: "no acceptable method" before the negotiation, or RFC 1929's
            # failure status after it; HTTP: a response naming the reason.
            if socks:
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(sock, socks_reply)
            else:
                status = _STATUS.get(reason, 403)
                out = http.error_response(status, str(reason), detail)
                if status == 407:
                    out = out.replace(
                        b"\r\n", b'\r\nProxy-Authenticate: Basic realm="stockade-gateway"\r\n', 1
                    )
                with contextlib.suppress(OSError):
                    await loop.sock_sendall(sock, out)
            self._deny_event(identity, reason, detail)
            return False

        pod, reason, detail = self.pods.lookup(identity["peer"])
        if pod is None:
            return await refuse(reason, detail)
        identity.update(
            namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, claim=pod.claim or None
        )
        greeted = False
        reviewed_user: str | None = None
        if self.reviewer is not None:
            token: str | None = None
            failed = _socks.userpass_reply(False)  # RFC 1929: authentication failed
            if socks:
                while (greeting := _socks.parse_methods(buffer)) is None:
                    if not await self._read_more(sock, buffer):
                        return await refuse(Reason.BAD_REQUEST, "incomplete SOCKS5 greeting")
                methods, used = greeting
                del buffer[:used]
                if _socks.METHOD_USERPASS not in methods:
                    return await refuse(
                        Reason.CREDENTIAL_MISSING, "the username/password method is required"
                    )
                await loop.sock_sendall(sock, _socks.method_selected(_socks.METHOD_USERPASS))
                while (parsed := _socks.parse_userpass(buffer)) is None:
                    if not await self._read_more(sock, buffer):
                        return await refuse(Reason.BAD_REQUEST, "incomplete SOCKS5 credentials")
                token, used = parsed
                del buffer[:used]
            else:
                value = _header(bytes(buffer[:head_end]), b"proxy-authorization")
                token = basic_password(value) if value is not None else None
            if not token:
                return await refuse(
                    Reason.CREDENTIAL_MISSING, "send the pod's token as the password", failed
                )
            review = await self.reviewer.review(token)
            if not review.authenticated:
                if review.error.startswith("TokenReview failed"):
                    self.metrics.inc("stockade_gateway_api_failures_total")
                return await refuse(Reason.CREDENTIAL_INVALID, review.error, failed)
            identity["service_account_user"] = reviewed_user = review.username
            if review.pod_uid != pod.uid:
                return await refuse(
                    Reason.CREDENTIAL_MISMATCH,
                    f"the token belongs to pod {review.pod_name or review.pod_uid or '(none)'}, "
                    f"not to {pod.namespace}/{pod.name}",
                    failed,
                )
            # The review was awaited: the pod may have been deleted, stopped, moved or
            # re-annotated meanwhile, and _pod_changed could not close a connection not
            # yet handed over. Look again: the same pod, with the same policy, or nothing.
            again, reason, detail = self.pods.lookup(identity["peer"])
            if again is None or again.uid != pod.uid or _policy_of(again) != _policy_of(pod):
                if reason is not Reason.IDENTITY_STALE:
                    reason = Reason.POD_GONE
                    detail = f"{pod.namespace}/{pod.name} changed while its token was reviewed"
                return await refuse(reason, detail, failed)
            if socks:
                await loop.sock_sendall(sock, _socks.userpass_reply(True))
                greeted = True
        # Every await is behind us: the generation chosen now is the one adopted into.
        chosen = self._resolve(pod)
        if isinstance(chosen, _Refused):
            if chosen.policy is not None:
                identity["policy"] = chosen.policy
            if chosen.generation is not None and chosen.policy is not None:
                identity["policy_digest"] = chosen.generation.digests[chosen.policy]
                identity["generation"] = chosen.generation.number
            return await refuse(chosen.reason, chosen.detail)
        handed = self._identity(identity["peer"], pod, chosen)
        if reviewed_user is not None:
            handed = Identity.of({**handed.fields, "service_account_user": reviewed_user})
        self._hand(chosen, sock, bytes(buffer), greeted, pod, handed, started)
        return True


@dataclass(frozen=True, slots=True)
class _Chosen:
    """The policy (of a generation) that serves a connection."""

    generation: Generation
    name: str


@dataclass(frozen=True, slots=True)
class _Refused:
    """Why no policy serves a pod: the refusal's reason and detail, and as much of the
    policy as was found (for the event)."""

    reason: Reason
    detail: str
    policy: str | None = None
    generation: Generation | None = None


def _policy_of(pod: Pod) -> str | None:
    return pod.annotations.get(POLICY_ANNOTATION)


def _header(head: bytes, wanted: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == wanted:
            return value.strip()
    return None


def _stdout(record: dict[str, Any]) -> None:
    _stdout_line(_ENCODER.encode(record))


def _stdout_line(line: str) -> None:
    # One write per line: lines from concurrent tasks never interleave.
    os.write(sys.stdout.fileno(), (line + "\n").encode())
