"""The approval broker under a real proxy on 127.0.0.1: asks, answers, live changes.

Every refusal has its allowed twin; "nothing was looked up" is checked on the resolver.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stockade import PolicyError
from stockade.egress import EgressRules
from stockade.egress.approval import AccessRequest, Answer, ApprovalBroker, RunGate, Scope
from tests.egress.conftest import (
    TIMEOUT,
    ProxyHarness,
    RecordingHTTPServer,
    read_http_response,
    static_resolver,
)

PINS = {"a.test": "127.0.0.1", "b.test": "127.0.0.1", "base.test": "127.0.0.1"}


class Gated:
    """A proxy with a gate, and the events its run wrote."""

    def __init__(self, broker: ApprovalBroker, **options: Any) -> None:
        self.broker = broker
        self.events: list[dict[str, Any]] = []
        self.gate: RunGate = broker.gate("r1", ("pip", "install"), self._emit)
        self.harness = ProxyHarness(broker.base, gate=self.gate, **options)
        self.gate.loop = self.harness.loop
        self.gate.on_change = self.harness.proxy.close_failing

    def _emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, **fields}
        self.events.append(record)
        return record

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def get(self, host: str, port: int) -> tuple[int, bytes]:
        sock = self.harness.connect()
        with sock:
            sock.sendall(
                f"GET http://{host}:{port}/x HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            status, rest = read_http_response(sock)
            return status, rest

    def refused(self, authority: str) -> int:
        status, sock = self.connect(authority)
        sock.close()
        return status

    def connect(self, authority: str) -> tuple[int, socket.socket]:
        sock = self.harness.connect()
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        status, _ = read_http_response(sock)
        return status, sock


@pytest.fixture
def gated() -> Iterator[Callable[..., Gated]]:
    made: list[Gated] = []

    def make(
        approver: Any = None,
        allow: tuple[str, ...] = ("base.test",),
        deny: tuple[str, ...] = (),
        timeout: float = 5.0,
        **options: Any,
    ) -> Gated:
        rules = EgressRules(allow=allow, deny=deny, hosts=PINS)
        g = Gated(ApprovalBroker(rules, asker=approver, timeout=timeout), **options)
        made.append(g)
        return g

    yield make
    for g in made:
        g.harness.stop()


class Script:
    """A scripted approver: answers by target, records what it was asked."""

    def __init__(self, answers: dict[str, Any], delay: float = 0.0) -> None:
        self.answers = answers
        self.delay = delay
        self.asked: list[AccessRequest] = []
        self.lock = threading.Lock()

    def __call__(self, request: AccessRequest) -> Any:
        with self.lock:
            self.asked.append(request)
        time.sleep(self.delay)
        answer = self.answers.get(request.target, self.answers.get(request.host))
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_miss_is_asked_and_allowed(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    script = Script({f"a.test:{origin.port}": Answer.allow()})
    g = gated(script)
    assert g.get("a.test", origin.port)[0] == 200
    assert g.get("a.test", origin.port)[0] == 200  # the run grant holds: asked once
    assert len(script.asked) == 1
    request = script.asked[0]
    assert (request.host, request.port, request.scheme, request.argv) == (
        "a.test",
        origin.port,
        "http",
        ("pip", "install"),
    )
    (ask,) = g.named("ask")
    (answer,) = g.named("answer")
    assert answer["verdict"] == "allow"
    assert answer["ask_id"] == ask["ask_id"]
    requests = g.harness.wait_events("net_request", 2)
    assert requests[0].decision.rule == f"grant:{ask['ask_id']}"


def test_allowed_host_is_never_asked(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    script = Script({})
    g = gated(script)
    assert g.get("base.test", origin.port)[0] == 200
    assert script.asked == []


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Answer.deny("no"), "user-denied"),
        (False, "user-denied"),
        (None, "user-denied"),
        ("yes", "approval-error"),
        (RuntimeError("boom"), "approval-error"),
        (Answer.allow(pattern="other.test"), "approval-error"),
        (Answer.allow(pattern="*"), "approval-error"),
    ],
)
def test_denials_before_any_lookup(
    gated: Callable[..., Gated], origin: RecordingHTTPServer, answer: Any, reason: str
) -> None:
    resolver = static_resolver({"c.test": ["127.0.0.1"]})
    g = gated(Script({"c.test": answer}), resolver=resolver)
    status, _ = g.get("c.test", origin.port)
    assert status == 403
    assert g.harness.last("net_request").reason == reason
    assert resolver.asked == []  # type: ignore[attr-defined]
    # Remembered for the run: the second connection is not asked again.
    assert g.get("c.test", origin.port)[0] == 403
    assert len(g.named("ask")) == 1


def test_true_allows_and_the_twin_resolves(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    resolver = static_resolver({"c.test": ["127.0.0.1"]})
    g = gated(Script({"c.test": True}), resolver=resolver, allow=("base.test", "127.0.0.1"))
    assert g.get("c.test", origin.port)[0] == 200
    assert resolver.asked == ["c.test"]  # type: ignore[attr-defined]


def test_timeout_denies(gated: Callable[..., Gated], origin: RecordingHTTPServer) -> None:
    g = gated(Script({"a.test": True}, delay=1.0), timeout=0.2)
    assert g.get("a.test", origin.port)[0] == 403
    assert g.harness.last("net_request").reason == "approval-timeout"
    (answer,) = g.named("answer")
    assert answer["reason"] == "approval-timeout"
    assert answer["verdict"] == "deny"


@pytest.mark.parametrize(
    "target",
    ["denied.test", "127.0.0.2", "10.1.2.3", "169.254.169.254", "bad_-.test..x"],
)
def test_never_askable(
    gated: Callable[..., Gated], origin: RecordingHTTPServer, target: str
) -> None:
    script = Script({})
    g = gated(script, deny=("denied.test",))
    status, _ = g.get(target, origin.port)
    assert status in (400, 403)
    assert script.asked == []
    assert g.named("ask") == []


def test_two_connections_one_ask(gated: Callable[..., Gated], origin: RecordingHTTPServer) -> None:
    script = Script({"a.test": True}, delay=0.5)
    g = gated(script)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(g.get("a.test", origin.port)[0]))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert results == [200, 200, 200]
    assert len(script.asked) == 1


def test_pending_ask_lets_nothing_else_through(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    release = threading.Event()

    def approver(request: AccessRequest) -> Any:
        if request.host == "a.test":
            release.wait(TIMEOUT)
            return True
        return False

    g = gated(approver)
    first: list[int] = []
    t = threading.Thread(target=lambda: first.append(g.get("a.test", origin.port)[0]))
    t.start()
    time.sleep(0.2)
    # While a.test waits: b.test is asked on its own and refused; nothing leaks.
    assert g.get("b.test", origin.port)[0] == 403
    assert first == []
    release.set()
    t.join(TIMEOUT)
    assert first == [200]


def test_session_scope_outlives_the_run_grant(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    script = Script({"a.test": Answer.allow(Scope.SESSION), "b.test": Answer.allow()})
    g = gated(script)
    assert g.get("a.test", origin.port)[0] == 200
    assert g.get("b.test", origin.port)[0] == 200
    patterns = [(x.pattern, x.scope) for x in g.broker.grants]
    assert patterns == [(f"a.test:{origin.port}", Scope.SESSION)]
    # A second run of the same broker: a.test passes, b.test is asked again.
    other = g.broker.gate("r2", ("x",), lambda *a, **k: {})
    assert other.current().check_name("a.test", origin.port).allowed
    assert not other.current().check_name("b.test", origin.port).allowed


def test_live_allow_and_revoke_close_the_tunnel(
    gated: Callable[..., Gated], origin: RecordingHTTPServer
) -> None:
    g = gated(None)
    target = f"b.test:{origin.port}"
    assert g.refused(target) == 403
    generation = g.broker.update(allow=["b.test"])
    status, tunnel = g.connect(target)
    assert status == 200
    with tunnel:
        tunnel.sendall(b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
        assert read_http_response(tunnel)[0] == 200
        assert g.broker.update(revoke=["b.test"], close=True) == generation + 1
        tunnel.settimeout(TIMEOUT)
        assert tunnel.recv(65536) == b""  # closed by the revoke
    assert g.refused(target) == 403
    reasons = [e.reason for e in g.harness.named("net_connect")]
    assert "host-revoked" in reasons
    assert [e["event"] for e in g.named("policy_change")] == ["policy_change"] * 2


def test_live_changes_are_bounded(gated: Callable[..., Gated]) -> None:
    g = gated(None, deny=("evil.test",))
    with pytest.raises(PolicyError, match=r"network\.deny"):
        g.broker.update(allow=["evil.test"])
    for wide in ("10.0.0.0/8", "127.0.0.1", "*.test"):
        with pytest.raises(PolicyError):
            g.broker.update(allow=[wide])
    g.broker.update(allow=["ok.test"])  # the twin: a plain name is fine
    assert g.gate.current().check_name("ok.test", 443).allowed
    g.broker.update(deny=["ok.test"])  # deny wins over the grant
    assert not g.gate.current().check_name("ok.test", 443).allowed


def test_resolver_answers_askable_names_without_any_lookup() -> None:
    """With asking on, a name not on the allow-list gets a synthetic address (so a client
    that ignores proxy variables reaches the ask when it connects); a denied name never
    does, nor does anything once asking is off."""
    from stockade.egress.dns import AddressPool, DnsServer
    from stockade.runtime._egress import _live_rules
    from tests.egress.dns import wire
    from tests.egress.dns.conftest import ask

    rules = EgressRules(allow=("base.test",), deny=("denied.test",))
    broker = ApprovalBroker(rules, asker=lambda request: False, timeout=1)
    gate = broker.gate("r1", (), lambda *a, **k: {})
    server = DnsServer(rules, AddressPool(), lambda *a: None, live=_live_rules(gate))
    assert ask(server, wire.query("new.test")).rcode == wire.NOERROR
    assert ask(server, wire.query("base.test")).rcode == wire.NOERROR
    assert ask(server, wire.query("denied.test")).rcode == wire.NXDOMAIN
    strict = ApprovalBroker(rules, asker=lambda request: False, timeout=1, strict=True)
    gate = strict.gate("r2", (), lambda *a, **k: {})
    server = DnsServer(rules, AddressPool(), lambda *a: None, live=_live_rules(gate))
    assert ask(server, wire.query("new.test")).rcode == wire.NXDOMAIN
    assert ask(server, wire.query("base.test")).rcode == wire.NOERROR
