"""listener_in_netns against real network namespaces, as root and as an unprivileged user."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from stockade._exceptions import SandboxError
from stockade.egress import _netns, listener_in_netns
from tests.egress.conftest import must_work_or_skip

pytestmark = pytest.mark.kernel

# Runs in a fresh interpreter (as root, or as uid 65534 through setpriv): starts a bwrap
# sandbox with its own user and network namespaces, creates the listener inside, and
# accepts the connection that the sandboxed command makes to 127.0.0.1:PORT.
SCRIPT = r"""
import json, os, socket, subprocess, sys
from stockade.egress import _netns, listener_in_netns

port = int(sys.argv[1])
inner = (
    "import socket, time\n"
    "for _ in range(250):\n"
    "    try:\n"
    f"        s = socket.create_connection(('127.0.0.1', {port}), 1)\n"
    "    except OSError:\n"
    "        time.sleep(0.02)\n"
    "        continue\n"
    "    s.sendall(b'from-sandbox'); s.close(); break\n"
)
# A python that the sandbox user can execute (a venv may point into a private home).
inner_python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
read_fd, write_fd = os.pipe()
proc = subprocess.Popen(
    ["bwrap", "--unshare-user", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/",
     "--info-fd", str(write_fd), "--", inner_python, "-c", inner],
    pass_fds=(write_fd,),
)
os.close(write_fd)
info = b""
while b"}" not in info:
    chunk = os.read(read_fd, 4096)
    if not chunk:
        break
    info += chunk
pid = json.loads(info)["child-pid"]
listener = listener_in_netns(pid, port)
listener.settimeout(10)
conn, _ = listener.accept()
data = conn.recv(100)
conn.close()
listener.close()
proc.wait(10)
print("RESULT", data.decode(), os.geteuid())
"""


def _needs(tool: str) -> None:
    if shutil.which(tool) is None:
        must_work_or_skip(f"{tool} is not installed")


def _run_script(prefix: list[str]) -> str:
    port = 20000 + os.getpid() % 20000
    # The helper is compiled into the user's cache: one that uid 65534 can write too
    # (pytest's tmp_path lies in a directory private to root).
    with tempfile.TemporaryDirectory(prefix="stockade-netns-") as tmp:
        os.chmod(tmp, 0o777)
        env = dict(os.environ, XDG_CACHE_HOME=f"{tmp}/cache", XDG_STATE_HOME=f"{tmp}/state")
        result = subprocess.run(
            [*prefix, sys.executable, "-c", SCRIPT, str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    if result.returncode != 0 and "No permissions to create new namespace" in result.stderr:
        must_work_or_skip(f"user namespaces are not available: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_bwrap_sandbox_as_current_user() -> None:
    _needs("bwrap")
    out = _run_script([])
    assert f"RESULT from-sandbox {os.geteuid()}" in out


def test_bwrap_sandbox_as_nobody() -> None:
    _needs("bwrap")
    _needs("setpriv")
    if os.geteuid() != 0:
        must_work_or_skip("switching to uid 65534 needs root")
    out = _run_script(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    assert "RESULT from-sandbox 65534" in out


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a network namespace of its own, loopback up (needs root)."""
    _needs("unshare")
    _needs("nsenter")
    _needs("ip")
    if os.geteuid() != 0:
        must_work_or_skip("unshare -n needs root")
    sleeper = subprocess.Popen(["unshare", "-n", "sleep", "20"])
    try:
        yield _up(sleeper)
    finally:
        sleeper.kill()
        sleeper.wait()


def _up(sleeper: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + 5
    while os.readlink(f"/proc/{sleeper.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        assert time.monotonic() < deadline, "unshare did not create a namespace"
        time.sleep(0.01)
    # unshare leaves loopback down (bwrap brings it up); a client inside needs it.
    subprocess.run(["nsenter", "-t", str(sleeper.pid), "-n", "ip", "link", "set", "lo", "up"],
                   check=True)  # fmt: skip
    return sleeper


def test_plain_network_namespace_as_root(sleeper: subprocess.Popen[bytes]) -> None:
    started = time.monotonic()
    listener = listener_in_netns(sleeper.pid)
    elapsed = time.monotonic() - started
    port = listener.getsockname()[1]
    assert listener.getsockname()[0] == "127.0.0.1"
    client = subprocess.Popen(
        [
            "nsenter", "-t", str(sleeper.pid), "-n", sys.executable, "-c",
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)"
            ".sendall(b'inside')",
        ]
    )  # fmt: skip
    try:
        listener.settimeout(10)
        conn, _ = listener.accept()
        assert conn.recv(100) == b"inside"
        conn.close()
        assert client.wait(10) == 0
    finally:
        listener.close()
        client.kill()
        client.wait()
    assert elapsed < 1.0


def test_errors_name_the_step() -> None:
    with pytest.raises(SandboxError, match="shares our network namespace"):
        listener_in_netns(os.getpid())
    with pytest.raises(SandboxError, match="is process"):
        listener_in_netns(2**22 + 7)


def test_the_helper_holds_only_its_own_descriptors_and_names_the_step_it_failed() -> None:
    """The helper is spawned from a process that holds other descriptors (a run server's
    listener, above all, inheritable here on purpose): it keeps none of them, only its
    channel and the namespace. And when loopback never comes up (unshare leaves it
    down) it fails closed, naming that step. Its twin, the same namespace with loopback
    up, is test_plain_network_namespace_as_root."""
    _needs("unshare")
    if os.geteuid() != 0:
        must_work_or_skip("unshare -n needs root")
    sleeper = subprocess.Popen(["unshare", "-n", "sleep", "20"])
    bystander = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bystander.set_inheritable(True)
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{sleeper.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "unshare did not create a namespace"
            time.sleep(0.01)
        failure: list[BaseException] = []

        def make() -> None:
            try:
                listener_in_netns(sleeper.pid).close()
            except BaseException as exc:
                failure.append(exc)

        worker = threading.Thread(target=make)
        worker.start()
        held: dict[int, str] = {}
        deadline = time.monotonic() + 4
        while not held and time.monotonic() < deadline:
            for pid in _children():
                if "netns-helper" in os.readlink(f"/proc/{pid}/exe"):
                    fds = f"/proc/{pid}/fd"
                    held = {int(fd): os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds)}
            time.sleep(0.01)
        worker.join(20)
        mine = os.readlink(f"/proc/self/fd/{bystander.fileno()}")
        assert mine not in held.values()
        # The std streams, the channel, the namespace, and the socket it polls loopback
        # with (made inside, after it closed the rest).
        assert sorted(held) == [0, 1, 2, 3, 4, 5]
        assert held[4].startswith("net:")
        assert len(failure) == 1
        assert isinstance(failure[0], SandboxError)
        assert "wait for lo" in str(failure[0])
    finally:
        bystander.close()
        sleeper.kill()
        sleeper.wait()


def _children() -> list[int]:
    me = os.getpid()
    out = []
    for task in os.listdir(f"/proc/{me}/task"):
        with open(f"/proc/{me}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def test_listener_is_not_reachable_from_the_host_namespace(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """The socket lives in the sandbox namespace: the host's 127.0.0.1 does not reach it."""
    listener = listener_in_netns(sleeper.pid)
    port = listener.getsockname()[1]
    probe = socket.socket()
    probe.settimeout(2)
    try:
        with pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", port))
    finally:
        probe.close()
        listener.close()


def test_info_json_shape() -> None:
    """Guard the bwrap --info-fd format the script relies on."""
    _needs("bwrap")
    read_fd, write_fd = os.pipe()
    proc = subprocess.run(
        ["bwrap", "--unshare-net", "--ro-bind", "/", "/", "--info-fd", str(write_fd), "true"],
        pass_fds=(write_fd,),
        capture_output=True,
        check=False,
    )
    os.close(write_fd)
    data = os.read(read_fd, 4096)
    os.close(read_fd)
    if proc.returncode != 0:
        must_work_or_skip(f"bwrap cannot run here: {proc.stderr.decode().strip()}")
    assert isinstance(json.loads(data)["child-pid"], int)


def _status(pid: int) -> str:
    """The state letter of ``pid`` ("" once it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def _wait_blocked(pid: int) -> None:
    """Until the helper sleeps (in its wait for the namespace)."""
    deadline = time.monotonic() + 5
    while _status(pid) != "S":
        assert time.monotonic() < deadline, f"helper {pid}: state {_status(pid)!r}"
        time.sleep(0.005)


def test_a_helper_spawned_ahead_waits_for_its_namespace_then_serves_it(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """A run spawns the helper while bubblewrap makes the namespace (RunProxy.prepare):
    it waits, holding nothing but its channel, and once handed the namespace it makes
    the listener there, as one spawned on the spot does (the tests above)."""
    helper = _netns.spawn_helper(0)
    _wait_blocked(helper.pid)
    fds = f"/proc/{helper.pid}/fd"
    assert sorted(int(fd) for fd in os.listdir(fds)) == [0, 1, 2, 3]
    netns = _netns.open_netns(sleeper.pid)
    try:
        (listener,) = helper.join(netns)
    finally:
        netns.close()
    assert _status(helper.pid) == ""  # reaped by join
    port = listener.getsockname()[1]
    inside = subprocess.run(
        ["nsenter", "-t", str(sleeper.pid), "-n", sys.executable, "-c",
         f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)"],
        check=False,
    )  # fmt: skip
    listener.close()
    assert inside.returncode == 0


def test_a_helper_never_handed_a_namespace_ends_and_is_reaped() -> None:
    """A run that ends before its sandbox had a namespace cancels the helper (RunProxy's
    close); a helper whose spawner only closes the channel (it died) exits by itself,
    with status 0 and nothing made."""
    cancelled = _netns.spawn_helper(0)
    _wait_blocked(cancelled.pid)
    cancelled.cancel()
    assert _status(cancelled.pid) == ""
    orphan = _netns.spawn_helper(0)
    _wait_blocked(orphan.pid)
    channel = orphan._channel
    assert channel is not None
    channel.close()
    _, status = os.waitpid(orphan.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_malformed_namespace_message_fails_closed_naming_the_step() -> None:
    """The channel carries "N" and one descriptor, or "U" and two: anything else is an
    error the helper names, and it makes nothing."""
    for kind, fds in ((b"N", []), (b"U", [0]), (b"X", [0])):
        helper = _netns.spawn_helper(0)
        channel = helper._channel
        assert channel is not None
        socket.send_fds(channel, [kind], fds)
        channel.settimeout(5)
        message, got, _, _ = socket.recv_fds(channel, 1024, 4)
        channel.close()
        _, status = os.waitpid(helper.pid, 0)
        assert message.startswith(b"ERR receive the namespace: "), message
        assert got == []
        assert os.waitstatus_to_exitcode(status) == 1
