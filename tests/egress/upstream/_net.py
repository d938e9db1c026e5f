"""A company network for the upstream tests: squid in one network namespace, stockade in
another, and targets that only squid can reach.

Two namespaces the test creates, joined by a veth pair::

    netns A (stockade)                      netns B (the company's side)
    10.203.N.1/30  ── veth ──  10.203.N.2/30  squid :3128 (basic auth, its own log)
    10.205.N.10 on lo: a "direct" server      10.204.N.10 on lo: the .test servers

A has no route to 10.204.N.0 and no default route: a direct dial from A to a target
fails at once (ENETUNREACH) and cannot leave the machine, so "the connection went through
squid" is a property of the network, not of the code under test. Nothing here touches
the host's own network namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trustme

from tests.conftest import require

T = TypeVar("T")
SQUID_PORT = 3128
USER, PASSWORD = "alice", "s3cret-pw"
NCSA = "/usr/lib/squid/basic_ncsa_auth"
_CLONE_NEWNET = 0x40000000

SQUID_CONF = """\
http_port {listen}:{port}
# squid's connections come from its own address: the targets see squid, not stockade
tcp_outgoing_address {listen}
auth_param basic program {ncsa} {dir}/passwd
auth_param basic realm stockade-test
auth_param basic credentialsttl 1 second
acl authed proxy_auth REQUIRED
http_access allow authed
http_access deny all
hosts_file {dir}/hosts
dns_nameservers 127.0.0.1
cache deny all
cache_mem 8 MB
access_log stdio:{dir}/access.log squid
cache_store_log none
cache_log {dir}/cache.log
pid_filename {dir}/squid.pid
coredump_dir {dir}
workers 1
shutdown_lifetime 0 seconds
"""

# One target server: HTTP or HTTPS on ADDRESS:PORT, logging every request as a JSON line
# (the peer address is what proves whose connection reached it).
SERVER = r"""
import http.server, json, socketserver, ssl, sys, threading
address, port, log, cert = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Lock()
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        entry = {"peer": self.client_address[0], "method": self.command, "path": self.path,
                 "host": self.headers.get("host"),
                 "proxy_auth": self.headers.get("proxy-authorization"), "body": len(body)}
        with lock, open(log, "a") as f:
            f.write(json.dumps(entry) + "\n")
        out = f"hello from {address}:{port} {self.command} {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = answer
    def log_message(self, *a):
        pass
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
server = Server((address, port), Handler)
if cert != "-":
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
"""


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread that entered ``netns`` (a network namespace is per thread):
    the sockets it creates live there, whichever thread uses them afterwards."""
    out: list[Any] = []

    def run() -> None:
        try:
            enter_netns(netns)
            out.append((True, fn()))
        except BaseException as exc:
            out.append((False, exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def enter_netns(netns: str) -> None:
    """Move the calling thread into ``netns`` (its sockets from now on are made there)."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc().setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {netns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Target:
    """A server in netns B (or A) and the requests it logged."""

    address: str
    port: int
    log: Path
    proc: subprocess.Popen[str]

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@dataclass
class Squid:
    """squid in netns B: its address, port and access log."""

    address: str
    port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def log(self) -> list[str]:
        """The access log's lines (squid writes each when a transaction ends)."""
        path = self.directory / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    def wait_log(self, needle: str, timeout: float = 5.0) -> list[str]:
        """The log lines containing ``needle``, waiting for squid to write them."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.log() if needle in line]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


@dataclass
class CompanyNet:
    """Both namespaces, squid, the targets and the test CA (see the module docstring)."""

    a: str
    b: str
    a_address: str
    target_address: str
    direct_address: str
    squid: Squid
    ca: trustme.CA
    ca_path: Path
    auth_file: Path
    bad_auth_file: Path
    http: Target
    https: Target
    direct: Target
    root: Path
    extra: list[subprocess.Popen[Any]] = field(default_factory=list)

    def policy(
        self,
        *,
        allow: tuple[str, ...] = (
            "web.test",
            "tls.test",
            "opaque.test",
            "direct.test",
            "evil-but-pinned.test",
        ),
        deny: tuple[str, ...] = (),
        upstream: str | None = None,
        no_proxy: tuple[str, ...] = (),
        auth_file: Path | str | None = "default",
        connect_by: str = "address",
        extra: str = "",
    ) -> str:
        """A policy pinning the .test names to the namespace addresses, with an upstream."""
        auth = self.auth_file if auth_file == "default" else auth_file
        lines = [
            "[network]",
            f"allow = {json.dumps(list(allow))}",
            f"deny = {json.dumps(list(deny))}",
            "hosts = { "
            + ", ".join(
                f'"{name}" = "{address}"'
                for name, address in (
                    ("web.test", self.target_address),
                    ("tls.test", self.target_address),
                    ("opaque.test", self.target_address),
                    ("evil-but-pinned.test", self.target_address),
                    ("direct.test", self.direct_address),
                )
            )
            + " }",
            f"tls_ports = [443, {self.https.port}]",
            extra,
            "[network.upstream]",
            f'proxy = "{upstream or self.squid.url}"',
            f"no_proxy = {json.dumps(list(no_proxy))}",
            f'connect_by = "{connect_by}"',
        ]
        if auth is not None:
            lines.append(f'auth_file = "{auth}"')
        return "\n".join(lines) + "\n"

    def connect(self, port: int) -> socket.socket:
        """A client socket in netns A connected to ``127.0.0.1:port`` there."""
        return in_netns(self.a, lambda: socket.create_connection(("127.0.0.1", port), 5))


def _serve(
    netns: str, address: str, port: int, log: Path, cert: str = "-"
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            netns,
            sys.executable,
            "-c",
            SERVER,
            address,
            str(port),
            str(log),
            cert,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(
            f"target server did not start: {proc.stderr.read() if proc.stderr else ''}"
        )
    return proc


def start_squid(net_b: str, squid: Squid) -> subprocess.Popen[bytes]:
    binary = shutil.which("squid") or "/usr/sbin/squid"
    proc = subprocess.Popen(
        ["ip", "netns", "exec", net_b, binary, "-N", "-f", str(squid.directory / "squid.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection((squid.address, squid.port), 0.5),
        ):
            return True
        return False

    deadline = time.monotonic() + 30
    while not in_netns(net_b, listening):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log = (
                (squid.directory / "cache.log").read_text()
                if (squid.directory / "cache.log").exists()
                else ""
            )
            raise RuntimeError(f"squid did not start: {log[-2000:]}")
        time.sleep(0.1)
    return proc


def require_company_net() -> None:
    """Skip (or, under STOCKADE_MUST_WORK=1, fail) without what the network needs."""
    require(
        shutil.which("squid") is not None or Path("/usr/sbin/squid").exists(),
        "squid is not installed (apt-get install squid)",
    )
    require(Path(NCSA).exists(), f"{NCSA} (squid's basic auth helper) is missing")
    require(os.geteuid() == 0, "network namespaces for the squid tests need root")
    require(shutil.which("ip") is not None, "ip (iproute2) is not installed")
    require(shutil.which("openssl") is not None, "openssl is needed to write squid's htpasswd")


@contextlib.contextmanager
def company_net() -> Iterator[CompanyNet]:
    """Build the two namespaces, squid and the targets; tear everything down after."""
    require_company_net()
    tag = secrets.token_hex(3)
    n = 1 + secrets.randbelow(250)
    a, b = f"stk-a-{tag}", f"stk-b-{tag}"
    veth_a, veth_b = f"stka{tag}", f"stkb{tag}"
    a_address, b_address = f"10.203.{n}.1", f"10.203.{n}.2"
    target, direct = f"10.204.{n}.10", f"10.205.{n}.10"
    root = Path(f"/tmp/stockade-company-{tag}")
    root.mkdir(mode=0o755)
    procs: list[subprocess.Popen[Any]] = []
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _ip("link", "set", veth_a, "netns", a)
        _ip("link", "set", veth_b, "netns", b)
        _ip("-n", a, "addr", "add", f"{a_address}/30", "dev", veth_a)
        _ip("-n", b, "addr", "add", f"{b_address}/30", "dev", veth_b)
        for ns, dev in ((a, veth_a), (b, veth_b)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", b, "addr", "add", f"{target}/32", "dev", "lo")
        _ip("-n", a, "addr", "add", f"{direct}/32", "dev", "lo")

        ca = trustme.CA()
        ca_path = root / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_path))
        cert = root / "tls-test.pem"
        ca.issue_cert("tls.test", "opaque.test").private_key_and_cert_chain_pem.write_to_path(
            str(cert)
        )
        cert.chmod(0o644)

        squid_dir = root / "squid"
        squid_dir.mkdir()
        hashed = subprocess.run(
            ["openssl", "passwd", "-apr1", PASSWORD], capture_output=True, text=True, check=True
        ).stdout.strip()
        (squid_dir / "passwd").write_text(f"{USER}:{hashed}\n")
        # internal.test: a name only the company proxy resolves (pinned nowhere else).
        (squid_dir / "hosts").write_text(f"{target} web.test tls.test opaque.test internal.test\n")
        squid = Squid(b_address, SQUID_PORT, squid_dir)
        (squid_dir / "squid.conf").write_text(
            SQUID_CONF.format(listen=b_address, port=SQUID_PORT, ncsa=NCSA, dir=squid_dir)
        )
        os.chmod(squid_dir, 0o777)  # squid drops to its own user and writes its logs here
        for name in ("passwd", "hosts", "squid.conf"):
            (squid_dir / name).chmod(0o644)
        squid.proc = start_squid(b, squid)
        procs.append(squid.proc)

        http = Target(target, 8080, root / "http.log", _serve(b, target, 8080, root / "http.log"))
        procs.append(http.proc)
        https = Target(
            target, 8443, root / "https.log", _serve(b, target, 8443, root / "https.log", str(cert))
        )
        procs.append(https.proc)
        direct_target = Target(
            direct, 8081, root / "direct.log", _serve(a, direct, 8081, root / "direct.log")
        )
        procs.append(direct_target.proc)

        auth_dir = root / "auth"
        auth_dir.mkdir(mode=0o755)
        auth_file = auth_dir / "proxy-auth"
        auth_file.write_text(f"{USER}:{PASSWORD}\n")
        auth_file.chmod(0o600)
        bad_auth = auth_dir / "bad-auth"
        bad_auth.write_text(f"{USER}:not-the-password\n")
        bad_auth.chmod(0o600)
        yield CompanyNet(
            a,
            b,
            a_address,
            target,
            direct,
            squid,
            ca,
            ca_path,
            auth_file,
            bad_auth,
            http,
            https,
            direct_target,
            root,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
