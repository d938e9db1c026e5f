"""``stockade doctor``: what this host can enforce, checked against the host itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from stockade.runtime import _host
from tests.conftest import World


def doctor(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None if path is None else dict(os.environ, PATH=path)
    return subprocess.run(
        [sys.executable, "-m", "stockade", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


@pytest.mark.usefixtures("kernel")
def test_doctor_reports_what_this_host_has() -> None:
    proc = doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert set(checks) == {
        "bubblewrap",
        "user namespaces",
        "userns restrictions",
        "landlock backend",
        "landlock",
        "seccomp",
        "mount API",
        "limits",
        "transparent egress",
        "upstream proxy",
        "gvisor",
        "kubernetes pod",
        "learn mode",
    }
    assert all(c["ok"] for c in checks.values())
    assert "seccomp user notification" in checks["learn mode"]["detail"]
    assert ("copy-on-write views" in checks["learn mode"]["detail"]) == _host.mount_api()
    assert checks["landlock"]["detail"].startswith(f"ABI {_host.landlock_abi()}")
    assert ("launcher makes" in checks["mount API"]["detail"]) == _host.mount_api()
    assert "resolver and capture" in checks["transparent egress"]["detail"]
    assert checks["kubernetes pod"]["detail"].startswith("not in a Kubernetes pod")
    text = doctor()
    assert "[ok  ] bubblewrap" in text.stdout


def test_doctor_names_a_missing_bubblewrap_and_the_fix() -> None:
    proc = doctor("--json", path="/nonexistent")
    assert proc.returncode == 1
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["bubblewrap"]["ok"] is False
    assert "apt-get install bubblewrap" in checks["bubblewrap"]["fix"]


class _FakeProxy:
    """A local HTTP proxy that answers every CONNECT with ``status`` and records the
    request lines it got (nothing is relayed anywhere)."""

    def __init__(self, status: int) -> None:
        import socket
        import threading

        self.status = status
        self.requests: list[str] = []
        self.accepted = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.settimeout(10)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        part = conn.recv(4096)
                        if not part:
                            break
                        data += part
                    if data:
                        self.requests.append(data.split(b"\r\n", 1)[0].decode())
                        phrase = "Connection established" if self.status == 200 else "Forbidden"
                        conn.sendall(f"HTTP/1.1 {self.status} {phrase}\r\n\r\n".encode())
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def _upstream(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    check: dict[str, object] = {c["name"]: c for c in json.loads(proc.stdout)}["upstream proxy"]
    return check


def test_doctor_upstream_proxy_really_connects(world: World) -> None:
    """--upstream-proxy with no allowed host to test: doctor still connects (it said ok
    without connecting); a port where nothing listens is a failure with the reason."""
    import socket

    # Bound, never listening: a connection to it is refused, and no one else can take it.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        proc = world.stockade("doctor", "--json", "--upstream-proxy", url)
    finally:
        closed.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    check = _upstream(proc)
    assert check["ok"] is False, check
    assert "Connection refused" in str(check["detail"]), check
    assert "(from --upstream-proxy," in str(check["detail"]), check  # not the policy key
    assert "--upstream-proxy names the proxy's host and port" in str(check["fix"])
    # The twin: a proxy that listens is ok, and was connected to.
    proxy = _FakeProxy(200)
    try:
        proc = world.stockade(
            "doctor", "--json", "--upstream-proxy", f"http://127.0.0.1:{proxy.port}"
        )
        for _ in range(200):  # the accept is the proxy thread's: let it run
            if proxy.accepted:
                break
            time.sleep(0.05)
    finally:
        proxy.close()
    check = _upstream(proc)
    assert check["ok"] is True, check
    assert "accepts connections" in str(check["detail"]), check
    assert proxy.accepted == 1


def test_doctor_connect_to_asks_for_a_tunnel_through_the_proxy(world: World) -> None:
    proxy = _FakeProxy(200)
    try:
        proc = world.stockade(
            "doctor",
            "--json",
            "--upstream-proxy",
            f"http://127.0.0.1:{proxy.port}",
            "--connect-to",
            "web.test:8443",
        )
    finally:
        proxy.close()
    check = _upstream(proc)
    assert check["ok"] is True, check
    assert proxy.requests == ["CONNECT web.test:8443 HTTP/1.1"]
    assert "answers CONNECT web.test:8443 with 200" in str(check["detail"]), check
    # The twin: a proxy that refuses the tunnel fails the check, naming the status.
    refusing = _FakeProxy(403)
    try:
        proc = world.stockade(
            "doctor",
            "--json",
            "--upstream-proxy",
            f"http://127.0.0.1:{refusing.port}",
            "--connect-to",
            "web.test",
        )
    finally:
        refusing.close()
    assert proc.returncode == 1
    check = _upstream(proc)
    assert check["ok"] is False, check
    assert refusing.requests == ["CONNECT web.test:443 HTTP/1.1"]
    assert "403" in str(check["detail"]), check
    assert "refuses a tunnel to web.test:443" in str(check["fix"]), check
