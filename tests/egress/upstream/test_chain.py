"""The egress proxy chained through a real squid: every path, every refusal, no direct dial.

The proxy runs in network namespace A (see ``_net.py``), whose only way to the targets is
squid in namespace B: a connection that reaches a target went through squid, and the
target's log shows squid's address as its peer. Each refusal has its allowed twin.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.egress import EgressProxy, EgressRules
from stockade.egress.inspect import CertificateAuthority, InspectLayer, write_trust_bundle
from stockade.egress.upstream import Transport, resolve_upstream
from stockade.policy import Decision, parse_policy_text
from tests.egress.upstream._net import CompanyNet, company_net, enter_netns

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def net() -> Iterator[CompanyNet]:
    with company_net() as built:
        yield built


class Chained:
    """An :class:`EgressProxy` for a policy, serving 127.0.0.1 inside netns A."""

    def __init__(
        self,
        net: CompanyNet,
        policy_text: str,
        *,
        inspect: bool = False,
        trust: bool = True,
        proxy: EgressProxy | None = None,
    ) -> None:
        """``proxy``: serve this one (built elsewhere, e.g. by the gateway) instead."""
        self.net = net
        self.events: list[tuple[Decision, dict[str, Any]]] = []
        self.lock = threading.Lock()
        policy = parse_policy_text(policy_text)
        rules = EgressRules.from_policy(policy.network)
        transport = Transport(
            resolve_upstream(policy.network.upstream), connect_timeout=3.0, reply_timeout=5.0
        )
        layer = None
        self.bundle: Path | None = None
        if inspect:
            ca = CertificateAuthority.ephemeral()
            self.bundle = write_trust_bundle(ca, net.root / f"bundle-{id(self)}.pem")
            # The company CA in the caller's trust store is how an intercepting company
            # proxy's certificates are trusted; without it, verification must fail.
            layer = InspectLayer.from_policy(
                policy,
                ca,
                self._record,
                caller_trust=[net.ca_path] if trust else [],
                transport=transport,
            )
        self.proxy = proxy or EgressProxy(rules, self._record, transport=transport, inspect=layer)
        self.layer = layer
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()

        def run() -> None:
            enter_netns(net.a)  # every socket the proxy makes is made in namespace A
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            self.port = listener.getsockname()[1]
            ready.set()
            self.loop.run_until_complete(self.proxy.serve_socket(listener))
            if self.layer is not None:
                self.layer.close()
            self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(TIMEOUT)

    def _record(self, decision: Decision, fields: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((decision, fields))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.close)
        self.thread.join(TIMEOUT)

    def connect(self) -> socket.socket:
        sock = self.net.connect(self.port)
        sock.settimeout(TIMEOUT)
        return sock

    def named(self, event: str) -> list[tuple[Decision, dict[str, Any]]]:
        import time

        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            with self.lock:
                found = [e for e in self.events if e[1]["event"] == event]
            if found:
                time.sleep(0.05)
                with self.lock:
                    return [e for e in self.events if e[1]["event"] == event]
            time.sleep(0.02)
        return []


def _head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    return data


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except TimeoutError:
            break
        if not part:
            break
        data += part
    return data


def connect_get(proxy: Chained, host: str, port: int, path: str = "/") -> tuple[bytes, bytes]:
    """CONNECT host:port, then a GET inside: (the CONNECT answer, the response)."""
    with proxy.connect() as sock:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        answer = _head(sock)
        if b" 200 " not in answer.split(b"\r\n")[0] + b" ":
            return answer, b""
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return answer, _read_all(sock)


def forward_get(proxy: Chained, url: str, extra: str = "") -> bytes:
    host = url.split("/")[2]
    with proxy.connect() as sock:
        sock.sendall(
            f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()
        )
        return _read_all(sock)


@pytest.fixture
def chained(net: CompanyNet) -> Iterator[Chained]:
    proxy = Chained(net, net.policy())
    yield proxy
    proxy.stop()


def test_connect_goes_through_squid_to_the_vetted_address(
    net: CompanyNet, chained: Chained
) -> None:
    path = "/connect-by-address"
    answer, response = connect_get(chained, "web.test", net.http.port, path)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert response.startswith(b"HTTP/1.1 200"), response
    assert b"hello from" in response, response
    seen = [r for r in net.http.requests() if r["path"] == path]
    assert seen
    assert seen[0]["peer"] == net.squid.address
    # CONNECT <vetted IP>:port, authenticated (squid logs the user).
    lines = net.squid.wait_log(f"CONNECT {net.target_address}:{net.http.port}")
    assert lines, net.squid.log()[-5:]
    assert " alice " in lines[-1], net.squid.log()[-5:]
    (decision, fields), *_ = chained.named("net_connect")
    assert decision.allowed
    assert fields["upstream"] == net.squid.url
    assert fields["upstream_status"] == 200
    assert "alice" not in json.dumps(fields)
    assert "s3cret" not in json.dumps(fields)


def test_without_the_upstream_the_target_is_unreachable(net: CompanyNet) -> None:
    """The twin that makes the other tests mean something: a direct dial fails here."""
    text = net.policy().split("[network.upstream]")[0]
    proxy = Chained(net, text)
    try:
        answer, _ = connect_get(proxy, "web.test", net.http.port)
        assert answer.startswith(b"HTTP/1.1 502"), answer
        (decision, fields), *_ = proxy.named("net_connect")
        assert decision.reason == "upstream-failed"
        assert "unreachable" in decision.detail.lower()
        assert "upstream" not in fields
    finally:
        proxy.stop()


def test_plain_http_is_forwarded_in_absolute_form(net: CompanyNet, chained: Chained) -> None:
    path = "/forwarded?q=1"
    response = forward_get(
        chained,
        f"http://web.test:{net.http.port}{path}",
        # The sandbox's own proxy credentials never reach the upstream.
        extra="Proxy-Authorization: Basic c2FuZGJveDpzYW5kYm94\r\n",
    )
    assert response.startswith(b"HTTP/1.1 200"), response
    assert b"hello from" in response, response
    seen = [r for r in net.http.requests() if r["path"] == path]
    assert seen
    assert seen[0]["peer"] == net.squid.address
    assert seen[0]["host"] == f"web.test:{net.http.port}"  # the name, as the client asked
    assert seen[0]["proxy_auth"] is None
    # By name (see Transport.forward_target): squid sets Host from the URL.
    lines = net.squid.wait_log(f"GET http://web.test:{net.http.port}/forwarded")
    assert lines, net.squid.log()[-5:]
    assert " alice " in lines[-1], net.squid.log()[-5:]
    (decision, fields), *_ = chained.named("net_request")
    assert decision.allowed
    assert fields["upstream"] == net.squid.url
    assert fields["upstream_status"] == 200


def test_socks5_goes_through_squid(net: CompanyNet, chained: Chained) -> None:
    path = "/socks"
    with chained.connect() as sock:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        name = b"web.test"
        sock.sendall(
            b"\x05\x01\x00\x03" + bytes([len(name)]) + name + net.http.port.to_bytes(2, "big")
        )
        reply = sock.recv(10)
        assert reply[:2] == b"\x05\x00", reply
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n".encode())
        assert b"hello from" in _read_all(sock)
    seen = [r for r in net.http.requests() if r["path"] == path]
    assert seen
    assert seen[0]["peer"] == net.squid.address
    (_decision, fields), *_ = chained.named("net_connect")
    assert fields["protocol"] == "socks5"
    assert fields["upstream_status"] == 200


def test_tls_tunnel_through_squid_keeps_the_sni_check(net: CompanyNet, chained: Chained) -> None:
    ctx = ssl.create_default_context(cafile=str(net.ca_path))
    for sni, expected in (("tls.test", True), ("web.test", False)):
        with chained.connect() as sock:
            sock.sendall(
                f"CONNECT tls.test:{net.https.port} HTTP/1.1\r\nHost: tls.test\r\n\r\n".encode()
            )
            assert _head(sock).startswith(b"HTTP/1.1 200")
            try:
                ctx.check_hostname = sni == "tls.test"
                with ctx.wrap_socket(sock, server_hostname=sni) as tls:
                    tls.sendall(b"GET /tls HTTP/1.1\r\nHost: tls.test\r\nConnection: close\r\n\r\n")
                    ok = b"hello from" in _read_all(tls)
            except (ssl.SSLError, OSError):
                ok = False
        assert ok is expected, sni
    events = chained.named("net_connect")
    reasons = sorted(str(d.reason) for d, _ in events)
    assert reasons == ["allowed", "sni-mismatch"], reasons


def test_connect_by_name_sends_the_name(net: CompanyNet) -> None:
    proxy = Chained(net, net.policy(connect_by="name"))
    try:
        answer, response = connect_get(proxy, "web.test", net.http.port, "/by-name")
        assert answer.startswith(b"HTTP/1.1 200")
        assert b"hello from" in response
        assert net.squid.wait_log(f"CONNECT web.test:{net.http.port}")
        response = forward_get(proxy, f"http://web.test:{net.http.port}/by-name-forward")
        assert b"hello from" in response
        assert net.squid.wait_log(f"GET http://web.test:{net.http.port}/by-name-forward")
    finally:
        proxy.stop()


def test_connect_by_name_leaves_a_name_only_the_upstream_knows_to_it(net: CompanyNet) -> None:
    # Company networks whose names only the proxy resolves: connect_by = "name" lets
    # the upstream resolve an allowed name that has no answer here.
    allow = ("web.test", "internal.test")
    proxy = Chained(net, net.policy(connect_by="name", allow=allow))
    try:
        answer, response = connect_get(proxy, "internal.test", net.http.port, "/internal")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"hello from" in response
        assert net.squid.wait_log(f"CONNECT internal.test:{net.http.port}")
        (_, fields), *_ = proxy.named("net_connect")
        assert fields["address_class"] == "resolved-by-upstream"
        assert fields["address"] == ""
    finally:
        proxy.stop()


def test_connect_by_address_refuses_a_name_it_cannot_resolve(net: CompanyNet) -> None:
    # The twin: by address (the default) the tunnel must be bound to an address that
    # passed the checks here, so a name without one is refused and squid hears nothing.
    allow = ("web.test", "internal.test")
    proxy = Chained(net, net.policy(allow=allow))
    line = f"CONNECT internal.test:{net.http.port}"
    before = len(net.squid.wait_log(line, timeout=0))
    try:
        answer, _ = connect_get(proxy, "internal.test", net.http.port, "/internal-by-address")
        assert b" 502 " in answer.split(b"\r\n")[0] + b" ", answer
        (decision, _), *_ = proxy.named("net_connect")
        assert str(decision.reason) == "resolve-failed"
        assert len(net.squid.wait_log(line, timeout=0.5)) == before
    finally:
        proxy.stop()


def test_wrong_credentials_are_upstream_refused(net: CompanyNet) -> None:
    proxy = Chained(net, net.policy(auth_file=net.bad_auth_file))
    before = len(net.http.requests())
    try:
        answer, _ = connect_get(proxy, "web.test", net.http.port)
        assert answer.startswith(b"HTTP/1.1 502"), answer
        assert b"upstream-refused" in answer
        assert b"407" in answer
        response = forward_get(proxy, f"http://web.test:{net.http.port}/with-bad-credentials")
        assert response.startswith(b"HTTP/1.1 502"), response
        assert b"upstream-refused" in response, response
        (connect, cfields), *_ = proxy.named("net_connect")
        assert connect.reason == "upstream-refused"
        assert cfields["upstream_status"] == 407
        (request, rfields), *_ = proxy.named("net_request")
        assert request.reason == "upstream-refused"
        assert rfields["upstream_status"] == 407
        assert len(net.http.requests()) == before
        # What squid saw: a 407, logged, for each.
        assert net.squid.wait_log("TCP_DENIED/407")
    finally:
        proxy.stop()


def test_no_credentials_for_a_proxy_that_wants_them(net: CompanyNet) -> None:
    proxy = Chained(net, net.policy(auth_file=None))
    try:
        answer, _ = connect_get(proxy, "web.test", net.http.port)
        assert answer.startswith(b"HTTP/1.1 502")
        assert b"upstream-refused" in answer
    finally:
        proxy.stop()


def test_upstream_down_is_unreachable_and_never_direct(net: CompanyNet) -> None:
    before = len(net.http.requests()) + len(net.direct.requests())
    proxy = Chained(net, net.policy(upstream=f"http://{net.squid.address}:3129"))
    try:
        answer, _ = connect_get(proxy, "web.test", net.http.port)
        assert answer.startswith(b"HTTP/1.1 502"), answer
        assert b"upstream-unreachable" in answer, answer
        response = forward_get(proxy, f"http://web.test:{net.http.port}/down")
        assert response.startswith(b"HTTP/1.1 502")
        assert b"upstream-unreachable" in response
        # direct.test is reachable directly from A: still never dialled directly.
        answer, _ = connect_get(proxy, "direct.test", net.direct.port)
        assert answer.startswith(b"HTTP/1.1 502")
        assert b"upstream-unreachable" in answer
        assert len(net.http.requests()) + len(net.direct.requests()) == before
        tunnels = [d for d, f in proxy.named("net_connect") if f["protocol"] == "connect"]
        requests = [d for d, _ in proxy.named("net_request")]
        assert {str(d.reason) for d in tunnels + requests} == {"upstream-unreachable"}
    finally:
        proxy.stop()


def test_no_proxy_sends_a_named_host_direct(net: CompanyNet) -> None:
    proxy = Chained(net, net.policy(no_proxy=("direct.test",)))
    try:
        answer, response = connect_get(proxy, "direct.test", net.direct.port, "/direct")
        assert answer.startswith(b"HTTP/1.1 200")
        assert b"hello from" in response
        seen = [r for r in net.direct.requests() if r["path"] == "/direct"]
        assert seen
        assert seen[0]["peer"] != net.squid.address
        assert not [line for line in net.squid.log() if net.direct_address in line]
        (_, fields), *_ = proxy.named("net_connect")
        assert "upstream" not in fields
    finally:
        proxy.stop()
    # The twin: without no_proxy, direct.test goes to squid, which cannot reach it.
    proxy = Chained(net, net.policy())
    try:
        answer, _ = connect_get(proxy, "direct.test", net.direct.port)
        assert answer.startswith(b"HTTP/1.1 502"), answer
        assert b"upstream-refused" in answer, answer
        (_decision, fields), *_ = proxy.named("net_connect")
        assert fields["upstream_status"] == 503, fields
        assert net.squid.wait_log(f"CONNECT {net.direct_address}:{net.direct.port}")
    finally:
        proxy.stop()


def test_a_denied_host_never_reaches_the_upstream(net: CompanyNet) -> None:
    proxy = Chained(net, net.policy(deny=("evil-but-pinned.test",)))
    try:
        before = net.squid.log()
        for host in ("evil-but-pinned.test", "unlisted.test"):
            answer, _ = connect_get(proxy, host, net.http.port)
            assert answer.startswith(b"HTTP/1.1 403"), answer
            response = forward_get(proxy, f"http://{host}:{net.http.port}/denied")
            assert response.startswith(b"HTTP/1.1 403"), response
        # The allowed twin, through the same proxy, does reach squid (and is logged).
        answer, _ = connect_get(proxy, "web.test", net.http.port, "/allowed-twin")
        assert answer.startswith(b"HTTP/1.1 200")
        lines = net.squid.wait_log("/allowed-twin") or net.squid.wait_log(
            f"CONNECT {net.target_address}:{net.http.port}"
        )
        new = net.squid.log()[len(before) :]
        assert len(new) == 1, new
        assert "CONNECT" in new[0], new
        assert lines
    finally:
        proxy.stop()


def test_inspected_tls_is_re_originated_through_squid(net: CompanyNet) -> None:
    rules = (
        '[[network.rules]]\nhost = "tls.test"\nmethods = ["GET"]\npaths = ["/**"]\n'
        'action = "allow"\n'
    )
    policy = net.policy().replace("[network.upstream]", rules + "[network.upstream]")
    for trust in (True, False):
        proxy = Chained(net, policy, inspect=True, trust=trust)
        try:
            assert proxy.bundle is not None
            ctx = ssl.create_default_context(cafile=str(proxy.bundle))
            with proxy.connect() as sock:
                sock.sendall(
                    f"CONNECT tls.test:{net.https.port} HTTP/1.1\r\nHost: tls.test\r\n\r\n".encode()
                )
                assert _head(sock).startswith(b"HTTP/1.1 200")
                with ctx.wrap_socket(sock, server_hostname="tls.test") as tls:
                    tls.sendall(
                        b"GET /inspected HTTP/1.1\r\nHost: tls.test:%d\r\n"
                        b"Connection: close\r\n\r\n" % net.https.port
                    )
                    response = _read_all(tls)
            (decision, fields), *_ = proxy.named("net_request")
            assert fields.get("upstream") == net.squid.url, (response, fields, decision)
            if trust:
                assert response.startswith(b"HTTP/1.1 200")
                assert b"hello from" in response
                assert decision.allowed
                assert fields["upstream_status"] == 200
                seen = [r for r in net.https.requests() if r["path"] == "/inspected"]
                assert seen
                assert seen[0]["peer"] == net.squid.address
            else:
                # Without the company's CA, the upstream certificate is not trusted.
                assert response.startswith(b"HTTP/1.1 502"), response
                assert "not trusted" in decision.detail
        finally:
            proxy.stop()


def test_trace_never_reaches_the_upstream(net: CompanyNet, chained: Chained) -> None:
    """TRACE to the company proxy would echo stockade's Proxy-Authorization back: it is
    refused (405) before anything is sent; its GET twin goes through squid."""
    before = net.squid.log()
    for method, extra in (("TRACE", ""), ("TRACK", ""), ("OPTIONS", "Max-Forwards: 0\r\n")):
        with chained.connect() as sock:
            url = f"http://web.test:{net.http.port}/echo"
            sock.sendall(
                f"{method} {url} HTTP/1.1\r\nHost: web.test\r\n{extra}"
                "Connection: close\r\n\r\n".encode()
            )
            response = _read_all(sock)
        assert response.startswith(b"HTTP/1.1 405"), response
        assert b"alice" not in response
    assert not [r for r in net.http.requests() if r["path"] == "/echo"]
    response = forward_get(chained, f"http://web.test:{net.http.port}/echo-twin")
    assert response.startswith(b"HTTP/1.1 200"), response
    assert net.squid.wait_log("/echo-twin")
    new = net.squid.log()[len(before) :]
    assert len(new) == 1, new
    assert "/echo-twin" in new[0], new


def _gateway_proxy(net: CompanyNet, tmp_path: Path, policy_text: str) -> EgressProxy:
    """The proxy the gateway builds for ``policy_text`` (its own assembly, no identity)."""
    from stockade.gateway._kube import KubeClient, KubeConfig
    from stockade.gateway._server import Gateway, GatewayConfig

    kube = KubeClient(KubeConfig("127.0.0.1", 1, tmp_path / "token", tmp_path / "ca.pem"))
    events: list[dict[str, Any]] = []
    gateway = Gateway(GatewayConfig(policies=tmp_path), kube, namespace=None, audit=events.append)
    (proxy,) = gateway._build({"team": parse_policy_text(policy_text)}).values()
    assert isinstance(proxy, EgressProxy)
    return proxy


def test_gateway_proxies_honour_the_upstream(net: CompanyNet, tmp_path: Path) -> None:
    """A gateway policy's [network.upstream] carries its connections through squid."""
    text = net.policy()
    served = Chained(net, text, proxy=_gateway_proxy(net, tmp_path, text))
    try:
        path = "/through-the-gateway"
        answer, response = connect_get(served, "web.test", net.http.port, path)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b"hello from" in response, response
        seen = [r for r in net.http.requests() if r["path"] == path]
        assert seen
        assert seen[0]["peer"] == net.squid.address
        assert net.squid.wait_log(f"CONNECT {net.target_address}:{net.http.port}")
    finally:
        served.stop()
    # The twin: the same policy without the upstream cannot reach the target at all.
    direct = text.split("[network.upstream]")[0]
    served = Chained(net, direct, proxy=_gateway_proxy(net, tmp_path, direct))
    try:
        answer, _ = connect_get(served, "web.test", net.http.port)
        assert answer.startswith(b"HTTP/1.1 502"), answer
    finally:
        served.stop()
