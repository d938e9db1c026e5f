"""The egress proxy is made when the sandbox first needs it (issue 23, item 5).

The sandbox's listeners (the proxy's, the resolver's, the capture listeners) exist from
the start of every run with the egress layer on; the proxy behind them (asyncio, h11,
the resolver's server) is imported and made only once one of them becomes readable. A
run that opens no socket never imports it, in the process that called :func:`stockade.run`;
a run that does gets the same decisions and the same audit events as a proxy made at
start: a refused name is a ``dns_query`` deny, a refused connection a ``net_connect``
deny, an allowed name pinned to a local server is reached.

Each check runs in a fresh Python process (the API's caller), since the test process
itself has long imported asyncio.
"""

from __future__ import annotations

import json
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

#: the API caller: one run of argv[2:] under the policy file argv[1] ("" for the
#: built-in one), then what it imported and what the run recorded
CALLER = r"""
import json, os, sys
import stockade
policy = sys.argv[1] or None
done = stockade.run(sys.argv[2:], policy=policy, capture_output=True, text=True)
print(json.dumps({
    "returncode": done.returncode,
    "stdout": done.stdout,
    "stderr": done.stderr,
    "events": done.events,
    "imported": sorted(
        m for m in ("asyncio", "h11", "ssl", "stockade.egress._proxy",
                    "stockade.egress.dns._server")
        if m in sys.modules
    ),
}))
"""

#: the sandboxed command of the twin: a refused name, a refused address (captured inside
#: the sandbox's own namespace), and, when given, an allowed name pinned to a server
PROBE = r"""
import json, socket, sys, urllib.request
out = {}
try:
    socket.getaddrinfo("refused-name.test", 443)
    out["resolve"] = "resolved"
except OSError as exc:
    out["resolve"] = type(exc).__name__
try:
    with socket.create_connection(("192.0.2.7", 80), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: 192.0.2.7\r\n\r\n")
        out["literal"] = s.recv(200).decode(errors="replace").split("\r\n")[0]
except OSError as exc:
    out["literal"] = type(exc).__name__
if len(sys.argv) > 1:
    out["allowed"] = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
print(json.dumps(out))
"""


def _call(world: World, policy: str, *argv: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CALLER, policy, *argv],
        cwd=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _layers(events: list[dict[str, Any]]) -> list[str]:
    start = [e for e in events if e["event"] == "run_start"]
    assert len(start) == 1, events
    layers: list[str] = start[0]["layers"]
    return layers


def test_a_run_that_opens_no_socket_never_imports_the_proxy(world: World) -> None:
    done = _call(world, "", "sh", "-c", "echo quiet")
    assert done["returncode"] == 0, done["stderr"]
    assert done["stdout"] == "quiet\n"
    # Every layer on, the egress layer included: its listeners existed all along.
    assert "egress" in _layers(done["events"])
    assert done["imported"] == [], done["imported"]
    assert not [e for e in done["events"] if e["event"] == "proxy_failed"], done["events"]


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


def test_a_run_that_uses_the_network_is_decided_and_audited_as_ever(world: World) -> None:
    # The twin: the first query starts the proxy, which refuses and audits it; so is the
    # connection to an address no name was resolved to.
    done = _call(world, "", "python3", "-c", PROBE)
    assert done["returncode"] == 0, done["stderr"]
    out = json.loads(done["stdout"])
    assert out["resolve"] == "gaierror", out
    assert out["literal"].startswith("HTTP/1.1 403"), out
    assert "asyncio" in done["imported"]
    assert "stockade.egress._proxy" in done["imported"]
    denied = [e for e in done["events"] if e.get("verdict") == "deny"]
    dns = [e for e in denied if e["event"] == "dns_query"]
    assert [e["name"] for e in dns] == ["refused-name.test"], denied
    literal = [
        e
        for e in denied
        if e["event"] in ("net_connect", "net_request") and e["host"] == "192.0.2.7"
    ]
    assert literal, denied
    assert all(e["reason"] == "host-not-allowed" for e in denied), denied
    assert not [e for e in done["events"] if e["event"] == "proxy_failed"], done["events"]


def test_an_allowed_host_is_reached_through_the_proxy_made_on_demand(
    world: World, local_server: int
) -> None:
    policy = world.root / "policy.toml"
    policy.write_text(
        '[network]\nallow = ["web.test"]\n[network.hosts]\n"web.test" = "127.0.0.1"\n'
    )
    done = _call(world, str(policy), "python3", "-c", PROBE, f"http://web.test:{local_server}/")
    assert done["returncode"] == 0, done["stderr"]
    out = json.loads(done["stdout"])
    assert out["allowed"] == "hello", out
    assert out["resolve"] == "gaierror", out
    assert out["literal"].startswith("HTTP/1.1 403"), out
    allowed = [
        e
        for e in done["events"]
        if e["event"] in ("net_connect", "net_request")
        and e.get("verdict") == "allow"
        and e.get("host") == "web.test"
    ]
    assert allowed, done["events"]


def test_an_allowed_host_is_reached_by_a_client_that_ignores_the_proxy_variables(
    world: World, local_server: int
) -> None:
    # The transparent path: the resolver's answer (a synthetic address) and the capture
    # listener behind it both come from the proxy made when the query arrived.
    policy = world.root / "policy.toml"
    policy.write_text(
        f'[network]\nallow = ["web.test:{local_server}"]\n'
        '[network.hosts]\n"web.test" = "127.0.0.1"\n'
    )
    script = (
        "import socket\n"
        f"s = socket.create_connection(('web.test', {local_server}), timeout=10)\n"
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n\\r\\n')[-1].decode())\n"
    )
    done = _call(world, str(policy), "python3", "-c", script)
    assert done["returncode"] == 0, done["stderr"]
    assert done["stdout"] == "hello\n", done
    names = [e for e in done["events"] if e["event"] == "dns_query" and e["name"] == "web.test"]
    assert names, done["events"]
    assert all(e["verdict"] == "allow" for e in names), names
