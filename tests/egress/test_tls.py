"""TLS tunnels: the SNI must name the CONNECT target, with real TLS clients and servers."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable

import pytest

from stockade.egress._tls import ClientHelloError, NotTLS, parse_client_hello
from tests.egress.conftest import (
    TIMEOUT,
    ProxyHarness,
    TLSServer,
    read_all,
    read_http_response,
    socks_connect,
)

MakeProxy = Callable[..., ProxyHarness]


def open_tunnel(proxy: ProxyHarness, authority: str) -> socket.socket:
    sock = proxy.connect()
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    status, _ = read_http_response(sock)
    assert status == 200
    return sock


def client_hello(server_name: str | None) -> bytes:
    """The ClientHello a real OpenSSL client sends for ``server_name``."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def refragment(hello: bytes, cut: int) -> bytes:
    """The same handshake message split over two TLS records at ``cut``."""
    assert hello[0] == 0x16
    body = hello[5:]
    version = hello[1:3]
    first, second = body[:cut], body[cut:]
    return (
        b"\x16" + version + len(first).to_bytes(2, "big") + first
        + b"\x16" + version + len(second).to_bytes(2, "big") + second
    )  # fmt: skip


# -- the parser -------------------------------------------------------------------------


def test_parser_reads_the_server_name() -> None:
    hello = parse_client_hello(client_hello("allowed.test"))
    assert hello is not None
    assert hello.server_names == ("allowed.test",)


def test_parser_joins_records_and_waits_for_more() -> None:
    data = refragment(client_hello("allowed.test"), 40)
    for end in range(len(data)):
        assert parse_client_hello(data[:end]) is None
    hello = parse_client_hello(data)
    assert hello is not None
    assert hello.server_names == ("allowed.test",)
    assert hello.length == len(data)


def test_parser_without_sni() -> None:
    hello = parse_client_hello(client_hello(None))
    assert hello is not None
    assert hello.server_names == ()


def test_parser_refuses_non_tls() -> None:
    with pytest.raises(NotTLS):
        parse_client_hello(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(NotTLS):
        parse_client_hello(b"\x16\x07\x01\x00\x10")


def build_hello(names: list[bytes], extra: bytes = b"", name_type: int = 0) -> bytes:
    """A minimal, well-formed ClientHello with the given server_name entries."""
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    entries = b"".join(bytes((name_type,)) + len(n).to_bytes(2, "big") + n for n in names)
    sni = b"\x00\x00" + (len(entries) + 2).to_bytes(2, "big") + len(entries).to_bytes(2, "big")
    extensions = sni + entries + extra
    body += len(extensions).to_bytes(2, "big") + extensions
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(message).to_bytes(2, "big") + message


def test_parser_on_built_hellos() -> None:
    one = parse_client_hello(build_hello([b"allowed.test"]))
    assert one is not None
    assert one.server_names == ("allowed.test",)
    two = parse_client_hello(build_hello([b"allowed.test", b"evil.test"]))
    assert two is not None
    assert two.server_names == ("allowed.test", "evil.test")
    ech = parse_client_hello(build_hello([b"allowed.test"], extra=b"\xfe\x0d\x00\x00"))
    assert ech is not None
    assert ech.has_ech
    with pytest.raises(ClientHelloError):
        parse_client_hello(build_hello([b"allowed.test"], name_type=1))
    with pytest.raises(ClientHelloError):
        parse_client_hello(build_hello([b"a.test"], extra=b"\x00\x00\x00\x00"))  # twice
    with pytest.raises(ClientHelloError):
        parse_client_hello(build_hello([b""]))


def test_parser_refuses_truncated_and_inconsistent() -> None:
    hello = client_hello("allowed.test")
    broken = bytearray(hello)
    broken[9:11] = b"\x00\x01"  # a legacy_version of 0x0001
    with pytest.raises(ClientHelloError):
        parse_client_hello(bytes(broken))
    broken = bytearray(hello)
    broken[5] = 2  # a ServerHello, not a ClientHello
    with pytest.raises(ClientHelloError):
        parse_client_hello(bytes(broken))


# -- through the proxy ----------------------------------------------------------------------


def test_real_tls_client_through_connect(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    with tls_server.client_context().wrap_socket(sock, server_hostname="allowed.test") as tls:
        tls.sendall(b"ping")
        assert tls.recv(100) == b"echo:ping"
    event = proxy.last()
    assert event.reason == "allowed"
    assert event.fields["sni"] == "allowed.test"


def test_real_tls_client_through_socks(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    sock = proxy.connect()
    assert socks_connect(sock, 3, b"allowed.test", tls_server.port) == 0
    with tls_server.client_context().wrap_socket(sock, server_hostname="allowed.test") as tls:
        tls.sendall(b"socks")
        assert tls.recv(100) == b"echo:socks"


def _tls_roundtrip(context: ssl.SSLContext, sock: socket.socket, name: str | None) -> None:
    with context.wrap_socket(sock, server_hostname=name) as tls:
        tls.sendall(b"x")
        tls.recv(10)


def _tls_fails(proxy: ProxyHarness, tls_server: TLSServer, server_name: str | None) -> None:
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    context = tls_server.client_context()
    if server_name is None:
        context.check_hostname = False
    with pytest.raises((ssl.SSLError, OSError)):
        _tls_roundtrip(context, sock, server_name)
    sock.close()


def test_sni_mismatch_is_domain_fronting(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    _tls_fails(proxy, tls_server, "evil.test")
    event = proxy.last()
    assert event.reason == "sni-mismatch"
    assert tls_server.connections == 0


def test_missing_sni_refused(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    _tls_fails(proxy, tls_server, None)
    assert proxy.last().reason == "sni-missing"
    assert tls_server.connections == 0


def test_two_names_refused(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    hello = build_hello([b"allowed.test", b"evil.test"])
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    sock.sendall(hello)
    assert read_all(sock) == b""
    sock.close()
    assert proxy.last().reason == "sni-mismatch"
    assert tls_server.connections == 0


def test_encrypted_client_hello_refused(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    sock.sendall(build_hello([b"allowed.test"], extra=b"\xfe\x0d\x00\x00"))
    assert read_all(sock) == b""
    sock.close()
    assert proxy.last().reason == "sni-mismatch"


def test_non_tls_on_tls_port_refused(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,))
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    sock.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    assert read_all(sock) == b""
    sock.close()
    assert proxy.last().reason == "not-tls"
    assert tls_server.connections == 0


def test_split_client_hello_across_records_and_reads(
    make_proxy: MakeProxy, tls_server: TLSServer
) -> None:
    """A ClientHello in two records, sent a few bytes at a time, still gets through."""
    proxy = make_proxy(tls_ports=(tls_server.port,))
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    context = tls_server.client_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="allowed.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    data = refragment(outgoing.read(), 50)
    for start in range(0, len(data), 97):
        sock.sendall(data[start : start + 97])
        time.sleep(0.002)
    sock.settimeout(TIMEOUT)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = outgoing.read()
            if pending:
                sock.sendall(pending)
            chunk = sock.recv(65536)
            assert chunk, "tunnel closed during the handshake"
            incoming.write(chunk)
    sock.sendall(outgoing.read())
    tls.write(b"split")
    sock.sendall(outgoing.read())
    reply = b""
    while not reply:
        try:
            reply = tls.read(100)
        except ssl.SSLWantReadError:
            incoming.write(sock.recv(65536))
    assert reply == b"echo:split"
    sock.close()
    assert proxy.last().reason == "allowed"


def test_client_hello_timeout(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    proxy = make_proxy(tls_ports=(tls_server.port,), handshake_timeout=0.3)
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    sock.sendall(client_hello("allowed.test")[:20])
    assert read_all(sock) == b""
    sock.close()
    assert proxy.last().reason == "handshake-timeout"


def test_non_tls_port_carries_anything(make_proxy: MakeProxy, tls_server: TLSServer) -> None:
    """The allowed twin: with the port not in tls_ports, no ClientHello is required."""
    proxy = make_proxy(tls_ports=(443,))
    sock = open_tunnel(proxy, f"allowed.test:{tls_server.port}")
    with tls_server.client_context().wrap_socket(sock, server_hostname="allowed.test") as tls:
        tls.sendall(b"plain-port")
        assert tls.recv(100) == b"echo:plain-port"
