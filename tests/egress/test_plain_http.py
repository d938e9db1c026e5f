"""The forward proxy's plain path: requests without a body and Content-Length responses
read without h11.

What the plain parsers accept, h11 must read the same way (checked on generated heads);
what they do not accept goes to h11 (checked case by case). End to end, a raw upstream
shows that a plain response is relayed byte-exact, that bytes after its body never reach
the client, and that anything else (chunked, read-to-close) still goes through h11.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.egress import _http
from tests.egress.conftest import TIMEOUT, ProxyHarness, read_all, read_head

MakeProxy = Callable[..., ProxyHarness]

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
tokens = st.text(TOKEN_CHARS, min_size=1, max_size=12).map(str.encode)
# Field values mixing visible bytes, obs-text and blanks (and, rarely, bytes that make a
# head invalid: h11 and the plain parser must then both refuse or the plain one defer).
values = st.binary(max_size=24).map(
    lambda b: bytes(c if c in (9, 32) or 33 <= c <= 126 or c >= 128 else 97 for c in b)
)
blanks = st.sampled_from([b"", b" ", b"\t", b"  "])


@st.composite
def request_heads(draw: st.DrawFn) -> bytes:
    method = draw(st.one_of(st.sampled_from([b"GET", b"HEAD", b"DELETE", b"OPTIONS"]), tokens))
    target = b"http://allowed.test" + draw(st.sampled_from([b"/", b"/a?b=c", b":8080/x"]))
    version = draw(st.sampled_from([b"1.1", b"1.0"]))
    fields = []
    if draw(st.booleans()):
        fields.append((b"Host", b"allowed.test"))
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.one_of(tokens, st.sampled_from([b"Host", b"Content-Length", b"Expect"])))
        fields.append((name, draw(values)))
    lines = [b"%s %s HTTP/%s" % (method, target, version)]
    for name, value in fields:
        lines.append(name + b":" + draw(blanks) + value + draw(blanks))
    return b"\r\n".join(lines) + b"\r\n\r\n"


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_heads())
def test_plain_requests_read_as_h11_reads_them(head: bytes) -> None:
    try:
        _http.check_head(head)
    except _http.BadRequest:
        return
    plain = _http.parse_plain_request(head)
    if plain is None:
        return  # h11's to read (or refuse)
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    event = conn.next_event()
    assert isinstance(event, h11.Request), head
    assert (event.method, event.target, event.http_version) == (
        plain.method,
        plain.target,
        plain.http_version,
    )
    assert list(event.headers) == plain.headers
    # No body: h11 sees the end of the message right after the head.
    assert isinstance(conn.next_event(), h11.EndOfMessage)


@st.composite
def response_heads(draw: st.DrawFn) -> bytes:
    status = draw(st.sampled_from([b"200", b"204", b"301", b"404", b"100", b"304", b"500"]))
    lines = [b"HTTP/1.1 " + status + b" " + draw(st.sampled_from([b"OK", b"", b"Not Found"]))]
    for _ in range(draw(st.integers(0, 3))):
        lines.append(draw(tokens) + b":" + draw(blanks) + draw(values))
    for _ in range(draw(st.integers(0, 2))):
        lines.append(b"Content-Length:" + draw(blanks) + draw(st.sampled_from([b"0", b"5", b"x"])))
    if draw(st.booleans()):
        lines.append(b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response_heads(), st.sampled_from([b"GET", b"HEAD", b"POST"]))
def test_plain_responses_read_as_h11_reads_them(head: bytes, method: bytes) -> None:
    plain = _http.parse_plain_response(head, method)
    if plain is None:
        return
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"allowed.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(head + b"x" * plain.length)
    event = conn.next_event()
    assert isinstance(event, h11.Response), head
    assert (event.status_code, event.reason) == (plain.status, plain.reason)
    assert list(event.headers) == plain.headers
    body = b""
    while not isinstance(event, h11.EndOfMessage):
        event = conn.next_event()
        if isinstance(event, h11.Data):
            body += event.data
    assert len(body) == plain.length


@pytest.mark.parametrize(
    "head",
    [
        b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
        b"POST http://allowed.test/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n",
        b"POST http://allowed.test/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\nHost : a\r\n\r\n",
        b"GET http://allowed.test/ HTTP/2.0\r\nHost: a\r\n\r\n",
        b"GET  http://allowed.test/ HTTP/1.1\r\nHost: a\r\n\r\n",
    ],
)
def test_what_is_not_plain_goes_to_h11(head: bytes) -> None:
    assert _http.parse_plain_request(head) is None


def test_a_plain_request() -> None:
    head = b"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\nAccept:  */* \r\n\r\n"
    assert _http.parse_plain_request(head) == _http.PlainRequest(
        b"GET",
        b"http://allowed.test/x",
        [(b"host", b"allowed.test"), (b"accept", b"*/*")],
        b"1.1",
    )


@pytest.mark.parametrize(
    ("head", "method"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"HEAD"),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", b"GET"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\n\r\n", b"GET"),  # read to close
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\n Folded: x\r\nContent-Length: 2\r\n\r\n", b"GET"),
        (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 2\r\n\r\n", b"GET"),
    ],
)
def test_what_is_not_a_plain_response_goes_to_h11(head: bytes, method: bytes) -> None:
    assert _http.parse_plain_response(head, method) is None


# -- end to end, through the proxy, with a raw upstream ------------------------------------


class RawUpstream:
    """Answers every connection with fixed bytes, then closes (or keeps it open)."""

    def __init__(self, answer: bytes, *, linger: bool = False) -> None:
        self.answer = answer
        self.linger = linger
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(read_head(conn))
                conn.sendall(self.answer)
                if self.linger:
                    conn.settimeout(TIMEOUT)
                    with contextlib.suppress(OSError):
                        conn.recv(1)


@pytest.fixture
def raw_upstream() -> Iterator[Callable[..., RawUpstream]]:
    made: list[RawUpstream] = []

    def make(answer: bytes, **kw: bool) -> RawUpstream:
        made.append(RawUpstream(answer, **kw))
        return made[-1]

    yield make
    for upstream in made:
        upstream.sock.close()


def read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def get(proxy: ProxyHarness, port: int, sock: socket.socket | None = None) -> socket.socket:
    sock = sock or proxy.connect()
    sock.sendall(
        b"GET http://allowed.test:%d/x HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n" % (port, port)
    )
    return sock


def test_bytes_after_a_plain_body_never_reach_the_client(
    make_proxy: MakeProxy, raw_upstream: Callable[..., RawUpstream]
) -> None:
    smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"
    upstream = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Up: 1\r\n\r\nhello" + smuggled, linger=True
    )
    proxy = make_proxy()
    sock = get(proxy, upstream.port)
    sock.settimeout(TIMEOUT)
    first = read_until(sock, b"hello")
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-up: 1" in head.lower()
    assert body == b"hello"
    # The twin: the same client connection serves a second request, whose answer is the
    # upstream's real first response again, not the bytes it appended.
    get(proxy, upstream.port, sock)
    second = read_until(sock, b"hello")
    assert b"EVIL" not in first + second
    sock.close()
    assert len(upstream.requests) == 2
    assert b"connection: close" in upstream.requests[0].lower()


def answered(make_proxy: MakeProxy, upstream: RawUpstream) -> bytes:
    """What a client gets, up to the proxy's close, for a GET to ``upstream``."""
    sock = get(make_proxy(), upstream.port)
    with sock:
        sock.settimeout(TIMEOUT)
        return read_all(sock)


def test_a_plain_body_cut_short_closes_the_client(
    make_proxy: MakeProxy, raw_upstream: Callable[..., RawUpstream]
) -> None:
    upstream = raw_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel")
    # The proxy closes after the short body: the client sees a cut body.
    assert answered(make_proxy, upstream).endswith(b"\r\n\r\nhel")


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", b"abc"),
        (b"HTTP/1.1 200 OK\r\n\r\nto-close", b"to-close"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    ],
)
def test_other_responses_go_through_h11(
    make_proxy: MakeProxy,
    raw_upstream: Callable[..., RawUpstream],
    answer: bytes,
    body: bytes,
) -> None:
    upstream = raw_upstream(answer)
    proxy = make_proxy()
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    try:
        conn.request("GET", f"http://allowed.test:{upstream.port}/x")
        response = conn.getresponse()
        assert response.status == 200
        assert response.read() == body
    finally:
        conn.close()


def test_a_malformed_plain_response_is_a_502(
    make_proxy: MakeProxy, raw_upstream: Callable[..., RawUpstream]
) -> None:
    upstream = raw_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
    assert answered(make_proxy, upstream).startswith(b"HTTP/1.1 502 ")
