"""``stockade gateway serve`` as a real subprocess, against the fake API server.

The topology and load tests (and bench/gateway.py) run the gateway as the operator does:
its own process, its own event loop, audit JSON lines on its stdout. The fake API server
of harness.py runs on an event loop in a thread of the test process, listening either
on 127.0.1.1 or on a socket made in another network namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trustme

from tests.gateway.harness import API_HOST, SA_TOKEN, FakeApiServer

T = TypeVar("T")


class ApiThread:
    """The fake API server on its own event loop in a daemon thread."""

    def __init__(self, tmp: Path, sock: socket.socket | None = None) -> None:
        ca = trustme.CA()
        self.ca_file = tmp / "cluster-ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        self.token_file = tmp / "sa-token"
        self.token_file.write_text(SA_TOKEN)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.api = FakeApiServer(ca.issue_cert(API_HOST))
        self.call(self.api.start(sock))

    @property
    def address(self) -> str:
        return f"{API_HOST}:{self.api.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def put(self, obj: dict[str, Any]) -> None:
        async def run() -> None:
            self.api.put(obj)

        self.call(run())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.api._server is not None:
                self.call(self.api.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class GatewayProcess:
    """``stockade gateway serve`` in a subprocess (``prefix``: e.g. ``ip netns exec gw``).

    ``connect(host, port)`` opens a socket from where the gateway's metrics listener can
    be reached (the gateway's namespace); readiness is its ``/readyz``.
    """

    def __init__(
        self,
        tmp: Path,
        api: ApiThread,
        args: Sequence[str],
        *,
        metrics: tuple[str, int],
        prefix: Sequence[str] = (),
        connect: Callable[[str, int], socket.socket] | None = None,
    ) -> None:
        self.metrics = metrics
        self._connect = connect or (lambda h, p: socket.create_connection((h, p), 3.0))
        self.audit_path = tmp / "gateway-audit.jsonl"
        self.log_path = tmp / "gateway-stderr.log"
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "stockade",
            "gateway",
            "serve",
            *args,
            "--api",
            api.address,
            "--token-file",
            str(api.token_file),
            "--ca-file",
            str(api.ca_file),
            "--metrics",
            f"{metrics[0]}:{metrics[1]}",
        ]
        with open(self.audit_path, "wb") as out, open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def http(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` from the metrics listener: (status, body)."""
        sock = self._connect(*self.metrics)
        with sock:
            sock.settimeout(3.0)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gateway\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the gateway exited {self.proc.returncode}: {self.stderr()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                if self.http("/readyz")[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not become ready: {self.stderr()}")
            time.sleep(0.05)

    def metric(self, line_prefix: str) -> float:
        """The value of the first /metrics sample line starting with ``line_prefix``."""
        for line in self.http("/metrics")[1].decode().splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def rss_kib(self) -> int:
        """The resident set of the gateway's Python process (under ``ip netns exec``
        that is the exec'd process itself: same pid)."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.audit_path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def raise_nofile() -> None:
    """Soft descriptor limit to the hard one (the load test holds ~2,500 sockets)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


__all__ = ["ApiThread", "GatewayProcess", "raise_nofile"]
