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

import contextlib
import os
import select
import socket
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stockade._exceptions import SandboxError
from stockade._fs import replace_file
from stockade.audit import AuditLog
from stockade.egress._env import proxy_environment
from stockade.egress._netns import (
    DNS_PORT,
    MAX_CAPTURE_PORTS,
    Helper,
    Netns,
    open_netns,
    spawn_helper,
    split_sockets,
)
from stockade.egress._rules import EgressRules
from stockade.egress.upstream._config import resolve_upstream
from stockade.enforce.environment import trust_paths
from stockade.policy import Policy
from stockade.policy._inspect import wants_inspection

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from stockade.egress._proxy import EgressProxy
    from stockade.egress.approval import ApprovalBroker, RunGate
    from stockade.egress.dns import DnsServer

#: The port the proxy listens on inside every sandbox (its own network namespace).
PROXY_PORT = 3128

#: The sandbox's resolver configuration: stockade's resolver only, no search list (the
#: host's would turn single-label names into extra queries). The resolver answers at once,
#: except the first query of a run whose proxy is made on demand (see RunProxy), which
#: waits for the proxy's import: on a loaded machine that can pass a second, so a client
#: retries after 2 s, 3 times. A resolver that is gone (its socket closed) is refused at
#: once: nothing waits for these timeouts then.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:2 attempts:3\n"
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


def resolver_files(
    scratch: Callable[[], Path], hostname: str, isolate: bool
) -> list[tuple[Path, str]]:
    """Files to bind read-only over the sandbox's resolver configuration.

    Each is bound at the real path of the host's file (``/etc/resolv.conf`` is often a
    symlink into /run; a bind onto a dangling symlink fails). A file the host lacks is
    left alone: glibc, musl, c-ares and Go all default to a nameserver on 127.0.0.1,
    which is stockade's resolver.

    The files are the same for every run on this host: they are kept in stockade's cache
    (:func:`_resolver_file`), not written into each run's ``scratch`` (called for a
    directory only when the cache cannot be used).
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
        out.append((_resolver_file(name, text, scratch), target))
    if not isolate:
        for sock in RESOLVER_SOCKETS:
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.stat(sock).st_mode):
                    out.append((Path("/dev/null"), sock))
    return out


def _resolver_file(name: str, text: str, scratch: Callable[[], Path]) -> Path:
    """A file holding ``text``, named by its digest in stockade's cache.

    Writing three files into each run's scratch directory (and removing them and the
    directory again) cost about half a millisecond of every run on an ext4 disk. The
    cache is one of stockade's trust roots, read-only in every sandbox (and the file is
    bound read-only besides); its content is checked before each use and written anew
    (to a temporary name, then renamed) when it differs. Where the cache cannot be
    written, the file goes into ``scratch()`` as before.
    """
    from stockade import _build
    from stockade._hash import sha256_hex

    data = text.encode("utf-8")
    cached = _build.cache_dir() / "resolver" / f"{sha256_hex(data)[:16]}-{name}"
    try:
        with open(cached, "rb") as f:
            if f.read(len(data) + 1) == data:
                return cached
    except OSError:
        pass
    try:
        cached.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(cached, data, 0o644)
        return cached
    except OSError:
        path = scratch() / f"etc-{name}"
        path.write_bytes(data)
        path.chmod(0o644)
        return path


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
        scratch: Path | Callable[[], Path],
        inside_dir: str | None,
        approvals: ApprovalBroker | None = None,
    ) -> None:
        self.policy = policy

        def where() -> Path:
            # The run's scratch directory, made only when something is written into it.
            return scratch() if callable(scratch) else scratch

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
            self.files += resolver_files(where, hostname, isolate=inside_dir is not None)
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
            bundle = write_trust_bundle(self._ca, where() / "ca-bundle.pem", self.caller_trust)
            inside = f"{inside_dir}/ca-bundle.pem" if inside_dir else str(bundle)
            self.files.append((bundle, inside))
            self.env.update(trust_environment(inside))
            self._store = SecretStore.resolve(policy.secrets, caller_env)
            self.env.update(self._store.environment())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Runs of one Sandbox may start their proxies from several threads at once.
        self._loop_lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The proxies' event loop, running in its own thread (started on first use)."""
        with self._loop_lock:
            if self._loop is None:
                import asyncio

                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="stockade-proxy", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    def proxy(self, audit: AuditLog, argv: Sequence[str] = ()) -> RunProxy:
        """A proxy for one run (``argv``), writing to that run's audit log.

        Without the inspect layer and without approvals the proxy is made (and asyncio,
        the proxy and the resolver imported) only once a listener of the sandbox becomes
        readable: see :class:`RunProxy`. With the inspect layer, the proxy is made here,
        before the sandbox starts, so that anything wrong with it stops the run before its
        command runs; with approvals (a :class:`~stockade.Sandbox`, ``--ask``), too: the
        broker has brought asyncio in already, and live grants and asks act on a proxy
        that is there from the start.
        """
        gate = None
        if self.approvals is not None:
            gate = self.approvals.gate(audit.run_id, argv, audit.emit)

        def make() -> EgressProxy:
            from stockade.egress._assemble import build_proxy
            from stockade.egress.dns import AddressPool
            from stockade.egress.upstream import Transport

            # The shared assembly: inspection, secrets and labels as the policy asks (the
            # CA made for this sandbox); one transport for the proxy and the inspect
            # layer, so both open their connections through the operator's upstream.
            return build_proxy(
                self.policy,
                audit,
                caller="stockade run",
                ca_fix="this is a bug: the sandbox's CA was not made",
                rules=self.rules,
                ca=self._ca,
                secrets=self._store,
                caller_trust=self.caller_trust,
                transport=Transport(self.upstream),
                pool=AddressPool() if self.transparent else None,
                gate=gate,
            )

        return RunProxy(
            make,
            self.loop,
            audit,
            self.capture_ports if self.transparent else None,
            gate=gate,
            lazy=self._ca is None and gate is None,
        )

    def close(self) -> None:
        """Stop the event loop thread."""
        with self._loop_lock:
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


#: what each held socket is for, as :meth:`RunProxy._serve` serves it
_PROXY, _CAPTURE, _DNS_UDP, _DNS_TCP = "proxy", "capture", "dns-udp", "dns-tcp"
#: how long a closing proxy goes on accepting what was already waiting (seconds)
_DRAIN_S = 0.5


class RunProxy:
    """The proxy of one run, served on the shared event loop.

    The sandbox's listeners (the proxy's, the resolver's, the capture listeners) are made
    at :meth:`attach`, before the command starts, exactly as many as the policy asks for.
    A *lazy* proxy (the default without the inspect layer) is not made then: a watcher
    thread polls those sockets, and the first one that becomes readable (a connection in
    a listener's backlog, a query in the resolver's queue) makes the proxy and serves
    them all. Nothing is lost meanwhile (the kernel queues it) and nothing is decided
    otherwise (the same proxy decides, and audits, every attempt); a run whose command
    never opens a socket does not import asyncio, ssl, h11 or the proxy (~100 ms of a
    cold start). A proxy that cannot be made closes the listeners (the sandbox has no
    way out) and the run reports ``proxy_failed``.
    """

    def __init__(
        self,
        make: Callable[[], EgressProxy],
        loop: Callable[[], asyncio.AbstractEventLoop],
        audit: AuditLog,
        capture_ports: tuple[int, ...] | None = None,
        *,
        gate: RunGate | None = None,
        lazy: bool = True,
    ) -> None:
        self._make = make
        self._get_loop = loop
        self.audit = audit
        #: None: no resolver and no capture (``network.transparent = false``)
        self.capture_ports = capture_ports
        #: the run's approval gate (live rules, asks), if any
        self.gate = gate
        # the proxy and its loop, once made (at once, or when first needed if lazy)
        self._proxy: EgressProxy | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dns: DnsServer | None = None
        self._serving: list[Future[None]] = []
        #: every socket handed to the proxy or the resolver (for the drain at close)
        self._listening: list[socket.socket] = []
        #: the sandbox's namespace, held while grants may add capture ports
        self._netns: Netns | None = None
        #: the namespace helper, spawned ahead of :meth:`attach` (:meth:`prepare`)
        self._helper: Helper | None = None
        self._captured: set[int] = set(capture_ports or ())
        self._capture_lock = threading.Lock()
        # The lazy start: sockets held (not yet served), the watcher that waits for one
        # to become readable, and the state both threads share (under _lock).
        self._lock = threading.Lock()
        self._held: list[tuple[str, socket.socket]] = []
        self._live = False  # serving: new sockets are served at once, not held
        self._closing = False
        self._failed = False
        self._watcher: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        if not lazy:
            self._build()

    @property
    def started(self) -> bool:
        """True once the proxy was made (a lazy one: once the sandbox needed it)."""
        return self._proxy is not None

    @property
    def proxy(self) -> EgressProxy:
        """The run's proxy; :class:`RuntimeError` before it was made (see :attr:`started`)."""
        if self._proxy is None:
            raise RuntimeError("the run's proxy was not started (nothing needed it yet)")
        return self._proxy

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the run's proxy is served on; :class:`RuntimeError` before it was made."""
        if self._loop is None:
            raise RuntimeError("the run's proxy was not started (nothing needed it yet)")
        return self._loop

    def _build(self) -> None:
        """Make the proxy (and the resolver) and wire the gate to the loop."""
        proxy = self._make()
        loop = self._get_loop()
        if self.gate is not None:
            self.gate.loop, self.gate.on_change = loop, proxy.close_failing
        if self.capture_ports is not None and proxy.pool is not None:
            from stockade.audit._sink import FailClosed
            from stockade.egress.dns import DnsServer

            live = _live_rules(self.gate) if self.gate is not None else None
            # The resolver writes to the run's log; a write that fails closes the proxy.
            sink = FailClosed(self.audit, proxy.close, "dns")
            self.dns = DnsServer(proxy.rules, proxy.pool, sink, live=live)
            self.dns.check_name = proxy.check_name
        self._proxy, self._loop = proxy, loop

    def serve_listener(self, sock: socket.socket) -> None:
        """Serve the proxy on ``sock``, a listener of the host (the landlock backend,
        which has no namespace to make one in)."""
        self._hold([(_PROXY, sock)])

    def prepare(self) -> None:
        """Spawn the helper that :meth:`attach` hands the sandbox's namespace to, while
        the namespace is still being made: its start is then off the run's path (about
        1 ms). :meth:`close` ends it when the run ends before :meth:`attach`."""
        if self._helper is None:
            # spawn_helper refuses more capture ports than one message carries.
            self._helper = spawn_helper(
                PROXY_PORT,
                dns=self.capture_ports is not None,
                capture_ports=self.capture_ports or (),
            )

    def attach(self, child_pid: int) -> None:
        """Create the listeners inside ``child_pid``'s network namespace and serve them
        (a lazy proxy: watch them, and serve them once one is readable).

        Raises :class:`~stockade.SandboxError` when any of them cannot be made: the
        command then never starts (a sandbox whose resolver or capture is missing would
        break clients silently, or be wider than asked).
        """
        self.prepare()
        helper, self._helper = self._helper, None
        assert helper is not None
        resolves = self.capture_ports is not None
        try:
            netns = open_netns(child_pid)
        except BaseException:
            helper.cancel()
            raise
        try:
            made = helper.join(netns)
        except BaseException:
            netns.close()
            raise
        socks = split_sockets(made, resolves)
        if self.capture_ports is not None and self.gate is not None:
            # Live grants can name ports nobody listens on yet: keep the namespace to
            # add their capture listeners (a client that ignores the proxy variables
            # then reaches a port allowed while it runs).
            self._netns = netns
            self.gate.on_grant = self._capture_granted_ports
        else:
            netns.close()
        held = [(_PROXY, socks.proxy)]
        held += [(_CAPTURE, capture) for capture in socks.captures]
        if socks.dns_udp is not None and socks.dns_tcp is not None:
            held += [(_DNS_UDP, socks.dns_udp), (_DNS_TCP, socks.dns_tcp)]
        if self._netns is not None:
            # A grant made before the namespace existed (a control channel's first
            # message, a Sandbox.allow before the run) found nowhere to listen: its
            # ports are listened on now, before the command is let go.
            with self._lock:
                self._held += held
            held = []
            self._capture_granted_ports()
        self._hold(held)

    def _hold(self, socks: list[tuple[str, socket.socket]]) -> None:
        """Serve ``socks`` now (a proxy made, or not lazy), or hold them for the watcher."""
        with self._lock:
            if self._closing or self._failed:
                for _, sock in socks:
                    sock.close()
                return
            if self._live:
                serve_now = socks
            else:
                serve_now = []
                self._held += socks
        if serve_now:
            self._serve(serve_now)
            return
        if self._proxy is not None:
            # Made already (not lazy): serve everything held, now.
            self._go()
            return
        if self._watcher is None:
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self._watcher = threading.Thread(
                target=self._watch, name="stockade-proxy-watch", daemon=True
            )
            self._watcher.start()
        else:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b".")

    def _watch(self) -> None:
        """The watcher thread: wait until a held socket is readable, then start."""
        try:
            while True:
                with self._lock:
                    closing = self._closing
                    fds = [sock.fileno() for _, sock in self._held]
                poller = select.poll()
                poller.register(self._wake_r, select.POLLIN)
                for fd in fds:
                    poller.register(fd, select.POLLIN)
                # Closing: one look without waiting, so that an attempt already queued
                # is still decided (and audited) by the proxy before the run ends.
                events = poller.poll(0 if closing else None)
                if any(fd != self._wake_r for fd, _ in events):
                    break
                if closing:
                    return
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 512)
            self._go()
        except BaseException as exc:
            self._fail(exc)

    def _go(self) -> None:
        """Make the proxy if it is not yet made, and serve every held socket."""
        if self._proxy is None:
            self._build()
        with self._lock:
            held, self._held = self._held, []
            self._live = True
        self._serve(held)

    def _serve(self, socks: list[tuple[str, socket.socket]]) -> None:
        """Serve ``socks`` on the proxy's loop (the proxy is made)."""
        import asyncio

        proxy, loop = self.proxy, self.loop
        run = asyncio.run_coroutine_threadsafe
        udp = tcp = None
        self._listening += [sock for _, sock in socks]
        for role, sock in socks:
            if role == _PROXY:
                self._serving.append(run(proxy.serve_socket(sock), loop))
            elif role == _CAPTURE:
                self._serving.append(run(proxy.serve_capture(sock), loop))
            elif role == _DNS_UDP:
                udp = sock
            else:
                tcp = sock
        if udp is not None and self.dns is not None:
            try:
                run(self.dns.serve(udp, tcp), loop).result(5.0)
            except BaseException:
                udp.close()
                if tcp is not None:
                    tcp.close()
                raise

    def _fail(self, exc: BaseException) -> None:
        """A lazy start failed: close every listener (no way out) and say so."""
        with self._lock:
            self._failed = True
            held, self._held = self._held, []
        for _, sock in held:
            sock.close()
        proxy, loop = self._proxy, self._loop
        if proxy is not None and loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(proxy.close)
                if self.dns is not None:
                    loop.call_soon_threadsafe(self.dns.close)
        self.audit.emit(
            "proxy_failed",
            layer="egress",
            verdict="deny",
            reason="upstream-failed",
            detail=f"{type(exc).__name__}: {exc}; the proxy could not start, the sandbox "
            "had no network",
        )

    def _capture_granted_ports(self) -> None:
        """Listen on the ports the current rules name that have no capture listener.

        Called in the thread that allowed (a ``Sandbox.allow`` returns once the port is
        listened on); made by a fresh helper in the held namespace, and served like the
        listeners made at start. A failure is audited, never raised into the allow.
        """
        gate = self.gate
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
        if made:
            self._hold([(_CAPTURE, sock) for sock in made])
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
        if self._helper is not None:
            self._helper.cancel()
            self._helper = None
        with self._capture_lock:
            if self._netns is not None:
                self._netns.close()
                self._netns = None
        with self._lock:
            self._closing = True
        if self._watcher is not None:
            # The watcher takes one last look: an attempt already waiting starts the
            # proxy, which decides and audits it below.
            self._wake()
            self._watcher.join()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        with self._lock:
            held, self._held = self._held, []
        for _, sock in held:
            sock.close()
        proxy, loop = self._proxy, self._loop
        if proxy is None or loop is None:
            # Never made: nothing was served, nothing is pending on any loop.
            if self.gate is not None:
                self.gate.close()
            return
        import asyncio

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
        listeners = self._listening
        dns = self.dns

        async def shutdown() -> None:
            # What already waits in a listener's backlog is accepted (and so decided and
            # audited) before the listeners close; a handful of loop turns, bounded.
            deadline = loop.time() + _DRAIN_S
            while listeners and loop.time() < deadline and _readable(listeners):
                await asyncio.sleep(0.005)
            if dns is not None:
                dns.close()
            if self.gate is not None:
                # On the loop: its pending asks' futures are this loop's.
                self.gate.close()
            proxy.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proxy.wait_closed(), 2.0)
            # On the loop: the pooled upstream connections are this loop's transports.
            inspect = getattr(proxy, "inspect", None)
            if inspect is not None:
                inspect.close()

        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5.0)


def _readable(socks: list[socket.socket]) -> bool:
    """Whether any of ``socks`` has something waiting (a connection, a datagram)."""
    poller = select.poll()
    for sock in socks:
        if sock.fileno() >= 0:
            poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))
