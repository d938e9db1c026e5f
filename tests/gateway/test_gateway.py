"""``stockade gateway serve`` against a fake API server (§6.2 tier 3 of scale-out.md).

No cluster can run here (no kube-apiserver, kind or k3s on this machine kind), so the
API server is an in-test asyncio HTTPS server on 127.0.1.1 with a trustme CA that
implements exactly the endpoints the gateway uses: pods list and watch (real watch-event
JSON) and TokenReview (see harness.py). Pods are told apart by their peer address:
each test client binds its socket to its pod's loopback address (127.0.0.2, .3, …)
before connecting. Origins are servers on 127.0.0.1 pinned with ``network.hosts``
under ``.test`` names. Every deny has its allow twin.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.gateway._server import Identity
from stockade.policy import Decision
from tests.gateway.harness import Harness, Origin, pod

A_IP, B_IP, PENDING_IP, NARROW_IP, OTHER_IP, WARM_IP, UNKNOWN_IP = (
    "127.0.0.2",
    "127.0.0.3",
    "127.0.0.4",
    "127.0.0.5",
    "127.0.0.6",
    "127.0.0.7",
    "127.0.0.9",
)

ORIGIN = Origin("origin")
INSIDE = Origin("inside", host="127.0.3.1")  # in a cluster range given to the gateway

HOSTS = """
[network.hosts]
"a.test" = "127.0.0.1"
"b.test" = "127.0.0.1"
"c.test" = "127.0.0.1"
"inside.test" = "127.0.3.1"
"meta.test" = "169.254.10.10"
"node.test" = "127.0.4.1"
"""


def policy(allow: list[str], namespaces: list[str], accounts: list[str] | None = None) -> str:
    kube = f"[kubernetes]\nnamespaces = {namespaces!r}\n".replace("'", '"')
    if accounts is not None:
        kube += f"service_accounts = {accounts!r}\n".replace("'", '"')
    return f"[network]\nallow = {allow!r}\n".replace("'", '"') + HOSTS + kube


POLICIES = {
    "a": policy(["a.test", "inside.test", "meta.test", "node.test"], ["team"]),
    "b": policy(["b.test"], ["team"]),
    "narrow": policy(["a.test"], ["other"]),
    "open-inside": policy(["127.0.3.1"], ["team"]),
}


#: a pod of agent-sandbox's warm pool, its template's policy annotation already on it,
#: that no claim has adopted yet
WARM = pod("pod-warm", WARM_IP, policy="a", warm_pool="agent-pool")


def url(host: str, path: str = "/") -> str:
    return f"http://{host}:{ORIGIN.port}{path}"


def make(tmp_path: Path, tokens: bool = False) -> Harness:
    h = Harness(tmp_path, POLICIES, tokens=tokens, cluster=("127.0.3.0/24",))
    for obj in (
        pod("pod-a", A_IP, policy="a", claim="claim-1"),
        pod("pod-b", B_IP, policy="b"),
        pod("pod-pending", PENDING_IP, policy="a", phase="Pending"),
        pod("pod-narrow", NARROW_IP, policy="narrow"),
        pod("pod-other", OTHER_IP, policy="narrow", namespace="other"),
        WARM,
    ):
        h.api.put(obj)
    h.start()
    return h


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Harness]:
    h = make(tmp_path)
    yield h
    h.close()


@pytest.fixture
def gwt(tmp_path: Path) -> Iterator[Harness]:
    h = make(tmp_path, tokens=True)
    h.api.tokens["token-a"] = (h.api.pods["uid-pod-a"], ["stockade-gateway"])
    h.api.tokens["token-b"] = (h.api.pods["uid-pod-b"], ["stockade-gateway"])
    h.api.tokens["token-a-api"] = (h.api.pods["uid-pod-a"], ["https://kubernetes.default.svc"])
    yield h
    h.close()


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"sandbox:{token}".encode()).decode()


# -- policy per pod ----------------------------------------------------------------------


def test_pod_a_gets_policy_a(gw: Harness) -> None:
    assert gw.get(A_IP, url("a.test"))[:2] == (200, b"origin")
    status, _, headers = gw.get(A_IP, url("b.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "host-not-allowed"


def test_pod_b_gets_policy_b(gw: Harness) -> None:
    assert gw.get(B_IP, url("b.test"))[:2] == (200, b"origin")
    assert gw.get(B_IP, url("a.test"))[0] == 403


def test_connect_and_socks_are_decided_alike(gw: Harness) -> None:
    status, sock = gw.tunnel(A_IP, f"a.test:{ORIGIN.port}")
    assert status == 200
    sock.sendall(b"hello\n")
    assert sock.recv(100) == b"echo:hello\n"
    sock.close()
    status, sock = gw.tunnel(B_IP, f"a.test:{ORIGIN.port}")
    assert status == 403
    sock.close()
    # SOCKS5 from pod B: b.test allowed, a.test refused (reply code 2).
    for host, code in ((b"b.test", 0), (b"a.test", 2)):
        sock = gw.connect(B_IP)
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        sock.sendall(
            b"\x05\x01\x00\x03" + bytes([len(host)]) + host + ORIGIN.port.to_bytes(2, "big")
        )
        assert sock.recv(10)[1] == code
        sock.close()


def test_unknown_address_is_refused(gw: Harness) -> None:
    status, _, headers = gw.get(UNKNOWN_IP, url("a.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "unknown-peer"
    assert gw.get(A_IP, url("a.test"))[0] == 200  # twin


def test_pod_not_running_is_refused(gw: Harness) -> None:
    status, _, headers = gw.get(PENDING_IP, url("a.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "pod-not-running"
    running = pod("pod-pending", PENDING_IP, policy="a")
    gw.soon(lambda: gw.api.put(running))
    gw.wait(lambda: gw.gateway.pods.lookup(PENDING_IP)[0] is not None, "the pod to run")
    assert gw.get(PENDING_IP, url("a.test"))[0] == 200


def test_policy_must_permit_the_namespace(gw: Harness) -> None:
    status, _, headers = gw.get(NARROW_IP, url("a.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "policy-not-permitted"
    # Twin: the same policy for a pod of the namespace it lists.
    assert gw.get(OTHER_IP, url("a.test"))[0] == 200


def test_policy_unknown_is_refused(gw: Harness) -> None:
    ghost = pod("pod-a", A_IP, policy="nonexistent", claim="claim-1")
    gw.soon(lambda: gw.api.put(ghost))
    gw.wait(
        lambda: (
            gw.gateway.pods.pods["uid-pod-a"].annotations.get("stockade.dev/policy")
            == "nonexistent"
        ),
        "the annotation",
    )
    status, _, headers = gw.get(A_IP, url("a.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "policy-unknown"


def test_annotation_update_switches_policy(gw: Harness) -> None:
    assert gw.get(A_IP, url("b.test"))[0] == 403
    switched = pod("pod-a", A_IP, policy="b", claim="claim-1")
    gw.soon(lambda: gw.api.put(switched))
    gw.wait(
        lambda: gw.gateway.pods.pods["uid-pod-a"].annotations.get("stockade.dev/policy") == "b",
        "the annotation",
    )
    assert gw.get(A_IP, url("b.test"))[0] == 200
    assert gw.get(A_IP, url("a.test"))[0] == 403


def _change_closes_a_tunnel_only(gw: Harness, change: Callable[[], None]) -> dict[str, Any]:
    """Open a tunnel for pod A and one for pod B, ``change`` pod A: A's closes and B's
    (the twin) still carries bytes. The pod-gone event of A's is returned."""
    status, sock = gw.tunnel(A_IP, f"a.test:{ORIGIN.port}")
    assert status == 200
    sock.sendall(b"one\n")
    assert sock.recv(100) == b"echo:one\n"
    status_b, sock_b = gw.tunnel(B_IP, f"b.test:{ORIGIN.port}")
    assert status_b == 200
    gw.soon(change)
    sock.settimeout(3.0)
    assert sock.recv(100) == b""
    sock_b.sendall(b"two\n")
    assert sock_b.recv(100) == b"echo:two\n"
    sock.close()
    sock_b.close()
    gw.wait(lambda: bool(gw.events_of(pod="pod-a", reason="pod-gone")), "the pod-gone event")
    return gw.events_of(pod="pod-a", reason="pod-gone")[0]


def test_pod_deleted_mid_tunnel_closes_it(gw: Harness) -> None:
    _change_closes_a_tunnel_only(gw, lambda: gw.api.delete("uid-pod-a"))
    assert gw.get(A_IP, url("a.test"))[0] == 403


def test_unclaimed_warm_pool_pod_is_refused_until_a_claim_adopts_it(gw: Harness) -> None:
    status, _, headers = gw.get(WARM_IP, url("a.test"))
    assert status == 403
    assert headers["x-stockade-reason"] == "pod-unclaimed"
    gw.wait(lambda: bool(gw.events_of(pod="pod-warm", reason="pod-unclaimed")), "the event")
    assert gw.events_of(pod="pod-warm", reason="pod-unclaimed")[0]["verdict"] == "deny"
    # Twin: a plain pod (no warm pool label) without any claim is served by its policy.
    assert gw.get(B_IP, url("b.test"))[0] == 200
    # Adoption writes the claim label on the live pod: its next connection is served.
    claimed = pod("pod-warm", WARM_IP, policy="a", warm_pool="agent-pool", claim="claim-9")
    gw.soon(lambda: gw.api.put(claimed))
    gw.wait(lambda: gw.gateway.pods.pods["uid-pod-warm"].claim == "claim-9", "the claim")
    assert gw.get(WARM_IP, url("a.test"))[0] == 200
    gw.wait(lambda: bool(gw.events_of(pod="pod-warm", verdict="allow")), "the allow event")
    assert gw.events_of(pod="pod-warm", verdict="allow")[0]["claim"] == "claim-9"


def test_unclaimed_serve_serves_warm_pool_pods(tmp_path: Path) -> None:
    h = Harness(tmp_path, POLICIES, unclaimed="serve")
    h.api.put(WARM)
    h.start()
    try:
        assert h.get(WARM_IP, url("a.test"))[0] == 200
        assert h.get(WARM_IP, url("b.test"))[0] == 403  # still its policy's decision
    finally:
        h.close()


def test_another_claim_closes_the_previous_claims_tunnels(gw: Harness) -> None:
    reclaimed = pod("pod-a", A_IP, policy="a", claim="claim-2")
    event = _change_closes_a_tunnel_only(gw, lambda: gw.api.put(reclaimed))
    assert "changed claim" in event["detail"]
    # The new claim's own connections pass.
    assert gw.get(A_IP, url("a.test"))[0] == 200


def test_cluster_ranges_and_link_local_refused_even_when_pinned(gw: Harness) -> None:
    for host in ("inside.test", "meta.test", "node.test"):
        status, _, headers = gw.get(A_IP, f"http://{host}:{INSIDE.port}/")
        assert status == 403, host
        assert headers["x-stockade-reason"] == "address-cluster", host
    assert INSIDE.accepted == 0
    # Twin: a policy that allows the address itself reaches it.
    opened = pod("pod-b", B_IP, policy="open-inside")
    gw.soon(lambda: gw.api.put(opened))
    gw.wait(
        lambda: (
            gw.gateway.pods.pods["uid-pod-b"].annotations.get("stockade.dev/policy")
            == "open-inside"
        ),
        "the annotation",
    )
    status, body, _ = gw.get(B_IP, f"http://127.0.3.1:{INSIDE.port}/")
    assert (status, body) == (200, b"inside")


def test_api_down_past_ttl_refuses_then_recovers(gw: Harness) -> None:
    assert gw.get(A_IP, url("a.test"))[0] == 200
    gw.call(gw.api.stop())
    time.sleep(0.8)  # past the 0.5 s cache lifetime
    status, _, headers = gw.get(A_IP, url("a.test"))
    assert status == 503
    assert headers["x-stockade-reason"] == "identity-stale"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics_port}/readyz", timeout=3)
    assert info.value.code == 503
    info.value.close()
    gw.call(gw.api.start())
    gw.wait(lambda: gw.gateway.pods.connected, "the watch to reconnect")
    assert gw.get(A_IP, url("a.test"))[0] == 200


def test_policy_edit_is_used_by_the_next_connection(gw: Harness) -> None:
    assert gw.get(A_IP, url("c.test"))[0] == 403
    before = gw.gateway.store.current
    assert before is not None
    new = gw.policies / "a.toml.new"
    new.write_text(policy(["a.test", "c.test"], ["team"]))
    os.replace(new, gw.policies / "a.toml")
    gw.wait(lambda: gw.gateway.store.current is not before, "the reload")
    assert gw.get(A_IP, url("c.test"))[0] == 200
    digests = {e.get("policy_digest") for e in gw.events_of(pod="pod-a", event="net_request")}
    assert len(digests) == 2  # each request names the generation that decided it


def test_bad_policy_edit_keeps_the_previous_generation(gw: Harness) -> None:
    before = gw.gateway.store.current
    (gw.policies / "b.toml").write_text("[network]\nallow = 3\n")
    gw.wait(lambda: bool(gw.events_of(event="policy_reload_failed")), "the failure event")
    assert gw.gateway.store.current is before
    assert gw.get(B_IP, url("b.test"))[0] == 200


def test_audit_lines_carry_the_identity(gw: Harness) -> None:
    gw.get(A_IP, url("a.test"))
    gw.get(UNKNOWN_IP, url("a.test"))
    gw.wait(lambda: bool(gw.events_of(pod="pod-a", event="net_request")), "the event")
    event = gw.events_of(pod="pod-a", event="net_request")[0]
    assert event["verdict"] == "allow"
    assert event["namespace"] == "team"
    assert event["pod_uid"] == "uid-pod-a"
    assert event["claim"] == "claim-1"
    assert event["policy"] == "a"
    assert event["policy_digest"].startswith("sha256:")
    assert event["peer"] == A_IP
    current = gw.gateway.store.current
    assert current is not None
    assert event["generation"] == current.number
    assert event["mode"] == "gateway"
    refused = gw.events_of(peer=UNKNOWN_IP)[0]
    assert refused["verdict"] == "deny"
    assert refused["reason"] == "unknown-peer"


def test_stdout_lines_splice_the_identity_which_wins(gw: Harness) -> None:
    # The stdout writer serialises a connection's identity once and splices it into
    # each line; a field of the event that names an identity key gives way to it.
    lines: list[str] = []
    gw.gateway._line = lines.append
    identity = Identity.of({"peer": A_IP, "pod": "pod-a", "policy": "a", "claim": None})
    gw.gateway._emit(
        "net_connect",
        Decision.allow("egress"),
        {"host": "a.test", "policy": "forged", "mode": "transparent"},
        identity,
    )
    (line,) = lines
    record = json.loads(line)
    assert record["policy"] == "a"
    assert record["mode"] == "gateway"
    assert (record["host"], record["pod"], record["claim"]) == ("a.test", "pod-a", None)
    assert line.count('"policy"') == 1


def test_health_ready_and_metrics(gw: Harness) -> None:
    gw.get(A_IP, url("a.test"))
    gw.get(A_IP, url("b.test"))
    base = f"http://127.0.0.1:{gw.metrics_port}"

    def fetch(path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(base + path, timeout=3) as answer:
            return answer.status, answer.read()

    assert fetch("/healthz") == (200, b"ok\n")
    assert fetch("/readyz")[0] == 200
    text = fetch("/metrics")[1].decode()
    assert 'stockade_gateway_decisions_total{policy="a",verdict="allow",reason="allowed"}' in text
    assert 'verdict="deny",reason="host-not-allowed"' in text
    assert 'stockade_gateway_bytes_total{policy="a",direction="down"}' in text
    assert "stockade_gateway_decision_seconds_bucket" in text
    assert "stockade_gateway_pods 6" in text


# -- the token identity ------------------------------------------------------------------


def test_token_of_the_pod_is_allowed(gwt: Harness) -> None:
    assert gwt.get(A_IP, url("a.test"), auth=basic("token-a"))[:2] == (200, b"origin")


def test_token_missing_is_refused(gwt: Harness) -> None:
    status, _, headers = gwt.get(A_IP, url("a.test"))
    assert status == 407
    assert headers["x-stockade-reason"] == "credential-missing"
    assert "proxy-authenticate" in headers


def test_token_of_another_pod_is_refused(gwt: Harness) -> None:
    status, _, headers = gwt.get(B_IP, url("a.test"), auth=basic("token-a"))
    assert status == 403
    assert headers["x-stockade-reason"] == "credential-mismatch"
    assert gwt.get(B_IP, url("b.test"), auth=basic("token-b"))[0] == 200  # twin


def test_token_for_another_audience_is_refused(gwt: Harness) -> None:
    status, _, headers = gwt.get(A_IP, url("a.test"), auth=basic("token-a-api"))
    assert status == 407
    assert headers["x-stockade-reason"] == "credential-invalid"


def test_pod_deleted_during_the_token_review_is_refused(gwt: Harness) -> None:
    # The pod is looked up, then its token reviewed (a slow API server); the pod is
    # deleted while the review is in flight. The review says "pod A" and the UID still
    # matches the pod found before the wait: only a second look finds it gone.
    gwt.api.review_delay = 0.5
    answers: list[tuple[int, bytes, dict[str, str]]] = []
    thread = threading.Thread(
        target=lambda: answers.append(gwt.get(A_IP, url("a.test"), auth=basic("token-a")))
    )
    thread.start()
    gwt.wait(lambda: any("tokenreviews" in r for r in gwt.api.requests), "the review")
    gwt.soon(lambda: gwt.api.delete("uid-pod-a"))
    thread.join(5)
    status, _, headers = answers[0]
    assert status == 403
    assert headers["x-stockade-reason"] == "pod-gone"
    # Twin: the same slow review for a pod that stays is allowed.
    assert gwt.get(B_IP, url("b.test"), auth=basic("token-b"))[0] == 200


def test_token_over_socks5(gwt: Harness) -> None:
    for token, expected in ((b"token-a", b"\x01\x00"), (b"token-b", b"\x01\x01")):
        sock = gwt.connect(A_IP)
        sock.sendall(b"\x05\x01\x02")
        assert sock.recv(2) == b"\x05\x02"
        sock.sendall(b"\x01\x07sandbox" + bytes([len(token)]) + token)
        assert sock.recv(2) == expected
        if expected == b"\x01\x00":
            host = b"a.test"
            sock.sendall(b"\x05\x01\x00\x03\x06" + host + ORIGIN.port.to_bytes(2, "big"))
            assert sock.recv(10)[1] == 0
            sock.sendall(b"hi\n")
            assert sock.recv(100) == b"echo:hi\n"
        sock.close()
