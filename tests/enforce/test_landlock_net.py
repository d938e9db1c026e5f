"""The launcher's parts of the landlock backend (issue 28), on this kernel: Landlock's TCP
connect rule (ABI 4+), the ``no_netns`` seccomp rules, the reaper and the spec records.

The launcher is started directly (no bubblewrap), as the landlock backend starts it.
Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from stockade.enforce import seccomp
from stockade.enforce.launcher import LauncherSpec, prepare, serialize
from stockade.runtime import _host
from tests.conftest import require

#: the launcher is built into the session's private cache (conftest), never the user's
pytestmark = pytest.mark.usefixtures("launcher_bin")

#: the system interpreter: Landlock grants /usr, not the venv
PYTHON = "/usr/bin/python3"

_CONNECT = r"""
import json, socket, sys
out = {}
for port in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", int(port)))
        out[port] = "connected"
    except OSError as e:
        out[port] = e.errno
    finally:
        s.close()
for name, kind in (("udp", socket.SOCK_DGRAM), ("tcp", socket.SOCK_STREAM)):
    try:
        socket.socket(socket.AF_INET, kind).close()
        out[name] = "made"
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))
"""


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        socks.append(s)
    try:
        yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for s in socks:
            s.close()


def _run(spec: LauncherSpec, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    prefix, fd = prepare(spec)
    try:
        return subprocess.run(
            [*prefix, *argv],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
    finally:
        os.close(fd)


def _spec(**kw: object) -> LauncherSpec:
    base: dict[str, object] = {
        "read_paths": ("/usr", "/lib", "/lib64", "/bin", "/etc", "/proc"),
        "write_paths": ("/dev/null",),
        "scope": False,
        "drop_caps": os.geteuid() == 0,
    }
    base.update(kw)
    return LauncherSpec(**base)  # type: ignore[arg-type]


def test_spec_records_of_the_landlock_backend() -> None:
    spec = LauncherSpec(
        landlock=True,
        scope=False,
        handle_net=True,
        connect_ports=(3128,),
        reaper=True,
        hold_fd=7,
        list_paths=("/etc",),
    )
    data = serialize(spec)
    for record in (b"N=1\0", b"c=3128\0", b"R=1\0", b"W=7\0", b"d=/etc\0"):
        assert record in data
    with pytest.raises(ValueError, match="connect port"):
        serialize(LauncherSpec(connect_ports=(0,)))
    with pytest.raises(ValueError, match="hold fd"):
        serialize(LauncherSpec(hold_fd=2))


def test_connect_rule_lets_only_the_named_port(listeners: tuple[int, int]) -> None:
    require(_host.landlock_abi() >= 4, "Landlock ABI 4 (network rules) is not available")
    allowed, other = listeners
    proc = _run(
        _spec(handle_net=True, connect_ports=(allowed,)),
        PYTHON,
        "-c",
        _CONNECT,
        str(allowed),
        str(other),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out[str(allowed)] == "connected"
    assert out[str(other)] == 13  # EACCES: Landlock
    # Twin: without the network rule both connect.
    proc = _run(_spec(), PYTHON, "-c", _CONNECT, str(allowed), str(other))
    out = json.loads(proc.stdout)
    assert out[str(allowed)] == out[str(other)] == "connected"


def test_no_netns_filter_refuses_udp_keeps_tcp() -> None:
    for bpf in (
        seccomp.build_filter(no_netns=True),
        seccomp.build_filter(no_netns=True, net_only=True),
    ):
        proc = _run(_spec(seccomp_bpf=bpf), PYTHON, "-c", _CONNECT)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {"udp": 1, "tcp": "made"}
    # Twin: the plain filter lets UDP sockets be made (a network namespace confines them).
    proc = _run(_spec(seccomp_bpf=seccomp.build_filter()), PYTHON, "-c", _CONNECT)
    assert json.loads(proc.stdout) == {"udp": "made", "tcp": "made"}
    with pytest.raises(ValueError, match="net_only"):
        seccomp.build_filter(net_only=True)
    with pytest.raises(ValueError, match="guard"):
        seccomp.build_filter(guard=True)


def test_guard_filter_refuses_io_uring_with_net_only() -> None:
    """io_uring's connect is invisible to a filter: the connect guard's part refuses it
    (the full filter does anyway); the twin without the guard leaves it."""
    probe = "import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(425, 4, ctypes.create_string_buffer(120)) >= 0 or ctypes.get_errno())"
    for bpf, expected in (
        (seccomp.build_filter(no_netns=True, net_only=True, guard=True), "1"),
        (seccomp.build_filter(no_netns=True, guard=True), "1"),
        (seccomp.build_filter(no_netns=True, net_only=True), "True"),
    ):
        proc = _run(_spec(seccomp_bpf=bpf), PYTHON, "-c", probe)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected


def test_reaper_kills_what_the_command_leaves() -> None:
    tag = f"stockade-reaper-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        f"(setsid /usr/bin/python3 -c 'import time; time.sleep(30)' {tag} "
        ">/dev/null 2>&1 </dev/null &); sleep 0.3; pgrep -f " + tag + " >/dev/null && echo up"
    )
    try:
        proc = _run(_spec(reaper=True), "/bin/sh", "-c", script)
        assert proc.stdout.strip() == "up", proc.stderr
        time.sleep(0.3)
        left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
        assert left.stdout.strip() == ""
        # Twin: without the reaper it outlives the launcher.
        proc = _run(_spec(), "/bin/sh", "-c", script)
        assert proc.stdout.strip() == "up", proc.stderr
        left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True, check=False)
        assert left.stdout.strip() != ""
    finally:
        subprocess.run(["pkill", "-KILL", "-f", tag], check=False)


def test_reaper_passes_the_exit_status_and_signal() -> None:
    assert _run(_spec(reaper=True), "/bin/sh", "-c", "exit 7").returncode == 7
    assert _run(_spec(reaper=True), "/bin/sh", "-c", "kill -TERM $$").returncode == -15
