"""``stockade proxy --policy P``: a policy with request rules is enforced or refused, never
served with its rules left out (DESIGN §7: "a policy file is silently partly ignored").

Without ``--ca`` the proxy refuses to start (exit 125, naming the keys and the fix) and
listens on nothing; with ``--ca DIR`` the rules run: a POST the rules do not allow is
refused with 403 before the origin sees it, and its GET twin passes. A policy without
rules still starts without a CA.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from stockade.egress.inspect import CertificateAuthority
from tests.egress.conftest import read_head
from tests.egress.inspect.harness import Client, Response, Upstream

POLICY = """\
[network]
allow = ["registry.test"]
hosts = {{ "registry.test" = "127.0.0.1" }}
tls_ports = [{port}]
tls = {{ upstream_ca = "{ca}" }}

[[network.rules]]
host = "registry.test"
methods = ["GET"]
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    return subprocess.Popen(
        [sys.executable, "-m", "stockade", "proxy", *args, "--quiet"],
        cwd=cwd,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=10)


def _wait_listening(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            assert proc.poll() is None, (
                f"stockade proxy exited: {proc.stderr and proc.stderr.read()}"
            )
            assert time.monotonic() < deadline, "stockade proxy did not listen"
            time.sleep(0.05)


class _Origin:
    """The inspect harness's HTTPS upstream, on its own event loop thread."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.upstream = Upstream(self.ca)
        asyncio.run_coroutine_threadsafe(self.upstream.start(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.upstream.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def origin() -> Iterator[_Origin]:
    o = _Origin()
    try:
        yield o
    finally:
        o.close()


def _policy(tmp_path: Path, origin: _Origin) -> Path:
    ca_file = tmp_path / "upstream-ca.pem"
    origin.ca.cert_pem.write_to_path(str(ca_file))
    path = tmp_path / "p.toml"
    path.write_text(POLICY.format(port=origin.upstream.port, ca=ca_file))
    return path


def test_rules_without_a_ca_are_refused_at_start(tmp_path: Path, origin: _Origin) -> None:
    policy = _policy(tmp_path, origin)
    port = _free_port()
    proc = _start(["--listen", f"tcp:127.0.0.1:{port}", "--policy", str(policy)], tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125, err
    assert "network.rules" in err
    assert "--ca DIR" in err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), 1).close()
    assert origin.upstream.connections == 0


def test_policy_without_rules_starts_without_a_ca(tmp_path: Path) -> None:
    policy = tmp_path / "plain.toml"
    policy.write_text('[network]\nallow = ["registry.test"]\n')
    port = _free_port()
    proc = _start(["--listen", f"tcp:127.0.0.1:{port}", "--policy", str(policy)], tmp_path)
    try:
        _wait_listening(proc, port)
    finally:
        _stop(proc)


def _https(proxy_port: int, bundle: Path, upstream_port: int, method: str) -> Response:
    host = "registry.test"
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    authority = f"{host}:{upstream_port}"
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert read_head(sock).startswith(b"HTTP/1.1 200")
    client = Client(sock, bundle, host)
    try:
        body = b"payload" if method == "POST" else b""
        return client.request(method, "/pkg", host=authority, body=body)
    finally:
        client.close()


def test_rules_with_a_ca_are_enforced(tmp_path: Path, origin: _Origin) -> None:
    policy = _policy(tmp_path, origin)
    ca_dir = tmp_path / "ca"
    ca = CertificateAuthority.for_user(ca_dir)
    bundle = tmp_path / "interception.pem"
    bundle.write_bytes(ca.cert_pem)
    port = _free_port()
    args = ["--listen", f"tcp:127.0.0.1:{port}", "--policy", str(policy), "--ca", str(ca_dir)]
    proc = _start(args, tmp_path)
    try:
        _wait_listening(proc, port)
        post = _https(port, bundle, origin.upstream.port, "POST")
        assert post.status == 403
        assert post.headers["x-stockade-reason"] == "no-rule-matched"
        get = _https(port, bundle, origin.upstream.port, "GET")
        assert get.status == 200
        assert [r.method for r in origin.upstream.received] == ["GET"]
    finally:
        _stop(proc)
