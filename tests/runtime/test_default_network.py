"""The built-in policy (nothing on the network allowed) still decides, audits and reports
every attempt: stockade's resolver refuses a name (a ``dns_query`` deny), the capture
listeners refuse a connection to an address (a ``net_connect`` or ``net_request`` deny),
the proxy refuses what comes through the proxy variables, and ``run``'s stderr summary
names what was refused. Nothing leaves the sandbox's own network namespace.

The twins: the same runs still reach the workspace and loopback inside the sandbox, and
an allowed name pinned to a server on 127.0.0.1 is reached.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

#: clients that ignore the proxy variables (the transparent path) and one that uses them
PROBE = r"""
import json, os, socket, sys, urllib.request
out = {}
try:
    socket.getaddrinfo("nothing-allowed.test", 443)
    out["resolve"] = "resolved"
except OSError as exc:
    out["resolve"] = type(exc).__name__
try:
    with socket.create_connection(("192.0.2.1", 80), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: 192.0.2.1\r\n\r\n")
        out["literal"] = s.recv(200).decode(errors="replace").split("\r\n")[0]
except OSError as exc:
    out["literal"] = type(exc).__name__
try:
    urllib.request.urlopen("http://via-proxy.test/", timeout=5)
    out["proxied"] = "fetched"
except Exception as exc:
    out["proxied"] = type(exc).__name__
# The twin: loopback inside the sandbox's own namespace works as ever.
srv = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"ping")
out["loopback"] = a.recv(4).decode()
print(json.dumps(out))
"""


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_nothing_allowed_still_audits_every_attempt(world: World) -> None:
    audit = world.root / "audit.jsonl"
    env = {k: v for k, v in world.env.items() if "proxy" not in k.lower()}
    world.env.clear()
    world.env.update(env)
    proc = world.stockade("run", "--audit", str(audit), "--", "python3", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["resolve"] == "gaierror"
    assert out["literal"].startswith("HTTP/1.1 403"), out
    assert out["proxied"] == "HTTPError", out  # the proxy's 403
    assert out["loopback"] == "ping"
    events = _events(audit)
    denied = [e for e in events if e.get("verdict") == "deny"]
    dns = [e for e in denied if e["event"] == "dns_query"]
    assert [e["name"] for e in dns] == ["nothing-allowed.test"], denied
    assert any(
        e["event"] in ("net_connect", "net_request") and e["host"] == "192.0.2.1" for e in denied
    ), denied
    assert any(e.get("host") == "via-proxy.test" for e in denied), denied
    assert all(e["reason"] == "host-not-allowed" for e in denied), denied
    # The summary says what was refused, and how to allow it.
    summary = [line for line in proc.stderr.splitlines() if line.startswith("stockade: denied")]
    assert len(summary) == 1, proc.stderr
    for target in ("nothing-allowed.test", "192.0.2.1", "via-proxy.test"):
        assert target in summary[0], summary
    assert f"details in {audit}" in summary[0]
    assert "stockade: hint: to allow nothing-allowed.test: --allow-host" in proc.stderr


class _Hello(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(1024)
        self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")


@pytest.fixture
def local_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_allowed_host_is_still_reached_beside_the_refusals(
    world: World, local_server: int
) -> None:
    # The twin: the allow-list still opens what it names, in a run that is refused the rest.
    policy = world.root / "policy.toml"
    policy.write_text(
        '[network]\nallow = ["web.test"]\n[network.hosts]\n"web.test" = "127.0.0.1"\n'
    )
    script = (
        "import urllib.request\n"
        f"print(urllib.request.urlopen('http://web.test:{local_server}/', timeout=5).read())\n"
        "try:\n"
        "    urllib.request.urlopen('http://other.test/', timeout=5)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    proc = world.stockade("run", "--policy", str(policy), "--", "python3", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["b'hello'", "HTTPError"]
    assert "stockade: denied 1: 1 egress host-not-allowed (GET other.test:80/)" in proc.stderr
    # The hint names the policy file given, not the user policy.
    assert f"network.allow in {policy}" in proc.stderr


def test_a_private_address_refusal_says_how_to_pin_it(world: World, local_server: int) -> None:
    # Item 12 of issue 24: the command line says what the MCP hint says.
    policy = world.root / "policy.toml"
    policy.write_text('[network]\nallow = ["localhost"]\n')
    script = (
        "import urllib.request\n"
        "try:\n"
        f"    urllib.request.urlopen('http://localhost:{local_server}/', timeout=5)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    proc = world.stockade("run", "--policy", str(policy), "--", "python3", "-c", script)
    assert proc.stdout.strip() == "HTTPError", proc.stderr
    assert "egress address-not-public" in proc.stderr
    assert "add it to network.hosts" in proc.stderr, proc.stderr
