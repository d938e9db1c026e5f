"""The proxy end to end over real sockets: forward HTTP, CONNECT, SOCKS5, and refusals.

Every "blocked" case has an "allowed" twin, and every blocked case checks that the
upstream (or a sink standing where the attacker's server would be) saw nothing.
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import socket
from collections.abc import Callable

import pytest

from tests.egress.conftest import (
    TIMEOUT,
    ProxyHarness,
    RecordingHTTPServer,
    SinkServer,
    read_all,
    read_http_response,
    socks_connect,
    static_resolver,
)

MakeProxy = Callable[..., ProxyHarness]


def forward(proxy: ProxyHarness, url: str, method: str = "GET") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    try:
        conn.request(method, url)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def connect_status(proxy: ProxyHarness, authority: str) -> tuple[int, socket.socket]:
    sock = proxy.connect()
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    status, _ = read_http_response(sock)
    return status, sock


# -- forward proxy ----------------------------------------------------------------------


def test_forward_get_allowed_and_keep_alive(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    conn.request("GET", f"http://allowed.test:{origin.port}/one?q=secret")
    first = conn.getresponse()
    assert first.status == 200
    assert first.read() == f"GET /one?q=secret host=allowed.test:{origin.port} body=0".encode()
    client_port = conn.sock.getsockname()[1]
    conn.request("POST", f"http://allowed.test:{origin.port}/two", body=b"payload")
    second = conn.getresponse()
    assert second.read() == f"POST /two host=allowed.test:{origin.port} body=7".encode()
    # The same client connection carried both requests.
    assert conn.sock.getsockname()[1] == client_port
    conn.close()
    requests = proxy.wait_events("net_request", 2)
    assert [e.reason for e in requests] == ["allowed", "allowed"]
    assert requests[0].fields["path"] == "/one"  # the query is not logged
    assert requests[0].fields["address"] == "127.0.0.1"
    assert requests[0].fields["address_class"] == "loopback"
    connects = proxy.wait_events("net_connect", 1)
    assert len(connects) == 1
    assert connects[0].fields["requests"] == 2


def test_a_connection_whose_request_was_refused_does_not_name_its_host(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    conn.request("GET", f"http://evil.test:{origin.port}/")
    assert conn.getresponse().status == 403
    conn.close()
    (request,) = proxy.wait_events("net_request", 1)
    assert (request.reason, request.fields["host"]) == ("host-not-allowed", "evil.test")
    (connection,) = proxy.wait_events("net_connect", 1)
    # The refusal is the request's event; the connection presents no host as allowed.
    assert connection.fields["host"] == ""
    # Its twin: a connection whose request went through names the host it reached.
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    conn.request("GET", f"http://allowed.test:{origin.port}/")
    assert conn.getresponse().status == 200
    conn.close()
    connects = proxy.wait_events("net_connect", 2)
    assert connects[1].fields["host"] == "allowed.test"


def test_forward_strips_proxy_and_hop_by_hop_headers(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    sock.sendall(
        f"GET http://allowed.test:{origin.port}/h HTTP/1.1\r\n"
        "Host: evil.test\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
        "Proxy-Connection: keep-alive\r\nConnection: close, X-Drop\r\nX-Drop: 1\r\n"
        "X-Keep: 2\r\n\r\n".encode()
    )
    status, _ = read_http_response(sock)
    sock.close()
    assert status == 200
    _, path, headers, _ = origin.requests[-1]
    assert path == "/h"
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["host"] == f"allowed.test:{origin.port}"
    assert "proxy-authorization" not in lowered
    assert "proxy-connection" not in lowered
    assert "x-drop" not in lowered
    assert lowered["x-keep"] == "2"


def test_forward_chunked_response_and_head(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    assert forward(proxy, f"http://allowed.test:{origin.port}/chunked") == (
        200,
        b"hello chunked world",
    )
    status, body = forward(proxy, f"http://allowed.test:{origin.port}/x", "HEAD")
    assert (status, body) == (200, b"")


def test_forward_large_body(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy()
    status, body = forward(proxy, f"http://allowed.test:{origin.port}/big/{5 * 1024 * 1024}")
    assert status == 200
    assert len(body) == 5 * 1024 * 1024
    event = proxy.last("net_request")
    assert event.fields["bytes_down"] > 5 * 1024 * 1024


def test_forward_denied_host_gets_403_before_dns(make_proxy: MakeProxy, sink: SinkServer) -> None:
    resolver = static_resolver({"evil.test": ["127.0.0.1"]})
    proxy = make_proxy(resolver=resolver)
    status, body = forward(proxy, f"http://evil.test:{sink.port}/?d=CANARY")
    assert status == 403
    assert b"host-not-allowed" in body
    assert resolver.asked == []  # type: ignore[attr-defined]
    assert sink.connections == 0
    event = proxy.last("net_request")
    assert event.reason == "host-not-allowed"
    assert event.fields["host"] == "evil.test"


def test_forward_refuses_https_scheme_and_origin_form(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    for target in ("https://allowed.test/", "/just/a/path", "http://allowed.test@evil.test/"):
        sock = proxy.connect()
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        status, _ = read_http_response(sock)
        sock.close()
        assert status == 400, target


@pytest.mark.parametrize(
    "head",
    [
        b"POST http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET http://allowed.test:{p}/ HTTP/1.1\nHost: a\n\n",
        b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
        b"POST http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\nx",
        b"POST http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
        b"Content-Length: 1\r\n\r\nx",
        b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
        b"GET http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nX\x00: a\r\n\r\n",
        b"POST http://allowed.test:{p}/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\nabc\r\n0\r\n\r\n",
    ],
    ids=["cl+te", "bare-lf", "obs-fold", "cl-list", "two-cl", "bare-cr", "nul", "chunk-lf"],
)
def test_ambiguous_framing_refused(
    make_proxy: MakeProxy, origin: RecordingHTTPServer, head: bytes
) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    sock.sendall(head.replace(b"{p}", str(origin.port).encode()))
    status, _ = read_http_response(sock)
    sock.close()
    assert status == 400
    # Nothing reached the origin except, for the chunk case, a request cut short.
    assert all(r[3] == b"" for r in origin.requests)


# -- CONNECT -------------------------------------------------------------------------------


def test_connect_allowed_relays_both_ways(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    status, sock = connect_status(proxy, f"allowed.test:{origin.port}")
    assert status == 200
    sock.sendall(b"GET /tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
    reply = read_all(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b"GET /tunnel host=allowed.test body=0")
    event = proxy.last()
    assert (event.reason, event.fields["protocol"]) == ("allowed", "connect")
    assert event.fields["bytes_up"] > 0
    assert event.fields["bytes_down"] == len(reply)


def test_connect_denied_host(make_proxy: MakeProxy, sink: SinkServer) -> None:
    proxy = make_proxy(hosts={"allowed.test": "127.0.0.1", "evil.test": "127.0.0.1"})
    status, sock = connect_status(proxy, f"evil.test:{sink.port}")
    sock.close()
    assert status == 403
    assert sink.connections == 0
    assert proxy.last().reason == "host-not-allowed"


def test_connect_needs_a_port(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    status, sock = connect_status(proxy, "allowed.test")
    sock.close()
    assert status == 400


def test_connect_half_close(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    """The client shuts its write side after the request; the reply still arrives."""
    proxy = make_proxy()
    status, sock = connect_status(proxy, f"allowed.test:{origin.port}")
    assert status == 200
    sock.sendall(b"GET /half HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
    sock.shutdown(socket.SHUT_WR)
    reply = read_all(sock)
    sock.close()
    assert reply.endswith(b"GET /half host=allowed.test body=0")


def test_deny_wins_over_allow(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy(
        allow=("*.allowed.test", "allowed.test"),
        deny=("bad.allowed.test",),
        hosts={"allowed.test": "127.0.0.1", "bad.allowed.test": "127.0.0.1"},
    )
    assert forward(proxy, f"http://bad.allowed.test:{origin.port}/")[0] == 403
    assert proxy.last("net_request").reason == "host-denied"
    assert forward(proxy, f"http://allowed.test:{origin.port}/")[0] == 200


def test_wildcard_does_not_match_apex(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy(
        allow=("*.allowed.test",),
        hosts={"allowed.test": "127.0.0.1", "api.allowed.test": "127.0.0.1"},
    )
    assert forward(proxy, f"http://api.allowed.test:{origin.port}/")[0] == 200
    assert forward(proxy, f"http://allowed.test:{origin.port}/")[0] == 403
    assert len(origin.requests) == 1


@pytest.mark.parametrize("spelling", ["ALLOWED.TEST", "Allowed.Test.", "allowed.test."])
def test_case_and_trailing_dot_decided_alike(
    make_proxy: MakeProxy, origin: RecordingHTTPServer, spelling: str
) -> None:
    proxy = make_proxy()
    assert forward(proxy, f"http://{spelling}:{origin.port}/")[0] == 200
    assert proxy.last("net_request").fields["host"] == "allowed.test"
    evil = re.sub("allowed", "evil", spelling, flags=re.IGNORECASE)
    assert forward(proxy, f"http://{evil}:{origin.port}/")[0] == 403
    assert proxy.last("net_request").fields["host"] == "evil.test"


def test_port_in_pattern(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy(allow=(f"allowed.test:{origin.port}",))
    assert forward(proxy, f"http://allowed.test:{origin.port}/")[0] == 200
    assert forward(proxy, f"http://allowed.test:{origin.port + 1}/")[0] == 403


# -- loopback, metadata, private: every spelling, every protocol ---------------------------

LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "2130706433",
    "0x7f000001",
    "017700000001",
    "0177.0.0.1",
    "0x7f.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "localhost",
    "0",
    "0.0.0.0",
]


@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
def test_loopback_spellings_refused_everywhere(
    make_proxy: MakeProxy, sink: SinkServer, spelling: str
) -> None:
    # "localhost" is allowed by name here, so it is refused for its address, after a real
    # getaddrinfo; the IP spellings are refused because no IP entry allows them.
    proxy = make_proxy(allow=("allowed.test", "localhost"))
    port = sink.port
    status, _ = forward(proxy, f"http://{spelling}:{port}/")
    assert status == 403, spelling
    status, sock = connect_status(proxy, f"{spelling}:{port}")
    sock.close()
    assert status == 403, spelling
    sock = proxy.connect()
    code = socks_connect(sock, 3, spelling.encode(), port)
    sock.close()
    assert code == 0x02, spelling
    events = proxy.wait_events("net_connect", 3)
    # The forward connection's own event is "allowed": its request carries the decision.
    tunnels = [e for e in events if e.fields["protocol"] != "http"]
    reasons = {e.reason for e in tunnels} | {e.reason for e in proxy.named("net_request")}
    assert reasons <= {"host-not-allowed", "address-not-public", "address-self"}
    if spelling == "localhost":
        assert "address-not-public" in reasons
    assert sink.connections == 0


def test_socks_ip_literals_refused(make_proxy: MakeProxy, sink: SinkServer) -> None:
    proxy = make_proxy()
    for atyp, address in ((1, bytes([127, 0, 0, 1])), (4, bytes(15) + b"\x01")):
        sock = proxy.connect()
        assert socks_connect(sock, atyp, address, sink.port) == 0x02
        sock.close()
    assert sink.connections == 0


METADATA_SPELLINGS = [
    "169.254.169.254",
    "2852039166",
    "0xA9FEA9FE",
    "0251.0376.0251.0376",
    "[::ffff:a9fe:a9fe]",
    "[::ffff:169.254.169.254]",
    "[64:ff9b::a9fe:a9fe]",
    "[fd00:ec2::254]",
    "169.254.170.2",
    "100.100.100.200",
]


@pytest.mark.parametrize("spelling", METADATA_SPELLINGS)
def test_metadata_refused_even_inside_an_allowed_range(
    make_proxy: MakeProxy, spelling: str
) -> None:
    proxy = make_proxy(
        allow=("169.254.0.0/16", "100.64.0.0/10", "::ffff:0:0/96", "64:ff9b::/96", "fd00::/8")
    )
    status, body = forward(proxy, f"http://{spelling}/latest/meta-data/")
    assert status == 403
    assert b"address-metadata" in body
    status, sock = connect_status(proxy, f"{spelling}:80")
    sock.close()
    assert status == 403


def test_metadata_by_name_refused(make_proxy: MakeProxy) -> None:
    resolver = static_resolver({"metadata.google.internal": ["169.254.169.254"]})
    proxy = make_proxy(
        allow=("metadata.google.internal",),
        hosts={"meta.test": "169.254.169.254"},
        resolver=resolver,
    )
    assert forward(proxy, "http://metadata.google.internal/")[0] == 403
    assert proxy.last("net_request").reason == "address-metadata"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("10.0.0.1", "address-not-public"),
        ("172.17.0.1", "address-not-public"),
        ("192.168.1.1", "address-not-public"),
        ("100.64.0.1", "address-not-public"),
        ("fd00::1", "address-not-public"),
        ("127.0.0.1", "address-not-public"),
        ("::ffff:10.0.0.1", "address-not-public"),
        ("2002:a00:1::", "address-not-public"),
        ("224.0.0.1", "address-not-public"),
        ("169.254.169.254", "address-metadata"),
    ],
)
def test_allowed_name_resolving_to_internal_address(
    make_proxy: MakeProxy, address: str, reason: str
) -> None:
    """DNS that points an allowed name inward (rebinding) is refused at the address."""
    proxy = make_proxy(allow=("inner.test",), resolver=static_resolver({"inner.test": [address]}))
    assert forward(proxy, "http://inner.test/")[0] == 403
    event = proxy.last("net_request")
    assert event.reason == reason
    assert event.fields["address"] == str(ipaddress.ip_address(address))


def test_public_record_chosen_over_internal_one(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    """Among several records the first acceptable one is dialled: here the pinned one."""
    proxy = make_proxy(
        allow=("allowed.test", "127.0.0.1"),
        hosts={},
        resolver=static_resolver({"allowed.test": ["10.0.0.1", "127.0.0.1"]}),
    )
    assert forward(proxy, f"http://allowed.test:{origin.port}/")[0] == 200
    assert proxy.last("net_request").fields["address"] == "127.0.0.1"


def test_explicit_ip_allow_reaches_loopback(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    """The allowed twin of the loopback refusals: an explicit IP entry opens it."""
    proxy = make_proxy(allow=(f"127.0.0.1:{origin.port}",))
    assert forward(proxy, f"http://127.1:{origin.port}/")[0] == 200
    assert forward(proxy, f"http://2130706433:{origin.port}/")[0] == 200
    assert forward(proxy, f"http://127.0.0.2:{origin.port}/")[0] == 403


def test_ipv6_origin_through_all_protocols(
    make_proxy: MakeProxy, origin6: RecordingHTTPServer
) -> None:
    proxy = make_proxy(allow=("allowed6.test", "::1"), hosts={"allowed6.test": "::1"})
    assert forward(proxy, f"http://allowed6.test:{origin6.port}/v6")[0] == 200
    assert forward(proxy, f"http://[::1]:{origin6.port}/v6")[0] == 200
    status, sock = connect_status(proxy, f"[::1]:{origin6.port}")
    sock.close()
    assert status == 200
    sock = proxy.connect()
    assert socks_connect(sock, 4, bytes(15) + b"\x01", origin6.port) == 0
    sock.sendall(b"GET /s6 HTTP/1.0\r\n\r\n")
    assert read_all(sock).endswith(b"GET /s6 host=None body=0")
    sock.close()


# -- SOCKS5 -----------------------------------------------------------------------------


def test_socks_by_name(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    assert socks_connect(sock, 3, b"allowed.test", origin.port) == 0
    sock.sendall(b"GET /socks HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
    assert read_all(sock).endswith(b"GET /socks host=allowed.test body=0")
    sock.close()
    event = proxy.last()
    assert (event.reason, event.fields["protocol"]) == ("allowed", "socks5")


def test_socks_by_ipv4_when_allowed(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy(allow=("127.0.0.1",))
    sock = proxy.connect()
    assert socks_connect(sock, 1, bytes([127, 0, 0, 1]), origin.port) == 0
    sock.close()


def test_socks_denied_name(make_proxy: MakeProxy, sink: SinkServer) -> None:
    proxy = make_proxy(hosts={"evil.test": "127.0.0.1"})
    sock = proxy.connect()
    assert socks_connect(sock, 3, b"evil.test", sink.port) == 0x02
    sock.close()
    assert sink.connections == 0


@pytest.mark.parametrize(("command", "name"), [(2, "BIND"), (3, "UDP ASSOCIATE")])
def test_socks_bind_and_udp_refused(make_proxy: MakeProxy, command: int, name: str) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    assert socks_connect(sock, 3, b"allowed.test", 53, command=command) == 0x07
    sock.close()
    event = proxy.last()
    assert event.reason == "unsupported-protocol"
    assert name in event.decision.detail


def test_socks_auth_only_client_refused(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    sock.sendall(b"\x05\x01\x02")  # username/password only
    assert sock.recv(2) == b"\x05\xff"
    sock.close()
    assert proxy.last().reason == "unsupported-protocol"


def test_socks_unknown_address_type(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    sock.sendall(b"\x05\x01\x00")
    assert sock.recv(2) == b"\x05\x00"
    sock.sendall(b"\x05\x01\x00\x09abcd\x00\x50")
    assert sock.recv(10)[1] == 0x08
    sock.close()


# -- malformed names ------------------------------------------------------------------------

BAD_NAMES = [b"a\x00b.test", b"a\x01.test", b"x" * 64 + b".test", (b"a" * 62 + b".") * 4 + b"abc"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["nul", "ctl", "long-label", "long-name"])
def test_bad_names_refused_cleanly(make_proxy: MakeProxy, name: bytes) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    assert socks_connect(sock, 3, name, 80) == 0x01
    sock.close()
    assert proxy.last().reason == "bad-hostname"
    sock = proxy.connect()
    sock.sendall(b"CONNECT " + name + b":443 HTTP/1.1\r\n\r\n")
    status, _ = read_http_response(sock)
    sock.close()
    assert status == 400
    sock = proxy.connect()
    sock.sendall(b"GET http://" + name + b"/ HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _ = read_http_response(sock)
    sock.close()
    assert status == 400


def test_percent_encoded_host_refused(make_proxy: MakeProxy) -> None:
    proxy = make_proxy()
    sock = proxy.connect()
    sock.sendall(b"GET http://%61llowed.test/ HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _ = read_http_response(sock)
    sock.close()
    assert status == 400
    assert proxy.last("net_request").reason == "bad-hostname"


# -- lifecycle ----------------------------------------------------------------------------


def test_one_event_per_connection(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy()
    count = 0
    for _ in range(3):
        forward(proxy, f"http://allowed.test:{origin.port}/")
        count += 1
        forward(proxy, "http://evil.test/")
        count += 1
        sock = proxy.connect()
        sock.close()  # connects and leaves without a byte
        count += 1
        sock = proxy.connect()
        sock.sendall(b"\x16\x03\x01garbage")
        read_all(sock)
        sock.close()
        count += 1
    events = proxy.wait_events("net_connect", count)
    assert len(events) == count


def test_handshake_timeout(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(handshake_timeout=0.3)
    sock = proxy.connect()
    sock.sendall(b"GET http://allowed.test/ HTTP/1.1\r\n")  # never finished
    assert read_all(sock) == b""
    sock.close()
    assert proxy.last().reason == "handshake-timeout"


def test_close_ends_open_tunnels_and_writes_their_events(
    make_proxy: MakeProxy, origin: RecordingHTTPServer
) -> None:
    proxy = make_proxy()
    socks = []
    for _ in range(5):
        status, sock = connect_status(proxy, f"allowed.test:{origin.port}")
        assert status == 200
        socks.append(sock)
    proxy.stop()
    for sock in socks:
        sock.settimeout(TIMEOUT)
        assert read_all(sock) == b""
        sock.close()
    assert len(proxy.named("net_connect")) == 5


def test_many_concurrent_connections(make_proxy: MakeProxy, origin: RecordingHTTPServer) -> None:
    proxy = make_proxy()
    socks = []
    try:
        for _ in range(300):
            sock = proxy.connect()
            sock.sendall(f"CONNECT allowed.test:{origin.port} HTTP/1.0\r\n\r\n".encode())
            socks.append(sock)
        for sock in socks:
            status, _ = read_http_response(sock)
            assert status == 200
    finally:
        for sock in socks:
            sock.close()
    assert len(proxy.wait_events("net_connect", 300, timeout=20)) == 300


# -- requests the next hop would answer with the request itself ---------------------------

#: TRACE/TRACK echo the request (with whatever was added on the way); Max-Forwards has a
#: proxy on the way answer in place of the origin
ECHO_REQUESTS = [
    ("TRACE", {}),
    ("TRACK", {}),
    ("trace", {}),
    ("OPTIONS", {"Max-Forwards": "0"}),
    ("GET", {"Max-Forwards": "0"}),
]


@pytest.mark.parametrize(("method", "headers"), ECHO_REQUESTS)
def test_forward_echo_requests_refused_before_any_contact(
    make_proxy: MakeProxy, origin: RecordingHTTPServer, method: str, headers: dict[str, str]
) -> None:
    proxy = make_proxy()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    try:
        conn.request(method, f"http://allowed.test:{origin.port}/echo", headers=headers)
        response = conn.getresponse()
        assert response.status == 405
        assert response.getheader("X-Stockade-Reason") == "bad-request"
        response.read()
    finally:
        conn.close()
    assert origin.connections == 0
    event = proxy.last("net_request")
    assert event.reason == "bad-request"
    assert event.fields["host"] == "allowed.test"
    # The twin: the same proxy forwards an ordinary request to the same origin.
    status, body = forward(proxy, f"http://allowed.test:{origin.port}/twin")
    assert status == 200
    assert body.startswith(b"GET /twin")
