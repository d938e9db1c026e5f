"""The inspect layer through ``stockade run``: real TLS, a trustme upstream, the real proxy.

The sandboxed script uses Python's urllib, which honours the proxy variables and the
trust bundle the runtime sets; the upstream HTTPS server records what reaches it.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")
REAL_KEY = "sk-real-0123456789abcdef"


@dataclass
class Upstream:
    port: int
    ca_path: Path
    seen: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Upstream]:
    ca = trustme.CA()
    ca_path = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "key": self.headers.get("x-api-key", ""),
                    "body": body.decode(errors="replace"),
                }
            )
            out = b'{"ok": true}'
            self.send_response(201 if self.command == "POST" else 200)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.test", "registry.test").configure_cert(ctx)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Upstream(server.server_address[1], ca_path, seen)
    finally:
        server.shutdown()
        server.server_close()


SCRIPT = r"""
import json, sys, urllib.request, os
def call(method, url, key=None, body=None):
    req = urllib.request.Request(url, method=method, data=body)
    if key:
        req.add_header("x-api-key", key)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
port = sys.argv[1]
out = {
    "get": call("GET", f"https://registry.test:{port}/pkg"),
    "publish": call("PUT", f"https://registry.test:{port}/pkg", body=b"x"),
    "api_placeholder": call("POST", f"https://api.test:{port}/v1/messages", key=os.environ["API_KEY"], body=b"hi"),
    "api_attacker": call("POST", f"https://api.test:{port}/v1/files", key="ATTACKER-KEY", body=open("secret.txt","rb").read()),
    "attacker_on_allowed_path": call("POST", f"https://api.test:{port}/v1/messages", key="ATTACKER-KEY", body=b"hi"),
    "placeholder_elsewhere": call("POST", f"https://registry.test:{port}/x", key=os.environ["API_KEY"], body=b"x"),
    "env_key": os.environ["API_KEY"],
}
print(json.dumps(out))
"""


def test_rules_binding_and_the_files_api_case(world: World, upstream: Upstream) -> None:
    policy = f"""
[network]
allow = ["registry.test", "api.test"]
hosts = {{ "registry.test" = "127.0.0.1", "api.test" = "127.0.0.1" }}
tls_ports = [443, {upstream.port}]
tls = {{ upstream_ca = "{upstream.ca_path}" }}
[[network.rules]]
host = "registry.test"
methods = ["GET", "HEAD"]
paths = ["/**"]
action = "allow"
[[network.rules]]
host = "api.test"
methods = ["POST"]
paths = ["/v1/messages"]
action = "allow"
[secrets.API_KEY]
from = "env:API_KEY"
hosts = ["api.test"]
header = "x-api-key"
"""
    (world.root / "p.toml").write_text(policy)
    (world.workspace / "secret.txt").write_text("user data\n")
    (world.workspace / "t.py").write_text(SCRIPT)
    env = dict(world.env, API_KEY=REAL_KEY)
    audit = world.root / "audit.jsonl"
    proc = world.stockade(
        "run",
        "--policy",
        str(world.root / "p.toml"),
        "--audit",
        str(audit),
        "--",
        "python3",
        "t.py",
        str(upstream.port),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["get"] == 200
    assert out["publish"] == 403
    assert out["api_placeholder"] == 201
    assert out["api_attacker"] == 403
    assert out["attacker_on_allowed_path"] == 403
    assert out["placeholder_elsewhere"] == 403
    assert out["env_key"] != REAL_KEY
    assert REAL_KEY not in proc.stdout + proc.stderr
    # What the upstream saw: the real key on the allowed API call, never the attacker's.
    assert [s["method"] + " " + s["path"] for s in upstream.seen] == [
        "GET /pkg",
        "POST /v1/messages",
    ]
    assert upstream.seen[1]["key"] == REAL_KEY
    assert all("ATTACKER" not in s["key"] for s in upstream.seen)
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    requests = [e for e in events if e["event"] == "net_request"]
    denied = [
        (e.get("method"), e.get("path"), e["reason"]) for e in requests if e["verdict"] == "deny"
    ]
    # The Files-API upload: one event that says why (no rule allows it).
    assert ("POST", "/v1/files", "no-rule-matched") in denied
    assert ("POST", "/v1/messages", "foreign-credential") in denied
    assert ("PUT", "/pkg", "no-rule-matched") in denied
    assert any(path == "/x" for _, path, _ in denied), denied
    assert REAL_KEY not in audit.read_text()
