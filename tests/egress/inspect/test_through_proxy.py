"""End to end through the egress proxy: CONNECT → SNI check → InspectingTunnel → upstream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from stockade.audit import AuditLog
from stockade.egress import EgressProxy, EgressRules
from stockade.egress.inspect import (
    CertificateAuthority,
    InspectLayer,
    SecretStore,
    write_trust_bundle,
)
from stockade.policy import parse_policy_text
from tests.egress.conftest import read_head
from tests.egress.inspect.harness import REAL_KEY, Client, Response, Upstream

POLICY = """
[network]
allow = ["api.test", "registry.test", "other.test"]
hosts = {{ "api.test" = "127.0.0.1", "registry.test" = "127.0.0.1", "other.test" = "127.0.0.1" }}
tls_ports = [{port}]
tls = {{ upstream_ca = "{ca}" }}

[[network.rules]]
host = "registry.test"
methods = ["GET", "HEAD"]

[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/v1/messages", "/v1/files"]

[secrets.ANTHROPIC_API_KEY]
from = "env:REAL_API_KEY"
hosts = ["api.test"]
header = "x-api-key"
"""


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@dataclass
class Proxied:
    upstream: Upstream
    proxy_port: int
    bundle: Path
    upstream_ca: Path
    audit: AuditLog
    store: SecretStore
    layer: InspectLayer

    def connect(self, host: str, port: int | None = None) -> tuple[socket.socket, bytes]:
        """CONNECT through the proxy (blocking); the socket and the proxy's answer."""
        port = port or self.upstream.port
        sock = socket.create_connection(("127.0.0.1", self.proxy_port), timeout=10)
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        return sock, read_head(sock)

    def https(self, host: str, method: str, target: str, **kw: Any) -> Response:
        sock, answer = self.connect(host)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        client = Client(sock, self.bundle, host)
        try:
            return client.request(method, target, host=f"{host}:{self.upstream.port}", **kw)
        finally:
            client.close()

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.audit.events if e["event"] == name]


@contextlib.asynccontextmanager
async def proxied(tmp: Path, policy_text: str = POLICY) -> AsyncIterator[Proxied]:
    ca = trustme.CA()
    ca_file = tmp / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = Upstream(ca)
    await upstream.start()
    policy = parse_policy_text(
        policy_text.format(port=upstream.port, ca=ca_file), "t.toml", workspace=tmp
    )
    audit = AuditLog("run", None)
    interception = CertificateAuthority.ephemeral()
    bundle = write_trust_bundle(interception, tmp / "bundle.pem")
    store = SecretStore.resolve(policy.secrets, {"REAL_API_KEY": REAL_KEY})
    layer = InspectLayer.from_policy(policy, interception, audit, secrets=store)
    proxy = EgressProxy(EgressRules.from_policy(policy.network), audit, inspect=layer)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    serving = asyncio.get_running_loop().create_task(proxy.serve_socket(listener))
    try:
        yield Proxied(upstream, port, bundle, ca_file, audit, store, layer)
    finally:
        proxy.close()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(serving, 5)
        layer.close()
        await upstream.stop()


def test_files_api_with_attacker_key_is_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("ATTACKER-KEY-sk-ant-0000111122223333\n")
    (workspace / "secret.txt").write_text("the quarterly numbers")

    async def go() -> None:
        async with proxied(tmp_path) as p:

            def script() -> Response:
                # What a prompt-injected script does: a key planted in the workspace,
                # a file POSTed to the Files API on the allow-listed host.
                key = (workspace / "notes.txt").read_text().strip()
                data = (workspace / "secret.txt").read_bytes()
                return p.https(
                    "api.test", "POST", "/v1/files", headers=[("x-api-key", key)], body=data
                )

            r = await asyncio.to_thread(script)
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "foreign-credential"
            assert not p.upstream.seen("ATTACKER")
            assert p.upstream.received == []
            await asyncio.sleep(0.1)
            (event,) = p.events("net_request")
            assert event["reason"] == "foreign-credential"
            assert event["path"] == "/v1/files"
            assert "ATTACKER" not in str(p.audit.events)

    run(go())


def test_files_api_with_placeholder_reaches_upstream_with_real_key(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:
            ph = p.store.environment()["ANTHROPIC_API_KEY"]
            r = await asyncio.to_thread(
                p.https, "api.test", "POST", "/v1/files", headers=[("x-api-key", ph)], body=b"x"
            )
            assert r.status == 200
            assert p.upstream.received[0].headers["x-api-key"] == REAL_KEY
            await asyncio.sleep(0.1)
            (connect,) = p.events("net_connect")
            assert connect["inspected"] is True
            assert connect["verdict"] == "allow"

    run(go())


def test_registry_read_allowed_and_publish_refused_through_proxy(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:
            ok = await asyncio.to_thread(p.https, "registry.test", "GET", "/pkg")
            put = await asyncio.to_thread(p.https, "registry.test", "PUT", "/pkg", body=b"{}")
            assert (ok.status, put.status) == (200, 403)
            assert [r.method for r in p.upstream.received] == ["GET"]

    run(go())


def test_uninspected_host_stays_an_opaque_tunnel(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:

            def talk() -> Response:
                sock, answer = p.connect("other.test")
                assert answer.startswith(b"HTTP/1.1 200")
                # The real upstream certificate arrives: it is not intercepted.
                client = Client(sock, p.upstream_ca, "other.test")
                try:
                    host = f"other.test:{p.upstream.port}"
                    return client.request("POST", "/anything", host=host, body=b"data")
                finally:
                    client.close()

            r = await asyncio.to_thread(talk)
            assert r.status == 200
            await asyncio.sleep(0.1)
            assert p.events("net_request") == []
            (connect,) = p.events("net_connect")
            assert "inspected" not in connect

    run(go())


def test_inspected_host_on_a_plain_port_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:
            sock, answer = await asyncio.to_thread(p.connect, "api.test", 8080)
            sock.close()
            assert answer.startswith(b"HTTP/1.1 400")
            await asyncio.sleep(0.1)
            (connect,) = p.events("net_connect")
            assert connect["reason"] == "unsupported-protocol"

    run(go())


def test_plain_http_to_an_inspected_host_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:

            def talk() -> bytes:
                with socket.create_connection(("127.0.0.1", p.proxy_port), timeout=10) as s:
                    url = f"http://registry.test:{p.upstream.port}/pkg"
                    s.sendall(f"GET {url} HTTP/1.1\r\nHost: registry.test\r\n\r\n".encode())
                    return s.recv(4096)

            answer = await asyncio.to_thread(talk)
            assert answer.startswith(b"HTTP/1.1 400")
            assert p.upstream.received == []

    run(go())


IDN_POLICY = """
[network]
allow = ["straße.test"]
hosts = {{ "straße.test" = "127.0.0.1" }}
tls_ports = [{port}]
tls = {{ upstream_ca = "{ca}" }}

[[network.rules]]
host = "straße.test"
methods = ["GET"]
"""


def test_rules_on_an_idn_host_are_enforced(tmp_path: Path) -> None:
    """A rule on straße.test applies to the A-label the allow-list admits (IDNA 2008):
    the host is intercepted, PUT is refused, its GET twin passes."""

    async def go() -> None:
        async with proxied(tmp_path, IDN_POLICY) as p:
            host = "xn--strae-oqa.test"
            put = await asyncio.to_thread(p.https, host, "PUT", "/x", body=b"data")
            assert put.status == 403
            assert put.headers["x-stockade-reason"] == "no-rule-matched"
            get = await asyncio.to_thread(p.https, host, "GET", "/x")
            assert get.status == 200
            assert [r.method for r in p.upstream.received] == ["GET"]
            assert [e["method"] for e in p.events("net_request")] == ["PUT", "GET"]

    run(go())


def test_an_inspect_event_that_cannot_be_written_closes_the_proxy(tmp_path: Path) -> None:
    """build_proxy's one fail-closed rule covers the inspect layer's events too: a
    ``net_request`` that cannot be written stops the proxy (it would run unaudited); the
    twin whose sink works keeps serving."""
    from stockade.egress._assemble import build_proxy

    async def go(broken: bool) -> bool:
        ca = trustme.CA()
        ca_file = tmp_path / f"upstream-ca-{broken}.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        upstream = Upstream(ca)
        await upstream.start()
        policy = parse_policy_text(
            POLICY.format(port=upstream.port, ca=ca_file), "t.toml", workspace=tmp_path
        )
        written: list[str] = []

        def sink(decision: object, fields: dict[str, Any]) -> None:
            if broken and fields["event"] == "net_request":
                raise OSError("disk full")
            written.append(fields["event"])

        interception = CertificateAuthority.ephemeral()
        bundle = write_trust_bundle(interception, tmp_path / f"bundle-{broken}.pem")
        store = SecretStore.resolve(policy.secrets, {"REAL_API_KEY": REAL_KEY})
        proxy = build_proxy(policy, sink, caller="test", ca_fix="-", ca=interception, secrets=store)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        serving = asyncio.get_running_loop().create_task(proxy.serve_socket(listener))
        p = Proxied(upstream, port, bundle, ca_file, AuditLog("x", None), store, proxy.inspect)  # type: ignore[arg-type]
        try:
            r = await asyncio.to_thread(p.https, "registry.test", "GET", "/x")
            assert r.status == 200
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(serving), 5 if broken else 0.5)
            return serving.done()
        finally:
            proxy.close()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(serving, 5)
            if proxy.inspect is not None:
                proxy.inspect.close()  # type: ignore[attr-defined]
            await upstream.stop()

    assert asyncio.run(go(broken=True)) is True
    assert asyncio.run(go(broken=False)) is False
