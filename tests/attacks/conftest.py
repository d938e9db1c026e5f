"""The fixture world of attacks.md A.0, shared by every case of Part A.

One :class:`Arena` per test module (starting servers and a git workspace costs time; the
cases of one section share it). It holds:

* F-CANARY: canary secrets in a throw-away HOME (every secret file of the catalogue, not
  only the eight of ``tests/conftest.py``) and in the parent environment;
* F-HOSTPROC: a host process with the canary in argv and environment;
* F-SINK-TCP: recording TCP listeners on ``127.0.0.1`` and ``[::1]``;
* F-ALLOWED / F-EVIL: recording HTTP and HTTPS servers (trustme CA) for ``allowed.test``
  and ``evil.test``, both pinned to 127.0.0.1 by the policy, only the first allowed;
* F-UNIX: recording unix-socket listeners (docker.sock, the session bus under
  ``$XDG_RUNTIME_DIR``, an ssh-agent, a tmux server) and an abstract ``@sbx-test-<uuid>``;
* F-MARK: hashes of host files that must not change, and a marker path that must never
  come to exist.

A probe is Python run inside ``stockade run`` (all layers on unless a case says
otherwise). :data:`PRELUDE` gives it small helpers; a batch prints one JSON line per
variant, so one sandbox start serves a whole family of variants.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.conftest import SECRET_ENV, SECRET_FILES, World, bwrap_works, require

#: Every secret file of F-CANARY plus the other stores the SEC cases name.
ALL_SECRET_FILES: tuple[str, ...] = (
    *SECRET_FILES,
    ".ssh/id_rsa",
    ".ssh/config",
    ".aws/config",
    ".config/gcloud/application_default_credentials.json",
    ".azure/accessTokens.json",
    ".pypirc",
    ".bash_history",
    ".zsh_history",
    ".claude/.credentials.json",
    ".config/stockade/token",
    ".config/google-chrome/Default/Cookies",
    ".mozilla/firefox/profile/logins.json",
    ".config/Exodus/exodus.wallet",
    ".electrum/wallets/default_wallet",
    ".config/Signal/config.json",
    ".gnupg/private-keys-v1.d/key.key",
    ".local/share/keyrings/login.keyring",
    ".cache/git/credential/creds",
    "projects/other/.env",
)

#: Host files whose content must never change (F-MARK); created with fixed text.
MARKED_HOME_FILES: tuple[str, ...] = (
    ".bashrc",
    ".zshrc",
    ".profile",
    ".bash_profile",
    ".zprofile",
    ".ssh/authorized_keys",
    ".gitconfig",
)


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


class _Recorder:
    """Thread-safe list of what a sink saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[str] = []

    def add(self, entry: str) -> None:
        with self.lock:
            self.log.append(entry)

    def take(self) -> list[str]:
        with self.lock:
            out, self.log = self.log, []
            return out


def _serve_stream(listener: socket.socket, rec: _Recorder, name: str) -> None:
    """Accept forever; log each connection and every byte it sends (F-SINK-*/F-UNIX)."""
    while True:
        try:
            conn, peer = listener.accept()
        except OSError:
            return
        conn.settimeout(0.5)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                data += chunk
        conn.close()
        rec.add(f"{name} {peer!r} {data[:200]!r}")


@dataclass
class HttpServer:
    """F-ALLOWED / F-EVIL: HTTP and HTTPS on 127.0.0.1, recording every request."""

    http_port: int
    https_port: int
    rec: _Recorder
    servers: list[http.server.ThreadingHTTPServer] = field(default_factory=list)

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def _http_server(name: str, ca: trustme.CA) -> HttpServer:
    rec = _Recorder()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            sni = getattr(self.connection, "stockade_sni", "")
            auth = {
                k.lower(): v
                for k, v in self.headers.items()
                if k.lower() in ("authorization", "x-api-key", "cookie", "proxy-authorization")
            }
            rec.add(
                json.dumps(
                    {
                        "server": name,
                        "method": self.command,
                        "path": self.path,
                        "host": self.headers.get("host", ""),
                        "sni": sni,
                        "auth": auth,
                        "body": body.decode(errors="replace")[:2000],
                    }
                )
            )
            out = json.dumps({"server": name, "path": self.path}).encode()
            self.send_response(201 if self.command == "POST" else 200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _answer

        def log_message(self, *args: object) -> None:
            pass

    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(f"{name}.test", f"*.{name}.test").configure_cert(ctx)

    def on_sni(_sock: ssl.SSLObject, sni: str | None, _ctx: ssl.SSLContext) -> None:
        rec.add(json.dumps({"server": name, "sni": sni}))

    ctx.sni_callback = on_sni
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    for s in (plain, tls):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    return HttpServer(plain.server_address[1], tls.server_address[1], rec, [plain, tls])


@dataclass
class Result:
    """One sandbox run: exit code, output, and the JSON lines it printed, by id."""

    proc: subprocess.CompletedProcess[str]
    lines: dict[str, dict[str, Any]]
    audit: list[dict[str, Any]]

    def __getitem__(self, key: str) -> dict[str, Any]:
        assert key in self.lines, (
            f"probe {key!r} printed nothing; stdout={self.proc.stdout[-3000:]!r} "
            f"stderr={self.proc.stderr[-3000:]!r}"
        )
        return self.lines[key]


#: Helpers available to every probe (stdlib only; runs under the sandbox's python3).
PRELUDE = r"""
import errno, json, os, socket, subprocess, sys, time
def emit(id, **kw):
    print(json.dumps({"id": id, **kw}, default=str), flush=True)
def sh(cmd, timeout=15, input=None):
    t0 = time.monotonic()
    try:
        p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout,
                           input=input, errors="replace")
        return {"rc": p.returncode, "out": p.stdout[-4000:], "err": p.stderr[-2000:],
                "t": round(time.monotonic() - t0, 2)}
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "out": "", "err": ""}
def read(path):
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return {"ok": True, "data": f.read(4000).decode(errors="replace")}
    except OSError as e:
        return {"ok": False, "errno": errno.errorcode.get(e.errno, e.errno)}
def write(path, text="x", mode="a"):
    try:
        with open(os.path.expanduser(path), mode) as f:
            f.write(text)
        return {"ok": True}
    except OSError as e:
        return {"ok": False, "errno": errno.errorcode.get(e.errno, e.errno)}
def connect(family, addr, send=b"PROBE", timeout=3):
    s = None
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(addr)
        s.sendall(send)
        # Transparent capture accepts every connection inside the sandbox and closes
        # the refused ones: an immediate end of stream is a refusal, not a way out
        # (whether anything reached a sink is checked in the sinks' own logs).
        s.settimeout(0.5)
        try:
            if s.recv(64) == b"":
                return {"ok": False, "errno": "closed"}
        except TimeoutError:
            pass
        return {"ok": True}
    except OSError as e:
        return {"ok": False, "errno": errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__}
    finally:
        if s is not None:
            s.close()
"""


#: The container backends every case runs under (``arena``'s parameter): bubblewrap, and
#: gVisor's runsc when STOCKADE_GVISOR=1 (``runsc`` in tests/conftest.py).
BACKENDS = ("bubblewrap", "gvisor")


class Arena:
    """The A.0 fixture world for one module, and the way to run probes in it."""

    def __init__(self, backend: str = "bubblewrap", runsc: str | None = None) -> None:
        #: the backend every ``stockade run`` of this arena uses (--backend)
        self.backend = backend
        self.backend_flags: tuple[str, ...] = (
            ("--backend", backend) if backend != "bubblewrap" else ()
        )
        self.root = Path(tempfile.mkdtemp(prefix="stockade-attacks-"))
        os.chmod(self.root, 0o755)
        self.canary = f"CANARY-{uuid.uuid4()}"
        self.home = self.root / "home"
        self.workspace = self.root / "ws"
        self.workspace.mkdir()
        self.mark = self.root / f"MARK-{uuid.uuid4().hex}"
        self._closers: list[Any] = []
        for rel in ALL_SECRET_FILES:
            path = self.home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"secret {self.canary}\n")
        for rel in MARKED_HOME_FILES:
            path = self.home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"# {rel} of the host\n")
        (self.workspace / "README").write_text("workspace file\n")
        (self.workspace / ".env").write_text("WORKSPACE_ENV=by-design\n")
        subprocess.run(["git", "init", "-q", str(self.workspace)], check=True)
        # A sibling project: outside the workspace, so never readable.
        (self.root / "sibling").mkdir()
        (self.root / "sibling" / ".env").write_text(f"TOKEN={self.canary}\n")
        self.rec_tcp = _Recorder()
        self.rec_unix = _Recorder()
        self.tcp_port = self._tcp_sinks()
        self.run_dir = self.root / "run"
        self.xdg_runtime = self.run_dir / "user" / "1000"
        self.unix: dict[str, Path] = {
            "docker": self.run_dir / "docker.sock",
            "podman": self.run_dir / "podman" / "podman.sock",
            "containerd": self.run_dir / "containerd" / "containerd.sock",
            "system_bus": self.run_dir / "dbus" / "system_bus_socket",
            "session_bus": self.xdg_runtime / "bus",
            "user_docker": self.xdg_runtime / "docker.sock",
            "ssh_agent": self.root / "tmp" / "ssh-XXXX" / "agent.123",
            "gpg_agent": self.xdg_runtime / "gnupg" / "S.gpg-agent",
            "tmux": self.root / "tmp" / "tmux-1000" / "default",
            "git_cred": self.home / ".cache" / "git" / "credential" / "socket",
        }
        for name, path in self.unix.items():
            self._unix_sink(name, path)
        self.abstract = f"sbx-test-{uuid.uuid4()}"
        self._unix_sink("abstract", "\0" + self.abstract)
        self.ca = trustme.CA()
        self.ca_path = self.root / "test-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        # The sandbox's own clients trust the test CA through a copy in the workspace.
        shutil.copy(self.ca_path, self.workspace / "test-ca.pem")
        self.allowed = _http_server("allowed", self.ca)
        self.evil = _http_server("evil", self.ca)
        self._closers += [self.allowed.close, self.evil.close]
        self.policy = self.root / "policy.toml"
        self.policy.write_text(self.policy_text())
        self.hostproc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", self.canary],
            env={"SECRET": self.canary, "PATH": "/usr/bin:/bin"},
        )
        self.marks = self.snapshot()
        self.env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        self.env.update(
            HOME=str(self.home),
            XDG_STATE_HOME=str(self.root / "state"),
            XDG_CONFIG_HOME=str(self.root / "config"),
            XDG_RUNTIME_DIR=str(self.xdg_runtime),
            DBUS_SESSION_BUS_ADDRESS=f"unix:path={self.unix['session_bus']}",
            SSH_AUTH_SOCK=str(self.unix["ssh_agent"]),
            DOCKER_HOST=f"unix://{self.unix['docker']}",
            TMUX=f"{self.unix['tmux']},1,0",
            ACTIONS_ID_TOKEN_REQUEST_URL=f"http://127.0.0.1:{self.tcp_port}/oidc?{self.canary}",
            ACTIONS_RUNTIME_TOKEN=self.canary,
            KUBERNETES_SERVICE_HOST="127.0.0.1",
            XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
        )
        for name in SECRET_ENV:
            self.env[name] = self.canary
        if runsc is not None:
            # The arena's HOME is a fake one: name the runsc to use explicitly.
            self.env["STOCKADE_RUNSC"] = runsc

    @property
    def gvisor(self) -> bool:
        return self.backend == "gvisor"

    # -- fixtures ----------------------------------------------------------------------

    def _tcp_sinks(self) -> int:
        """F-SINK-TCP on 127.0.0.1:P and [::1]:P (the same port on both)."""
        for _ in range(20):
            v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            v4.bind(("127.0.0.1", 0))
            port: int = v4.getsockname()[1]
            v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            try:
                v6.bind(("::1", port))
            except OSError:
                v4.close()
                v6.close()
                continue
            for s, name in ((v4, "tcp4"), (v6, "tcp6")):
                s.listen(64)
                threading.Thread(
                    target=_serve_stream, args=(s, self.rec_tcp, name), daemon=True
                ).start()
                self._closers.append(s.close)
            return port
        raise RuntimeError("no free port on both 127.0.0.1 and ::1")

    def _unix_sink(self, name: str, path: Path | str) -> None:
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        if isinstance(path, Path):
            os.chmod(path, 0o777)
        s.listen(64)
        threading.Thread(target=_serve_stream, args=(s, self.rec_unix, name), daemon=True).start()
        self._closers.append(s.close)

    def policy_text(self, extra_allow: tuple[str, ...] = ()) -> str:
        allow = ", ".join(json.dumps(h) for h in ("allowed.test", *extra_allow))
        return f"""version = 1
[network]
allow = [{allow}]
hosts = {{ "allowed.test" = "127.0.0.1", "evil.test" = "127.0.0.1", "api.allowed.test" = "127.0.0.1" }}
tls_ports = [443, {self.allowed.https_port}, {self.evil.https_port}]
tls = {{ upstream_ca = "{self.ca_path}" }}
"""

    def snapshot(self) -> dict[str, str | None]:
        """F-MARK: hashes of host files that must not change."""
        paths = [self.home / rel for rel in MARKED_HOME_FILES]
        paths += [self.workspace / ".git" / "config"]
        paths += sorted((self.workspace / ".git" / "hooks").iterdir())
        return {str(p): sha256(p) for p in paths}

    def close(self) -> None:
        self.hostproc.kill()
        self.hostproc.wait()
        for close in self._closers:
            with contextlib.suppress(Exception):
                close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- running probes ----------------------------------------------------------------

    @property
    def world(self) -> World:
        return World(self.root, self.home, self.workspace, self.canary, self.env)

    def argv(self, *args: str) -> list[str]:
        """``python -m stockade ARGS``, with this arena's backend after ``run``."""
        if args and args[0] == "run":
            args = ("run", *self.backend_flags, *args[1:])
        return [sys.executable, "-m", "stockade", *args]

    def stockade(
        self,
        *args: str,
        timeout: float = 90,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=cwd or self.workspace,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run(
        self,
        *cmd: str,
        flags: tuple[str, ...] = (),
        policy: Path | None = None,
        timeout: float = 90,
        env: dict[str, str] | None = None,
    ) -> Result:
        """``stockade run --policy P --audit A FLAGS -- CMD``; JSON lines by their "id"."""
        audit = self.root / f"audit-{uuid.uuid4().hex}.jsonl"
        # STOCKADE_ATTACKS_FLAGS="--disable files ..." weakens every run: a check that the
        # suite notices (it must fail), never for normal use.
        flags = (*os.environ.get("STOCKADE_ATTACKS_FLAGS", "").split(), *flags)
        proc = self.stockade(
            "run",
            "--policy",
            str(policy or self.policy),
            "--audit",
            str(audit),
            *flags,
            "--",
            *cmd,
            timeout=timeout,
            env=env,
        )
        lines: dict[str, dict[str, Any]] = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict) and "id" in obj:
                        lines[str(obj["id"])] = obj
        events: list[dict[str, Any]] = []
        if audit.exists():
            events = [json.loads(x) for x in audit.read_text().splitlines() if x.strip()]
        return Result(proc, lines, events)

    def py(self, body: str, *args: str, **kw: Any) -> Result:
        """Run ``PRELUDE + body`` with the sandbox's python3."""
        return self.run("python3", "-c", PRELUDE + body, *args, **kw)

    # -- verdicts ----------------------------------------------------------------------

    def writable_files_with_canary(self) -> list[Path]:
        """Files the sandbox could write (the workspace) that contain the canary."""
        hits = []
        for path in self.workspace.rglob("*"):
            with contextlib.suppress(OSError):
                if (
                    path.is_file()
                    and not path.is_symlink()
                    and self.canary.encode() in path.read_bytes()
                ):
                    hits.append(path)
        return hits

    def assert_no_leak(self, result: Result) -> None:
        """BLOCK-FS: the canary is in no output and in no file the sandbox can write."""
        assert self.canary not in result.proc.stdout
        assert self.canary not in result.proc.stderr
        assert self.writable_files_with_canary() == []

    def assert_sinks_quiet(self) -> None:
        """BLOCK-NET: no sink logged a connection, a byte or a request."""
        time.sleep(0.1)
        assert self.rec_tcp.take() == []
        assert self.rec_unix.take() == []
        assert self.evil.rec.take() == []

    def assert_marks_unchanged(self) -> None:
        """F-MARK: protected host files keep their hash, the marker never exists."""
        assert self.snapshot() == self.marks
        assert not self.mark.exists()

    def reset(self) -> None:
        for rec in (self.rec_tcp, self.rec_unix, self.evil.rec, self.allowed.rec):
            rec.take()


@pytest.fixture(scope="module", params=BACKENDS)
def arena(request: pytest.FixtureRequest) -> Iterator[Arena]:
    """The module's arena, once per backend: every case must be refused under gVisor as
    under bubblewrap (the gVisor arena needs STOCKADE_GVISOR=1, else it skips, or fails
    under STOCKADE_MUST_WORK=1)."""
    backend: str = request.param
    runsc = None
    if backend == "gvisor":
        runsc = request.getfixturevalue("runsc")
    else:
        require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")
    a = Arena(backend, runsc)
    try:
        yield a
    finally:
        a.close()


# ---------------------------------------------------------------------------------------
# An isolated network namespace for the probes that aim at addresses other than loopback
# (metadata, private ranges, raw IPs, public resolvers) or that could make the proxy
# resolve a name: the whole ``stockade run`` (proxy included) runs inside a fresh network
# and mount namespace where those addresses live on ``lo`` with recording sinks (F-IMDS,
# F-SINK-TCP on "host" addresses, F-SINK-DNS as the only resolver). Whatever a broken
# proxy would send therefore never leaves this machine.

#: Addresses given to ``lo`` in the isolated namespace, each with recording sinks.
ISOLATED_V4 = (
    "169.254.169.254",
    "169.254.170.2",
    "100.100.100.200",
    "10.0.0.1",
    "172.17.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "203.0.113.10",
    "192.0.2.1",
    "1.1.1.1",
    "8.8.8.8",
)
ISOLATED_V6 = ("fd00:ec2::254", "fd00::1", "2001:db8::1")
SINK_PORTS = (80, 443, 53, 853, 2375)

HARNESS = r"""
import json, os, socket, subprocess, sys, tempfile, threading, time
cfg = json.loads(sys.argv[1])
def ip(*a):
    subprocess.run(["ip", *a], check=True)
ip("link", "set", "lo", "up")
for a in cfg["v4"]:
    if a != "127.0.0.1":
        ip("addr", "add", a + "/32", "dev", "lo")
for a in cfg["v6"]:
    ip("-6", "addr", "add", a + "/128", "dev", "lo", "nodad")
resolv = tempfile.NamedTemporaryFile("w", delete=False, suffix=".resolv")
resolv.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"); resolv.close()
subprocess.run(["mount", "--bind", resolv.name, os.path.realpath("/etc/resolv.conf")], check=True)
log, lock = [], threading.Lock()
def add(x):
    with lock:
        log.append(x)
def qname(data):
    labels, i = [], 12
    while i < len(data) and data[i]:
        n = data[i]; labels.append(data[i+1:i+1+n].decode(errors="replace")); i += 1 + n
    return ".".join(labels)
def tcp(s, addr):
    while True:
        try:
            c, peer = s.accept()
        except OSError:
            return
        c.settimeout(1)
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            if addr[1] in (53, 853) and len(data) > 2:
                add({"kind": "dns-tcp", "addr": addr, "qname": qname(data[2:])})
            else:
                add({"kind": "tcp", "addr": addr, "data": data[:300].decode(errors="replace")})
            body = b"sink"
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\n" + body)
        except OSError:
            pass
        c.close()
def udp(s, addr):
    while True:
        try:
            data, peer = s.recvfrom(4096)
        except OSError:
            return
        add({"kind": "dns-udp" if addr[1] == 53 else "udp", "addr": addr, "qname": qname(data)})
        if len(data) > 12:  # NXDOMAIN
            s.sendto(data[:2] + b"\x81\x83" + data[4:6] + b"\0\0\0\0\0\0" + data[12:], peer)
for a in ["127.0.0.1", "::1", *cfg["v4"], *cfg["v6"]]:
    fam = socket.AF_INET6 if ":" in a else socket.AF_INET
    for port in cfg["ports"]:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            if kind == socket.SOCK_DGRAM and port not in (53, 443, 123):
                continue
            s = socket.socket(fam, kind)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((a, port))
            except OSError:
                continue
            if kind == socket.SOCK_STREAM:
                s.listen(64)
                threading.Thread(target=tcp, args=(s, (a, port)), daemon=True).start()
            else:
                threading.Thread(target=udp, args=(s, (a, port)), daemon=True).start()
proc = subprocess.run(cfg["cmd"], capture_output=True, text=True, cwd=cfg["cwd"], env=cfg["env"], timeout=cfg["timeout"])
time.sleep(0.3)
with lock:
    out = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "log": list(log)}
with open(cfg["out"], "w") as f:
    json.dump(out, f)
"""


@dataclass
class Isolated:
    """What an isolated run printed, and what every sink inside its namespace recorded."""

    result: Result
    log: list[dict[str, Any]]

    def hits(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.log if kind is None or e["kind"] == kind]


def host_addresses() -> list[str]:
    """Every address of this host's interfaces (HOST-09), loopback excluded."""
    proc = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False)
    out: list[str] = []
    with contextlib.suppress(ValueError):
        for link in json.loads(proc.stdout or "[]"):
            for info in link.get("addr_info", []):
                addr = info.get("local", "")
                if addr and not addr.startswith(("127.", "::1", "fe80")):
                    out.append(addr)
    return out


def isolated_works() -> bool:
    return (
        os.getuid() == 0
        and shutil.which("unshare") is not None
        and shutil.which("ip") is not None
        and bwrap_works()
    )


def run_isolated(
    arena: Arena,
    body: str,
    *args: str,
    policy_text: str,
    timeout: float = 90,
    extra_v4: tuple[str, ...] = (),
) -> Isolated:
    """Run ``PRELUDE + body`` under ``stockade run`` inside an isolated netns (see above)."""
    require(isolated_works(), "isolated network namespaces need root, unshare and ip")
    policy = arena.root / f"iso-{uuid.uuid4().hex}.toml"
    policy.write_text(policy_text)
    audit = arena.root / f"iso-audit-{uuid.uuid4().hex}.jsonl"
    out = arena.root / f"iso-{uuid.uuid4().hex}.json"
    v4 = list(dict.fromkeys([*ISOLATED_V4, *extra_v4]))
    v4s = [a for a in v4 if ":" not in a]
    v6s = list(dict.fromkeys([*ISOLATED_V6, *(a for a in extra_v4 if ":" in a)]))
    cmd = [
        sys.executable,
        "-m",
        "stockade",
        "run",
        *arena.backend_flags,
        "--policy",
        str(policy),
        "--audit",
        str(audit),
        "--",
        "python3",
        "-c",
        PRELUDE + body,
        *args,
    ]
    cfg: dict[str, Any] = {
        "v4": v4s,
        "v6": v6s,
        "ports": list(SINK_PORTS),
        "cwd": str(arena.workspace),
        "env": arena.env,
        "timeout": timeout,
        "out": str(out),
        "cmd": cmd,
    }
    subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            HARNESS,
            json.dumps(cfg),
        ],
        check=True,
        timeout=timeout + 30,
    )
    data = json.loads(out.read_text())
    proc = subprocess.CompletedProcess(cmd, data["rc"], data["stdout"], data["stderr"])
    lines: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and "id" in obj:
                    lines[str(obj["id"])] = obj
    events = []
    if audit.exists():
        events = [json.loads(x) for x in audit.read_text().splitlines() if x.strip()]
    return Isolated(Result(proc, lines, events), data["log"])


def isolated_policy(extra: str = "", allow: tuple[str, ...] = ("allowed.test",)) -> str:
    allow_s = ", ".join(json.dumps(h) for h in allow)
    return f"""version = 1
[network]
allow = [{allow_s}]
hosts = {{ "allowed.test" = "127.0.0.1", "evil.test" = "127.0.0.1" }}
{extra}"""
