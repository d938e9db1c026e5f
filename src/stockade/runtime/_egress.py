"""The egress proxy of one run: a thread with its own event loop, fed by a listener
created inside the sandbox's network namespace.

Plumbing (DESIGN §5 (b)): bubblewrap starts with ``--info-fd`` (it reports the sandbox's
pid) and ``--block-fd`` (it holds the command until released). A short-lived helper joins
the sandbox's network namespace and hands back a socket listening on 127.0.0.1 there; the
proxy accepts on it directly, so nothing inside the sandbox relays traffic and each
sandbox reaches only its own proxy (identity is structural, DESIGN §4 rule 7). Only then
is the command released.

With ``network.transparent`` (the default) the same helper also makes stockade's
resolver sockets (127.0.0.1:53) and one capture listener per port inside the namespace,
and the sandbox's ``/etc/resolv.conf`` names that resolver: clients that ignore proxy
variables resolve an allowed name to a synthetic address and their connection to it is
captured and decided like a CONNECT (:mod:`stockade.egress.dns`, ``serve_capture``).

If the proxy fails, its listener closes and the sandbox has no way out at all: the
failure is fail-closed by construction, and it is reported in the audit log.

With ``[network.upstream]`` the operator's proxy is resolved here once (``proxy = "env"``
from stockade's own environment, credentials from ``auth_file``) and one
:class:`~stockade.egress.upstream.Transport` carries every connection the proxy and the
inspect layer open; nothing of it enters the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stockade._exceptions import SandboxError
from stockade.audit import AuditLog
from stockade.audit._sink import FailClosed
from stockade.egress import EgressProxy, EgressRules, proxy_environment
from stockade.egress._assemble import build_proxy
from stockade.egress._netns import (
    DNS_PORT,
    MAX_CAPTURE_PORTS,
    Netns,
    check_capture_count,
    open_netns,
    split_sockets,
)
from stockade.egress.approval import ApprovalBroker, RunGate
from stockade.egress.dns import AddressPool, DnsServer
from stockade.egress.upstream import Transport, resolve_upstream
from stockade.enforce.environment import trust_paths
from stockade.policy import Policy
from stockade.policy._inspect import wants_inspection

#: The port the proxy listens on inside every sandbox (its own network namespace).
PROXY_PORT = 3128

#: The sandbox's resolver configuration: stockade's resolver only, no search list (the
#: host's would turn single-label names into extra queries), a fast retry.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:2\n"
#: Host-side resolver sockets that bypass resolv.conf (nscd, systemd-resolved's varlink,
#: avahi). Visible only when the container layer is off; masked then, since each would
#: resolve any name on the host: an exfiltration channel around the proxy.
RESOLVER_SOCKETS = (
    "/run/nscd/socket",
    "/var/run/nscd/socket",
    "/run/systemd/resolve/io.systemd.Resolve",
    "/run/systemd/resolve/io.systemd.Resolve.Monitor",
    "/run/avahi-daemon/socket",
)


def _nsswitch() -> str | None:
    """The host's nsswitch.conf with ``hosts: files dns`` (no nscd, resolved or mdns)."""
    try:
        text = Path("/etc/nsswitch.conf").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    lines = [
        "hosts: files dns" if line.split(":", 1)[0].strip() == "hosts" else line
        for line in text.splitlines()
    ]
    if "hosts: files dns" not in lines:
        lines.append("hosts: files dns")
    return "\n".join(lines) + "\n"


def resolver_files(scratch: Path, hostname: str, isolate: bool) -> list[tuple[Path, str]]:
    """Files to bind read-only over the sandbox's resolver configuration.

    Each is bound at the real path of the host's file (``/etc/resolv.conf`` is often a
    symlink into /run; a bind onto a dangling symlink fails). A file the host lacks is
    left alone: glibc, musl, c-ares and Go all default to a nameserver on 127.0.0.1,
    which is stockade's resolver.
    """
    hosts = (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        # getaddrinfo(gethostname()) must work (Java's InetAddress.getLocalHost, Gradle).
        f"127.0.1.1\t{hostname}\n"
    )
    out: list[tuple[Path, str]] = []
    for name, text in (
        ("resolv.conf", RESOLV_CONF),
        ("hosts", hosts),
        ("nsswitch.conf", _nsswitch()),
    ):
        target = os.path.realpath(f"/etc/{name}")
        if text is None or not os.path.isfile(target):
            continue
        path = scratch / f"etc-{name}"
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)
        out.append((path, target))
    if not isolate:
        for sock in RESOLVER_SOCKETS:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.stat(sock).st_mode):
                    out.append((Path("/dev/null"), sock))
    return out


def inspects(policy: Policy) -> bool:
    """Whether the inspect layer has anything to do for ``policy``."""
    return wants_inspection(policy)


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
        approvals: ApprovalBroker | None = None,
    ) -> None:
        self.policy = policy
        #: grants, live changes and asks shared by the runs (None: the policy, fixed)
        self.approvals = approvals
        self.rules = (
            approvals.base if approvals is not None else EgressRules.from_policy(policy.network)
        )
        #: the operator's upstream proxy (None: direct); a bad setting raises PolicyError
        #: here, before anything starts
        self.upstream = resolve_upstream(policy.network.upstream)
        self.env = proxy_environment(f"http://127.0.0.1:{PROXY_PORT}")
        self.files: list[tuple[Path, str]] = []
        #: the trust stores the caller's variables name (trusted upstream as well)
        self.caller_trust = [p for p in trust_paths(caller_env) if p.is_file()]
        self.transparent = policy.network.transparent
        #: ports captured inside the sandbox; the proxy's and the resolver's own are
        #: taken by their listeners
        self.capture_ports: tuple[int, ...] = ()
        if self.transparent:
            reserved = {PROXY_PORT, DNS_PORT}
            self.capture_ports = tuple(p for p in self.rules.capture_ports() if p not in reserved)
            hostname = "stockade" if inside_dir else socket.gethostname()
            self.files += resolver_files(scratch, hostname, isolate=inside_dir is not None)
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
            bundle = write_trust_bundle(self._ca, scratch / "ca-bundle.pem", self.caller_trust)
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

    def proxy(self, audit: AuditLog, argv: Sequence[str] = ()) -> RunProxy:
        """A proxy for one run (``argv``), writing to that run's audit log."""
        pool = AddressPool() if self.transparent else None
        gate = None
        if self.approvals is not None:
            gate = self.approvals.gate(audit.run_id, argv, audit.emit)
        # The shared assembly: inspection, secrets and labels as the policy asks (the CA
        # made for this sandbox); one transport for the proxy and the inspect layer, so
        # both open their connections through the operator's upstream proxy.
        proxy = build_proxy(
            self.policy,
            audit,
            caller="stockade run",
            ca_fix="this is a bug: the sandbox's CA was not made",
            rules=self.rules,
            ca=self._ca,
            secrets=self._store,
            caller_trust=self.caller_trust,
            transport=Transport(self.upstream),
            pool=pool,
            gate=gate,
        )
        loop = self.loop()
        if gate is not None:
            gate.loop, gate.on_change = loop, proxy.close_failing
        return RunProxy(proxy, loop, audit, self.capture_ports if self.transparent else None)

    def close(self) -> None:
        """Stop the event loop thread."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()
        self._loop = self._thread = None


def _live_rules(gate: RunGate) -> Callable[[], tuple[EgressRules, Callable[[str], bool]]]:
    """The resolver's view of ``gate``: the current rules, and which names are askable."""

    def live() -> tuple[EgressRules, Callable[[str], bool]]:
        ruleset = gate.current()
        return ruleset.rules, ruleset.may_ask

    return live


class RunProxy:
    """The proxy of one run, served on the shared event loop."""

    def __init__(
        self,
        proxy: EgressProxy,
        loop: asyncio.AbstractEventLoop,
        audit: AuditLog,
        capture_ports: tuple[int, ...] | None = None,
    ) -> None:
        self.proxy = proxy
        self.loop = loop
        self.audit = audit
        #: None: no resolver and no capture (``network.transparent = false``)
        self.capture_ports = capture_ports
        self.dns: DnsServer | None = None
        if capture_ports is not None and proxy.pool is not None:
            live = _live_rules(proxy.gate) if proxy.gate is not None else None
            # The resolver writes to the run's log; a write that fails closes the proxy.
            sink = FailClosed(audit, proxy.close, "dns")
            self.dns = DnsServer(proxy.rules, proxy.pool, sink, live=live)
            self.dns.check_name = proxy.check_name
        self._serving: list[Future[None]] = []
        #: the sandbox's namespace, held while grants may add capture ports
        self._netns: Netns | None = None
        self._captured: set[int] = set(capture_ports or ())
        self._capture_lock = threading.Lock()

    def serve_listener(self, sock: socket.socket) -> None:
        """Serve the proxy on ``sock``, a listener of the host (the landlock backend,
        which has no namespace to make one in)."""
        self._serving.append(
            asyncio.run_coroutine_threadsafe(self.proxy.serve_socket(sock), self.loop)
        )

    def attach(self, child_pid: int) -> None:
        """Create the listeners inside ``child_pid``'s network namespace and serve them.

        Raises :class:`~stockade.SandboxError` when any of them cannot be made: the
        command then never starts (a sandbox whose resolver or capture is missing would
        break clients silently, or be wider than asked).
        """
        check_capture_count(len(self.capture_ports or ()))
        netns = open_netns(child_pid)
        try:
            made = netns.sockets(
                PROXY_PORT, dns=self.dns is not None, capture_ports=self.capture_ports or ()
            )
        except BaseException:
            netns.close()
            raise
        socks = split_sockets(made, self.dns is not None)
        if self.capture_ports is not None and self.proxy.gate is not None:
            # Live grants can name ports nobody listens on yet: keep the namespace to
            # add their capture listeners (a client that ignores the proxy variables
            # then reaches a port allowed while it runs).
            self._netns = netns
            self.proxy.gate.on_grant = self._capture_granted_ports
        else:
            netns.close()
        if self._netns is not None:
            # A grant made before the namespace existed (a control channel's first
            # message, a Sandbox.allow before the run) found nowhere to listen: its
            # ports are listened on now, before the command is let go.
            self._capture_granted_ports()
        run = asyncio.run_coroutine_threadsafe
        self._serving.append(run(self.proxy.serve_socket(socks.proxy), self.loop))
        for capture in socks.captures:
            self._serving.append(run(self.proxy.serve_capture(capture), self.loop))
        if self.dns is not None and socks.dns_udp is not None:
            try:
                run(self.dns.serve(socks.dns_udp, socks.dns_tcp), self.loop).result(5.0)
            except BaseException:
                socks.close()
                raise

    def _capture_granted_ports(self) -> None:
        """Listen on the ports the current rules name that have no capture listener.

        Called in the thread that allowed (a ``Sandbox.allow`` returns once the port is
        listened on); made by a fresh helper in the held namespace, and served like the
        listeners made at start. A failure is audited, never raised into the allow.
        """
        gate = self.proxy.gate
        if gate is None:
            return
        with self._capture_lock:
            netns = self._netns
            if netns is None:
                return
            reserved = {PROXY_PORT, DNS_PORT}
            wanted = [
                p
                for p in gate.current().rules.capture_ports()
                if p not in self._captured and p not in reserved
            ]
            room = MAX_CAPTURE_PORTS - len(self._captured)
            ports, skipped = tuple(wanted[: max(room, 0)]), wanted[max(room, 0) :]
            try:
                made = (
                    netns.sockets(capture_ports=ports, proxy=False, routes=not self._captured)
                    if ports
                    else []
                )
            except SandboxError as exc:
                made, skipped = [], wanted
                detail = f"{exc}"
            else:
                detail = f"at most {MAX_CAPTURE_PORTS} captured ports" if skipped else ""
            self._captured.update(ports if made else ())
        for sock in made:
            self._serving.append(
                asyncio.run_coroutine_threadsafe(self.proxy.serve_capture(sock), self.loop)
            )
        if made:
            self.audit.emit(
                "capture_added",
                layer="egress",
                verdict="allow",
                reason="allowed",
                ports=list(ports),
            )
        if skipped:
            self.audit.emit(
                "capture_failed",
                layer="egress",
                verdict="deny",
                reason="unsupported-protocol",
                ports=skipped,
                detail=f"{detail}; reachable through the proxy variables only",
            )

    def close(self) -> None:
        """Stop accepting and close every connection; report a proxy that failed."""
        with self._capture_lock:
            if self._netns is not None:
                self._netns.close()
                self._netns = None
        failures = [
            exc
            for future in self._serving
            if future.done() and (exc := future.exception()) is not None
        ]
        if failures:
            # One event for the run: the proxy listener and the capture listeners
            # share one loop and usually fail together.
            exc = failures[0]
            more = f" ({len(failures)} listeners failed)" if len(failures) > 1 else ""
            self.audit.emit(
                "proxy_failed",
                layer="egress",
                verdict="deny",
                reason="upstream-failed",
                detail=f"{type(exc).__name__}: {exc}; the sandbox had no network from then on{more}",
            )

        async def shutdown() -> None:
            if self.dns is not None:
                self.dns.close()
            if self.proxy.gate is not None:
                # On the loop: its pending asks' futures are this loop's.
                self.proxy.gate.close()
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
