"""Node's own WebSocket client through an inspected host, in a real ``stockade run``.

Node (``--experimental-websocket`` on Node 20, built in from 22) ignores the proxy
variables: it resolves the name with stockade's resolver and connects to the address it
got, so the transparent capture hands the connection to the inspect layer, which
intercepts the TLS (Node trusts the run's CA through ``NODE_EXTRA_CA_CERTS``). A message
echoes; a message carrying a label closes the socket with 1008 before the server sees it.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from tests.conftest import World, require

pytestmark = pytest.mark.usefixtures("kernel")
CANARY = "CANARY-7f3a9c1e-token"

#: the client: open, send "hello", send second.txt after the echo (a file: the argv is in
#: the audit log's run record), print what happened
CLIENT = r"""
const port = process.argv[2];
const second = require("fs").readFileSync("second.txt", "utf8");
const out = {};
const ws = new WebSocket(`wss://ws.test:${port}/ws`);
const timer = setTimeout(() => { console.log(JSON.stringify({ ...out, timeout: true })); process.exit(3); }, 30000);
ws.onopen = () => ws.send("hello");
let n = 0;
ws.onmessage = (e) => {
  n += 1;
  if (n === 1) { out.echo = e.data; ws.send(second); } else { out.echo2 = e.data; ws.close(1000, "done"); }
};
ws.onerror = (e) => { out.error = String((e && e.message) || "error"); };
ws.onclose = (e) => { clearTimeout(timer); out.close = e.code; out.reason = e.reason; console.log(JSON.stringify(out)); };
"""


def node_with_websocket() -> list[str]:
    node = shutil.which("node")
    require(node is not None, "no node on this host")
    assert node is not None
    for flags in ([], ["--experimental-websocket"]):
        probe = subprocess.run(
            [node, *flags, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return [node, *flags]
    require(False, "this node has no WebSocket client (Node >= 20.10 with a flag, 22 without)")
    raise AssertionError  # unreachable: require fails or skips


@dataclass
class Echo:
    port: int
    ca_path: Path
    received: list[str | bytes] = field(default_factory=list)


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Echo]:
    pytest.importorskip("websockets")
    from websockets.sync.server import ServerConnection, serve

    ca = trustme.CA()
    ca_path = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("ws.test").configure_cert(ctx)
    received: list[str | bytes] = []

    def handler(ws: ServerConnection) -> None:
        for message in ws:
            received.append(message)
            ws.send(message)

    server = serve(handler, "127.0.0.1", 0, ssl=ctx)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Echo(server.socket.getsockname()[1], ca_path, received)
    finally:
        server.shutdown()
        thread.join(10)


def run_client(world: World, echo: Echo, second: str) -> tuple[dict[str, object], Path]:
    node = node_with_websocket()
    policy = f"""
version = 1
[network]
allow = ["ws.test"]
hosts = {{ "ws.test" = "127.0.0.1" }}
tls_ports = [{echo.port}]
tls = {{ upstream_ca = "{echo.ca_path}" }}
[[network.rules]]
host = "ws.test"
methods = ["WEBSOCKET"]
paths = ["/ws"]
[labels]
canaries = ["{CANARY}"]
"""
    (world.root / "p.toml").write_text(policy)
    (world.workspace / "client.js").write_text(CLIENT)
    (world.workspace / "second.txt").write_text(second)
    audit = world.root / "audit.jsonl"
    proc = world.stockade(
        "run",
        "--policy",
        str(world.root / "p.toml"),
        "--audit",
        str(audit),
        "--",
        *node,
        "client.js",
        str(echo.port),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), audit


def test_node_websocket_echoes_through_an_inspected_host(world: World, echo: Echo) -> None:
    out, audit = run_client(world, echo, "second message")
    assert out["echo"] == "hello"
    assert out["echo2"] == "second message"
    assert out["close"] == 1000, out
    assert echo.received == ["hello", "second message"]
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    upgrades = [e for e in events if e.get("event") == "net_request"]
    assert any(e.get("method") == "WEBSOCKET" and e.get("status") == 101 for e in upgrades)


def test_node_websocket_message_with_a_label_closes_the_socket(world: World, echo: Echo) -> None:
    out, audit = run_client(world, echo, f"exfil {CANARY}")
    assert out["echo"] == "hello"
    assert out["close"] == 1008, out
    assert "labelled-data" in str(out["reason"])
    assert echo.received == ["hello"]  # the server never saw the labelled message
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    denied = [e for e in events if e.get("event") == "net_request" and e["verdict"] == "deny"]
    assert [e["reason"] for e in denied] == ["labelled-data"]
    assert CANARY not in audit.read_text()
