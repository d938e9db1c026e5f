"""The landlock backend on a host that refuses user namespaces (issue 28).

The restriction is made real without touching the host's settings: stockade runs under
a parent that loads stockade's own seccomp filter (as container runtimes load theirs),
which refuses ``unshare``/``clone`` with ``CLONE_NEWUSER``; bubblewrap then cannot start,
as on a host with ``user.max_user_namespaces=0``. Each case runs as root and as uid
65534. Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade import Unavailable
from stockade.enforce import netguard
from stockade.runtime import _host, _landlock
from tests.conftest import World, _nobody_python, as_nobody, require

#: run argv[1:] with CLONE_NEWUSER refused (stockade's own filter), after checking it is
_RESTRICT = r"""
import ctypes, errno, os, sys
from stockade.enforce import seccomp
bpf = seccomp.build_filter()
libc = ctypes.CDLL(None, use_errno=True)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
buf = ctypes.create_string_buffer(bpf, len(bpf))
prog = Prog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(nr, 1, 0, ctypes.byref(prog)) != 0:
    sys.exit("restrict: cannot load the filter")
if libc.unshare(0x10000000) == 0 or ctypes.get_errno() != errno.EPERM:
    sys.exit("restrict: unshare(CLONE_NEWUSER) still works")
os.execvp(sys.argv[1], sys.argv[1:])
"""

#: as _RESTRICT, but the parent's filter allows pidfd_getfd (as a container profile
#: with CAP_SYS_PTRACE does; Docker's and containerd's defaults refuse it without, and
#: so does stockade's own filter, which _RESTRICT loads)
_RESTRICT_PTRACE = _RESTRICT.replace("build_filter()", "build_filter(allow_ptrace=True)")

#: as _RESTRICT_PTRACE, but the parent's filter refuses user namespaces alone (unshare,
#: clone with CLONE_NEWUSER, clone3, whose flags no filter can read), as a minimal
#: container profile would: what stockade's own filter refuses is then stockade's doing
_RESTRICT_MINIMAL = _RESTRICT.replace(
    "bpf = seccomp.build_filter()",
    """import struct
ins = lambda c, t, f, k: struct.pack("=HBBI", c, t, f, k)
arch = seccomp.ARCHES[seccomp.native_arch()]
nr_of = arch.nr
bpf = b"".join([
    ins(0x20, 0, 0, 4), ins(0x15, 1, 0, arch.audit_arch), ins(6, 0, 0, 0x80000000),
    ins(0x20, 0, 0, 0),
    ins(0x15, 0, 1, nr_of["unshare"]), ins(6, 0, 0, 0x50001),
    ins(0x15, 0, 1, nr_of["clone3"]), ins(6, 0, 0, 0x50026),
    ins(0x15, 0, 3, nr_of["clone"]), ins(0x20, 0, 0, 16), ins(0x45, 0, 1, 0x10000000),
    ins(6, 0, 0, 0x50001),
    ins(6, 0, 0, 0x7FFF0000),
])""",
)

#: run argv[3:] as _RESTRICT (argv[2] "ptrace": as _RESTRICT_PTRACE), under a parent
#: that holds a seccomp listener of its own, as a container runtime using seccomp
#: notification does (LXD, sysbox): it sends landlock_create_ruleset(NULL, 0,
#: LANDLOCK_CREATE_RULESET_VERSION) to this parent, which answers argv[1]
_RESTRICT_ABI = r"""
import array, ctypes, errno, fcntl, os, select, socket, struct, sys
from stockade.enforce import observe, seccomp
abi, ptrace = int(sys.argv[1]), sys.argv[2] == "ptrace"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
def load(bpf, flags):
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = Prog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return libc.syscall(nr, 1, flags, ctypes.byref(prog))
ins = lambda c, t, f, k: struct.pack("=HBBI", c, t, f, k)
arch = seccomp.ARCHES[seccomp.native_arch()].audit_arch
fake = b"".join([
    ins(0x20, 0, 0, 4), ins(0x15, 1, 0, arch), ins(6, 0, 0, 0x7FFF0000),
    ins(0x20, 0, 0, 0), ins(0x15, 0, 5, 444),  # landlock_create_ruleset
    ins(0x20, 0, 0, 32), ins(0x15, 0, 3, 1),  # flags == VERSION
    ins(0x20, 0, 0, 16), ins(0x15, 0, 1, 0),  # attr == NULL
    ins(6, 0, 0, 0x7FC00000), ins(6, 0, 0, 0x7FFF0000),
])
host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
pid = os.fork()
if pid == 0:
    host.close()
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if libc.prctl(38, 1, 0, 0, 0) != 0 or load(seccomp.build_filter(allow_ptrace=ptrace), 0) != 0:
        sys.exit("restrict: cannot load the filter")
    if libc.unshare(0x10000000) == 0 or ctypes.get_errno() != errno.EPERM:
        sys.exit("restrict: unshare(CLONE_NEWUSER) still works")
    listener = load(fake, 8)  # SECCOMP_FILTER_FLAG_NEW_LISTENER
    if listener < 0:
        sys.exit("restrict: cannot load the ABI filter")
    child.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [listener]))])
    os.close(listener)
    child.close()
    got = libc.syscall(444, None, 0, 1)
    if got != abi:
        sys.exit(f"restrict: Landlock ABI reported as {got}, not {abi}")
    os.execvp(sys.argv[3], sys.argv[3:])
child.close()
_, anc, _, _ = host.recvmsg(1, socket.CMSG_SPACE(4))
listener = array.array("i", anc[0][2][:4])[0]
poller = select.poll()
poller.register(listener, select.POLLIN)
buf = bytearray(observe._NOTIF.size)
while True:
    mask = poller.poll()[0][1]
    if mask & select.POLLIN:
        buf[:] = bytes(len(buf))
        try:
            fcntl.ioctl(listener, observe._IOCTL_RECV, buf, True)
            fcntl.ioctl(listener, observe._IOCTL_SEND, observe._RESP.pack(
                observe._NOTIF.unpack(bytes(buf))[0], abi, 0, 0))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINTR):
                raise
    elif mask & (select.POLLHUP | select.POLLERR):
        break
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""

#: run inside: one JSON line of what got through
_INSIDE = r"""
import json, os, socket, sys, urllib.request
port, other, proxy_port = int(sys.argv[1]), int(sys.argv[2]), 0
out = {}
url = os.environ.get("HTTP_PROXY", "")
out["proxy_env"] = url
proxy_port = int(url.rsplit(":", 1)[1]) if url else 0
try:
    with urllib.request.urlopen(f"http://a.test:{port}/via-proxy", timeout=5) as r:
        out["via_proxy"] = r.status
except Exception as e:
    out["via_proxy"] = repr(e)
def tcp(host, p):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, p))
        s.sendall(b"GET /direct HTTP/1.0\r\n\r\n")
        return "connected"
    except OSError as e:
        return e.errno
    finally:
        s.close()
out["direct_same_port"] = tcp("127.0.0.1", port)
out["direct_other_host"] = tcp("127.0.0.2", other)
out["other_host_proxy_port"] = tcp("127.0.0.2", proxy_port) if proxy_port else None
for name, kind in (("udp", socket.SOCK_DGRAM), ("raw", socket.SOCK_RAW)):
    try:
        socket.socket(socket.AF_INET, kind).close()
        out[name] = "made"
    except OSError as e:
        out[name] = e.errno
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    out["packet"] = "made"
except (OSError, AttributeError) as e:
    out["packet"] = getattr(e, "errno", "none")
s = socket.socket()
try:
    s.sendto(b"x", 0x20000000, ("127.0.0.1", port))
    out["fastopen"] = "sent"
except OSError as e:
    out["fastopen"] = e.errno
finally:
    s.close()
print(json.dumps(out))
"""


@pytest.fixture
def server() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on 127.0.0.1 recording the paths it was asked for."""
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1]), paths
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(params=["root", "nobody"])
def who(request: pytest.FixtureRequest) -> str:
    require(_host.landlock_abi() >= 4, "Landlock ABI 4 (network rules) is not available")
    if request.param == "root":
        require(os.getuid() == 0, "not running as root")
    else:
        require(os.getuid() == 0, "switching to uid 65534 needs root")
        require(shutil.which("setpriv") is not None, "no setpriv")
    return str(request.param)


def _python_for(who: str) -> str:
    if who == "root":
        return sys.executable
    # one that a process of uid 65534 can exec itself: the restricting parent execs it
    python = _nobody_python(from_any_process=True)
    require(python is not None, "no Python >= 3.11 that uid 65534 can execute")
    assert python is not None
    return python


def restricted(
    world: World,
    who: str,
    *args: str,
    timeout: float = 120,
    abi: int | None = None,
    ptrace: bool = False,
    listener_abi: int | None = None,
    minimal: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``stockade ARGS`` under a parent that refuses CLONE_NEWUSER, as ``who``.

    ``abi``: stockade told to use at most that Landlock ABI (``STOCKADE_LANDLOCK_ABI_MAX``);
    ``ptrace``: the parent's filter allows pidfd_getfd; ``minimal``: it refuses user
    namespaces alone; ``listener_abi``: the parent holds a seccomp listener and reports
    that ABI to the tree."""
    python = _python_for(who)
    cap = ["/usr/bin/env", f"STOCKADE_LANDLOCK_ABI_MAX={abi}"] if abi is not None else []
    if listener_abi is not None:
        mode = "ptrace" if ptrace else "noptrace"
        script = [_RESTRICT_ABI, str(listener_abi), mode]
    elif minimal:
        script = [_RESTRICT_MINIMAL]
    else:
        script = [_RESTRICT_PTRACE if ptrace else _RESTRICT]
    command = [*cap, python, "-c", *script, python, "-m", "stockade"]
    if who == "root":
        return subprocess.run(
            [*command, *args],
            cwd=world.workspace,
            env=world.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return as_nobody(world, *args, timeout=timeout, command=command)


def _guard_works() -> None:
    ok, why = netguard.available()
    require(ok, f"the connect guard cannot work on this host: {why}")


def _policy(world: World, text: str) -> Path:
    path = world.root / "policy.toml"
    path.write_text("version = 1\n" + text)
    return path


def test_default_backend_fails_closed_with_the_fallback_hint(world: World, who: str) -> None:
    marker = world.workspace / "ran"
    proc = restricted(world, who, "run", "--", "touch", str(marker))
    assert proc.returncode == 125, proc.stderr
    assert "user namespaces" in proc.stderr
    assert "--backend landlock" in proc.stderr
    assert not marker.exists()
    # auto without allow_degraded: the same refusal, never a silent fallback
    proc = restricted(world, who, "run", "--backend", "auto", "--", "touch", str(marker))
    assert proc.returncode == 125, proc.stderr
    assert "allow_degraded" in proc.stderr
    assert not marker.exists()


def test_auto_with_allow_degraded_runs_under_landlock(world: World, who: str) -> None:
    policy = _policy(world, '[container]\nbackend = "auto"\nallow_degraded = true\n')
    (world.workspace / "out").mkdir()
    proc = restricted(
        world,
        who,
        "run",
        "--policy",
        str(policy),
        "--",
        "sh",
        "-c",
        "echo in > out/made; cat out/made",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "in"
    assert "landlock backend" in proc.stderr


def test_landlock_files_and_protected_paths(world: World, who: str) -> None:
    ws = world.workspace
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("x = 1\n")
    (ws / ".envrc").write_text("# user's\n")
    script = (
        'r() { if eval "$1" 2>/dev/null; then echo "$2 done"; else echo "$2 blocked"; fi; }; '
        "r 'cat README >/dev/null' read-ws; "
        "r 'echo y >> src/app.py' write-existing; "
        "r 'mkdir src/new && echo z > src/new/f' create-in-subdir; "
        "r 'echo evil > .git/hooks/pre-commit' git-hook; "
        "r 'echo evil >> .envrc' envrc; "
        "r 'rm -f .envrc && test ! -e .envrc' rm-envrc; "
        "r 'echo x >> .git/config' git-config; "
        f"r 'cat {world.home}/.ssh/id_rsa' read-ssh; "
        f"r 'echo x >> {world.home}/.bashrc' write-bashrc; "
        "r 'echo new > top-level-new' new-top-level; "
        "r 'cat /etc/passwd >/dev/null' read-etc; "
        "r 'cat /etc/shadow >/dev/null' read-shadow; "
        "r 'echo x > /dev/null' write-devnull; "
        "r 'ls /dev/pts >/dev/null' list-pts"
    )
    proc = restricted(world, who, "run", "--backend", "landlock", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())
    assert got == {
        "read-ws": "done",
        "write-existing": "done",
        "create-in-subdir": "done",
        "git-hook": "blocked",
        "envrc": "blocked",
        "rm-envrc": "blocked",
        "git-config": "blocked",
        "read-ssh": "blocked",
        "write-bashrc": "blocked",
        # the stated cost: nothing new directly in a directory holding protected paths
        "new-top-level": "blocked",
        "read-etc": "done",
        # no mask without a mount namespace: the read grant is split around it (root
        # could read it otherwise, uid 65534 cannot either way)
        "read-shadow": "blocked",
        "write-devnull": "done",
        # the user's other terminals are there
        "list-pts": "blocked",
    }, proc.stdout
    assert (ws / ".envrc").read_text() == "# user's\n"
    assert "evil" not in (ws / ".git" / "config").read_text()
    assert (world.home / ".bashrc").read_text() == "# bashrc\n"
    assert (ws / "src" / "new" / "f").read_text() == "z\n"


def test_stockade_dirs_are_never_writable(world: World, who: str) -> None:
    # The workspace holds stockade's own configuration: still read-only inside.
    world.env["XDG_CONFIG_HOME"] = str(world.workspace / "cfg")
    config = world.workspace / "cfg" / "stockade"
    config.mkdir(parents=True)
    (config / "policy.toml").write_text("version = 1\n")
    other = world.workspace / "cfg" / "other"
    other.mkdir()
    script = (
        f"echo 'x' >> {config}/policy.toml && echo config-written; "
        f"echo ok > {other}/f && echo other-written"
    )
    proc = restricted(
        world,
        who,
        "run",
        "--backend",
        "landlock",
        "--",
        "sh",
        "-c",
        script,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["other-written"], proc.stdout + proc.stderr
    assert (config / "policy.toml").read_text() == "version = 1\n"


def test_landlock_egress_through_the_proxy_only(
    world: World, who: str, server: tuple[int, list[str]]
) -> None:
    port, paths = server
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.listen()
    other_port = other.getsockname()[1]
    policy = _policy(
        world, f'[network]\nallow = ["a.test:{port}"]\n[network.hosts]\n"a.test" = "127.0.0.1"\n'
    )
    (world.workspace / "inside.py").write_text(_INSIDE)
    try:
        proc = restricted(
            world,
            who,
            "run",
            "--backend",
            "landlock",
            "--policy",
            str(policy),
            "--",
            "/usr/bin/python3",
            "inside.py",
            str(port),
            str(other_port),
        )
    finally:
        other.close()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["proxy_env"].startswith("http://127.0.0.1:")
    assert out["via_proxy"] == 200
    assert paths == ["/via-proxy"]  # the direct attempt never reached the server
    eacces, eperm = 13, 1
    # Landlock: connect() to any port but the proxy's
    assert out["direct_same_port"] == eacces
    assert out["direct_other_host"] == eacces
    # seccomp: TCP alone, and no connect hidden in sendto(MSG_FASTOPEN)
    assert out["udp"] == eperm
    assert out["raw"] == eperm
    assert out["packet"] == eperm
    assert out["fastopen"] == eperm
    # What the model says gets through (the rule names a port, not an address): another
    # host on the proxy's port. Nothing listens there, so the kernel answers, not Landlock.
    assert out["other_host_proxy_port"] == 111  # ECONNREFUSED


def test_landlock_reaps_what_the_command_leaves(world: World, who: str) -> None:
    marker = world.root / "daemon-alive"
    tag = f"stockade-ll-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        f"(setsid /usr/bin/python3 -c 'import time; time.sleep(30)' {tag} >/dev/null 2>&1 </dev/null &) ; "
        f"(sh -c 'sleep 2; touch {marker}' &) ; sleep 0.5; pgrep -f {tag} >/dev/null && "
        "echo started"
    )
    proc = restricted(world, who, "run", "--backend", "landlock", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "started"
    time.sleep(3)
    assert not marker.exists()
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", left.stdout
    # Twin: the same daemon outlives the command when the container layer (the reaper)
    # is off, as the model says.
    proc = restricted(
        world,
        who,
        "run",
        "--backend",
        "landlock",
        "--disable",
        "container",
        "--",
        "sh",
        "-c",
        f"(setsid /usr/bin/python3 -c 'import time; time.sleep(30)' {tag} >/dev/null 2>&1 </dev/null &) ; echo started",
    )
    try:
        assert proc.returncode == 0, proc.stderr
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
        assert left.stdout.strip() != ""
    finally:
        subprocess.run(["pkill", "-KILL", "-f", tag], check=False)


def test_landlock_timeout_kills_the_tree(world: World, who: str) -> None:
    tag = f"stockade-llt-{os.getpid()}-{time.monotonic_ns()}"
    proc = restricted(
        world,
        who,
        "run",
        "--backend",
        "landlock",
        "--timeout",
        "2",
        "--",
        "sh",
        "-c",
        f"(setsid /usr/bin/python3 -c 'import time; time.sleep(30)' {tag} >/dev/null 2>&1 </dev/null &) ; sleep 30",
    )
    assert proc.returncode == 124, proc.stderr
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", left.stdout


# root only: the demo runs the installed stockade as its caller
@pytest.mark.parametrize("who", ["root"], indirect=True)
def test_landlock_runs_the_bundled_demo(world: World, who: str) -> None:
    demo = Path(__file__).resolve().parents[2] / "examples" / "compromised" / "demo.py"
    python = sys.executable
    proc = subprocess.run(
        [python, "-c", _RESTRICT, python, str(demo), "--backend", "landlock"],
        env=world.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unneeded actions still open: 0   needed actions broken: 0" in proc.stdout


def test_doctor_names_the_restriction_the_fix_and_the_fallback(world: World, who: str) -> None:
    proc = restricted(world, who, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    found = checks["userns restrictions"]
    assert found["ok"] is False
    assert "unshare(CLONE_NEWUSER) fails with EPERM under a seccomp filter" in found["detail"]
    assert "seccompProfile" in found["fix"]
    backend = checks["landlock backend"]
    assert backend["ok"] is True
    assert "--backend landlock" in backend["fix"]
    assert any("host-socket" in line for line in backend["loses"])
    # Twin: on this host without the restricting parent nothing is found.
    plain = subprocess.run(
        [sys.executable, "-m", "stockade", "doctor", "--json"],
        env=world.env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    checks = {c["name"]: c for c in json.loads(plain.stdout)}
    if checks["user namespaces"]["ok"]:
        assert checks["userns restrictions"]["ok"] is True
        assert checks["landlock backend"]["fix"] == ""


# root only: the probe's fixture world is made by its caller
@pytest.mark.parametrize("who", ["root"], indirect=True)
@pytest.mark.parametrize("abi", [None, 3], ids=["abi", "abi3"])
def test_probe_under_landlock_agrees_with_the_model(
    world: World, who: str, abi: int | None
) -> None:
    # The scenario's attacks under every subset, on a host that refuses user namespaces:
    # each row's outcome is the model's under landlock (held where it says the backend
    # stops it, through where it says not); with abi=3, under the connect guard.
    proc = restricted(
        world,
        who,
        "probe",
        "--backend",
        "landlock",
        "--cost-runs",
        "0",
        "--json",
        timeout=900,
        abi=abi,
        ptrace=abi is not None,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["backend"] == "landlock"
    assert data["agreement"]["agree"] == data["agreement"]["total"] > 0
    assert all(data["build"][layer]["enforceable"] for layer in ("files", "container", "egress"))
    assert ("the connect guard" in data["build"]["egress"]["detail"]) == (abi is not None)
    survive = [r["cells"]["survive"] for r in data["runs"] if "container" in r["layers"]]
    assert survive
    assert all(c["measured"] == "stopped" for c in survive)


# root only: the cgroup this host delegates is root's
@pytest.mark.parametrize("who", ["root"], indirect=True)
def test_landlock_run_in_a_cgroup_caps_the_pids(world: World, who: str) -> None:
    from stockade.enforce import limits

    require(limits.detect() is not None, "no cgroup can be made here")
    policy = _policy(world, "[limits]\npids = 16\n")
    (world.workspace / "forks.py").write_text(
        "import os, signal, time\n"
        "print('in-cgroup' if 'stockade' in open('/proc/self/cgroup').read() else 'outside')\n"
        "pids = []\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "print(len(pids))\n"
        "for pid in pids:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
    )
    base = ("run", "--backend", "landlock", "--policy", str(policy))
    capped = restricted(world, who, *base, "--", "/usr/bin/python3", "forks.py")
    assert capped.returncode == 0, capped.stderr
    where, count = capped.stdout.split()
    assert where == "in-cgroup"
    assert int(count) < 16
    # Twin: with the limits layer off there is no cgroup, and every fork succeeds.
    free = restricted(
        world, who, *base, "--disable", "limits", "--", "/usr/bin/python3", "forks.py"
    )
    assert free.returncode == 0, free.stderr
    assert free.stdout.split() == ["outside", "40"]


#: run inside the restricting parent: start a landlock run whose command leaves a
#: setsid daemon, wait until the daemon is up, then kill the run from the API
_CANCEL = r"""
import subprocess, sys, time
import stockade
policy, tag = sys.argv[1], sys.argv[2]
daemon = f"(setsid /usr/bin/python3 -c 'import time; time.sleep(30)' {tag} >/dev/null 2>&1 </dev/null &) ; sleep 30"
with stockade.Sandbox(policy) as sb:
    p = sb.popen(["sh", "-c", daemon])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if subprocess.run(["pgrep", "-f", tag], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    else:
        sys.exit("the daemon never started")
    print("up", flush=True)
    p.kill()
    p.wait()
print("killed", flush=True)
"""


def test_landlock_cancel_kills_what_left_the_group(world: World, who: str) -> None:
    """A run killed from another thread (``SandboxProcess.kill``, ``arun`` cancelled) ends
    the processes that left the command's group too: without a PID namespace they are
    only reachable below the launcher, the child subreaper."""
    tag = f"stockade-llc-{os.getpid()}-{time.monotonic_ns()}"
    policy = _policy(world, '[container]\nbackend = "landlock"\n')
    python = _python_for(who)
    try:
        command = [python, "-c", _RESTRICT, python, "-c", _CANCEL]
        if who == "root":
            proc = subprocess.run(
                [*command, str(policy), tag],
                cwd=world.workspace,
                env=world.env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        else:
            # uid 65534 gets no cgroup here: the launcher's subreaper is all that holds
            proc = as_nobody(world, str(policy), tag, timeout=120, command=command)
        # The daemon was running under the sandbox before the kill (what the kill ends
        # is real), and nothing of it is left after.
        assert proc.stdout.split() == ["up", "killed"], proc.stderr
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
        assert left.stdout.strip() == "", left.stdout
    finally:
        subprocess.run(["pkill", "-KILL", "-f", tag], check=False)


#: appended to _INSIDE under the connect guard: what it must still let through, and the
#: race it must not lose
_GUARD_EXTRA = r"""
import ctypes, select, struct, threading
os.chdir(os.environ["TMPDIR"])  # the workspace's top takes nothing new (split grant)
srv = socket.socket(socket.AF_UNIX)
srv.bind("guard.sock")
srv.listen()
c = socket.socket(socket.AF_UNIX)
try:
    c.connect("guard.sock")  # a relative path: resolved in the command's directory
    out["unix_relative"] = "connected"
except OSError as e:
    out["unix_relative"] = e.errno
c.close()
srv.close()
os.unlink("guard.sock")
s = socket.socket()
s.setblocking(False)
first = s.connect_ex(("127.0.0.1", proxy_port))
select.select([], [s], [], 5)
out["nonblocking"] = [first, s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)]
s.close()
# From a thread that is not the process's first (a resolver's, a pool's worker)
in_thread = {}
def from_thread():
    for key, p in (("proxy", proxy_port), ("other", port)):
        k = socket.socket()
        try:
            k.connect(("127.0.0.1", p))
            in_thread[key] = "connected"
        except OSError as e:
            in_thread[key] = e.errno
        finally:
            k.close()
worker = threading.Thread(target=from_thread)
worker.start()
worker.join()
out["thread"] = in_thread
# Another thread rewrites the address between the proxy's and the server's while
# connect() is pending: the guard must decide and connect on one copy.
libc = ctypes.CDLL(None, use_errno=True)
def sockaddr(p):
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", p) + bytes([127, 0, 0, 1]) + bytes(8)
good, bad = sockaddr(proxy_port), sockaddr(port)
buf = ctypes.create_string_buffer(good, 16)
stop = []
def flip():
    while not stop:
        ctypes.memmove(buf, bad, 16)
        ctypes.memmove(buf, good, 16)
t = threading.Thread(target=flip)
t.start()
race = {}
# at least 300 tries, and on until both addresses were seen at the moment of a check (a
# loaded machine can starve the rewriting thread for a while), within 3000
for n in range(3000):
    if n >= 300 and race.get("proxy") and race.get("13"):
        break
    k = socket.socket()
    if libc.connect(k.fileno(), buf, 16) == 0:
        key = "proxy" if k.getpeername()[1] == proxy_port else "leak"
    else:
        key = str(ctypes.get_errno())
    race[key] = race.get(key, 0) + 1
    k.close()
stop.append(1)
t.join()
out["race"] = race
"""


def test_connect_guard_below_abi4_holds_egress(
    world: World, who: str, server: tuple[int, list[str]]
) -> None:
    """stockade told to use Landlock ABI 3 (no TCP rules): the connect guard carries the egress
    layer. The proxy is reached; a direct connection to another port or host, UDP, raw
    and packet sockets are refused; unlike Landlock's port rule, the guard checks the
    address too. A unix socket and a non-blocking connect still work (the guard performs
    them), and a thread rewriting the address during connect() never gets past it."""
    _guard_works()
    port, paths = server
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.listen()
    other_port = other.getsockname()[1]
    policy = _policy(
        world, f'[network]\nallow = ["a.test:{port}"]\n[network.hosts]\n"a.test" = "127.0.0.1"\n'
    )
    script = _INSIDE.replace("print(json.dumps(out))", _GUARD_EXTRA + "print(json.dumps(out))")
    (world.workspace / "inside.py").write_text(script)
    try:
        proc = restricted(
            world,
            who,
            "run",
            "--backend",
            "landlock",
            "--policy",
            str(policy),
            "--",
            "/usr/bin/python3",
            "inside.py",
            str(port),
            str(other_port),
            abi=3,
            ptrace=True,
        )
    finally:
        other.close()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["via_proxy"] == 200, out
    assert paths == ["/via-proxy"]  # nothing direct reached the server
    eacces, eperm, einprogress = 13, 1, 115
    assert out["direct_same_port"] == eacces, out
    assert out["direct_other_host"] == eacces, out
    assert out["other_host_proxy_port"] == eacces, out  # the address, not only the port
    assert (out["udp"], out["raw"], out["packet"], out["fastopen"]) == (eperm,) * 4, out
    assert out["unix_relative"] == "connected", out
    assert out["nonblocking"] == [einprogress, 0], out
    assert out["thread"] == {"proxy": "connected", "other": eacces}, out
    race = out["race"]
    assert "leak" not in race, race
    # both addresses were seen at the moment of the check: the race was run
    assert race.get("proxy", 0) > 0, race
    assert race.get(str(eacces), 0) > 0, race


def test_connect_guard_fails_closed_where_it_cannot_work(world: World, who: str) -> None:
    """Below ABI 4 the guard is the egress layer: where it cannot be set up the run is
    refused, 125, with the reason. A parent profile that refuses pidfd_getfd (Docker's
    and containerd's defaults without CAP_SYS_PTRACE, stockade's own), and a parent that
    holds a seccomp listener already (the kernel allows one per filter chain). The twin:
    under the same parents, with the egress layer off (nothing to guard), it runs."""
    landlock = ("run", "--backend", "landlock")
    proc = restricted(world, who, *landlock, "--", "true", abi=3)
    assert proc.returncode == 125, proc.stderr
    assert "pidfd_getfd fails with EPERM" in proc.stderr
    proc = restricted(world, who, *landlock, "--", "true", listener_abi=3, ptrace=True)
    assert proc.returncode == 125, proc.stderr
    assert "a parent already installed one (EBUSY" in proc.stderr
    for kw in ({"abi": 3}, {"listener_abi": 3, "ptrace": True}):
        proc = restricted(world, who, *landlock, "--disable", "egress", "--", "true", **kw)  # type: ignore[arg-type]
        assert proc.returncode == 0, proc.stderr


def test_landlock_missing_protected_paths_need_no_placeholders(world: World, who: str) -> None:
    """A fresh workspace (no .git, .envrc, .vscode, .claude): Landlock keeps the missing
    protected names from being created without a placeholder for each (the directory
    holding them is split, so nothing new is made in it), and the run leaves the
    workspace as it found it, inside and after. The twin: a subdirectory is writable."""
    ws = world.workspace
    (ws / "src").mkdir()
    before = sorted(os.listdir(ws))
    script = (
        'r() { if eval "$1" 2>/dev/null; then echo "$2 done"; else echo "$2 blocked"; fi; }; '
        "r 'mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit' git; "
        "r 'echo evil > .envrc' envrc; "
        "r 'mkdir -p .vscode && echo {} > .vscode/settings.json' vscode; "
        "r 'mkdir -p .claude && echo {} > .claude/settings.json' claude; "
        "r 'echo ok > src/new' write-subdir; "
        'echo "seen $(ls -A | tr "\\n" " ")"'
    )
    proc = restricted(world, who, "run", "--backend", "landlock", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    got = dict(line.rsplit(" ", 1) for line in lines if not line.startswith("seen "))
    assert got == {
        "git": "blocked",
        "envrc": "blocked",
        "vscode": "blocked",
        "claude": "blocked",
        "write-subdir": "done",
    }
    seen = next(line for line in lines if line.startswith("seen ")).split()[1:]
    assert sorted(seen) == before  # no placeholder inside the run
    assert sorted(os.listdir(ws)) == before  # nor after it
    assert (ws / "src" / "new").read_text() == "ok\n"


_IO_URING = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)  # io_uring_setup: its IORING_OP_CONNECT bypasses seccomp
print("io_uring", "made" if fd >= 0 else ctypes.get_errno())
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
s = socket.create_connection(("127.0.0.1", port), timeout=5)
print("proxy", "connected")
"""


def test_connect_guard_refuses_io_uring_with_the_syscalls_layer_off(world: World, who: str) -> None:
    """io_uring's connect is not a system call a filter sees: with the syscalls layer off
    (which otherwise refuses io_uring), the connect guard's part of the filter refuses it
    below ABI 4; at ABI 4 Landlock's hook covers it, and it is left. The twin: the proxy
    is reached either way."""
    _guard_works()
    (world.workspace / "src").mkdir()
    (world.workspace / "src" / "uring.py").write_text(_IO_URING)
    run = ("run", "--backend", "landlock", "--disable", "syscalls", "--")
    command = ("/usr/bin/python3", "src/uring.py")
    guarded = restricted(world, who, *run, *command, abi=3, minimal=True)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.split("\n")[:2] == ["io_uring 1", "proxy connected"]
    landlock = restricted(world, who, *run, *command, minimal=True)
    assert landlock.returncode == 0, landlock.stderr
    assert landlock.stdout.split("\n")[:2] == ["io_uring made", "proxy connected"]


def test_doctor_names_the_connect_guard_below_abi4(world: World, who: str) -> None:
    """Below ABI 4 doctor names the connect guard where it can work, and says why not
    (with the fix) where the container's profile refuses pidfd_getfd."""
    _guard_works()
    proc = restricted(world, who, "doctor", "--json", abi=3, ptrace=True)
    backend = {c["name"]: c for c in json.loads(proc.stdout)}["landlock backend"]
    assert backend["ok"] is True, backend
    assert "Landlock ABI 3, no network rules: the connect guard" in backend["detail"]
    proc = restricted(world, who, "doctor", "--json", abi=3)
    backend = {c["name"]: c for c in json.loads(proc.stdout)}["landlock backend"]
    assert backend["ok"] is False, backend
    assert "the connect guard cannot work (pidfd_getfd fails with EPERM" in backend["detail"]
    assert "allow pidfd_getfd" in backend["fix"]


def test_abi_cap_only_lowers_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    """STOCKADE_LANDLOCK_ABI_MAX lowers the ABI the backend uses, never raises it, and a
    value that is not a number above 0 stops the run (Unavailable: 125)."""
    kernel = _host.landlock_abi()
    monkeypatch.delenv(_landlock.ABI_MAX_ENV, raising=False)
    assert _landlock.usable_abi() == kernel
    monkeypatch.setenv(_landlock.ABI_MAX_ENV, "3")
    assert _landlock.usable_abi() == min(kernel, 3)
    monkeypatch.setenv(_landlock.ABI_MAX_ENV, str(kernel + 5))
    assert _landlock.usable_abi() == kernel
    for bad in ("0", "-1", "three"):
        monkeypatch.setenv(_landlock.ABI_MAX_ENV, bad)
        with pytest.raises(Unavailable, match=_landlock.ABI_MAX_ENV):
            _landlock.usable_abi()
