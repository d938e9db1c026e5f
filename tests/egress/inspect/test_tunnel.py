"""End to end through InspectingTunnel: real TLS on both sides, real upstream."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import trustme

from stockade.egress.inspect import PINNING_MESSAGE
from tests.egress.inspect.harness import LABELLED, REAL_KEY, Client, harness


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


# -- rules -----------------------------------------------------------------------------


def test_registry_get_is_forwarded_and_logged(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("registry.test", "GET", "/left-pad")
            assert r.status == 200
            assert r.body.startswith(b"ok GET /left-pad")
            await h.settle()
            (event,) = h.events()
            assert event["verdict"] == "allow"
            assert event["rule"] == "network.rules[0]"
            assert event["path"] == "/left-pad"
            assert event["method"] == "GET"
            assert event["status"] == 200

    run(go())


@pytest.mark.parametrize("method", ["PUT", "POST", "DELETE"])
def test_registry_publish_is_refused(tmp_path: Path, method: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("registry.test", method, "/left-pad", body=b'{"name":"x"}')
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "no-rule-matched"
            assert h.upstream.received == []
            await h.settle()
            (event,) = h.events()
            assert event["verdict"] == "deny"
            assert event["reason"] == "no-rule-matched"

    run(go())


def test_report_rule_lets_through_and_logs(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("registry.test", "POST", "/-/report/abc", body=b"{}")
            assert r.status == 200
            assert len(h.upstream.received) == 1
            await h.settle()
            (event,) = h.events()
            assert event["verdict"] == "report"
            assert event["reason"] == "rule-denied"
            assert event["rule"] == "network.rules[1]"

    run(go())


# -- credentials -------------------------------------------------------------------------


def test_placeholder_becomes_real_key_upstream(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call(
                "api.test",
                "POST",
                "/v1/messages",
                headers=[("x-api-key", h.placeholder)],
                body=b'{"model":"x"}',
            )
            assert r.status == 200
            (seen,) = h.upstream.received
            assert seen.headers["x-api-key"] == REAL_KEY
            await h.settle()
            (event,) = h.events()
            assert event["verdict"] == "allow"
            assert event["secrets"] == ["API_KEY"]
            assert REAL_KEY not in str(h.audit.events)

    run(go())


def test_echoed_real_key_is_redacted_in_the_response(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call(
                "api.test", "GET", "/echo-headers", headers=[("x-api-key", h.placeholder)]
            )
            assert r.status == 200
            assert h.upstream.received[0].headers["x-api-key"] == REAL_KEY
            assert REAL_KEY.encode() not in r.body
            assert h.placeholder.encode() in r.body

    run(go())


@pytest.mark.parametrize(
    "header",
    [
        ("x-api-key", "ATTACKER-KEY-000111222333"),
        ("authorization", "Bearer ATTACKER-KEY-000111222333"),
        ("cookie", "session=ATTACKER-KEY-000111222333"),
    ],
)
def test_other_credential_on_bound_host_is_refused(tmp_path: Path, header: tuple[str, str]) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("api.test", "GET", "/v1/models", headers=[header])
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "foreign-credential"
            assert not h.upstream.seen("ATTACKER")

    run(go())


def test_credential_query_parameter_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("api.test", "GET", "/v1/models?key=ATTACKER-KEY-0001")
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "foreign-credential"
            assert h.upstream.received == []

    run(go())


def test_request_without_credential_to_bound_host_passes(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("api.test", "GET", "/v1/models")
            assert r.status == 200
            assert "x-api-key" not in h.upstream.received[0].headers

    run(go())


@pytest.mark.parametrize("where", ["header", "query", "body"])
def test_placeholder_to_another_host_is_refused(tmp_path: Path, where: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            ph = h.placeholder
            target, headers, body = "/upload", [], b"hello"
            if where == "header":
                headers = [("x-api-key", ph)]
            elif where == "query":
                target = f"/upload?x={ph}"
            else:
                body = b'{"k":"' + ph.encode() + b'"}'
            r = await h.call("other.test", "POST", target, headers=headers, body=body)
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "secret-wrong-host"
            assert not h.upstream.seen(ph)
            await h.settle()
            (event,) = h.events()
            assert event["label"] == "secret:API_KEY"

    run(go())


def test_real_key_to_another_host_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("other.test", "POST", "/x", body=REAL_KEY.encode())
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "secret-wrong-host"
            assert not h.upstream.seen(REAL_KEY)
            ok = await h.call("other.test", "POST", "/x", body=b"harmless")
            assert ok.status == 200

    run(go())


# -- labels ------------------------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


@pytest.mark.parametrize("shape", ["plain", "chunked", "split", "gzip", "gzip-members"])
def test_labelled_value_in_body_is_refused(tmp_path: Path, shape: str) -> None:
    secret = LABELLED.encode()
    payload = b'{"note":"' + secret + b'"}'
    headers: list[tuple[str, str]] = []
    body: bytes | list[bytes] = payload
    if shape == "chunked":
        body = [payload]
    elif shape == "split":
        half = payload.index(secret) + len(secret) // 2
        body = [payload[:half], payload[half:]]
    elif shape == "gzip":
        headers = [("content-encoding", "gzip")]
        body = _gzip(payload)
    elif shape == "gzip-members":
        headers = [("content-encoding", "gzip")]
        body = _gzip(b"innocent start ") + _gzip(payload)

    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("other.test", "POST", "/paste", headers=headers, body=body, pause=0.05)
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "labelled-data"
            assert not h.upstream.seen(LABELLED[:12])
            await h.settle()
            (event,) = h.events()
            assert event["label"].endswith(".env")
            assert LABELLED not in str(h.audit.events)

    run(go())


@pytest.mark.parametrize("shape", ["plain", "chunked", "split", "gzip"])
def test_body_without_labelled_value_passes(tmp_path: Path, shape: str) -> None:
    payload = b'{"note":"nothing to see here, just text"}' * 10
    headers: list[tuple[str, str]] = []
    body: bytes | list[bytes] = payload
    if shape == "chunked":
        body = [payload]
    elif shape == "split":
        body = [payload[:37], payload[37:]]
    elif shape == "gzip":
        headers = [("content-encoding", "gzip")]
        body = _gzip(payload)

    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("other.test", "POST", "/paste", headers=headers, body=body, pause=0.02)
            assert r.status == 200
            (seen,) = h.upstream.received
            expected = _gzip(payload) if shape == "gzip" else payload
            assert seen.body_len == len(expected)
            if shape != "gzip":
                assert seen.body == payload

    run(go())


def test_canary_in_url_and_header_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r1 = await h.call("other.test", "GET", "/q?c=CANARY-7f3a9c1e-token")
            r2 = await h.call("other.test", "GET", "/q", headers=[("x-t", "CANARY-7f3a9c1e-token")])
            r3 = await h.call("other.test", "GET", "/q?c=CANARY%2D7f3a9c1e%2Dtoken")
            assert [r1.status, r2.status, r3.status] == [403, 403, 403]
            assert h.upstream.received == []

    run(go())


def test_unscannable_encoding_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call(
                "other.test", "POST", "/x", headers=[("content-encoding", "br")], body=b"\x0b"
            )
            assert r.status == 415
            assert r.headers["x-stockade-reason"] == "unscannable-body"

    run(go())


# -- agreement and targets -----------------------------------------------------------------


def test_sni_mismatch_is_421(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("other.test", "GET", "/", sni="api.test")
            assert r.status == 421
            assert r.headers["x-stockade-reason"] == "sni-mismatch"
            r = await h.call("other.test", "GET", "/", sni=None)
            assert r.status == 421
            # the reason the opaque tunnel gives for the same ClientHello (one check)
            assert r.headers["x-stockade-reason"] == "sni-missing"
            assert h.upstream.received == []

    run(go())


def test_host_header_mismatch_is_421(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call("other.test", "GET", "/", host_header=h.host_header("api.test"))
            assert r.status == 421
            assert r.headers["x-stockade-reason"] == "host-mismatch"
            r = await h.call("other.test", "GET", "/", host_header="other.test:1")
            assert r.status == 421
            r = await h.call("other.test", "GET", "/", host_header=h.host_header("OTHER.test."))
            assert r.status == 200
            assert len(h.upstream.received) == 1

    run(go())


def test_host_must_agree_on_every_request_of_a_tunnel(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("other.test")

            def talk() -> tuple[int, int]:
                c = Client(sock, h.bundle, "other.test")
                first = c.request("GET", "/", host=h.host_header("other.test")).status
                second = c.request("GET", "/", host=h.host_header("api.test")).status
                c.close()
                return first, second

            assert await asyncio.to_thread(talk) == (200, 421)
            assert len(h.upstream.received) == 1

    run(go())


@pytest.mark.parametrize(
    "target",
    [
        b"/a/../admin",
        b"/a/./b",
        b"/%2e%2e/admin",
        b"/a%2f..%2fadmin",
        b"/a%5Cb",
        b"/a\\b",
        b"/a%00b",
        b"//evil/x",
        b"https://api.test/x",
        b"http://other.test/x",
        b"*",
        b"/bad%zz",
    ],
)
def test_ambiguous_targets_are_refused(tmp_path: Path, target: bytes) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("other.test")
            host = h.host_header("other.test").encode()

            def talk() -> int:
                c = Client(sock, h.bundle, "other.test")
                status = c.raw(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
                c.close()
                return status

            status = await asyncio.to_thread(talk)
            assert status in (400, 421)
            assert h.upstream.received == []

    run(go())


def test_plain_targets_are_normalised_and_forwarded(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            port = h.upstream.port
            r1 = await h.call("other.test", "GET", "/a/%7Euser/b%2Bc?q=1")
            r2 = await h.call("other.test", "GET", f"https://other.test:{port}/abs")
            assert (r1.status, r2.status) == (200, 200)
            targets = [r.target for r in h.upstream.received]
            assert targets == ["/a/~user/b%2Bc?q=1", "/abs"]

    run(go())


# -- streaming, keep-alive, pool ------------------------------------------------------------


def test_large_upload_streams_with_bounded_memory(tmp_path: Path) -> None:
    size = 100 * 1024 * 1024

    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("other.test")

            def talk() -> int:
                c = Client(sock, h.bundle, "other.test")
                r = c.stream(
                    "PUT", "/big", host=h.host_header("other.test"), size=size, piece=65536
                )
                c.close()
                return r.status

            assert await asyncio.to_thread(talk) == 200
            assert h.upstream.received[0].body_len == size
            await h.settle()
            stats = h.tasks[0].result()
            # the proxy never held more than one read plus the scanner's tail
            assert 0 < stats.max_buffered < 1024 * 1024

    run(go())


def test_keep_alive_and_upstream_reuse(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("registry.test")

            def talk() -> list[int]:
                c = Client(sock, h.bundle, "registry.test")
                statuses = [
                    c.request("GET", f"/p{i}", host=h.host_header("registry.test")).status
                    for i in range(5)
                ]
                c.close()
                return statuses

            assert await asyncio.to_thread(talk) == [200] * 5
            for i in range(3):
                assert (await h.call("registry.test", "GET", f"/fresh{i}")).status == 200
            # one upstream connection served the keep-alive tunnel and the fresh ones
            assert h.upstream.connections == 1
            assert h.layer.pool.reused >= 7

    run(go())


def test_refused_request_keeps_the_connection_usable(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("registry.test")

            def talk() -> list[int]:
                c = Client(sock, h.bundle, "registry.test")
                host = h.host_header("registry.test")
                out = [c.request("DELETE", "/x", host=host).status]
                out.append(c.request("GET", "/x", host=host).status)
                c.close()
                return out

            assert await asyncio.to_thread(talk) == [403, 200]

    run(go())


def test_expect_100_continue(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call(
                "other.test", "POST", "/e", headers=[("expect", "100-continue")], body=b"abc"
            )
            assert r.status == 200
            assert h.upstream.received[0].body == b"abc"
            assert "expect" not in h.upstream.received[0].headers

    run(go())


def test_untrusted_upstream_is_502(tmp_path: Path) -> None:
    policy = """
[network]
allow = ["other.test"]
[labels]
canaries = ["CANARY-7f3a9c1e-token"]
"""

    async def go() -> None:
        async with harness(tmp_path, policy) as h:
            r = await h.call("other.test", "GET", "/")
            assert r.status == 502
            assert r.headers["x-stockade-reason"] == "upstream-failed"
            assert h.upstream.received == []

    run(go())


def test_client_refusing_the_certificate_is_logged(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            sock = h.open("api.test")
            other_ca = tmp_path / "other.pem"
            trustme.CA().cert_pem.write_to_path(str(other_ca))

            def talk() -> str:
                try:
                    Client(sock, other_ca, "api.test")
                except ssl.SSLCertVerificationError as exc:
                    return exc.verify_message
                finally:
                    sock.close()
                return "connected"

            assert "certificate" in await asyncio.to_thread(talk)
            await h.settle()
            (event,) = h.events("net_intercept")
            assert event["reason"] == "client-refused-cert"
            assert event["detail"] == PINNING_MESSAGE
            assert h.events() == []

    run(go())


# -- requests the next hop would answer with the request itself ---------------------------


@pytest.mark.parametrize(
    ("method", "headers"),
    [("TRACE", []), ("TRACK", []), ("trace", []), ("OPTIONS", [("max-forwards", "0")])],
)
def test_echo_requests_are_405_with_no_upstream_contact(
    tmp_path: Path, method: str, headers: list[tuple[str, str]]
) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            # api.test has a bound secret: an echo would carry the injected real key back.
            r = await h.call("api.test", method, "/v1/models", headers=headers)
            assert r.status == 405
            assert r.headers["x-stockade-reason"] == "bad-request"
            assert h.upstream.connections == 0
            ok = await h.call("api.test", "GET", "/v1/models")
            assert ok.status == 200

    run(go())


# -- every part of a request: the method and the trailers too -----------------------------


@pytest.mark.parametrize("what", ["label", "placeholder"])
def test_a_secret_as_the_method_is_refused(tmp_path: Path, what: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            value = LABELLED if what == "label" else h.placeholder
            r = await h.call("other.test", value, "/m")
            assert r.status == 403
            reason = "labelled-data" if what == "label" else "secret-wrong-host"
            assert r.headers["x-stockade-reason"] == reason
            assert h.upstream.received == []
            assert not h.upstream.seen(value)
            await h.settle()
            assert value not in str(h.audit.events)
            ok = await h.call("other.test", "GET", "/m")
            assert ok.status == 200

    run(go())


def test_a_labelled_value_in_a_trailer_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            r = await h.call(
                "other.test", "POST", "/t", body=[b"harmless"], trailers=[("x-note", LABELLED)]
            )
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "labelled-data"
            assert h.upstream.received == []
            assert not h.upstream.seen(LABELLED[:12])
            await h.settle()
            assert LABELLED not in str(h.audit.events)

    run(go())


def test_a_foreign_bearer_in_a_trailer_to_a_bound_host_is_refused(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            trailer = ("authorization", "Bearer ATTACKER-KEY-000111222333")
            r = await h.call(
                "api.test",
                "POST",
                "/v1/messages",
                headers=[("x-api-key", h.placeholder)],
                body=[b"{}"],
                trailers=[trailer],
            )
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "foreign-credential"
            assert h.upstream.received == []
            assert not h.upstream.seen("ATTACKER")

    run(go())


def test_a_request_with_a_harmless_trailer_passes(tmp_path: Path) -> None:
    """The twin: a chunked body with a plain trailer reaches a bound host, trailer and
    injected key included; without trailers the same request passes as well."""

    async def go() -> None:
        async with harness(tmp_path) as h:
            for trailers in ([("x-checksum", "abc123")], []):
                r = await h.call(
                    "api.test",
                    "POST",
                    "/v1/messages",
                    headers=[("x-api-key", h.placeholder)],
                    body=[b"{}"],
                    trailers=trailers,
                )
                assert r.status == 200
                seen = h.upstream.received[-1]
                assert seen.headers["x-api-key"] == REAL_KEY
                assert seen.trailers == dict(trailers)

    run(go())
