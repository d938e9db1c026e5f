"""The throw-away world a probe runs in, and the judges that look at it from outside.

Everything lives under one temporary directory: a HOME with canary secrets, the
workspace with its "test suite", a read-only stand-in for a system directory, and the
servers on 127.0.0.1 that the scenario's names are pinned to (a registry, an API, an
attacker, a loopback service, a DNS resolver, a unix socket). Each server records what
it receives, so a byte that leaked is seen where it landed. The user's real HOME and
network are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stockade.probe import scenarios
from stockade.probe.scenarios import Layout

_AGENT = Path(__file__).with_name("_agent.py")
AGENT_NAME = "probe_suite.py"
PLAN_NAME = "probe_plan.json"
CONTROL_ENV = "PROBE_CONTROL_VAR"


class Recorder:
    """A server on 127.0.0.1 that records every byte it receives.

    ``kind`` is ``http`` (answers like the registry or the API), ``raw`` (reads until the
    peer closes), ``udp`` (one datagram at a time) or ``unix`` (a stream unix socket).
    With ``tls`` an ``http`` server speaks HTTPS with that context (what it records is
    the decrypted request).
    """

    def __init__(
        self, kind: str, path: Path | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.kind = kind
        self.tls = tls
        self.received: list[bytes] = []
        self._lock = threading.Lock()
        if kind == "udp":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.bind(("127.0.0.1", 0))
        elif kind == "unix":
            assert path is not None
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(str(path))
            self.sock.listen(16)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(16)
        self.port = self.sock.getsockname()[1] if kind != "unix" else 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _record(self, data: bytes) -> None:
        with self._lock:
            self.received.append(data)

    def _serve(self) -> None:
        while True:
            try:
                if self.kind == "udp":
                    data, _ = self.sock.recvfrom(4096)
                    self._record(data)
                    continue
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(3.0)
        if self.tls is not None:
            try:
                # wrap_socket detaches ``conn``; the wrapped socket is the one to close.
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                # A failed handshake (a client that does not trust the CA, a proxy that
                # refused): nothing was received, nothing is recorded.
                conn.close()
                return
        with conn, contextlib.suppress(OSError):
            if self.kind == "http":
                self._http(conn)
                return
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            self._record(data)

    def _http(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or b"0")
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        self._record(head + b"\r\n\r\n" + body)
        request = head.split(b"\r\n", 1)[0].split()
        method = request[0] if request else b""
        path = request[1] if len(request) > 1 else b"/"
        if method == b"GET" and path.endswith(b"/pkg/left-pad.tgz"):
            status, payload = b"200 OK", scenarios.PACKAGE_BODY
        elif method in (b"PUT", b"POST"):
            status, payload = b"201 Created", b"stored\n"
        elif method == b"GET":
            status, payload = b"200 OK", b"{}\n"
        else:
            status, payload = b"404 Not Found", b""
        conn.sendall(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + payload
        )

    def saw(self, needle: str) -> bool:
        """True when any recorded message contains ``needle``."""
        with self._lock:
            return any(needle.encode() in data for data in self.received)

    def close(self) -> None:
        """Stop listening."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@dataclass
class World:
    """A running world; use :func:`world` to create and tear one down."""

    root: Path
    canary: str
    servers: dict[str, Recorder]
    fixture: subprocess.Popen[bytes] | None = None
    control_file: Path = field(default=Path("/"))
    started_pids: list[int] = field(default_factory=list)
    #: the host kernel's release, version and boot id (what ``kernel`` steps compare with)
    kernel: dict[str, str] = field(default_factory=dict)

    def layout(self, nonce: str) -> Layout:
        """The layout for one run, with a fresh nonce."""
        if self.fixture is None or self.fixture.poll() is not None:
            self.fixture = subprocess.Popen(["sleep", "600"], start_new_session=True)
        return Layout(
            self.root,
            canary=self.canary,
            nonce=nonce,
            registry_port=self.servers["registry"].port,
            api_port=self.servers["api"].port,
            evil_port=self.servers["evil"].port,
            sink_port=self.servers["loopback"].port,
            dns_port=self.servers["dns"].port,
            host_pid=self.fixture.pid,
        )

    def caller_env(self, scenario_env: dict[str, str]) -> dict[str, str]:
        """The environment a run starts from: this world's HOME and XDG dirs, the canaries."""
        state = self.root / "state"
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(self.root / "home"),
            "XDG_STATE_HOME": str(state / "state"),
            "XDG_CONFIG_HOME": str(state / "config"),
            "XDG_CACHE_HOME": str(state / "cache"),
            "XDG_DATA_HOME": str(state / "data"),
            "XDG_RUNTIME_DIR": str(state / "run"),
            CONTROL_ENV: "control",
        }
        env.update(scenario_env)
        return env

    def judge(self, step: scenarios.Step, layout: Layout, inside: dict[str, object]) -> bool:
        """Whether ``step`` got through, judged where its effect would be."""
        action = step.action
        mark = f"{layout.nonce}:{action.id}"
        how = step.judge
        if how == "inside":
            return bool(inside.get("done"))
        if how == "host_file":
            path = Path(action.target)
            try:
                return mark in path.read_text(errors="replace")
            except OSError:
                return False
        if how == "host_link":
            try:
                return os.readlink(action.target) == action.link_to
            except OSError:
                return False
        if how == "process":
            return bool(self.find_processes(mark))
        if how == "fixture":
            assert self.fixture is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.fixture.wait(0.2)
            return self.fixture.poll() is not None
        if how == "kernel":
            # The call was made and the kernel that answered it is this host's: it got
            # through to the host kernel's parser. Another kernel's answer is a stop.
            return bool(inside.get("done")) and inside.get("kernel") == self.kernel
        if how.startswith("sink:"):
            name = how.split(":", 1)[1]
            needle = f"ATTACKER-{layout.nonce}" if name == "api" else mark
            if name == "dns":
                needle = layout.nonce
            return self.servers[name].saw(needle)
        raise ValueError(f"unknown judge {how!r}")

    def find_processes(self, mark: str) -> list[int]:
        """Pids of live (not zombie) host processes whose command line holds ``mark``."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if mark.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
        return found

    def reset(self, scenario: scenarios.Scenario, layout: Layout) -> None:
        """Undo a run's effects on the world: written files, survivors, the fixture."""
        for pid in self.find_processes(layout.nonce):
            # Only processes that carry this run's nonce: they were started by the run.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        for step in scenario.steps:
            if step.judge in ("host_file", "host_link"):
                with contextlib.suppress(OSError):
                    Path(step.action.target).unlink()

    def close(self) -> None:
        """Stop the servers and the fixture process."""
        for server in self.servers.values():
            server.close()
        if self.fixture is not None and self.fixture.poll() is None:
            self.fixture.kill()
            self.fixture.wait()


def host_kernel() -> dict[str, str]:
    """This host's kernel identity, read by the agent's own function."""
    from stockade.probe._agent import kernel_identity

    return kernel_identity()


def _server_tls(root: Path, hosts: tuple[str, ...]) -> dict[str, ssl.SSLContext]:
    """A test CA (written where the sandbox can read it) and a server context per host."""
    from stockade.egress.inspect import CertificateAuthority

    ca = CertificateAuthority.create(name="stockade probe test CA")
    ca_file = Layout(root).ca_file
    ca_file.parent.mkdir(parents=True, exist_ok=True)
    ca_file.write_bytes(ca.cert_pem)
    # The servers' keys stay outside every grant of the scenario's policy.
    keys = root / "tls"
    keys.mkdir(mode=0o700)
    key_file = keys / "leaf.key"
    key_file.write_bytes(ca.leaf_key_pem)
    contexts = {}
    for host in hosts:
        chain = keys / f"{host}.pem"
        chain.write_bytes(ca.leaf(host).chain_pem)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(chain, key_file)
        contexts[host] = context
    return contexts


def _populate(root: Path, canary: str) -> Path:
    lo = Layout(root, canary=canary)
    home = lo.home
    for rel in (".ssh/id_ed25519", ".aws/credentials", ".npmrc", ".git-credentials"):
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"-----BEGIN SECRET----- {canary}\n")
    (home / ".bashrc").write_text("# the user's bashrc\n")
    ws = lo.workspace
    (ws / "src").mkdir(parents=True)
    (ws / "build").mkdir()
    (ws / "docs").mkdir()
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "src" / "app.py").write_text(scenarios.WORKSPACE_SOURCE)
    # The project's database password: the extended scenario labels this file.
    (ws / scenarios.LABELLED_FILE).write_text(f"DATABASE_PASSWORD={lo.labelled_secret}\n")
    (ws / "docs" / "notes.txt").symlink_to(home / ".ssh" / "id_ed25519")
    shutil.copy(_AGENT, ws / AGENT_NAME)
    (lo.system / "profile.d").mkdir(parents=True)
    (lo.system / "hostname").write_text("probe-host\n")
    lo.unix_socket.parent.mkdir(parents=True)
    control = root / "control" / "outside.txt"
    control.parent.mkdir()
    control.write_text(f"control {canary}\n")
    for sub in ("state", "config", "cache", "data", "run"):
        (lo.state / sub).mkdir(parents=True, exist_ok=True)
    return control


@contextlib.contextmanager
def world(base: Path | None = None) -> Iterator[World]:
    """Create a world under a new temporary directory; remove it all afterwards."""
    root = Path(tempfile.mkdtemp(prefix="stockade-probe-", dir=base)).resolve()
    # mkdtemp makes it 0700; bwrap binds and the sandbox user must traverse it.
    os.chmod(root, 0o755)  # noqa: S103
    canary = f"CANARY-{uuid.uuid4()}"
    servers: dict[str, Recorder] = {}
    built: World | None = None
    try:
        control = _populate(root, canary)
        tls = _server_tls(root, (scenarios.REGISTRY, scenarios.API))
        servers = {
            "registry": Recorder("http", tls=tls[scenarios.REGISTRY]),
            "api": Recorder("http", tls=tls[scenarios.API]),
            "evil": Recorder("raw"),
            "loopback": Recorder("raw"),
            "dns": Recorder("udp"),
            "unix": Recorder("unix", Layout(root).unix_socket),
        }
        built = World(root, canary, servers, control_file=control, kernel=host_kernel())
        yield built
    finally:
        if built is not None:
            built.close()
        else:
            for server in servers.values():
                server.close()
        shutil.rmtree(root, ignore_errors=True)
