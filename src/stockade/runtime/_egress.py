"""The egress proxy of one run: a thread with its own event loop, fed by a listener
created inside the sandbox's network namespace.

Plumbing (DESIGN §5 (b)): bubblewrap starts with ``--info-fd`` (it reports the sandbox's
pid) and ``--block-fd`` (it holds the command until released). A short-lived helper joins
the sandbox's network namespace and hands back a socket listening on 127.0.0.1 there; the
proxy accepts on it directly, so nothing inside the sandbox relays traffic and each
sandbox reaches only its own proxy (identity is structural, DESIGN §4 rule 7). Only then
is the command released.

If the proxy fails, its listener closes and the sandbox has no way out at all: the
failure is fail-closed by construction, and it is reported in the audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stockade.audit import AuditLog
from stockade.egress import EgressProxy, EgressRules, listener_in_netns, proxy_environment
from stockade.policy import Policy

#: The port the proxy listens on inside every sandbox (its own network namespace).
PROXY_PORT = 3128


def inspects(policy: Policy) -> bool:
    """Whether the inspect layer has anything to do for ``policy``."""
    return policy.layers.inspect and bool(
        policy.network.rules or policy.secrets or policy.labels.configured
    )


class EgressPlan:
    """What the egress (and inspect) layer prepares for a sandbox: shared by its runs.

    ``env`` points clients at the proxy (and, when requests are inspected, at a trust
    bundle of the system roots plus a CA made for this sandbox, and carries placeholders
    for bound secrets); ``files`` are host files to bind read-only into the sandbox. The
    CA's key never leaves this process. The event loop thread that runs the proxies is
    started on first use and kept until :meth:`close`, so that a warm
    :class:`~stockade.Sandbox` pays for it once.
    """

    def __init__(
        self,
        policy: Policy,
        caller_env: Mapping[str, str],
        scratch: Path,
        inside_dir: str | None,
    ) -> None:
        self.policy = policy
        self.rules = EgressRules.from_policy(policy.network)
        self.env = proxy_environment(f"http://127.0.0.1:{PROXY_PORT}")
        self.files: list[tuple[Path, str]] = []
        self._ca: Any = None
        self._store: Any = None
        if inspects(policy):
            from stockade.egress.inspect import (
                CertificateAuthority,
                SecretStore,
                trust_environment,
                write_trust_bundle,
            )

            self._ca = CertificateAuthority.ephemeral()
            bundle = write_trust_bundle(self._ca, scratch / "ca-bundle.pem")
            inside = f"{inside_dir}/ca-bundle.pem" if inside_dir else str(bundle)
            self.files.append((bundle, inside))
            self.env.update(trust_environment(inside))
            self._store = SecretStore.resolve(policy.secrets, caller_env)
            self.env.update(self._store.environment())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The proxies' event loop, running in its own thread (started on first use)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name="stockade-proxy", daemon=True
            )
            self._thread.start()
            self._loop = loop
        return self._loop

    def proxy(self, audit: AuditLog) -> RunProxy:
        """A proxy for one run, writing to that run's audit log."""
        inspect = None
        if self._ca is not None:
            from stockade.egress.inspect import InspectLayer

            inspect = InspectLayer.from_policy(self.policy, self._ca, audit, secrets=self._store)
        return RunProxy(EgressProxy(self.rules, audit, inspect=inspect), self.loop(), audit)

    def close(self) -> None:
        """Stop the event loop thread."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()
        self._loop = self._thread = None


class RunProxy:
    """The proxy of one run, served on the shared event loop."""

    def __init__(
        self, proxy: EgressProxy, loop: asyncio.AbstractEventLoop, audit: AuditLog
    ) -> None:
        self.proxy = proxy
        self.loop = loop
        self.audit = audit
        self._serving: list[Future[None]] = []

    def attach(self, child_pid: int) -> None:
        """Create the listener inside ``child_pid``'s network namespace and serve it."""
        sock = listener_in_netns(child_pid, PROXY_PORT)
        self._serving.append(
            asyncio.run_coroutine_threadsafe(self.proxy.serve_socket(sock), self.loop)
        )

    def close(self) -> None:
        """Stop accepting and close every connection; report a proxy that failed."""
        for future in self._serving:
            if future.done() and future.exception() is not None:
                exc = future.exception()
                self.audit.emit(
                    "proxy_failed",
                    layer="egress",
                    verdict="deny",
                    reason="upstream-failed",
                    detail=f"{type(exc).__name__}: {exc}; the sandbox had no network from then on",
                )

        async def shutdown() -> None:
            self.proxy.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proxy.wait_closed(), 2.0)
            # On the loop: the pooled upstream connections are this loop's transports.
            inspect = getattr(self.proxy, "inspect", None)
            if inspect is not None:
                inspect.close()

        if self.loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5.0)
