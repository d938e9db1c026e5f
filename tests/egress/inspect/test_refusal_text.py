"""Every HTTP refusal the proxy writes has a status, its reason phrase, X-Stockade-Reason
and a one-line ``stockade: REASON: DETAIL`` body, on every path (#24, polish list): the
forward proxy, CONNECT, and the inspected tunnel (which wrote ``HTTP/1.1 403 `` with no
phrase). One writer makes them (``egress/_http.py``: ``refusal_parts``)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from stockade.egress._http import error_response, reason_phrase
from tests.egress.inspect.test_through_proxy import proxied, run


def _exchange(sock: socket.socket | ssl.SSLSocket, request: bytes) -> bytes:
    sock.sendall(request)
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def _check(answer: bytes, status: int, phrase: str, reason: str) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == f"HTTP/1.1 {status} {phrase}".encode(), answer
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines[1:])}
    assert headers[b"x-stockade-reason"] == reason.encode(), answer
    assert body.startswith(f"stockade: {reason}".encode()), answer
    assert body.endswith(b"\n")
    assert body.count(b"\n") == 1


def test_reason_phrases() -> None:
    assert reason_phrase(403) == "Forbidden"
    assert reason_phrase(405) == "Method Not Allowed"
    assert reason_phrase(421) == "Misdirected Request"
    assert reason_phrase(413).endswith("Too Large")  # the wording varies by Python version
    assert reason_phrase(599) == "Error"
    _check(error_response(405, "bad-request", "TRACE"), 405, "Method Not Allowed", "bad-request")


def test_inspected_refusals_carry_the_phrase(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:

            def talk(method: str, host_header: str) -> bytes:
                sock, answer = p.connect("registry.test")
                assert answer.startswith(b"HTTP/1.1 200"), answer
                ctx = ssl.create_default_context(cafile=str(p.bundle))
                with ctx.wrap_socket(sock, server_hostname="registry.test") as tls:
                    request = (
                        f"{method} /pkg HTTP/1.1\r\nHost: {host_header}\r\n"
                        "Connection: close\r\n\r\n"
                    )
                    return _exchange(tls, request.encode())

            here = f"registry.test:{p.upstream.port}"
            # A request rule refuses DELETE (registry.test allows GET and HEAD only).
            denied = await asyncio.to_thread(talk, "DELETE", here)
            _check(denied, 403, "Forbidden", "no-rule-matched")
            # The Host header names another host than the tunnel's.
            other = await asyncio.to_thread(talk, "GET", "api.test")
            _check(other, 421, "Misdirected Request", "host-mismatch")
            # The twin: an allowed request passes with the upstream's own answer.
            ok = await asyncio.to_thread(talk, "GET", here)
            assert ok.startswith(b"HTTP/1.1 200"), ok

    run(go())


def test_forward_and_connect_refusals_carry_the_phrase(tmp_path: Path) -> None:
    async def go() -> None:
        async with proxied(tmp_path) as p:

            def raw(request: bytes) -> bytes:
                with socket.create_connection(("127.0.0.1", p.proxy_port), timeout=10) as s:
                    return _exchange(s, request)

            refused = await asyncio.to_thread(
                raw, b"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test:443\r\n\r\n"
            )
            _check(refused, 403, "Forbidden", "host-not-allowed")
            trace = await asyncio.to_thread(
                raw, b"TRACE http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
            )
            _check(trace, 405, "Method Not Allowed", "bad-request")

    run(go())
