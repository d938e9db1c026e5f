"""Credential detectors and decoded views: each detector in each request part, each
encoding, benign look-alikes (UUIDs, digests, commit ids, image data) passing.

The pure part checks the detectors and decoders directly; the end-to-end part sends
each credential through the inspect layer over real TLS (the harness's upstream is an
h11 server on 127.0.0.1) and checks the upstream never saw it, the event names the
detector and the part (never the value), and the benign twin got through.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import os
import random
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from stockade._exceptions import PolicyError
from stockade.egress.inspect._content import ContentCheck, ContentScanner, Detected
from stockade.egress.inspect._decode import views
from stockade.egress.inspect._detectors import DETECTORS, DetectorSet
from stockade.egress.inspect._http import Refusal
from stockade.egress.inspect._secrets import Pattern, PatternSet
from stockade.policy import DETECTOR_NAMES, InspectPolicy, Policy, parse_policy_text
from tests.egress.inspect.harness import LABELLED, POLICY, harness
from tests.policy.test_inspect_policy import _compose

# Credential-shaped test values (not real credentials), one per detector.
CREDENTIALS: dict[str, str] = {
    "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----",
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret_key": "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github_token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "gitlab_token": "glpat-" + "xYz12345678901234567",
    "slack_token": "xoxb-123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx",
    "stripe_key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "anthropic_key": "sk-ant-api03-" + "Ab1Cd2Ef3Gh4" * 8,
    "openai_key": "sk-proj-" + "Ab1_Cd2-Ef3G" * 5,
    "google_api_key": "AIza" + "SyA-1234567890abcdefghijklmnopqrstu",
    "npm_token": "npm_" + "aB1cD2eF3gH4" * 3,
    "pypi_token": "pypi-AgEIcHlwaS5vcmcCJGE" + "x1Y2z3" * 10,
    "jwt": (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
        "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36"
    ),
    "authorization": "Authorization: Bearer abcDEF123456ghi789",
    "basic_auth": "Authorization: Basic " + base64.b64encode(b"deploy:hunter22").decode(),
}

#: what must never be a finding
BENIGN: dict[str, bytes] = {
    "uuid": str(uuid.UUID(int=0x3F2B8C1E8D4A4F1E9A7B2C6D5E4F3A2B)).encode(),
    "sha256": hashlib.sha256(b"stockade").hexdigest().encode(),
    "sha1-commit": hashlib.sha1(b"commit").hexdigest().encode(),
    "image-base64": base64.b64encode(random.Random(7).randbytes(96 * 1024)),
    "image-bytes": random.Random(8).randbytes(64 * 1024),
    "placeholder-bearer": b"Authorization: Bearer stockade-ph-" + b"0a1b" * 8,
    "publishable-stripe": b"pk_live_" + b"4eC39HqLyjWDarjtT1zdp7dc",
    "certificate": b"-----BEGIN CERTIFICATE-----\nMIIB",
    "public-key": b"-----BEGIN PUBLIC KEY-----\nMIIB",
    "eyJ-not-jwt": b"eyJmb28iOiJiYXIifQ.eyJmb28iOiJiYXIifQ.x",
    "prose": b"Authorization: Bearer authentication is described in RFC 6750",
    "unnamed-40": b"token wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY here",
    "akia-in-word": b"XAKIAIOSFODNN7EXAMPLEX",
}


def _encodings(value: bytes) -> dict[str, bytes]:
    """``value`` hidden every way the decoders undo, inside some context."""

    def pct(b: bytes) -> bytes:
        return "".join(f"%{c:02X}" for c in b).encode()

    return {
        "base64": base64.b64encode(b"v=" + value),
        "base64-offset": b"j" + base64.b64encode(b"v=" + value),
        "base64url": base64.urlsafe_b64encode(b"\n" + value).rstrip(b"="),
        "base64-wrapped": base64.encodebytes(b"v=" + value + b"\n" + b"pad" * 30),
        "hex": value.hex().encode(),
        "hex-odd": b"f" + value.hex().encode(),
        "hex-colon": value.hex(":").encode(),
        "hex-dash": value.hex("-").upper().encode(),
        "hex-x": b"".join(b"\\x%02x" % c for c in value),
        "percent-2": pct(pct(value)),
        "percent-3": pct(pct(pct(value))),
        "json-u": json.dumps(value.decode(), ensure_ascii=True)
        .encode()
        .replace(value[:4], b"".join(b"\\u%04x" % c for c in value[:4])),
        "gzip-base64": base64.b64encode(gzip.compress(b"v=" + value)),
        "base64-of-hex": base64.b64encode(value.hex().encode()),
        "qp": b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        + b"=\r\n".join(value[i : i + 10] for i in range(0, len(value), 10)),
    }


def _check(detectors: DetectorSet | None = None) -> ContentCheck:
    return ContentCheck(PatternSet(), PatternSet(), detectors or DetectorSet(), decode=True)


def _feed_all(scanner: ContentScanner, pieces: list[bytes], released: list[bytes]) -> None:
    for piece in pieces:
        released.append(scanner.feed(piece))
    released.append(scanner.finish())


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


# -- pure ----------------------------------------------------------------------------------


def test_detector_names_are_the_policys() -> None:
    assert tuple(d.name for d in DETECTORS) == DETECTOR_NAMES
    assert set(CREDENTIALS) == set(DETECTOR_NAMES)


@pytest.mark.parametrize("name", DETECTOR_NAMES)
def test_each_detector_finds_its_credential_raw(name: str) -> None:
    found = DetectorSet().search(b'{"x": "' + CREDENTIALS[name].encode() + b'"}\n')
    assert found is not None
    assert found.detector == name


@pytest.mark.parametrize("look_alike", sorted(BENIGN))
def test_benign_look_alikes_are_not_findings(look_alike: str) -> None:
    data = b"value: " + BENIGN[look_alike] + b"\n"
    assert _check().search(data, "body") is None


@pytest.mark.parametrize("encoding", sorted(_encodings(b"x")))
@pytest.mark.parametrize("name", ["aws_access_key", "github_token", "jwt", "private_key"])
def test_each_encoding_is_decoded(name: str, encoding: str) -> None:
    value = CREDENTIALS[name].encode()
    data = b"payload=" + _encodings(value)[encoding] + b"&end=1"
    assert name.encode() not in data
    assert value not in data
    hit = _check().search(data, "query")
    assert hit is not None, encoding
    assert hit.name == name, (encoding, hit)
    assert hit.where.startswith("query (")  # the chain of decoders is named


def test_labels_are_searched_in_decoded_views() -> None:
    # A layered encoding the label scanner's spellings do not cover: base64 of hex.
    label = PatternSet([Pattern(LABELLED.encode(), "file:/w/.env", "label")], percent=False)
    check = ContentCheck(PatternSet(), label, DetectorSet({}), decode=True)
    hit = check.search(base64.b64encode(LABELLED.encode().hex().encode()), "body")
    assert hit is not None
    assert hit.kind == "label"
    assert hit.where == "body (base64>hex)"
    assert check.search(base64.b64encode(b"unrelated".hex().encode()), "body") is None


def test_views_cost_is_bounded() -> None:
    data = base64.b64encode(os.urandom(256 * 1024))
    made = views(data)
    assert sum(len(v) for _, v in made) <= 6 * len(data) + 64 * 1024
    # Nested base64 to any depth stops at the documented depth.
    deep = b"AKIAIOSFODNN7EXAMPLE"
    for _ in range(8):
        deep = base64.b64encode(deep)
    assert max(c.count(">") for c, _ in views(deep)) <= 3


def test_report_action_and_off() -> None:
    value = CREDENTIALS["jwt"].encode()
    hit = _check(DetectorSet({"jwt": "report"})).search(value, "body")
    assert hit is not None
    assert hit.action == "report"
    assert _check(DetectorSet({"jwt": "off"})).search(value, "body") is None
    # A deny finding wins over a report one in the same data.
    both = value + b" " + CREDENTIALS["npm_token"].encode()
    hit = _check(DetectorSet({"jwt": "report"})).search(both, "body")
    assert hit is not None
    assert (hit.name, hit.action) == ("npm_token", "deny")


def test_stream_finds_a_credential_split_at_every_byte_and_releases_none_of_it() -> None:
    value = CREDENTIALS["github_token"].encode()
    for encoded in (value, base64.b64encode(b"t=" + value), value.hex(":").encode()):
        body = b"a" * 3000 + b" " + encoded + b" " + b"z" * 3000
        start = body.index(encoded)
        for cut in range(start - 2, start + len(encoded) + 2, 7):
            scanner = ContentScanner(PatternSet(), _check(), InspectPolicy())
            released: list[bytes] = []
            with pytest.raises(Detected) as caught:
                _feed_all(scanner, [body[:cut], body[cut:]], released)
            assert caught.value.hit.name == "github_token"
            assert encoded[:12] not in b"".join(released)


def test_stream_of_benign_data_is_released_whole() -> None:
    body = BENIGN["image-base64"] + b"\n" + BENIGN["sha256"] * 50
    scanner = ContentScanner(PatternSet(), _check(), InspectPolicy())
    out = b"".join(scanner.feed(body[i : i + 8192]) for i in range(0, len(body), 8192))
    assert out + scanner.finish() == body


def test_decode_limit_refuse_and_scan_raw() -> None:
    hidden = base64.b64encode(b"k=" + CREDENTIALS["aws_access_key"].encode())
    body = [b"x" * 60_000, b" " + hidden + b" "]
    refuse = InspectPolicy(decode_limit=50_000, past_limit="refuse")
    scanner = ContentScanner(PatternSet(), _check(), refuse)
    with pytest.raises(Refusal) as caught:
        _feed_all(scanner, body, [])
    assert caught.value.status == 413
    # scan-raw: decoding stops past the limit, raw credentials are still found.
    raw = ContentScanner(PatternSet(), _check(), InspectPolicy(decode_limit=50_000))
    _feed_all(raw, body, [])
    raw = ContentScanner(PatternSet(), _check(), InspectPolicy(decode_limit=50_000))
    plain = [body[0], b" " + CREDENTIALS["aws_access_key"].encode() + b" "]
    with pytest.raises(Detected):
        _feed_all(raw, plain, [])


def test_policy_inspect_table(tmp_path: Path) -> None:
    text = '[inspect]\ndetectors = { jwt = "report", basic_auth = "off" }\npast_limit = "refuse"\n'
    policy = parse_policy_text(text, "p.toml", workspace=tmp_path)
    assert policy.inspect.actions()["jwt"] == "report"
    assert policy.inspect.actions()["basic_auth"] == "off"
    assert policy.inspect.actions()["github_token"] == "deny"
    assert policy.to_dict()["inspect"]["past_limit"] == "refuse"
    for bad, key in (
        ('[inspect]\ndetectors = { nope = "deny" }\n', "inspect.detectors.nope"),
        ('[inspect]\ndetectors = { jwt = "allow" }\n', "inspect.detectors.jwt"),
        ('[inspect]\npast_limit = "pass"\n', "inspect.past_limit"),
        ("[inspect]\nunknown = 1\n", "inspect.unknown"),
    ):
        with pytest.raises(PolicyError, match=key.replace(".", r"\.")):
            parse_policy_text(bad, "p.toml", workspace=tmp_path)
    # The default policy keeps its digest (no [inspect] in it).
    assert "inspect" not in parse_policy_text("", "p.toml", workspace=tmp_path).to_dict()


def test_workspace_may_only_strengthen_detectors(tmp_path: Path) -> None:
    user = '[inspect]\ndetectors = { jwt = "report" }\n'
    ws = _compose(tmp_path, user, '[inspect]\ndetectors = { jwt = "deny" }\n')
    assert isinstance(ws, Policy)
    assert ws.inspect.actions()["jwt"] == "deny"
    kept = _compose(tmp_path, user, "")
    assert isinstance(kept, Policy)
    assert kept.inspect.actions()["jwt"] == "report"
    with pytest.raises(PolicyError, match=r"inspect\.detectors\.github_token"):
        _compose(tmp_path, user, '[inspect]\ndetectors = { github_token = "off" }\n')
    with pytest.raises(PolicyError, match=r"inspect\.decode"):
        _compose(tmp_path, user, "[inspect]\ndecode = false\n")


# -- end to end over real TLS ---------------------------------------------------------------

#: request parts a credential is put in: (part name in the event, how to send it)
PARTS = ("path", "query", "header", "body-json", "body-chunked", "body-multipart")


def _request(part: str, value: str) -> tuple[str, str, dict[str, Any]]:
    """(method, target, call kwargs) carrying ``value`` in ``part``."""
    q = quote(value, safe="")
    if part == "path":
        return "GET", f"/v1/{q}", {}
    if part == "query":
        return "GET", f"/v1/search?q={q}", {}
    if part == "header":
        return "GET", "/v1/", {"headers": [("x-debug", value)]}
    if part == "body-json":
        return "POST", "/v1/upload", {"body": json.dumps({"env": value}).encode()}
    if part == "body-chunked":
        blob = f"KEY={value}\n".encode()
        return "POST", "/v1/upload", {"body": [blob[:9], blob[9:]]}
    boundary = "b0undary"
    form = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=f; filename=env.txt\r\n"
        f"Content-Type: text/plain\r\n\r\n{value}\r\n--{boundary}--\r\n"
    ).encode()
    return "POST", "/v1/upload", {"body": form}


def _where(part: str) -> str:
    return {"header": "header x-debug"}.get(part, part.split("-")[0])


E2E_DETECTORS = ["aws_access_key", "github_token", "jwt", "private_key", "stripe_key"]


@pytest.mark.parametrize("name", E2E_DETECTORS)
def test_credential_in_each_part_never_reaches_the_upstream(tmp_path: Path, name: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            value = CREDENTIALS[name]
            for part in PARTS:
                if part in ("path", "query") and name == "private_key":
                    continue  # a key block is a file: sent in a body or a header dump
                method, target, kw = _request(part, value)
                r = await h.call("other.test", method, target, **kw)
                assert r.status == 403, (part, r.body)
                assert r.headers["x-stockade-reason"] == "credential-detected"
            await h.settle()
            assert not h.upstream.seen(value[:16])
            events = [e for e in h.events() if e.get("detector")]
            assert events
            assert {e["detector"] for e in events} == {name}
            for e in events:
                assert value[4:20] not in json.dumps(e), "the event must not hold the value"
                assert e["verdict"] == "deny"
                assert e["reason"] == "credential-detected"
            expected = {_where(p) for p in PARTS if name != "private_key" or "body" in p}
            assert {e["found_in"].split(" (")[0] for e in events} >= expected - {"header"}

    run(go())


@pytest.mark.parametrize("look_alike", ["uuid", "sha256", "sha1-commit", "image-base64"])
def test_benign_twin_in_each_part_passes(tmp_path: Path, look_alike: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            value = BENIGN[look_alike].decode()[:2000]
            for part in PARTS:
                method, target, kw = _request(part, value)
                r = await h.call("other.test", method, target, **kw)
                assert r.status == 200, (part, r.body)

    run(go())


def test_encoded_credential_refused_end_to_end(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            value = CREDENTIALS["aws_access_key"].encode()
            for encoding, spelled in _encodings(value).items():
                text = spelled.decode("latin-1")
                r = await h.call("other.test", "POST", "/v1/upload", body=spelled)
                assert r.status == 403, (encoding, r.body)
                r = await h.call("other.test", "GET", "/q?d=" + quote(text, safe=""))
                assert r.status == 403, (encoding, r.body)
            await h.settle()
            assert not any(r.body_len for r in h.upstream.received)
            # gzip Content-Encoding of a body holding the key
            r = await h.call(
                "other.test",
                "POST",
                "/v1/upload",
                body=gzip.compress(b"k=" + value),
                headers=[("content-encoding", "gzip")],
            )
            assert r.status == 403

    run(go())


def test_report_lets_the_request_through_and_says_so(tmp_path: Path) -> None:
    policy = POLICY + '\n[inspect]\ndetectors = {{ jwt = "report" }}\n'

    async def go() -> None:
        async with harness(tmp_path, policy) as h:
            jwt = CREDENTIALS["jwt"]
            r = await h.call("other.test", "GET", "/v1/", headers=[("x-session", jwt)])
            assert r.status == 200
            r = await h.call("other.test", "POST", "/v1/up", body=jwt.encode())
            assert r.status == 200
            await h.settle()
            events = h.events()[-2:]
            assert [e["verdict"] for e in events] == ["report", "report"]
            assert [e["found_in"] for e in events] == ["header x-session", "body"]
            assert all(e["reason"] == "credential-detected" for e in events)

    run(go())


def test_bound_credential_to_its_own_host_is_not_a_finding(tmp_path: Path) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            # The harness binds API_KEY to api.test in x-api-key; the sandbox sends the
            # placeholder, the proxy injects the real value after the checks.
            r = await h.call(
                "api.test", "GET", "/echo-headers", headers=[("x-api-key", h.placeholder)]
            )
            assert r.status == 200
            # An Authorization Bearer to an unbound host is a finding.
            bearer = CREDENTIALS["authorization"].split(": ", 1)[1]
            r = await h.call("other.test", "GET", "/v1/", headers=[("authorization", bearer)])
            assert r.status == 403
            assert r.headers["x-stockade-reason"] == "credential-detected"
            # The same to the bound host is the foreign-credential refusal (as before).
            r = await h.call("api.test", "GET", "/v1/", headers=[("authorization", bearer)])
            assert r.headers["x-stockade-reason"] == "foreign-credential"

    run(go())


# -- trailers: the detectors search them as they search the head's headers ----------------


@pytest.mark.parametrize("name", ["github_token", "aws_access_key", "jwt"])
def test_credential_in_a_trailer_is_refused(tmp_path: Path, name: str) -> None:
    async def go() -> None:
        async with harness(tmp_path) as h:
            value = CREDENTIALS[name]
            r = await h.call(
                "other.test", "POST", "/v1/up", body=[b"harmless"], trailers=[("x-note", value)]
            )
            assert r.status == 403, r.body
            assert r.headers["x-stockade-reason"] == "credential-detected"
            assert not h.upstream.seen(value[:16])
            # Encoded the same (base64), it is found in the decoded view.
            encoded = base64.b64encode(value.encode()).decode()
            r = await h.call(
                "other.test", "POST", "/v1/up", body=[b"x"], trailers=[("x-note", encoded)]
            )
            assert r.status == 403, r.body
            await h.settle()
            events = [e for e in h.events() if e.get("detector")]
            assert [e["detector"] for e in events] == [name, name]
            assert events[0]["found_in"] == "trailer x-note"
            assert all(e["verdict"] == "deny" for e in events)
            assert value[4:20] not in json.dumps(events)

    run(go())


def test_benign_trailer_passes_and_report_lets_a_credential_through(tmp_path: Path) -> None:
    """The twins: a digest or a UUID in a trailer reaches the upstream, trailer and all;
    with the detector on ``report`` a JWT trailer does too, with a ``report`` event."""
    policy = POLICY + '\n[inspect]\ndetectors = {{ jwt = "report" }}\n'

    async def go() -> None:
        async with harness(tmp_path, policy) as h:
            for look_alike in ("sha256", "uuid", "sha1-commit"):
                trailer = ("x-checksum", BENIGN[look_alike].decode())
                r = await h.call("other.test", "POST", "/v1/up", body=[b"data"], trailers=[trailer])
                assert r.status == 200, (look_alike, r.body)
                assert h.upstream.received[-1].trailers == dict([trailer])
            jwt = CREDENTIALS["jwt"]
            r = await h.call(
                "other.test", "POST", "/v1/up", body=[b"data"], trailers=[("x-session", jwt)]
            )
            assert r.status == 200
            assert h.upstream.received[-1].trailers == {"x-session": jwt}
            await h.settle()
            last = h.events()[-1]
            assert last["verdict"] == "report"
            assert last["found_in"] == "trailer x-session"

    run(go())
