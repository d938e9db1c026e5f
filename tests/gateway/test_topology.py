"""The gateway on a real network topology (research/scale-out.md §6.2 tier 4).

Three network namespaces and two veth pairs, made here (see netns.py): ``sbx`` holds the
pod addresses and a single route, to the gateway (the NetworkPolicy fence, emulated);
``gw`` runs ``stockade gateway serve --listen 10.77.1.1:3128 --listen-pod-network`` as a
real subprocess against the fake API server (whose listening socket lives on ``gw``'s
loopback); ``inet`` serves HTTP on :80 and HTTPS on :443 with a test CA, under ``.test``
names pinned in the policies. A client bound to pod A's address gets policy A, one bound
to pod B's gets policy B. Needs root and iproute2 (CI has both).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from tests.conftest import require
from tests.gateway.harness import API_HOST, pod
from tests.gateway.netns import GW_POD_SIDE, INET, Topology, existing
from tests.gateway.process import ApiThread, GatewayProcess

POD_A, POD_B, STRANGER = "10.77.1.2", "10.77.1.3", "10.77.1.9"
NAMES = ("web.test", "api.test", "other.test", "b.test")
REAL_KEY = "real-key-4f1c9e0b7a2d6358"
PLACEHOLDER = "stockade-ph-0123456789abcdef0123456789abcdef"
PINS = "{ " + ", ".join(f'"{n}" = "{INET}"' for n in NAMES) + " }"

POLICY_A = f"""
[network]
allow = ["web.test", "api.test", "other.test"]
hosts = {PINS}
tls = {{ upstream_ca = "{{ca}}" }}

[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/v1/messages"]

[secrets.API_KEY]
from = "env:API_KEY"
hosts = ["api.test"]
header = "x-api-key"

[kubernetes]
namespaces = ["team"]
"""

POLICY_B = f"""
[network]
allow = ["b.test", "api.test"]
hosts = {PINS}

[kubernetes]
namespaces = ["team"]
"""


@dataclass
class Seen:
    """One request as an origin in ``inet`` received it."""

    scheme: str
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Origins:
    """HTTP on INET:80 and HTTPS on INET:443, one thread per connection."""

    tls: ssl.SSLContext
    seen: list[Seen] = field(default_factory=list)
    listeners: list[socket.socket] = field(default_factory=list)

    def serve(self, sock: socket.socket, scheme: str) -> None:
        self.listeners.append(sock)
        threading.Thread(target=self._accept, args=(sock, scheme), daemon=True).start()

    def _accept(self, sock: socket.socket, scheme: str) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn, scheme), daemon=True).start()

    def _one(self, conn: socket.socket, scheme: str) -> None:
        try:
            conn.settimeout(10)
            if scheme == "https":
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            need = int(headers.get("content-length", "0"))
            while len(body) < need and (chunk := conn.recv(65536)):
                body += chunk
            self.seen.append(Seen(scheme, method, path, headers))
            text = f"{headers.get('host', '').split(':')[0]} {scheme} {method} {path}".encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(text), text)
            )
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        for sock in self.listeners:
            sock.close()


@dataclass
class World:
    topo: Topology
    gateway: GatewayProcess
    origins: Origins
    gateway_ca: Path
    inet_ca: Path

    def _proxy(self, source: str) -> socket.socket:
        return self.topo.connect(self.topo.sbx, GW_POD_SIDE, 3128, source=source)

    def get(self, source: str, url: str) -> tuple[int, dict[str, str], bytes]:
        """A forward-proxy GET from ``source`` in sbx."""
        sock = self._proxy(source)
        host = url.split("/")[2]
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return _read_response(sock)

    def https(
        self,
        source: str,
        host: str,
        method: str,
        path: str,
        *,
        cafile: Path,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """CONNECT host:443 from ``source``, then one request over TLS trusting ``cafile``;
        a refused CONNECT gives its own status."""
        sock = self._proxy(source)
        sock.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1]) if head else 0
        if status != 200:
            sock.close()
            return status, _headers(head), b""
        context = ssl.create_default_context(cafile=str(cafile))
        tls = context.wrap_socket(sock, server_hostname=host)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        tls.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        return _read_response(tls)

    def seen(self, path: str) -> list[Seen]:
        return [s for s in self.origins.seen if s.path == path]


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        k, _, v = line.partition(":")
        out[k.strip().lower()] = v.strip()
    return out


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    with sock:
        while True:
            try:
                chunk = sock.recv(65536)
            except (OSError, ssl.SSLError):
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    headers = _headers(head)
    if headers.get("transfer-encoding") == "chunked":  # as the inspect layer re-frames
        body = _dechunk(body)
    return status, headers, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require(
        os.geteuid() == 0 and shutil.which("ip") is not None,
        "network namespaces need root and iproute2 (ip)",
    )
    tmp = tmp_path_factory.mktemp("topology")
    topo = Topology((POD_A, POD_B, STRANGER))
    names = {topo.sbx, topo.gw, topo.inet}
    api: ApiThread | None = None
    gateway: GatewayProcess | None = None
    origins: Origins | None = None
    try:
        topo.create()
        # Origins in inet, with their own CA.
        inet_ca = trustme.CA()
        inet_ca_file = tmp / "inet-ca.pem"
        inet_ca.cert_pem.write_to_path(str(inet_ca_file))
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        inet_ca.issue_cert(*NAMES).configure_cert(tls)
        origins = Origins(tls)
        origins.serve(topo.listen(topo.inet, INET, 80), "http")
        origins.serve(topo.listen(topo.inet, INET, 443), "https")
        # The API server listens on the gateway namespace's loopback.
        api = ApiThread(tmp, topo.listen(topo.gw, API_HOST, 0))
        api.put(pod("pod-a", POD_A, policy="a", claim="claim-a"))
        api.put(pod("pod-b", POD_B, policy="b"))
        # Policies, the interception CA, the bound credential.
        from stockade.egress.inspect import CertificateAuthority

        policies, ca_dir, secrets = tmp / "policies", tmp / "ca", tmp / "secrets"
        policies.mkdir()
        (policies / "a.toml").write_text(POLICY_A.replace("{ca}", str(inet_ca_file)))
        (policies / "b.toml").write_text(POLICY_B)
        CertificateAuthority.for_user(ca_dir)
        secrets.mkdir()
        (secrets / "API_KEY").write_text(REAL_KEY)
        (secrets / "API_KEY.placeholder").write_text(PLACEHOLDER)
        gateway = GatewayProcess(
            tmp,
            api,
            [
                "--listen",
                f"{GW_POD_SIDE}:3128",
                "--listen-pod-network",
                "--policies",
                str(policies),
                "--ca",
                str(ca_dir),
                "--secrets",
                str(secrets),
                "--namespace",
                "team",
                "--cluster-cidrs",
                "10.77.1.0/24",
            ],
            metrics=("127.0.0.1", 9102),
            prefix=("ip", "netns", "exec", topo.gw),
            connect=lambda h, p: topo.connect(topo.gw, h, p, timeout=3.0),
        )
        gateway.wait_ready()
        yield World(topo, gateway, origins, ca_dir / "ca-cert.pem", inet_ca_file)
    finally:
        if gateway is not None:
            gateway.close()
        if origins is not None:
            origins.close()
        if api is not None:
            api.close()
        topo.destroy()
        assert not names & existing(), "a network namespace was left behind"


# -- the fence -----------------------------------------------------------------------------


def test_sandbox_reaches_only_the_gateway(world: World) -> None:
    topo = world.topo
    # Direct to the origins: no route.
    for port in (80, 443):
        with pytest.raises(OSError):
            topo.connect(topo.sbx, INET, port, source=POD_A, timeout=2.0).close()
    # Twin: the origin is up (reachable from gw), and the gateway is reachable from sbx.
    topo.connect(topo.gw, INET, 80).close()
    assert world.get(POD_A, "http://web.test/fence")[0] == 200


def test_gateway_namespace_is_not_a_router(world: World) -> None:
    # Even with a route through the gateway's address (which the fence would not allow
    # a pod to add), packets are not forwarded: only the proxy's own connections leave.
    topo = world.topo
    subprocess.run(
        ["ip", "-n", topo.sbx, "route", "add", "10.77.2.0/24", "via", GW_POD_SIDE],
        check=True,
    )
    try:
        with pytest.raises(OSError):
            topo.connect(topo.sbx, INET, 80, source=POD_A, timeout=1.0).close()
    finally:
        subprocess.run(["ip", "-n", topo.sbx, "route", "del", "10.77.2.0/24"], check=True)
    assert world.get(POD_A, "http://web.test/")[0] == 200  # twin: through the proxy


# -- policy per pod ------------------------------------------------------------------------


def test_pod_a_reaches_what_policy_a_allows(world: World) -> None:
    status, _, body = world.get(POD_A, "http://web.test/a")
    assert (status, body) == (200, b"web.test http GET /a")
    status, headers, _ = world.get(POD_A, "http://b.test/a")
    assert status == 403
    assert headers["x-stockade-reason"] == "host-not-allowed"


def test_pod_b_gets_policy_b(world: World) -> None:
    status, _, body = world.get(POD_B, "http://b.test/b")
    assert (status, body) == (200, b"b.test http GET /b")
    status, headers, _ = world.get(POD_B, "http://web.test/b")
    assert status == 403
    assert headers["x-stockade-reason"] == "host-not-allowed"


def test_unknown_address_in_the_pod_network_is_refused(world: World) -> None:
    status, headers, _ = world.get(STRANGER, "http://web.test/stranger")
    assert status == 403
    assert headers["x-stockade-reason"] == "unknown-peer"
    assert not world.seen("/stranger")
    assert world.get(POD_A, "http://web.test/stranger")[0] == 200  # twin


def test_connect_is_decided_per_pod(world: World) -> None:
    # A's CONNECT to b.test is refused; B's succeeds (B's tunnel is opaque: it trusts
    # the origin's own CA).
    assert world.https(POD_A, "b.test", "GET", "/t", cafile=world.gateway_ca)[0] == 403
    status, _, body = world.https(POD_B, "b.test", "GET", "/t", cafile=world.inet_ca)
    assert (status, body) == (200, b"b.test https GET /t")


# -- inspected requests: rules and the bound credential ---------------------------------------


def test_method_and_path_rules_apply_to_pod_a_only(world: World) -> None:
    ca = world.gateway_ca
    status, headers, _ = world.https(POD_A, "api.test", "GET", "/v1/models", cafile=ca)
    assert status == 403
    assert headers["x-stockade-reason"] == "no-rule-matched"
    status, _, _ = world.https(POD_A, "api.test", "POST", "/v1/files", cafile=ca)
    assert status == 403
    assert not world.seen("/v1/models")
    assert not world.seen("/v1/files")
    # Plain HTTP to a ruled host would bypass its rules: refused for A.
    status, headers, _ = world.get(POD_A, "http://api.test/v1/messages")
    assert status == 400
    assert headers["x-stockade-reason"] == "unsupported-protocol"
    assert world.get(POD_B, "http://api.test/plain")[0] == 200  # twin: B has no rules
    # Twins: the rule's own method and path pass for A; B has no rules for api.test.
    status, _, body = world.https(POD_A, "api.test", "POST", "/v1/messages", cafile=ca)
    assert (status, body) == (200, b"api.test https POST /v1/messages")
    status, _, _ = world.https(POD_B, "api.test", "GET", "/v1/models", cafile=world.inet_ca)
    assert status == 200
    assert len(world.seen("/v1/models")) == 1


def test_credential_is_injected_for_pod_a_and_the_bound_host_only(world: World) -> None:
    key = {"x-api-key": PLACEHOLDER}
    ca = world.gateway_ca
    before = len(world.seen("/v1/messages"))
    # Pod A, bound host: the placeholder is replaced by the real value.
    status, _, _ = world.https(POD_A, "api.test", "POST", "/v1/messages", cafile=ca, headers=key)
    assert status == 200
    got = world.seen("/v1/messages")[before:]
    assert [s.headers.get("x-api-key") for s in got] == [REAL_KEY]
    # Pod A, another allowed host: not inspected (no rule, no binding), so an opaque
    # tunnel to the origin itself, which gets the placeholder, never the value.
    status, _, _ = world.https(
        POD_A, "other.test", "POST", "/elsewhere", cafile=world.inet_ca, headers=key
    )
    assert status == 200
    assert [s.headers.get("x-api-key") for s in world.seen("/elsewhere")] == [PLACEHOLDER]
    # Pod B, the same request to the same host: B's policy binds no credential.
    status, _, _ = world.https(
        POD_B, "api.test", "POST", "/v1/messages", cafile=world.inet_ca, headers=key
    )
    assert status == 200
    got = world.seen("/v1/messages")[before:]
    assert [s.headers.get("x-api-key") for s in got] == [REAL_KEY, PLACEHOLDER]
    # The value went to api.test, for pod A, and nowhere else.
    carried = [s for s in world.origins.seen if REAL_KEY in str(s.headers)]
    assert {(s.scheme, s.headers["host"], s.path) for s in carried} == {
        ("https", "api.test", "/v1/messages")
    }


# -- audit -------------------------------------------------------------------------------------


def test_every_decision_is_audited_with_its_pod(world: World) -> None:
    world.get(POD_A, "http://web.test/audit-a")
    world.get(POD_B, "http://web.test/audit-b")
    events = [e for e in world.gateway.events() if e.get("mode") == "gateway"]
    decided = [e for e in events if e.get("event") in ("net_connect", "net_request")]
    assert decided
    for event in decided:
        if event.get("peer") == POD_A:
            assert (event["pod"], event["policy"], event["claim"]) == ("pod-a", "a", "claim-a")
        elif event.get("peer") == POD_B:
            assert (event["pod"], event["policy"]) == ("pod-b", "b")
        else:
            assert event["peer"] == STRANGER
            assert event["verdict"] == "deny"
            assert "pod" not in event
    by_path = {e.get("path"): e for e in decided if e.get("event") == "net_request"}
    assert by_path["/audit-a"]["verdict"] == "allow"
    assert by_path["/audit-a"]["namespace"] == "team"
    assert by_path["/audit-a"]["pod_uid"] == "uid-pod-a"
    assert by_path["/audit-b"]["verdict"] == "deny"
    assert by_path["/audit-b"]["pod"] == "pod-b"


def test_rotated_credential_is_used_by_the_next_request(world: World) -> None:
    # A Secret volume update swaps the file (here: an atomic rename); the next
    # connection must carry the new value, the old one no longer.
    secrets = world.gateway.audit_path.parent / "secrets"
    rotated = "real-key-rotated-9d8c7b6a5f4e"
    new = secrets / ".API_KEY.new"
    new.write_text(rotated)
    os.replace(new, secrets / "API_KEY")
    generation = max(
        e.get("generation", 0) for e in world.gateway.events() if e["event"] == "policy_loaded"
    )
    deadline = time.monotonic() + 5
    while not any(
        e["event"] == "policy_loaded" and e["generation"] > generation
        for e in world.gateway.events()
    ):
        assert time.monotonic() < deadline, "the gateway did not reload its credentials"
        time.sleep(0.05)
    key = {"x-api-key": PLACEHOLDER}
    status, _, _ = world.https(
        POD_A, "api.test", "POST", "/v1/messages", cafile=world.gateway_ca, headers=key
    )
    assert status == 200
    assert world.seen("/v1/messages")[-1].headers["x-api-key"] == rotated
