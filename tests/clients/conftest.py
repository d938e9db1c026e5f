"""The compatibility suite's servers, programs and runner (issue 13).

Every client runs inside ``stockade run`` with all layers on, against servers of this
process on 127.0.0.1 that are reached under ``.test`` names pinned with
``network.hosts``. One origin server speaks plain HTTP, another HTTPS with a certificate
from a trustme CA; both serve ``/hello``, a PEP 503 index with a tiny wheel, an npm
registry with a tiny tarball and a git repository over smart HTTP (``git http-backend``).
Every URL starts with ``/t/TOKEN/``: the servers record the token of each request they
see, so "this client reached this server under this name" and "nothing of this case
reached any server" are checked by token, with servers shared by every test.

Each client is run in two modes. **proxy**: the environment stockade sets (the proxy
variables are a fast path; a client that ignores them goes through the resolver and
capture). **transparent**: every proxy variable unset first (``HTTP_PROXY``,
``JAVA_TOOL_OPTIONS``, ``GIT_CONFIG_*``, ...), so the client must resolve the name with
stockade's resolver and be captured.

Many cases share one run: the clients read tab-separated jobs (id, client, method,
url, header) and print ``RESULT id status text`` lines (``programs/``).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.conftest import SECRET_ENV, World, require

# The package both suites install: one wheel builder.
from tests.runtime.test_toolchains import MESSAGE, PKG, tiny_tarball, tiny_wheel

PROGRAMS = Path(__file__).parent / "programs"
MODES = ("proxy", "transparent")
#: the stand-in of a real credential bound to the inspected hosts
REAL_KEY = "sk-real-clients-0123456789abcdef"

#: Every variable that can point a client at the proxy, unset in transparent mode (the
#: brief's ``env -u HTTP_PROXY -u ...`` list, taken from the environment itself so that
#: a variable stockade adds later is unset too); the run fails if one is left.
TRANSPARENT_PRELUDE = (
    "for v in $(env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p' | "
    "grep -iE 'proxy|^JAVA_TOOL_OPTIONS$|^GRADLE_OPTS$|^GIT_CONFIG_|^_JAVA_OPTIONS$'); "
    'do unset "$v"; done\n'
    "if env | grep -iE '^[^=]*(proxy|JAVA_TOOL_OPTIONS|GIT_CONFIG_COUNT)[^=]*='; then "
    "echo 'a proxy variable is left' >&2; exit 99; fi\n"
)

#: which program runs each client, and what it needs on the host
RUNNERS: dict[str, tuple[str, str | None]] = {
    "curl": ("sh", "curl"),
    "curl-socks": ("sh", "curl"),
    "wget": ("sh", "wget"),
    "pip": ("sh", None),
    "uv": ("sh", "uv"),
    "npm": ("sh", "npm"),
    "git": ("sh", "git"),
    "urllib": ("py", None),
    "httpclient": ("py", None),
    "requests": ("py", None),
    "httpx": ("py", None),
    "aiohttp": ("py", None),
    "aiohttp-env": ("py", None),
    "node-fetch": ("node", "node"),
    "node-get": ("node", "node"),
    "java": ("java", "javac"),
    "go": ("go", "go"),
}


def _node_reads_proxy_variables() -> bool:
    """Node 24 (and 22.21) route fetch and http(s).request through HTTP(S)_PROXY when
    NODE_USE_ENV_PROXY=1, which stockade sets; Node 20 and older never do."""
    node = shutil.which("node")
    if node is None:
        return False
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    major, minor = (int(x) for x in out.stdout.strip().lstrip("v").split(".")[:2])
    return major >= 24 or (major == 22 and minor >= 21)


#: clients that ignore the proxy variables stockade sets (they need the resolver and
#: capture in any mode)
IGNORE_PROXY_VARIABLES = frozenset(
    {"httpclient", "aiohttp"}
    | (set() if _node_reads_proxy_variables() else {"node-fetch", "node-get"})
)
#: clients that install or clone (their text is the package's message or a file)
INSTALLERS = frozenset({"pip", "uv", "npm", "git"})


def uv_path() -> str | None:
    """uv from the dev extra (beside this interpreter), or on PATH."""
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


def tool_path(tool: str | None) -> str | None:
    if tool is None:
        return sys.executable
    if tool == "uv":
        return uv_path()
    return shutil.which(tool)


def require_client(client: str) -> None:
    """Skip (fail in CI) a client whose program is not installed."""
    tool = RUNNERS[client][1]
    require(tool_path(tool) is not None, f"{tool} is not installed (scripts/test installs it)")


# --- what the servers serve ----------------------------------------------------------------


def bare_repository(root: Path) -> Path:
    """A bare repository ``repo.git`` under ``root`` with one commit of hello.txt."""
    work = root / "work"
    bare = root / "repo.git"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=stockade", "-c", "user.email=stockade@example.test"]

    def git(*args: str, cwd: Path = root) -> None:
        subprocess.run(["git", *ident, *args], cwd=cwd, env=env, check=True, capture_output=True)

    git("init", "-q", "-b", "main", str(work))
    (work / "hello.txt").write_text(MESSAGE + "\n")
    git("add", "hello.txt", cwd=work)
    git("commit", "-q", "-m", "first", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare))
    return bare


# --- the origin servers ----------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One request an origin server received."""

    token: str
    method: str
    path: str
    host: str
    headers: dict[str, str]


@dataclass
class Content:
    wheel_name: str
    wheel: bytes
    tarball: bytes
    git_root: Path


_TOKEN = re.compile(r"^/t/([A-Za-z0-9._-]+)(/.*)$")


class Origin(http.server.ThreadingHTTPServer):
    """An HTTP or HTTPS origin on 127.0.0.1 that records the token of every request."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(
        self, kind: str, content: Content, context: ssl.SSLContext | None, port: int = 0
    ) -> None:
        self.kind = kind
        self.content = content
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _OriginHandler)
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def seen_for(self, token: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.token == token]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up half-way (a refused case) is expected; keep stderr quiet.
        pass

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _OriginHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Origin

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return body
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _send(self, status: int, data: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _answer(self) -> None:
        body = self._body()
        match = _TOKEN.match(self.path)
        token, path = (match.group(1), match.group(2)) if match else ("", self.path)
        host = self.headers.get("host", "")
        with self.server.lock:
            self.server.seen.append(
                Seen(
                    token, self.command, path, host, {k.lower(): v for k, v in self.headers.items()}
                )
            )
        content = self.server.content
        base = f"/t/{token}"
        route = path.split("?", 1)[0]
        if route == "/hello":
            self._send(200, f"hello {token} via {self.server.kind}:{self.server.port}".encode())
        elif route in ("/simple/", f"/simple/{PKG}/"):
            digest = hashlib.sha256(content.wheel).hexdigest()
            link = f"{base}/files/{content.wheel_name}#sha256={digest}"
            page = f'<!DOCTYPE html><html><body><a href="{link}">{content.wheel_name}</a></body></html>'
            self._send(200, page.encode(), "text/html")
        elif route == f"/files/{content.wheel_name}":
            self._send(200, content.wheel, "application/octet-stream")
        elif route == f"/{PKG}":
            self._send(200, self._packument(host, base), "application/json")
        elif route == f"/{PKG}/-/{PKG}-1.0.0.tgz":
            self._send(200, content.tarball, "application/octet-stream")
        elif route.startswith("/repo.git/"):
            self._git(path, body)
        else:
            self._send(404, b"not found")

    def _packument(self, host: str, base: str) -> bytes:
        tgz = self.server.content.tarball
        scheme = "https" if self.server.kind == "https" else "http"
        return json.dumps(
            {
                "name": PKG,
                "dist-tags": {"latest": "1.0.0"},
                "versions": {
                    "1.0.0": {
                        "name": PKG,
                        "version": "1.0.0",
                        "main": "index.js",
                        "dist": {
                            "tarball": f"{scheme}://{host}{base}/{PKG}/-/{PKG}-1.0.0.tgz",
                            "shasum": hashlib.sha1(tgz).hexdigest(),
                            "integrity": "sha512-"
                            + base64.b64encode(hashlib.sha512(tgz).digest()).decode(),
                        },
                    }
                },
            }
        ).encode()

    def _git(self, path: str, body: bytes) -> None:
        """Smart HTTP: ``git http-backend`` as a CGI program."""
        script, _, query = path.partition("?")
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": str(self.server.content.git_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": script,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("content-encoding", ""),
            "GIT_PROTOCOL": self.headers.get("git-protocol", ""),
            "REMOTE_ADDR": "127.0.0.1",
        }
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_HEAD = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


class LineEcho:
    """A line-protocol TCP server on two ports of 127.0.0.1: each line comes back as
    ``echo LINE``; every connection is recorded with its port."""

    def __init__(self) -> None:
        self.socks = []
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            self.socks.append(sock)
        self.ports = [int(s.getsockname()[1]) for s in self.socks]
        self.connections: list[int] = []
        self.lines: list[str] = []
        self.lock = threading.Lock()
        for sock in self.socks:
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        port = int(sock.getsockname()[1])
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections.append(port)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn, conn.makefile("rwb") as stream:
            try:
                for raw in stream:
                    line = raw.decode(errors="replace").rstrip("\r\n")
                    with self.lock:
                        self.lines.append(line)
                    stream.write(f"echo {line}\n".encode())
                    stream.flush()
            except OSError:
                return

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@dataclass
class Servers:
    ca: trustme.CA
    ca_pem: bytes
    ca_path: Path
    http: Origin
    https: Origin
    echo: LineEcho
    #: what the origins serve, and the HTTPS origins' TLS context (for more origins)
    content: Content
    context: ssl.SSLContext

    def origin(self, scheme: str) -> Origin:
        return self.https if scheme == "https" else self.http

    def seen_for(self, token: str) -> list[Seen]:
        return self.http.seen_for(token) + self.https.seen_for(token)


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    root = Path(tempfile.mkdtemp(prefix="stockade-clients-srv-"))
    ca = trustme.CA()
    ca_path = root / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # One certificate for every name of the suite (each client has names of its own).
    ca.issue_cert("*.ok.test", "*.api.test", "*.no.test", "*.dns.test").configure_cert(context)
    require(shutil.which("git") is not None, "git is not installed")
    wheel_name, wheel = tiny_wheel()
    content = Content(wheel_name, wheel, tiny_tarball(), bare_repository(root).parent)
    plain = Origin("http", content, None)
    secure = Origin("https", content, context)
    echo = LineEcho()
    try:
        yield Servers(ca, ca.cert_pem.bytes(), ca_path, plain, secure, echo, content, context)
    finally:
        plain.close()
        secure.close()
        echo.close()
        shutil.rmtree(root, ignore_errors=True)


# --- the Go client, built once ---------------------------------------------------------------


@pytest.fixture(scope="session")
def go_client() -> Iterator[Path | None]:
    """``programs/client.go`` built with CGO_ENABLED=0 (None without a Go toolchain)."""
    go = shutil.which("go")
    if go is None:
        yield None
        return
    build = Path(tempfile.mkdtemp(prefix="stockade-clients-go-"))
    shutil.copy(PROGRAMS / "client.go", build / "client.go")
    env = dict(
        os.environ,
        CGO_ENABLED="0",
        GO111MODULE="off",
        GOCACHE=str(build / "cache"),
        GOPATH=str(build / "path"),
        GOFLAGS="",
    )
    proc = subprocess.run(
        [go, "build", "-o", "client-go", "client.go"],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    try:
        yield build / "client-go"
    finally:
        shutil.rmtree(build, ignore_errors=True)


# --- a world shared by the runs of a module ---------------------------------------------------


def make_world() -> World:
    """A world like tests/conftest.py's (HOME with canaries), readable by uid 65534."""
    root = Path(tempfile.mkdtemp(prefix="stockade-clients-"))
    os.chmod(root, 0o755)
    home = root / "home"
    home.mkdir()
    canary = f"CANARY-{uuid.uuid4()}"
    (home / ".netrc").write_text(f"machine ok.test login x password {canary}\n")
    workspace = root / "ws"
    workspace.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env.update(
        HOME=str(home),
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
    )
    return World(root, home, workspace, canary, env)


@pytest.fixture(scope="module")
def cworld(servers: Servers, go_client: Path | None) -> Iterator[World]:
    """A world whose workspace holds the client programs and the test CA (ca.pem)."""
    world = make_world()
    install_programs(world, servers, go_client)
    try:
        yield world
    finally:
        shutil.rmtree(world.root, ignore_errors=True)


def install_programs(world: World, servers: Servers, go_client: Path | None) -> None:
    for name in (
        "clients.sh",
        "clients.py",
        "clients.js",
        "Client.java",
        "dns_probe.py",
        "echo_probe.py",
    ):
        shutil.copy(PROGRAMS / name, world.workspace / name)
    if go_client is not None:
        shutil.copy(go_client, world.workspace / "client-go")
    (world.workspace / "ca.pem").write_bytes(servers.ca_pem)


# --- jobs, policies and runs ----------------------------------------------------------------


DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Job:
    """One case: ``client`` does ``method`` on ``url`` (sending ``header``)."""

    id: str
    client: str
    method: str
    url: str
    host: str
    port: int
    token: str
    header: str = "-"

    @property
    def scheme(self) -> str:
        return self.url.split(":", 1)[0]

    @property
    def endpoint(self) -> str:
        """The allow entry for this case: ``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def host_header(self) -> str:
        """What the server sees as Host (no port for the scheme's default one)."""
        return self.host if DEFAULT_PORTS[self.scheme] == self.port else self.endpoint

    def line(self) -> str:
        return "\t".join((self.id, self.client, self.method, self.url, self.header))


def url_for(client: str, scheme: str, host: str, port: int, token: str) -> str:
    """The case's URL; a scheme's default port is left out, as people write it."""
    authority = host if DEFAULT_PORTS[scheme] == port else f"{host}:{port}"
    base = f"{scheme}://{authority}/t/{token}"
    if client in ("pip", "uv"):
        return f"{base}/simple/"
    if client == "npm":
        return f"{base}/"
    if client == "git":
        return f"{base}/repo.git"
    return f"{base}/hello"


def make_job(
    client: str,
    scheme: str,
    zone: str,
    port: int,
    *,
    method: str = "GET",
    header: str = "-",
    label: str = "",
) -> Job:
    """A case of ``client`` on the name ``CLIENT-SCHEME[-LABEL].ZONE.test``."""
    name = "-".join(p for p in (client, scheme, label) if p)
    host = f"{name}.{zone}.test"
    token = f"{name}-{method.lower()}-{uuid.uuid4().hex[:12]}"
    return Job(
        token,
        client,
        method,
        url_for(client, scheme, host, port, token),
        host,
        port,
        token,
        header,
    )


#: the caller's trust-store variables, passed into the sandbox (naming ca.pem)
TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "npm_config_cafile",
)
#: what the programs are told by the caller: the interpreter with pip and the client
#: libraries, uv, and the installers' settings (no retries, no prompts)
RUN_VARIABLES = {
    "CLIENT_PY": sys.executable,
    "CLIENT_UV": uv_path() or "uv-not-installed",
    "UV_HTTP_RETRIES": "0",
    "UV_HTTP_TIMEOUT": "10",
    "UV_NO_PROGRESS": "1",
    "PIP_NO_INPUT": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def policy_text(
    *,
    allow: Iterable[str],
    pins: Iterable[str],
    tls_ports: Iterable[int] = (),
    tail: str = "",
    # The venv's interpreter (the Python clients' libraries, pip and uv) lives outside the
    # workspace: readable, not writable.
    read: Sequence[str] = (sys.prefix, sys.base_prefix),
    pass_trust: bool = True,
) -> str:
    """A policy allowing ``allow`` (``host:port`` entries) with every name of ``pins``
    pinned to 127.0.0.1; the program variables passed, and the trust-store ones too
    unless ``pass_trust`` is false (stockade passes them by default)."""
    hosts = ", ".join(f'"{h}" = "127.0.0.1"' for h in sorted(set(pins)))
    env_pass = json.dumps([*(TRUST_VARIABLES if pass_trust else ()), *RUN_VARIABLES])
    return (
        "version = 1\n"
        f"[filesystem]\nread = {json.dumps(sorted(set(read)))}\n"
        f"[env]\npass = {env_pass}\n"
        f"[network]\nallow = {json.dumps(sorted(set(allow)))}\n"
        f"hosts = {{ {hosts} }}\n"
        f"tls_ports = {json.dumps(sorted({443, *tls_ports}))}\n"
        f"{tail}"
    )


@dataclass
class Ran:
    proc: subprocess.CompletedProcess[str]
    events: list[dict[str, Any]]
    results: dict[str, tuple[str, str]]
    probes: dict[str, Any]
    seconds: float

    @property
    def out(self) -> str:
        return self.proc.stdout[-6000:] + "\n--- stderr\n" + self.proc.stderr[-4000:]

    def about(self, host: str) -> list[dict[str, Any]]:
        """Events that name ``host`` (as host or name)."""
        host = host.rstrip(".").lower()
        return [
            e
            for e in self.events
            if any(str(e.get(k, "")).rstrip(".").lower() == host for k in ("host", "name"))
        ]

    def denials(self, host: str) -> list[dict[str, Any]]:
        return [e for e in self.about(host) if e.get("verdict") == "deny"]

    def allowed(self, host: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.about(host)
            if e.get("verdict") == "allow" and e["event"] in ("net_connect", "net_request")
        ]

    def brief(self, host: str) -> str:
        keep = ("event", "verdict", "reason", "host", "name", "port", "mode", "method", "path")
        return json.dumps([{k: e[k] for k in keep if k in e} for e in self.about(host)])


_RESULT = re.compile(r"^RESULT (\S+) (\S+) ?(.*)$")


@dataclass
class Matrix:
    """One ``stockade run`` of every case of a matrix, in one mode."""

    mode: str
    ran: Ran
    #: per client, its jobs on an allowed name and on a name not in the policy
    allowed: dict[str, list[Job]]
    denied: dict[str, list[Job]]
    #: extra names the run looked up itself: (allowed, not in the policy)
    names: tuple[str, str] = ("", "")

    def check(self, client: str, servers: Servers) -> None:
        """Every allowed job of ``client`` got its answer; every denied one its denial."""
        require_client(client)
        for job in self.allowed[client]:
            check_allowed(self.ran, job, servers, self.mode)
        for job in self.denied[client]:
            check_denied(self.ran, job, servers, self.mode)


def matrix_jobs(
    cases: dict[str, tuple[str, ...]], servers: Servers, label: str = ""
) -> tuple[dict[str, list[Job]], dict[str, list[Job]]]:
    """Each client's jobs, one per scheme, on an allowed name and on a name not allowed."""
    allowed: dict[str, list[Job]] = {}
    denied: dict[str, list[Job]] = {}
    ports = {"http": servers.http.port, "https": servers.https.port}
    for client, schemes in cases.items():
        for scheme in schemes:
            for zone, jobs in (("ok", allowed), ("no", denied)):
                jobs.setdefault(client, []).append(
                    make_job(client, scheme, zone, ports[scheme], label=label)
                )
    return allowed, denied


def parse_run(proc: subprocess.CompletedProcess[str], audit: Path, seconds: float = 0.0) -> Ran:
    """The audit log and the RESULT and PROBE lines of a finished run."""
    events = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    results: dict[str, tuple[str, str]] = {}
    probes: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if match := _RESULT.match(line):
            results[match.group(1)] = (match.group(2), match.group(3).strip())
        elif line.startswith("PROBE "):
            _, key, value = line.split(" ", 2)
            probes[key] = json.loads(value)
    return Ran(proc, events, results, probes, seconds)


def script_for(
    jobs: Sequence[Job],
    mode: str,
    label: str,
    *,
    go_client: bool = True,
    python: str = "$CLIENT_PY",
) -> tuple[str, dict[str, str]]:
    """A subshell that runs ``jobs`` in ``run-LABEL/`` (each runner in parallel with the
    others) in ``mode``, and the job files it reads (paths relative to the workspace)."""
    assert mode in MODES
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        runner = RUNNERS[job.client][0]
        if runner == "sh":
            # Each installer in a runner of its own: they are the slow ones.
            runner = job.client if job.client in INSTALLERS else "sh"
        groups.setdefault(runner, []).append(job)
    files: dict[str, str] = {}
    lines = [f"(cd run-{label} || exit 1"]
    if mode == "transparent":
        lines.append(TRANSPARENT_PRELUDE)
    for runner, group in groups.items():
        name = f"jobs-{runner}.tsv"
        files[f"run-{label}/{name}"] = "".join(j.line() + "\n" for j in group)
        if runner == "go" and not go_client:
            command = f"awk -F'\\t' '{{print \"RESULT \" $1 \" not-installed go\"}}' {name}"
        elif runner in ("py", "node", "java", "go"):
            command = {
                "py": f'"{python}" ../clients.py {name}',
                "node": f"node ../clients.js {name}",
                # C1 only: the client's few requests do not pay back C2's compilations.
                "java": f"java -XX:TieredStopAtLevel=1 ../Client.java {name}",
                "go": f"../client-go {name}",
            }[runner]
        else:
            command = f"sh ../clients.sh {name}"
        lines.append(f"( {command} ) >out-{runner}.txt 2>&1 </dev/null &")
    lines.append("wait")
    lines.append("cat out-*.txt)")
    return "\n".join(lines) + "\n", files


def run_env(
    world: World, env: dict[str, str] | None = None, trust: Path | None = None
) -> dict[str, str]:
    """The caller's environment of a run: the trust-store variables name ``trust``
    (the workspace's ca.pem by default)."""
    out = dict(world.env)
    for name in TRUST_VARIABLES:
        out[name] = str(trust or world.workspace / "ca.pem")
    out.update(RUN_VARIABLES)
    out.update(env or {})
    return out


def write_run(world: World, label: str, policy: str, files: dict[str, str]) -> tuple[Path, Path]:
    """Write the policy and the run's files; (policy path, audit path)."""
    shutil.rmtree(world.workspace / f"run-{label}", ignore_errors=True)
    (world.workspace / f"run-{label}").mkdir()
    for name, text in files.items():
        path = world.workspace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    policy_path = world.root / f"policy-{label}.toml"
    policy_path.write_text(policy)
    audit = world.root / f"audit-{label}.jsonl"
    audit.unlink(missing_ok=True)
    return policy_path, audit


def run_jobs(
    world: World,
    jobs: Sequence[Job],
    policy: str,
    *,
    mode: str,
    go_client: bool,
    label: str,
    env: dict[str, str] | None = None,
    trust: Path | None = None,
    after: str = "",
    backend: str = "bubblewrap",
) -> Ran:
    """Run ``jobs`` in one ``stockade run`` under ``policy`` (then the shell commands
    ``after``) on ``backend``; results by job id."""
    script, files = script_for(jobs, mode, label, go_client=go_client)
    return run_script(
        world,
        script + after,
        policy,
        label=label,
        env=env,
        files=files,
        trust=trust,
        backend=backend,
    )


def run_script(
    world: World,
    script: str,
    policy: str,
    *,
    label: str,
    env: dict[str, str] | None = None,
    files: dict[str, str] | None = None,
    timeout: float = 120,
    prefix: Sequence[str] = (),
    trust: Path | None = None,
    backend: str = "bubblewrap",
) -> Ran:
    """``sh -c script`` in one ``stockade run`` under ``policy`` (``files`` written to
    the workspace first) on the container ``backend`` (gvisor: the world's environment
    names the runsc, as STOCKADE_RUNSC); the audit log and the RESULT and PROBE lines
    parsed. ``prefix`` is a command that runs the stockade command (``unshare ...``)."""
    policy_path, audit = write_run(world, label, policy, files or {})
    args = (
        "run",
        # bubblewrap is the default: its runs keep the command line they always had
        *(("--backend", backend) if backend != "bubblewrap" else ()),
        "--policy",
        str(policy_path),
        "--audit",
        str(audit),
        "--",
        "sh",
        "-c",
        script,
    )
    started = time.monotonic()
    proc = subprocess.run(
        [*prefix, *world.command, *args],
        cwd=world.workspace,
        env=run_env(world, env, trust),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return parse_run(proc, audit, time.monotonic() - started)


def expected_body(job: Job, servers: Servers) -> str:
    if job.client in INSTALLERS:
        return MESSAGE
    return f"hello {job.token} via {job.scheme}:{servers.origin(job.scheme).port}"


def check_allowed(ran: Ran, job: Job, servers: Servers, mode: str) -> None:
    """The case succeeded, reached the right server under its name, and was audited."""
    status, text = ran.results.get(job.id, ("missing", ""))
    want_status = "ok" if job.client in INSTALLERS else "200"
    assert (status, text) == (want_status, expected_body(job, servers)), (
        f"{job.client} {job.method} {job.url} in {mode} mode: {status} {text}\n"
        f"events: {ran.brief(job.host)}"
    )
    seen = servers.origin(job.scheme).seen_for(job.token)
    assert seen, f"{job.client}: the {job.scheme} server saw no request of {job.token}"
    assert {s.host for s in seen} == {job.host_header}, seen
    allowed = ran.allowed(job.host)
    assert allowed, f"{job.client}: no allow event for {job.host}: {ran.brief(job.host)}"
    transparent = [e for e in allowed if e.get("mode") == "transparent"]
    if mode == "transparent" or job.client in IGNORE_PROXY_VARIABLES:
        assert transparent, f"{job.client}: not captured: {ran.brief(job.host)}"
    else:
        # The proxy variables are the fast path for a client that reads them.
        assert len(transparent) < len(allowed), f"{job.client}: {ran.brief(job.host)}"


def check_denied(ran: Ran, job: Job, servers: Servers, mode: str) -> None:
    """The case failed, nothing of it reached a server, and the denial is audited."""
    status, text = ran.results.get(job.id, ("missing", ""))
    assert status != "missing", f"{job.client}: no result\n{ran.out}"
    assert status not in ("200", "ok"), f"{job.client} reached {job.url}: {text}"
    assert servers.seen_for(job.token) == []
    denied = ran.denials(job.host)
    assert denied, f"{job.client} {job.url} ({status} {text}): no denial for {job.host}"
    if mode == "transparent" or job.client in IGNORE_PROXY_VARIABLES:
        # No name to connect to: the resolver says no, and the lookup went nowhere.
        assert any(e["event"] == "dns_query" for e in denied), ran.brief(job.host)
    else:
        assert any(e["event"] in ("net_connect", "net_request") for e in denied), ran.brief(
            job.host
        )
