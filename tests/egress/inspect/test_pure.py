"""The sans-IO pieces: targets, rules, binding, scanning, redaction, CA."""

from __future__ import annotations

import datetime
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from stockade._exceptions import SandboxError, Unavailable
from stockade.egress.inspect import (
    CertificateAuthority,
    Pattern,
    Refusal,
    RuleSet,
    SecretStore,
    StreamReplacer,
    StreamScanner,
    normalise_target,
    trust_environment,
    value_tokens,
    write_trust_bundle,
)
from stockade.egress.inspect._secrets import bind_credentials
from stockade.egress.inspect._tunnel import decode_body
from stockade.policy import BoundSecret, Reason, RequestRule, Verdict

# -- targets -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "query"),
    [
        (b"/", "/", ""),
        (b"/a/b?x=1&y=%2F", "/a/b", "x=1&y=%2F"),
        (b"/%7euser/%41b", "/~user/Ab", ""),
        (b"/a%2bb", "/a%2Bb", ""),
        (b"/dir/", "/dir/", ""),
        (b"https://h.test/x?q", "/x", "q"),
        (b"https://h.test", "/", ""),
    ],
)
def test_targets_normalised_once(raw: bytes, path: str, query: str) -> None:
    t = normalise_target(raw, "h.test", 443)
    assert (t.path, t.query) == (path, query)


@pytest.mark.parametrize(
    "raw",
    [
        b"/a/../b",
        b"/..",
        b"/./a",
        b"/%2e%2e/a",
        b"/%2E/a",
        b"/a%5cb",
        b"/a\\b",
        b"/a%00",
        b"/a%0d%0a",
        b"//x",
        b"/a//b",
        b"/a#frag",
        b"/%zz",
        b"/%4",
        b"*",
        b"h.test:443",
        b"http://h.test/x",
        b"https://user@h.test/x",
        b"/\xc3\xa9",
    ],
)
def test_ambiguous_targets_refused(raw: bytes) -> None:
    with pytest.raises(Refusal) as info:
        normalise_target(raw, "h.test", 443)
    assert info.value.reason is Reason.AMBIGUOUS_PATH


def test_absolute_form_for_another_host_is_a_host_mismatch() -> None:
    with pytest.raises(Refusal) as info:
        normalise_target(b"https://evil.test/x", "h.test", 443)
    assert (info.value.status, info.value.reason) == (421, Reason.HOST_MISMATCH)


# -- rules ----------------------------------------------------------------------------------


def test_encoded_slash_is_kept_with_its_decoded_reading() -> None:
    # npm asks for scoped packages as /@scope%2fname: kept encoded, forwarded as sent.
    target = normalise_target(b"/@scope%2fname", "registry.test", 443)
    assert target.path == "/@scope%2Fname"
    assert target.slash_decoded == "/@scope/name"
    assert target.forwarded == b"/@scope%2Fname"
    assert normalise_target(b"/plain", "registry.test", 443).slash_decoded is None
    # Either reading with a dot or empty segment is still refused.
    for raw in (b"/a%2f..%2fetc", b"/a%2f%2fb", b"/a/%2f"):
        with pytest.raises(Refusal):
            normalise_target(raw, "registry.test", 443)


def _rules(*specs: tuple[str, tuple[str, ...], tuple[str, ...], str]) -> RuleSet:
    return RuleSet([RequestRule(h, m, p, a, i) for i, (h, m, p, a) in enumerate(specs)])


def test_first_match_in_file_order_wins() -> None:
    rules = _rules(
        ("api.test", ("POST",), ("/v1/files", "/v1/files/**"), "deny"),
        ("api.test", (), ("/**",), "allow"),
    )
    deny = rules.decide("api.test", 443, "POST", "/v1/files")
    assert (deny.verdict, deny.reason, deny.rule) == (
        Verdict.DENY,
        Reason.RULE_DENIED,
        "network.rules[0]",
    )
    assert rules.decide("api.test", 443, "POST", "/v1/messages").rule == "network.rules[1]"
    # the same rules in the other order: the broad allow shadows the deny
    flipped = _rules(
        ("api.test", (), ("/**",), "allow"),
        ("api.test", ("POST",), ("/v1/files",), "deny"),
    )
    assert flipped.decide("api.test", 443, "POST", "/v1/files").allowed


def test_ruled_host_denies_unmatched_and_unruled_host_passes() -> None:
    rules = _rules(("registry.test", ("GET", "HEAD"), ("/**",), "allow"))
    assert rules.decide("registry.test", 443, "GET", "/x").allowed
    denied = rules.decide("registry.test", 443, "PUT", "/x")
    assert denied.reason is Reason.NO_RULE_MATCHED
    assert rules.decide("other.test", 443, "PUT", "/x").allowed
    assert rules.ruled("registry.test", 443)
    assert not rules.ruled("other.test", 443)


def test_report_rule() -> None:
    rules = _rules(("r.test", ("POST",), ("/-/npm/*",), "report"))
    d = rules.decide("r.test", 443, "POST", "/-/npm/audit")
    assert (d.verdict, d.allowed, d.reason) == (Verdict.REPORT, True, Reason.RULE_DENIED)


@pytest.mark.parametrize(
    ("glob", "path", "hit"),
    [
        ("/**", "/", True),
        ("/**", "/a/b/c", True),
        ("/v1/*", "/v1/messages", True),
        ("/v1/*", "/v1/a/b", False),
        ("/v1/**", "/v1", True),
        ("/v1/**", "/v1x", False),
        ("/v1/files*", "/v1/files/abc", False),
        ("/v1/files*", "/v1/files_x", True),
        ("/*/git-upload-pack", "/o/r.git/git-upload-pack", False),
        ("/*/*/git-upload-pack", "/o/r.git/git-upload-pack", True),
        ("/a.b", "/aXb", False),
    ],
)
def test_globs(glob: str, path: str, hit: bool) -> None:
    rules = _rules(("h.test", (), (glob,), "allow"))
    assert rules.decide("h.test", 443, "GET", path).allowed is hit


def test_host_patterns_in_rules() -> None:
    rules = _rules(("*.example.test", (), ("/**",), "deny"), ("h.test:8443", (), ("/x",), "deny"))
    assert not rules.decide("a.example.test", 443, "GET", "/").allowed
    assert rules.decide("example.test", 443, "GET", "/").allowed
    assert not rules.decide("h.test", 8443, "GET", "/x").allowed
    assert rules.decide("h.test", 443, "GET", "/x").allowed


# -- binding -----------------------------------------------------------------------------------


def _store(header: str = "x-api-key") -> SecretStore:
    return SecretStore.resolve(
        [BoundSecret("K", "env:K", ("api.test",), header)], {"K": "real-value-123456"}
    )


def test_placeholder_shape_and_environment() -> None:
    store = _store()
    ph = store.environment()["K"]
    assert ph.startswith("stockade-ph-")
    assert len(ph) == len("stockade-ph-") + 32
    assert "real-value" not in repr(store.secrets)
    assert _store().environment()["K"] != ph


def test_missing_secret_value_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="K"):
        SecretStore.resolve([BoundSecret("K", "env:K", ("a.test",))], {})
    path = tmp_path / "key"
    path.write_text("file-secret-value\n")
    store = SecretStore.resolve([BoundSecret("K", f"file:{path}", ("a.test",))], {})
    assert store.secrets[0].value == b"file-secret-value"


def test_bind_injects_only_into_the_bound_header() -> None:
    store = _store()
    s = store.secrets[0]
    headers, injected = bind_credentials([(b"x-api-key", s.placeholder)], "", store.secrets)
    assert headers == [(b"x-api-key", b"real-value-123456")]
    assert injected == ["K"]
    with pytest.raises(Refusal) as info:
        bind_credentials([(b"authorization", b"Bearer " + s.placeholder)], "", store.secrets)
    assert info.value.reason is Reason.FOREIGN_CREDENTIAL
    for carrier in (b"x-api-key", b"authorization", b"proxy-authorization", b"cookie", b"api-key"):
        with pytest.raises(Refusal):
            bind_credentials([(carrier, b"attacker")], "", store.secrets)
    with pytest.raises(Refusal):
        bind_credentials([], "api_key=attacker", store.secrets)


def test_bearer_binding() -> None:
    store = _store("authorization")
    s = store.secrets[0]
    headers, _ = bind_credentials([(b"authorization", b"bearer " + s.placeholder)], "", [s])
    assert headers == [(b"authorization", b"Bearer real-value-123456")]


# -- scanning and redaction -----------------------------------------------------------------


PATS = [Pattern(b"SECRET-VALUE-1", "file:a", "label"), Pattern(b"xyzzy-plugh", "env:B", "label")]


@pytest.mark.parametrize("split", range(1, 14))
def test_scanner_finds_a_value_split_anywhere(split: int) -> None:
    data = b"prefix SECRET-VALUE-1 suffix"
    at = data.index(b"SECRET") + split
    scanner = StreamScanner(PATS)
    first = scanner.feed(data[:at])
    # the start of the value is held back, never released before the match is known
    assert b"SECRET" not in first
    with pytest.raises(Exception, match="file:a"):
        scanner.feed(data[at:])


def test_scanner_passes_clean_data_byte_for_byte() -> None:
    data = os.urandom(200_000).replace(b"S", b"s").replace(b"x", b"X")
    scanner = StreamScanner(PATS)
    out = b"".join(scanner.feed(data[i : i + 977]) for i in range(0, len(data), 977))
    assert out + scanner.finish() == data
    assert scanner.max_buffered <= 977 + scanner.keep


def test_replacer_across_chunks() -> None:
    r = StreamReplacer({b"REAL-KEY-VALUE": b"placeholder-xx"})
    data = b"a REAL-KEY-VALUE b REAL-KEY-VALUE"
    for cut in range(1, len(data)):
        r = StreamReplacer({b"REAL-KEY-VALUE": b"placeholder-xx"})
        out = r.feed(data[:cut]) + r.feed(data[cut:]) + r.finish()
        assert out == b"a placeholder-xx b placeholder-xx"


def test_value_tokens() -> None:
    text = b"""# comment
[default]
aws_access_key_id = AKIAEXAMPLE12345
aws_secret_access_key=wJalrXUtnFEMI/K7MDENG
export TOKEN="quoted-token-value"
SHORT=abc
a bare line that is long enough
"""
    tokens = value_tokens(text)
    assert b"AKIAEXAMPLE12345" in tokens
    assert b"wJalrXUtnFEMI/K7MDENG" in tokens
    assert b"quoted-token-value" in tokens
    assert b"abc" not in tokens
    assert b"a bare line that is long enough" in tokens
    assert value_tokens(b"ghp_singletokenfile0123\n") == [b"ghp_singletokenfile0123"]


def test_decode_body_caps_and_members() -> None:
    import gzip
    import zlib

    assert b"".join(decode_body(gzip.compress(b"a") + gzip.compress(b"b"), "gzip", 10)) == b"ab"
    assert b"".join(decode_body(zlib.compress(b"hello"), "deflate", 10)) == b"hello"
    raw = zlib.compressobj(wbits=-15)
    assert b"".join(decode_body(raw.compress(b"hi") + raw.flush(), "deflate", 10)) == b"hi"
    with pytest.raises(OverflowError):
        b"".join(decode_body(gzip.compress(b"0" * 1000), "gzip", 100))
    with pytest.raises(ValueError):
        b"".join(decode_body(b"not gzip", "gzip", 100))
    with pytest.raises(ValueError):
        b"".join(decode_body(gzip.compress(b"abc")[:-4], "gzip", 100))


# -- CA ------------------------------------------------------------------------------------------


def test_ca_shape_and_leaf() -> None:
    ca = CertificateAuthority.ephemeral()
    bc = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical
    assert bc.value.ca
    assert bc.value.path_length == 0
    ku = ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign
    assert ku.crl_sign
    assert isinstance(ca.cert.public_key(), ec.EllipticCurvePublicKey)
    assert ca.cert.not_valid_after_utc - ca.cert.not_valid_before_utc < datetime.timedelta(days=3)
    leaf = x509.load_pem_x509_certificate(ca.leaf("api.test").chain_pem)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["api.test"]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(
        hours=24, minutes=5
    )
    assert ca.leaf("api.test") is ca.leaf("api.test")
    ip_leaf = x509.load_pem_x509_certificate(ca.leaf("127.0.0.1").chain_pem)
    assert ip_leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_every_leaf_shares_one_key_and_a_leaf_is_issued_once() -> None:
    """What keeps a new host's leaf cheap, checked as a property rather than timed (the
    time itself is bench/interception.py's): no key is generated per leaf (every leaf
    carries the one P-256 key), and a host's leaf is issued once and then reused."""
    ca = CertificateAuthority.ephemeral()
    leaves = [x509.load_pem_x509_certificate(ca.leaf(f"h{i}.test").chain_pem) for i in range(5)]
    keys = {
        leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for leaf in leaves
    }
    assert len(keys) == 1
    assert len({leaf.serial_number for leaf in leaves}) == 5
    assert ca.leaf("h0.test") is ca.leaf("h0.test")


def test_user_ca_is_private_and_reused(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    first = CertificateAuthority.for_user(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "ca-key.pem").stat().st_mode) == 0o600
    again = CertificateAuthority.for_user(d)
    assert again.cert == first.cert
    d.chmod(0o755)
    with pytest.raises(SandboxError, match="chmod 700"):
        CertificateAuthority.for_user(d)


def test_trust_bundle_and_environment(tmp_path: Path) -> None:
    ca = CertificateAuthority.ephemeral()
    bundle = write_trust_bundle(ca, tmp_path / "b" / "bundle.pem")
    data = bundle.read_bytes()
    assert data.endswith(ca.cert_pem)
    assert b"PRIVATE KEY" not in data
    ctx = ssl.create_default_context(cafile=str(bundle))
    assert ctx.cert_store_stats()["x509_ca"] >= 1
    env = trust_environment("/run/stockade/ca.pem")
    assert set(env) >= {
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
        "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
    }
    assert set(env.values()) == {"/run/stockade/ca.pem"}


def test_encoded_slash_refused_only_when_it_changes_the_rule() -> None:
    from stockade.egress.inspect import Inspector, RequestRecord
    from stockade.policy import parse_policy_text

    policy = parse_policy_text(
        '[network]\nallow = ["registry.test"]\n'
        '[[network.rules]]\nhost = "registry.test"\nmethods = ["GET"]\npaths = ["/pkgs/*"]\naction = "allow"\n'
        '[[network.rules]]\nhost = "registry.test"\nmethods = ["GET"]\npaths = ["/**"]\naction = "report"\n'
    )
    inspector = Inspector.from_policy(policy, environ={})
    headers = [(b"host", b"registry.test")]

    def head(target: bytes) -> str:
        record = RequestRecord(method="GET", host="registry.test", port=443)
        inspector.head(record, "registry.test", target, headers)
        return record.rule

    # The same rule decides either reading, so it passes (npm's scoped names under /**).
    assert head(b"/@scope%2fname") == head(b"/plain") == "network.rules[1]"
    # "/pkgs/a%2Fb" is one segment to the rules but two to a server that decodes it:
    # the second rule would apply instead, so the request is refused as ambiguous.
    assert head(b"/pkgs/ab") == "network.rules[0]"
    with pytest.raises(Refusal) as info:
        head(b"/pkgs/a%2fb")
    assert info.value.reason == Reason.AMBIGUOUS_PATH
