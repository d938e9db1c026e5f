"""Benchmark: small HTTPS requests through the inspect layer, an opaque tunnel, mitmproxy.

Three processes per measurement (the machine has 2 cores): an upstream HTTPS server
(trustme CA, keep-alive), the proxy under test, and this client. The client talks
through the proxy with CONNECT, then TLS, then ``GET /`` with a 2-byte answer:

* **keep-alive** — one tunnel, one TLS session, N requests one after another;
* **fresh** — a new TCP connection, CONNECT and full TLS handshake for every request.

Proxies: stockade's egress proxy with the inspect layer intercepting the host (a rule
allows ``GET /**``); the same proxy relaying an opaque tunnel to an uninspected host;
mitmproxy 11.0.2 (the last release for Python 3.11), installed by this script into its
own venv, intercepting the same way (``mitmdump``, upstream verified against the test
CA). The leaf-issue time of the CA is measured too. The last line is JSON.

Run: ``.venv/bin/python bench/interception.py [--quick]``.
"""

from __future__ import annotations

import os
import sys

# This file is named inspect.py and Python puts its directory first on sys.path, where
# it would shadow the standard library's ``inspect`` for every later import; hence the
# imports below this line (ruff: E402 is expected here).
# ruff: noqa: E402
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

MITM_VERSION = "11.0.2"
HOST = "api.test"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


# -- roles run in child processes ---------------------------------------------------------


async def _upstream(cert: str, key: str, port_file: str) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t: Any = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                _, _, self.buf = self.buf.partition(b"\r\n\r\n")
                self.t.write(RESPONSE)

    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0, ssl=ctx)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    await server.serve_forever()


async def _stockade(upstream_port: int, ca_file: str, bundle: str, port_file: str) -> None:
    from stockade.audit import AuditLog
    from stockade.egress import EgressProxy, EgressRules
    from stockade.egress.inspect import CertificateAuthority, InspectLayer, write_trust_bundle
    from stockade.policy import parse_policy_text

    policy = parse_policy_text(
        f"""
[network]
allow = ["{HOST}", "opaque.test"]
hosts = {{ "{HOST}" = "127.0.0.1", "opaque.test" = "127.0.0.1" }}
tls_ports = [{upstream_port}]
tls = {{ upstream_ca = "{ca_file}" }}
[[network.rules]]
host = "{HOST}"
methods = ["GET", "HEAD"]
paths = ["/**"]
""",
        workspace=Path(tempfile.gettempdir()),
    )
    ca = CertificateAuthority.ephemeral()
    write_trust_bundle(ca, Path(bundle))
    audit = AuditLog("bench", None)
    layer = InspectLayer.from_policy(policy, ca, audit)
    proxy = EgressProxy(EgressRules.from_policy(policy.network), audit, inspect=layer)

    def drop_events(event: dict[str, Any]) -> None:
        # Keep memory flat over a long run: the in-memory list is for the API only.
        audit.events.clear()

    audit.subscribe(drop_events)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    Path(port_file).write_text(str(listener.getsockname()[1]))
    await proxy.serve_socket(listener)


# -- client ----------------------------------------------------------------------------------


def _connect(proxy_port: int, authority: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("proxy closed the CONNECT")
        answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"CONNECT refused: {answer[:80]!r}")
    return sock


def _get(tls: ssl.SSLSocket, host_header: str) -> None:
    tls.sendall(f"GET / HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
    buf = b""
    while not (b"\r\n\r\n" in buf and buf.endswith(b"ok")):
        chunk = tls.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed mid-response")
        buf += chunk
    if not buf.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer {buf[:80]!r}")


def measure(
    proxy_port: int,
    authority: str,
    sni: str,
    host_header: str,
    cafile: str,
    *,
    fresh: bool,
    count: int,
    seconds: float,
) -> dict[str, float]:
    """Requests/s and p50 latency (ms) for ``count`` requests (or ``seconds``)."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    latencies: list[float] = []
    start = time.perf_counter()
    tls: ssl.SSLSocket | None = None
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            if tls is None:
                tls = ctx.wrap_socket(_connect(proxy_port, authority), server_hostname=sni)
            _get(tls, host_header)
            if fresh:
                tls.close()
                tls = None
            latencies.append(time.perf_counter() - t0)
            if time.perf_counter() - start > seconds:
                break
    finally:
        if tls is not None:
            tls.close()
    elapsed = time.perf_counter() - start
    return {
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "n": len(latencies),
    }


def _wait_port(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args!r} did not start")


def _wait_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def mitm_venv(root: Path) -> Path | None:
    """mitmdump from a separate venv (installed here on first use), or None."""
    mitmdump = root / "bin" / "mitmdump"
    if mitmdump.exists():
        return mitmdump
    python = shutil.which("python3.11") or sys.executable
    try:
        subprocess.run([python, "-m", "venv", str(root)], check=True, capture_output=True)
        subprocess.run(
            [str(root / "bin" / "pip"), "install", "-q", f"mitmproxy=={MITM_VERSION}"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"mitmproxy {MITM_VERSION} could not be installed: {exc}", file=sys.stderr)
        return None
    return mitmdump if mitmdump.exists() else None


def leaf_issue_ms() -> dict[str, float]:
    from stockade.egress.inspect import CertificateAuthority

    ca = CertificateAuthority.ephemeral()
    t0 = time.perf_counter()
    ca.leaf("first.test")
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(200):
        ca.leaf(f"h{i}.test")
    after = (time.perf_counter() - t0) / 200
    return {"first_ms": round(first * 1000, 3), "after_first_ms": round(after * 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["upstream", "stockade"], help=argparse.SUPPRESS)
    parser.add_argument("--args", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--mitm-venv", default="/tmp/stockade-mitm-venv")
    ns = parser.parse_args()
    if ns.role == "upstream":
        asyncio.run(_upstream(*ns.args))
        return
    if ns.role == "stockade":
        a = ns.args
        asyncio.run(_stockade(int(a[0]), a[1], a[2], a[3]))
        return

    import trustme

    keep_n, fresh_n, secs = (300, 60, 10.0) if ns.quick else (3000, 400, 30.0)
    work = Path(tempfile.mkdtemp(prefix="stockade-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"leaf_issue": leaf_issue_ms()}
    try:
        ca = trustme.CA()
        ca_file = work / "upstream-ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        leaf = ca.issue_cert(HOST, "opaque.test")
        cert, key = work / "up-cert.pem", work / "up-key.pem"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        me = [sys.executable, __file__]

        def spawn(role: str, *args: str) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen([*me, "--role", role, "--args", *args])
            procs.append(proc)
            return proc

        up = spawn("upstream", str(cert), str(key), str(work / "up.port"))
        up_port = _wait_port(work / "up.port", up)
        bundle = work / "bundle.pem"
        st = spawn("stockade", str(up_port), str(ca_file), str(bundle), str(work / "st.port"))
        st_port = _wait_port(work / "st.port", st)
        authority = f"{HOST}:{up_port}"

        def run(port: int, auth: str, sni: str, cafile: Path, fresh: bool) -> dict[str, float]:
            n = fresh_n if fresh else keep_n
            # warm-up: leaves, pools, caches
            measure(port, auth, sni, auth, str(cafile), fresh=fresh, count=5, seconds=5)
            return measure(port, auth, sni, auth, str(cafile), fresh=fresh, count=n, seconds=secs)

        for mode in ("keepalive", "fresh"):
            fresh = mode == "fresh"
            results[f"inspected_{mode}"] = run(st_port, authority, HOST, bundle, fresh)
            opaque = f"opaque.test:{up_port}"
            results[f"opaque_{mode}"] = run(st_port, opaque, "opaque.test", ca_file, fresh)

        mitmdump = mitm_venv(Path(ns.mitm_venv))
        if mitmdump is not None:
            confdir = work / "mitm"
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            mport = sock.getsockname()[1]
            sock.close()
            mitm = subprocess.Popen(
                [
                    str(mitmdump),
                    "--listen-host",
                    "127.0.0.1",
                    "--listen-port",
                    str(mport),
                    "--set",
                    f"confdir={confdir}",
                    "--set",
                    f"ssl_verify_upstream_trusted_ca={ca_file}",
                    "--set",
                    "connection_strategy=lazy",
                    "--quiet",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(mitm)
            _wait_listening(mport)
            mitm_ca = confdir / "mitmproxy-ca-cert.pem"
            # mitmproxy resolves names itself; the tunnel names the address and the client
            # sends the host name in SNI and Host, which is what mitmproxy intercepts for.
            mitm_auth = f"127.0.0.1:{up_port}"
            for mode in ("keepalive", "fresh"):
                fresh = mode == "fresh"
                n = fresh_n if fresh else keep_n
                measure(mport, mitm_auth, HOST, authority, str(mitm_ca), fresh=fresh, count=5,
                        seconds=5)  # fmt: skip
                results[f"mitmproxy_{mode}"] = measure(
                    mport,
                    mitm_auth,
                    HOST,
                    authority,
                    str(mitm_ca),
                    fresh=fresh,
                    count=n,
                    seconds=secs,
                )
            for mode in ("keepalive", "fresh"):
                ours = results[f"inspected_{mode}"]["rps"]
                theirs = results[f"mitmproxy_{mode}"]["rps"]
                results[f"ratio_vs_mitmproxy_{mode}"] = round(ours / theirs, 2)
        else:
            results["mitmproxy"] = "not installed"
        for mode in ("keepalive", "fresh"):
            results[f"inspect_cost_vs_opaque_{mode}"] = round(
                results[f"opaque_{mode}"]["rps"] / results[f"inspected_{mode}"]["rps"], 2
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        shutil.rmtree(work, ignore_errors=True)
    targets = {
        "ratio_vs_mitmproxy_keepalive>=3": results.get("ratio_vs_mitmproxy_keepalive", 0) >= 3,
        "ratio_vs_mitmproxy_fresh>=3": results.get("ratio_vs_mitmproxy_fresh", 0) >= 3,
        "leaf_issue_after_first<=2ms": results["leaf_issue"]["after_first_ms"] <= 2,
    }
    results["targets_met"] = targets
    for name, value in results.items():
        print(f"{name}: {value}", file=sys.stderr)
    print(json.dumps(results, sort_keys=True))
    if os.environ.get("STOCKADE_BENCH_STRICT") and not all(targets.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
