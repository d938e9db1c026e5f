"""Egress proxy benchmark: stockade vs direct vs squid vs srt, in one run.

Measures, all on loopback:

* CONNECT-tunnel throughput: 1 GiB downloaded through a tunnel;
* forward-proxy throughput: 1 GiB response body through ``GET http://...``;
* latency: p50/p99 of 1,000 small HTTP requests, each on a fresh connection;
* 500 concurrent tunnels held 10 s, then used: errors, and the proxy's RSS;
* transparent capture beside CONNECT: tunnel throughput and the p50 of a small request
  on a fresh tunnel, opened by CONNECT or by connecting to the synthetic address that
  stockade's resolver hands out (the capture listener here sits on the host's loopback at
  that address, as it sits on the sandbox's);
* stockade chained through squid (``[network.upstream]``) beside squid alone, in turns:
  tunnel throughput, the p50 of a small request on a fresh tunnel and of a forward
  request. stockade sends loopback destinations direct; here the upstream's one check
  that says so is switched off, so that loopback stands in for the company network.

The upstream servers and each proxy run in their own processes so that no measurement
shares a GIL with what it measures. squid is installed with apt-get (as root) and srt with
npm into a temporary folder, when they can be; srt's host-side proxy is measured with the
credentials srt hands its sandbox. The last line printed is one JSON object.
Run: ``.venv/bin/python bench/egress.py [--size-mib 1024] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _srt import install_srt, srt_proxy

HOST = "127.0.0.1"
NAME = "allowed.test"
ROOT = Path(__file__).resolve().parent.parent

# Upstream roles, in one process with a thread per connection:
#   source: reads an 8-byte length, sends that many bytes, closes;
#   http:   GET /big/N answers N bytes, anything else a 2-byte body; then closes;
#   echo:   echoes until EOF.
UPSTREAM = r"""
import socket, sys, threading
CHUNK = memoryview(b"x" * (4 << 20))

def source(conn):
    need = b""
    while len(need) < 8:
        part = conn.recv(8 - len(need))
        if not part:
            return
        need += part
    left = int.from_bytes(need, "big")
    while left:
        n = min(left, len(CHUNK))
        conn.sendall(CHUNK[:n])
        left -= n

def http(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return
        data += part
    path = data.split(b" ", 2)[1]
    size = int(path.split(b"/")[2]) if path.startswith(b"/big/") else 2
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
    if size == 2:
        conn.sendall(b"ok")
        return
    left = size
    while left:
        n = min(left, len(CHUNK))
        conn.sendall(CHUNK[:n])
        left -= n

def echo(conn):
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)

def serve(sock, handler):
    while True:
        conn, _ = sock.accept()
        def run(conn=conn):
            try:
                handler(conn)
            except OSError:
                pass
            finally:
                conn.close()
        threading.Thread(target=run, daemon=True).start()

ports = []
for handler in (source, http, echo):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(2048)
    ports.append(s.getsockname()[1])
    threading.Thread(target=serve, args=(s, handler), daemon=True).start()
print(" ".join(map(str, ports)), flush=True)
sys.stdin.read()
"""

# stockade's proxy in its own process, with the test name pinned to loopback.
STOCKADE = r"""
import asyncio, os, resource, socket, sys
from stockade.egress import EgressProxy, EgressRules
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
from stockade.egress.dns import AddressPool
rules = EgressRules(allow=("allowed.test",), hosts={"allowed.test": "127.0.0.1"},
                    tls_ports=())
count = 0
def audit(decision, fields):
    global count
    count += 1
pool = AddressPool()
synthetic = str(pool.issue("allowed.test"))
transport = None
if os.environ.get("STOCKADE_BENCH_UPSTREAM"):  # chained through squid on this port
    from stockade.egress.upstream import Transport, Upstream
    class Chained(Upstream):
        __slots__ = ()
        def direct(self, host, port, address):
            return False  # loopback stands in for the company network here
    upstream = Chained("127.0.0.1", int(os.environ["STOCKADE_BENCH_UPSTREAM"]),
                       connect_by="name")
    transport = Transport(upstream)
proxy = EgressProxy(rules, audit, pool=pool, transport=transport)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(4096)
captures = []
for port in sys.argv[1:]:  # capture the upstream's ports at the synthetic address
    capture = socket.socket()
    capture.bind((synthetic, int(port)))
    capture.listen(4096)
    captures.append(capture)
print(sock.getsockname()[1], synthetic, flush=True)
async def main():
    await asyncio.gather(proxy.serve_socket(sock), *map(proxy.serve_capture, captures))
asyncio.run(main())
"""

SQUID_CONF = """\
http_port 127.0.0.1:{port}
acl target dstdomain {name}
acl CONNECT method CONNECT
http_access allow target
http_access deny all
hosts_file {dir}/hosts
dns_nameservers 127.0.0.1
cache deny all
cache_mem 8 MB
maximum_object_size_in_memory 0 KB
access_log none
cache_store_log none
cache_log {dir}/cache.log
pid_filename {dir}/squid.pid
coredump_dir {dir}
max_filedescriptors 8192
workers 1
shutdown_lifetime 1 seconds
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def recv_exact_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            raise RuntimeError(f"connection closed in the head: {data!r}")
        data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def drain(sock: socket.socket, expected: int, already: int = 0) -> int:
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    got = already
    while got < expected:
        n = sock.recv_into(view)
        if not n:
            break
        got += n
    return got


@dataclass(frozen=True)
class Via:
    """A proxy to measure: its port, the upstream's name there, a Proxy-Authorization line."""

    port: int
    name: str = NAME
    auth: str = ""

    def head(self, method: str, target: str, upstream: int) -> bytes:
        return (
            f"{method} {target} HTTP/1.1\r\nHost: {self.name}:{upstream}\r\n{self.auth}\r\n"
        ).encode()


@dataclass(frozen=True)
class Captured:
    """Transparent capture: the client connects to the synthetic address itself."""

    address: str


def tunnel_open(proxy: Via | Captured | None, port: int) -> socket.socket:
    if proxy is None:
        return socket.create_connection((HOST, port), 10)
    if isinstance(proxy, Captured):
        return socket.create_connection((proxy.address, port), 10)
    sock = socket.create_connection((HOST, proxy.port), 10)
    sock.sendall(proxy.head("CONNECT", f"{proxy.name}:{port}", port))
    head, rest = recv_exact_head(sock)
    if b" 200 " not in head.split(b"\r\n")[0] + b" ":
        raise RuntimeError(f"CONNECT refused: {head[:80]!r}")
    assert not rest
    return sock


def tunnel_throughput(proxy: Via | Captured | None, port: int, size: int) -> float:
    sock = tunnel_open(proxy, port)
    with sock:
        started = time.perf_counter()
        sock.sendall(size.to_bytes(8, "big"))
        got = drain(sock, size)
        elapsed = time.perf_counter() - started
    if got != size:
        raise RuntimeError(f"tunnel moved {got} of {size} bytes")
    return size / elapsed


def forward_throughput(proxy: Via | None, port: int, size: int) -> float:
    target = proxy.port if proxy is not None else port
    sock = socket.create_connection((HOST, target), 10)
    with sock:
        started = time.perf_counter()
        if proxy is not None:
            sock.sendall(proxy.head("GET", f"http://{proxy.name}:{port}/big/{size}", port))
        else:
            sock.sendall(f"GET /big/{size} HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n".encode())
        head, rest = recv_exact_head(sock)
        if b" 200 " not in head.split(b"\r\n")[0] + b" ":
            raise RuntimeError(f"forward GET failed: {head[:80]!r}")
        got = drain(sock, size, len(rest))
        elapsed = time.perf_counter() - started
    if got != size:
        raise RuntimeError(f"forward moved {got} of {size} bytes")
    return size / elapsed


def latency(proxy: Via | None, port: int, count: int) -> tuple[float, float, int]:
    samples = []
    errors = 0
    target = proxy.port if proxy is not None else port
    if proxy is not None:
        request = proxy.head("GET", f"http://{proxy.name}:{port}/", port)
    else:
        request = f"GET / HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n".encode()
    for _ in range(count):
        started = time.perf_counter()
        try:
            with socket.create_connection((HOST, target), 5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(request)
                data = b""
                while not data.endswith(b"ok"):
                    part = sock.recv(65536)
                    if not part:
                        break
                    data += part
            if not data.endswith(b"ok"):
                errors += 1
                continue
        except OSError:
            errors += 1
            continue
        samples.append(time.perf_counter() - started)
    samples.sort()
    p50 = statistics.median(samples) * 1000
    p99 = samples[int(len(samples) * 0.99) - 1] * 1000
    return p50, p99, errors


def tunnel_latency(proxy: Via | Captured, port: int, count: int) -> float:
    """p50 (ms) of one small request on a fresh tunnel, the tunnel's opening included."""
    request = f"GET / HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n".encode()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        with tunnel_open(proxy, port) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            data = b""
            while not data.endswith(b"ok"):
                part = sock.recv(65536)
                if not part:
                    raise RuntimeError(f"tunnel request cut short: {data[:80]!r}")
                data += part
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def transparent_vs_connect(
    via: Via, captured: Captured, ports: list[int], size: int, samples: int, rounds: int = 3
) -> dict[str, Any]:
    """The two ways into a tunnel, measured in turns so that both see the same moment."""
    source, http, _ = ports
    best: dict[str, float] = {"connect": 0.0, "transparent": 0.0}
    p50s: dict[str, list[float]] = {"connect": [], "transparent": []}
    for _ in range(rounds):
        for label, proxy in (("connect", via), ("transparent", captured)):
            best[label] = max(best[label], tunnel_throughput(proxy, source, size))
            p50s[label].append(tunnel_latency(proxy, http, samples))
    result = {
        label: {
            "tunnel_GBps": round(best[label] / 1e9, 3),
            "p50_ms": round(statistics.median(p50s[label]), 3),
        }
        for label in best
    }
    print(f"transparent vs connect: {result}", file=sys.stderr, flush=True)
    return result


def chained_vs_squid(
    squid_via: Via, chained: Via, ports: list[int], size: int, samples: int, rounds: int = 3
) -> dict[str, Any]:
    """stockade chained through squid beside squid alone, in turns (one moment for both)."""
    source, http, _ = ports
    best: dict[str, float] = {"squid": 0.0, "chained": 0.0}
    tunnel_p50s: dict[str, list[float]] = {"squid": [], "chained": []}
    forward_p50s: dict[str, list[float]] = {"squid": [], "chained": []}
    for _ in range(rounds):
        for label, proxy in (("squid", squid_via), ("chained", chained)):
            best[label] = max(best[label], tunnel_throughput(proxy, source, size))
            tunnel_p50s[label].append(tunnel_latency(proxy, http, samples))
            forward_p50s[label].append(latency(proxy, http, samples)[0])
    result = {
        label: {
            "tunnel_GBps": round(best[label] / 1e9, 3),
            "tunnel_p50_ms": round(statistics.median(tunnel_p50s[label]), 3),
            "forward_p50_ms": round(statistics.median(forward_p50s[label]), 3),
        }
        for label in best
    }
    print(f"chained vs squid: {result}", file=sys.stderr, flush=True)
    return result


def concurrent(proxy: Via, port: int, pid: int, count: int, hold: float) -> dict[str, Any]:
    socks: list[socket.socket] = []
    errors = 0
    started = time.perf_counter()
    try:
        for _ in range(count):
            try:
                socks.append(tunnel_open(proxy, port))
            except (OSError, RuntimeError):
                errors += 1
        opened = time.perf_counter() - started
        time.sleep(hold)
        rss = rss_kib(pid)
        for index, sock in enumerate(socks):
            payload = f"ping-{index}".encode()
            try:
                sock.settimeout(5)
                sock.sendall(payload)
                if sock.recv(100) != payload:
                    errors += 1
            except OSError:
                errors += 1
    finally:
        for sock in socks:
            sock.close()
    return {"connections": count, "errors": errors, "open_s": round(opened, 3), "rss_kib": rss}


@contextlib.contextmanager
def process(argv: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(argv, text=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def ensure_squid() -> str | None:
    path = shutil.which("squid") or (
        "/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None
    )
    if path is not None:
        return path
    if os.geteuid() != 0:
        print("squid: not installed and not root; skipped", file=sys.stderr)
        return None
    print("squid: installing with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(
        ["apt-get", "install", "-y", "-q", "squid"], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        result = subprocess.run(
            ["apt-get", "install", "-y", "-q", "squid"], capture_output=True, text=True, env=env
        )
    if result.returncode != 0:
        print(f"squid: install failed: {result.stderr[-300:]}", file=sys.stderr)
        return None
    # The package starts a system squid; this benchmark runs its own.
    subprocess.run(["systemctl", "stop", "squid"], capture_output=True)
    subprocess.run(["service", "squid", "stop"], capture_output=True)
    return shutil.which("squid") or "/usr/sbin/squid"


@contextlib.contextmanager
def squid(binary: str) -> Iterator[tuple[int, int]]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stockade-squid-") as tmp:
        directory = Path(tmp)
        (directory / "hosts").write_text(f"127.0.0.1 {NAME}\n")
        conf = directory / "squid.conf"
        conf.write_text(SQUID_CONF.format(port=port, name=NAME, dir=directory))
        os.chmod(directory, 0o777)  # squid drops to its own user and writes its log here
        with process([binary, "-N", "-f", str(conf)], stdout=subprocess.DEVNULL) as proc:
            wait_port(port)
            yield port, proc.pid


def run_suite(
    label: str, proxy: Via | None, ports: list[int], size: int, samples: int
) -> dict[str, Any]:
    source, http, _ = ports
    tunnel = max(tunnel_throughput(proxy, source, size) for _ in range(2))
    forward = max(forward_throughput(proxy, http, size) for _ in range(2))
    p50, p99, errors = latency(proxy, http, samples)
    result = {
        "tunnel_GBps": round(tunnel / 1e9, 3),
        "forward_GBps": round(forward / 1e9, 3),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "latency_errors": errors,
    }
    print(f"{label:>9}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=500)
    parser.add_argument("--hold", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="64 MiB, 200 requests, 2 s hold")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.requests, args.hold = 64, 200, 2.0
    size = args.size_mib << 20
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out: dict[str, Any] = {"size_mib": args.size_mib}
    with process(
        [sys.executable, "-c", UPSTREAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as upstream:
        assert upstream.stdout is not None
        ports = [int(p) for p in upstream.stdout.readline().split()]
        out["direct"] = run_suite("direct", None, ports, size, args.requests)
        captured_ports = [str(p) for p in ports[:2]]
        with process(
            [sys.executable, "-c", STOCKADE, *captured_ports], stdout=subprocess.PIPE, env=env
        ) as stockade:
            assert stockade.stdout is not None
            port_text, synthetic = stockade.stdout.readline().split()
            port = int(port_text)
            wait_port(port)
            out["stockade"] = run_suite("stockade", Via(port), ports, size, args.requests)
            out["tunnels"] = transparent_vs_connect(
                Via(port), Captured(synthetic), ports, size, args.requests
            )
            out["stockade"]["concurrent"] = concurrent(
                Via(port), ports[2], stockade.pid, args.concurrent, args.hold
            )
            print(f"concurrent: {out['stockade']['concurrent']}", file=sys.stderr)
        binary = ensure_squid()
        if binary is not None:
            with squid(binary) as (port, pid):
                out["squid"] = run_suite("squid", Via(port), ports, size, args.requests)
                out["squid"]["rss_kib"] = rss_kib(pid)
                chain_env = {**env, "STOCKADE_BENCH_UPSTREAM": str(port)}
                with process(
                    [sys.executable, "-c", STOCKADE], stdout=subprocess.PIPE, env=chain_env
                ) as chained:
                    assert chained.stdout is not None
                    chained_port = int(chained.stdout.readline().split()[0])
                    wait_port(chained_port)
                    out["chained"] = chained_vs_squid(
                        Via(port), Via(chained_port), ports, size, args.requests
                    )
        else:
            out["squid"] = None
            out["chained"] = None
        out["srt"] = None
        with tempfile.TemporaryDirectory(prefix="stockade-srt-") as tmp:
            srt = install_srt(Path(tmp))
            if srt is None:
                out["srt_note"] = "srt (@anthropic-ai/sandbox-runtime): npm cannot install it"
            else:
                # srt has no host mapping: the upstream is asked for as "localhost".
                with srt_proxy(srt, Path(tmp), "localhost") as found:
                    if found is None:
                        out["srt_note"] = "srt did not start (see: srt --debug)"
                    else:
                        port, auth = found
                        via = Via(port, "localhost", auth)
                        out["srt"] = run_suite("srt", via, ports, size, args.requests)
    s, d = out["stockade"], out["direct"]
    ratios: dict[str, Any] = {
        "added_p50_ms": round(s["p50_ms"] - d["p50_ms"], 3),
        "tunnel_vs_direct": round(s["tunnel_GBps"] / d["tunnel_GBps"], 3),
    }
    if out["squid"]:
        q = out["squid"]
        ratios["tunnel_vs_squid"] = round(s["tunnel_GBps"] / q["tunnel_GBps"], 3)
        ratios["forward_vs_squid"] = round(s["forward_GBps"] / q["forward_GBps"], 3)
        ratios["p50_vs_squid"] = round(s["p50_ms"] / q["p50_ms"], 3)
    if out["srt"]:
        r = out["srt"]
        ratios["tunnel_vs_srt"] = round(s["tunnel_GBps"] / r["tunnel_GBps"], 3)
        ratios["forward_vs_srt"] = round(s["forward_GBps"] / r["forward_GBps"], 3)
        ratios["p50_vs_srt"] = round(s["p50_ms"] / r["p50_ms"], 3)
    targets = {
        "tunnel_ge_squid": bool(out["squid"]) and ratios.get("tunnel_vs_squid", 0) >= 1,
        "forward_ge_squid": bool(out["squid"]) and ratios.get("forward_vs_squid", 0) >= 1,
        "tunnel_ge_4x_srt": bool(out["srt"]) and ratios.get("tunnel_vs_srt", 0) >= 4,
        "added_p50_le_0.5ms": ratios["added_p50_ms"] <= 0.5,
        "concurrent_no_error": s["concurrent"]["errors"] == 0,
    }
    if out["chained"]:
        c, q = out["chained"]["chained"], out["chained"]["squid"]
        ratios["chained_vs_squid_tunnel"] = round(c["tunnel_GBps"] / q["tunnel_GBps"], 3)
        ratios["chained_added_tunnel_p50_ms"] = round(c["tunnel_p50_ms"] - q["tunnel_p50_ms"], 3)
        ratios["chained_added_forward_p50_ms"] = round(c["forward_p50_ms"] - q["forward_p50_ms"], 3)
        targets["chained_tunnel_within_10pct_of_squid"] = ratios["chained_vs_squid_tunnel"] >= 0.9
        targets["chained_added_p50_le_0.5ms"] = (
            ratios["chained_added_tunnel_p50_ms"] <= 0.5
            and ratios["chained_added_forward_p50_ms"] <= 0.5
        )
    t = out["tunnels"]
    ratios["transparent_vs_connect_tunnel"] = round(
        t["transparent"]["tunnel_GBps"] / t["connect"]["tunnel_GBps"], 3
    )
    ratios["transparent_vs_connect_p50"] = round(
        t["transparent"]["p50_ms"] / t["connect"]["p50_ms"], 3
    )
    targets["transparent_tunnel_within_10pct"] = ratios["transparent_vs_connect_tunnel"] >= 0.9
    targets["transparent_p50_within_10pct"] = ratios["transparent_vs_connect_p50"] <= 1.1
    out["ratios"] = ratios
    out["targets"] = targets
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
