"""Which pod a peer address belongs to: a cache kept by a list and watch of the API server.

Identity by peer address holds when the CNI drops spoofed source addresses and nothing
rewrites them between the pod and the gateway (no SNAT, no mesh tunnel): see
``docs/kubernetes.md``. The cache fails closed: an address no pod owns, two Running pods
claiming one address (a reused IP seen before the old pod's deletion), a pod not Running
or being deleted, and a cache that lost the API server for longer than its TTL all give
no pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stockade.gateway._kube import KubeClient, KubeError
from stockade.policy._decision import Reason

__all__ = ["CLAIM_ANNOTATION", "POLICY_ANNOTATION", "WARM_POOL_LABEL", "Pod", "PodCache"]

logger = logging.getLogger("stockade.gateway")

#: the annotation that names a pod's policy
POLICY_ANNOTATION = "stockade.dev/policy"
#: agent-sandbox's claim of a pod (on the audit events when present)
CLAIM_ANNOTATION = "agents.x-k8s.io/claim-uid"
#: the label agent-sandbox puts on the pods of a warm pool (research §1.3): such a pod
#: waits for a claim, and runs nobody's task until one adopts it
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"


@dataclass(frozen=True)
class Pod:
    """What the gateway needs of one pod."""

    uid: str
    namespace: str
    name: str
    ips: tuple[str, ...]
    phase: str
    deleting: bool
    service_account: str
    host_ip: str = ""
    host_network: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        """Running and not being deleted: the only state whose connections pass."""
        return self.phase == "Running" and not self.deleting

    @property
    def claim(self) -> str:
        """The agent-sandbox claim UID, or ""."""
        return self.annotations.get(CLAIM_ANNOTATION, "") or self.labels.get(CLAIM_ANNOTATION, "")

    @property
    def unclaimed(self) -> bool:
        """A warm-pool pod that no claim has adopted yet (plain pods never are)."""
        return WARM_POOL_LABEL in self.labels and not self.claim

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Pod | None:
        """Read a Pod object as the API server sends it; None when it has no UID."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return None
        ips: list[str] = []
        for entry in status.get("podIPs") or []:
            if isinstance(entry, dict) and entry.get("ip"):
                ips.append(_canonical(str(entry["ip"])))
        if status.get("podIP") and _canonical(str(status["podIP"])) not in ips:
            ips.append(_canonical(str(status["podIP"])))
        return cls(
            uid=uid,
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            ips=tuple(ip for ip in ips if ip),
            phase=str(status.get("phase") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            service_account=str(spec.get("serviceAccountName") or "default"),
            host_ip=_canonical(str(status.get("hostIP") or "")),
            host_network=bool(spec.get("hostNetwork")),
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        )


def _canonical(text: str) -> str:
    """One spelling per address (IPv4-mapped IPv6 as IPv4); "" for garbage."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


#: called with (before, after) for every pod that changed; None for absent
PodListener = Callable[[Pod | None, Pod | None], None]


class PodCache:
    """Pods of one namespace (or all), by UID and by address, kept by list then watch.

    ``ttl``: how long the cache is trusted after it last heard from the API server while
    no watch is open. ``on_change`` hears every change (the gateway closes the tunnels of
    a pod that is gone, stopped or moved); ``on_node`` every node address seen.
    """

    def __init__(
        self,
        client: KubeClient,
        namespace: str | None,
        *,
        ttl: float = 10.0,
        on_change: PodListener | None = None,
        on_node: Callable[[str], None] | None = None,
        backoff: tuple[float, float] = (0.5, 10.0),
        watch_timeout: int = 300,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.ttl = ttl
        self.on_change = on_change
        self.on_node = on_node
        self.backoff = backoff
        self.watch_timeout = watch_timeout
        self.pods: dict[str, Pod] = {}
        self._by_ip: dict[str, set[str]] = {}
        self.resource_version = ""
        #: a first list succeeded (readiness)
        self.synced = False
        #: a watch stream is open right now
        self.connected = False
        self.last_ok = 0.0
        self.failures = 0
        self.last_error = ""

    @property
    def _path(self) -> str:
        if self.namespace:
            return f"/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}/pods"
        return "/api/v1/pods"

    def fresh(self) -> bool:
        """True while the cache can be trusted: synced, and a watch open or the last
        word from the API server within ``ttl``."""
        if not self.synced:
            return False
        return self.connected or time.monotonic() - self.last_ok <= self.ttl

    def lookup(self, ip: str) -> tuple[Pod | None, Reason, str]:
        """The Running pod that owns ``ip``; else None with the reason and a detail."""
        if not self.fresh():
            return None, Reason.IDENTITY_STALE, self.last_error or "the pod list is not synced"
        owners = self._by_ip.get(ip)
        if owners is not None and len(owners) == 1:
            # The common case, without parsing the address: the keys are canonical
            # spellings, so a peer string equal to one is that very address.
            for uid in owners:
                pod = self.pods.get(uid)
                if pod is not None and pod.running:
                    return pod, Reason.ALLOWED, ""
        key = _canonical(ip)
        uids = self._by_ip.get(key, set())
        pods = [self.pods[u] for u in uids if u in self.pods]
        running = [p for p in pods if p.running]
        if len(running) == 1:
            return running[0], Reason.ALLOWED, ""
        if len(running) > 1:
            names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p in running))
            return None, Reason.UNKNOWN_PEER, f"{key} is claimed by several pods ({names})"
        if pods:
            pod = pods[0]
            state = "being deleted" if pod.deleting else (pod.phase or "no phase")
            return None, Reason.POD_NOT_RUNNING, f"{pod.namespace}/{pod.name} is {state}"
        return None, Reason.UNKNOWN_PEER, f"no pod has address {key}"

    # -- keeping the cache -------------------------------------------------------------

    def _put(self, pod: Pod | None, uid: str) -> None:
        before = self.pods.get(uid)
        if before is not None:
            for ip in before.ips:
                owners = self._by_ip.get(ip)
                if owners is not None:
                    owners.discard(uid)
                    if not owners:
                        del self._by_ip[ip]
        if pod is None:
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = pod
            if pod.host_ip and self.on_node is not None:
                self.on_node(pod.host_ip)
            if pod.host_network:
                # Its address is its node's, shared by every host-network pod: never an
                # identity (and the node's address is refused as a destination).
                if self.on_node is not None:
                    for ip in pod.ips:
                        self.on_node(ip)
            else:
                for ip in pod.ips:
                    self._by_ip.setdefault(ip, set()).add(uid)
        if self.on_change is not None and before != pod:
            try:
                self.on_change(before, pod)
            except Exception as exc:
                logger.error("gateway: pod listener failed: %s", exc)

    async def sync(self) -> None:
        """List the pods once and replace the cache with what the list says."""
        listing = await self.client.request("GET", self._path)
        items = listing.get("items") or []
        seen: dict[str, Pod] = {}
        for obj in items:
            if isinstance(obj, dict):
                pod = Pod.from_object(obj)
                if pod is not None:
                    seen[pod.uid] = pod
        for uid in list(self.pods):
            if uid not in seen:
                self._put(None, uid)  # deleted while nobody was watching
        for uid, pod in seen.items():
            self._put(pod, uid)
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        self.synced = True
        self.last_ok = time.monotonic()

    async def _watch(self) -> bool:
        """Watch until the stream ends; True when it carried at least one event."""
        query = urllib.parse.urlencode(
            {
                "watch": "1",
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(self.watch_timeout),
            }
        )
        stream = self.client.watch(f"{self._path}?{query}", self.watch_timeout + 30.0)
        heard = False
        try:
            async for event in stream:
                heard = self.connected = True
                self.last_ok = time.monotonic()
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    # 410 Gone: the version is too old; anything else: start over too.
                    raise KubeError(
                        f"watch error: {obj.get('message', obj)}", int(obj.get("code") or 0)
                    )
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind == "BOOKMARK":
                    self.resource_version = version or self.resource_version
                    continue
                pod = Pod.from_object(obj)
                if pod is None:
                    continue
                self._put(None if kind == "DELETED" else pod, pod.uid)
                if version:
                    self.resource_version = version
        finally:
            if self.connected:
                self.last_ok = time.monotonic()
            self.connected = False
            await stream.aclose()
        return heard

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """List, then watch from the list's version, forever; on any failure relist after
        a backoff (doubling up to its maximum), so no event can be missed silently."""
        delay = self.backoff[0]
        while True:
            try:
                await self.sync()
                if ready is not None:
                    ready.set()
                self.failures, self.last_error = 0, ""
                delay = self.backoff[0]
                while True:
                    heard = await self._watch()  # ends when timeoutSeconds passed
                    if not heard:
                        # A stream closed at once with nothing in it: a server going away
                        # or a proxy cutting it; back off rather than spin.
                        raise KubeError("the watch ended without an event")
                    self.failures = 0
            except KubeError as exc:
                self.failures += 1
                self.last_error = f"API server: {exc}"
                logger.warning("gateway: %s; retrying in %.1fs", exc, delay)
            except (OSError, ValueError) as exc:
                self.failures += 1
                self.last_error = f"API server: {exc}"
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    def close(self) -> None:
        """Nothing to release; the watch ends with the task that runs :meth:`run`."""
        with contextlib.suppress(Exception):
            self.connected = False
