"""Transparent capture in the proxy: a captured connection is decided as a CONNECT is.

The capture listeners here are bound on the host's own loopback at synthetic addresses
(every 127.0.0.0/8 address is local), which is what the sandbox's AnyIP routes make of
every address inside its namespace; the end-to-end runs are in tests/runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest

from stockade.egress.dns import AddressPool
from tests.conftest import require
from tests.egress.conftest import (
    TIMEOUT,
    ProxyHarness,
    RecordingHTTPServer,
    SinkServer,
    TLSServer,
)

Make = Callable[..., ProxyHarness]


def capture(harness: ProxyHarness, address: str, port: int) -> None:
    """Serve a capture listener at ``address:port`` on the harness's proxy."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(64)
    asyncio.run_coroutine_threadsafe(harness.proxy.serve_capture(sock), harness.loop)


def events(harness: ProxyHarness, count: int = 1) -> list[dict[str, object]]:
    return [
        {**e.fields, "verdict": str(e.decision.verdict), "reason": e.reason}
        for e in harness.wait_events("net_connect", count)
    ]


def assert_closed(conn: socket.socket) -> None:
    """The proxy closed the connection without relaying (a reset when data was unread)."""
    conn.settimeout(TIMEOUT)
    with contextlib.suppress(ConnectionResetError):
        assert conn.recv(10) == b""


@pytest.fixture
def pool() -> AddressPool:
    return AddressPool()


def captured_tls(
    make_proxy: Make, pool: AddressPool, tls_server: TLSServer
) -> tuple[ProxyHarness, socket.socket]:
    """A proxy capturing allowed.test's TLS port, and a client connected to it there."""
    h = make_proxy(tls_ports=(443, tls_server.port), pool=pool)
    address = str(pool.issue("allowed.test"))
    capture(h, address, tls_server.port)
    return h, socket.create_connection((address, tls_server.port), timeout=TIMEOUT)


def test_tls_capture_reaches_the_pinned_host_when_sni_matches(
    make_proxy: Make, pool: AddressPool, tls_server: TLSServer
) -> None:
    h, raw = captured_tls(make_proxy, pool, tls_server)
    with tls_server.client_context().wrap_socket(raw, server_hostname="allowed.test") as tls:
        tls.sendall(b"ping")
        assert tls.recv(100) == b"echo:ping"
    (event,) = events(h)
    assert event["verdict"] == "allow"
    assert event["mode"] == "transparent"
    assert (event["host"], event["port"], event["sni"]) == (
        "allowed.test",
        tls_server.port,
        "allowed.test",
    )
    assert event["address"] == "127.0.0.1"


def test_tls_capture_refuses_another_sni(
    make_proxy: Make, pool: AddressPool, tls_server: TLSServer
) -> None:
    h, raw = captured_tls(make_proxy, pool, tls_server)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    # The handshake dies: the proxy closes before dialling anything.
    with pytest.raises((ssl.SSLError, OSError)):
        context.wrap_socket(raw, server_hostname="evil.test")
    (event,) = events(h)
    assert (event["verdict"], event["reason"]) == ("deny", "sni-mismatch")
    assert tls_server.connections == 0


def test_capture_of_an_address_never_issued_is_refused(
    make_proxy: Make, pool: AddressPool, sink: SinkServer
) -> None:
    h = make_proxy(allow=("allowed.test",), pool=pool, hosts={"allowed.test": "127.0.0.1"})
    pool.issue("allowed.test")
    capture(h, "127.64.0.99", sink.port)
    with socket.create_connection(("127.64.0.99", sink.port), timeout=TIMEOUT) as conn:
        conn.sendall(b"data")
        assert_closed(conn)
    (event,) = events(h)
    assert (event["verdict"], event["reason"]) == ("deny", "host-not-allowed")
    assert event["host"] == "127.64.0.99"
    assert sink.connections == 0


def test_capture_of_a_name_the_rules_do_not_allow_is_refused(
    make_proxy: Make, pool: AddressPool, sink: SinkServer
) -> None:
    # An address issued for a name that the rules (now) refuse: decided at connect time.
    h = make_proxy(allow=("allowed.test",), pool=pool, hosts={"gone.test": "127.0.0.1"})
    address = str(pool.issue("gone.test"))
    capture(h, address, sink.port)
    with socket.create_connection((address, sink.port), timeout=TIMEOUT) as conn:
        assert_closed(conn)
    (event,) = events(h)
    assert (event["reason"], event["host"]) == ("host-not-allowed", "gone.test")
    assert sink.connections == 0


def test_opaque_capture_carries_a_server_first_protocol(
    make_proxy: Make, pool: AddressPool
) -> None:
    # A protocol where the server speaks first (SSH, SMTP, MySQL): nothing to sniff.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]

    def greet() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"SSH-2.0-test\r\n")
            conn.settimeout(TIMEOUT)
            conn.sendall(b"got:" + conn.recv(100))

    threading.Thread(target=greet, daemon=True).start()
    h = make_proxy(allow=(f"git.test:{port}",), hosts={"git.test": "127.0.0.1"}, pool=pool)
    address = str(pool.issue("git.test"))
    capture(h, address, port)
    try:
        with socket.create_connection((address, port), timeout=TIMEOUT) as conn:
            assert conn.recv(100) == b"SSH-2.0-test\r\n"
            conn.sendall(b"hi")
            assert conn.recv(100) == b"got:hi"
    finally:
        server.close()
    (event,) = events(h)
    assert (event["verdict"], event["protocol"], event["mode"]) == ("allow", "tcp", "transparent")


def test_opaque_capture_refuses_a_port_the_entry_does_not_name(
    make_proxy: Make, pool: AddressPool, sink: SinkServer
) -> None:
    h = make_proxy(allow=("git.test:22",), hosts={"git.test": "127.0.0.1"}, pool=pool)
    address = str(pool.issue("git.test"))
    capture(h, address, sink.port)
    with socket.create_connection((address, sink.port), timeout=TIMEOUT) as conn:
        assert_closed(conn)
    (event,) = events(h)
    assert event["reason"] == "host-not-allowed"
    assert sink.connections == 0


def test_connect_to_an_issued_address_means_its_name(
    make_proxy: Make, pool: AddressPool, tls_server: TLSServer
) -> None:
    # socks5:// and some CONNECT clients resolve first, through stockade's resolver.
    h = make_proxy(tls_ports=(443, tls_server.port), pool=pool)
    address = pool.issue("allowed.test")
    with h.connect() as conn:
        target = f"{address}:{tls_server.port}"
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert conn.recv(100).startswith(b"HTTP/1.1 200")
        with tls_server.client_context().wrap_socket(conn, server_hostname="allowed.test") as tls:
            tls.sendall(b"x")
            assert tls.recv(100) == b"echo:x"
    (event,) = events(h)
    assert (event["verdict"], event["host"]) == ("allow", "allowed.test")


@pytest.fixture
def origin80() -> Iterator[RecordingHTTPServer]:
    # Port 80 is how capture knows plain HTTP; binding it needs root.
    require(os.geteuid() == 0, "an origin on port 80 needs root")
    server = RecordingHTTPServer(("127.0.0.2", 80))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_http_capture_forwards_when_host_names_the_address(
    make_proxy: Make, pool: AddressPool, origin80: RecordingHTTPServer
) -> None:
    h = make_proxy(allow=("web.test",), hosts={"web.test": "127.0.0.2"}, pool=pool)
    address = str(pool.issue("web.test"))
    capture(h, address, 80)
    conn = http.client.HTTPConnection(address, 80, timeout=TIMEOUT)
    conn.request("GET", "/page?q=1", headers={"Host": "web.test"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.read() == b"GET /page?q=1 host=web.test body=0"
    conn.close()
    request = h.last("net_request")
    assert request.decision.allowed
    assert (request.fields["host"], request.fields["mode"]) == ("web.test", "transparent")


def test_http_capture_refuses_a_host_header_naming_another_host(
    make_proxy: Make, pool: AddressPool, origin80: RecordingHTTPServer
) -> None:
    h = make_proxy(allow=("web.test", "other.test"), hosts={"web.test": "127.0.0.2"}, pool=pool)
    address = str(pool.issue("web.test"))
    capture(h, address, 80)
    conn = http.client.HTTPConnection(address, 80, timeout=TIMEOUT)
    conn.request("GET", "/", headers={"Host": "other.test"})
    assert conn.getresponse().status == 400
    conn.close()
    request = h.last("net_request")
    assert request.reason == "bad-request"
    assert (request.fields["host"], request.fields["port"]) == ("web.test", 80)
    assert "other.test" in str(request.fields.get("detail", request.decision.detail))
    assert origin80.requests == []


@pytest.mark.parametrize(("method", "headers"), [("TRACE", {}), ("OPTIONS", {"Max-Forwards": "0"})])
def test_http_capture_refuses_echo_requests_before_any_contact(
    make_proxy: Make,
    pool: AddressPool,
    origin80: RecordingHTTPServer,
    method: str,
    headers: dict[str, str],
) -> None:
    h = make_proxy(allow=("web.test",), hosts={"web.test": "127.0.0.2"}, pool=pool)
    address = str(pool.issue("web.test"))
    capture(h, address, 80)
    conn = http.client.HTTPConnection(address, 80, timeout=TIMEOUT)
    conn.request(method, "/", headers={"Host": "web.test", **headers})
    assert conn.getresponse().status == 405
    conn.close()
    assert origin80.connections == 0
    request = h.last("net_request")
    assert request.reason == "bad-request"
    assert (request.fields["host"], request.fields["mode"]) == ("web.test", "transparent")
    # The twin: a GET through the same capture reaches the origin.
    conn = http.client.HTTPConnection(address, 80, timeout=TIMEOUT)
    conn.request("GET", "/twin", headers={"Host": "web.test"})
    assert conn.getresponse().status == 200
    conn.close()
