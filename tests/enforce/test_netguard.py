"""The connect guard (enforce/netguard.py) with the real launcher and kernel.

The launcher runs as this process's user (the guard, like stockade, supervises its own
user's processes; the runs as uid 65534 are in tests/runtime/test_landlock_backend.py).
Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.enforce import netguard
from stockade.enforce.launcher import LauncherSpec, prepare, serialize

from .conftest import require

#: connect to each port of argv[1:] and print what happened
_CONNECTS = r"""
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", int(p)))
        print(p, "connected")
    except OSError as e:
        print(p, e.errno)
    finally:
        s.close()
"""


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two TCP listeners on 127.0.0.1: the "proxy" and another port."""
    socks = [socket.socket() for _ in range(2)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    try:
        yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for sock in socks:
            sock.close()


def _usable() -> None:
    ok, why = netguard.available()
    require(ok, f"the connect guard cannot work here: {why}")


def _launch(
    spec: LauncherSpec, fds: tuple[int, ...], *argv: str
) -> subprocess.CompletedProcess[str]:
    prefix, fd = prepare(spec)
    try:
        return subprocess.run(
            [*prefix, *argv],
            pass_fds=(fd, *fds),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(fd)


def _spec(guard: netguard.ConnectGuard) -> LauncherSpec:
    # Landlock's files rules off: the guard is what is under test
    return LauncherSpec(
        landlock=False,
        scope=False,
        drop_caps=os.geteuid() == 0,
        observer_fd=guard.child_fd,
        observer_bpf=guard.program,
        guard=True,
    )


def test_serialize_refuses_a_guard_without_its_filter_and_a_bad_cap() -> None:
    with pytest.raises(ValueError, match="connect guard"):
        serialize(LauncherSpec(guard=True))
    with pytest.raises(ValueError, match="ABI cap"):
        serialize(LauncherSpec(abi_max=0))
    assert b"\0A=3\0" in serialize(LauncherSpec(abi_max=3))


def test_guard_lets_the_proxy_through_and_refuses_the_rest(listeners: tuple[int, int]) -> None:
    _usable()
    proxy, other = listeners
    guard = netguard.ConnectGuard((("127.0.0.1", proxy),))
    guard.start()
    try:
        r = _launch(
            _spec(guard), (guard.child_fd,), sys.executable, "-c", _CONNECTS, str(proxy), str(other)
        )
    finally:
        guard.stop()
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [f"{proxy} connected", f"{other} 13"]
    assert guard.error is None
    # the launcher's own probe of 127.0.0.1:1, then the command's
    assert (guard.performed, guard.refused) == (1, 2)
    assert guard.examples == ["127.0.0.1:1", f"127.0.0.1:{other}"]


def test_launcher_refuses_to_run_without_a_working_guard(
    listeners: tuple[int, int], tmp_path: Path
) -> None:
    """Fail closed: nobody takes the listener (the host's end is gone), or the host takes
    it and closes it (every notified call then gets ENOSYS): the command never runs.
    The twin above runs it with a guard at work."""
    _usable()
    proxy, _ = listeners
    marker = tmp_path / "ran"
    command = ("/bin/sh", "-c", f"touch {marker}")
    guard = netguard.ConnectGuard((("127.0.0.1", proxy),))
    guard._host.close()  # the host's end of the socket, gone
    r = _launch(_spec(guard), (guard.child_fd,), *command)
    guard._child.close()
    assert r.returncode == 125, r.stderr
    assert "sending the listener of the connect guard" in r.stderr

    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    guard = netguard.ConnectGuard((("127.0.0.1", proxy),))
    spec = LauncherSpec(
        landlock=False,
        scope=False,
        drop_caps=os.geteuid() == 0,
        observer_fd=child.fileno(),
        observer_bpf=guard.program,
        guard=True,
    )
    prefix, fd = prepare(spec)
    try:
        proc = subprocess.Popen(
            [*prefix, *command],
            pass_fds=(fd, child.fileno()),
            stderr=subprocess.PIPE,
            text=True,
        )
        child.close()
        _, ancdata, _, _ = host.recvmsg(1, socket.CMSG_SPACE(4))
        os.close(int.from_bytes(ancdata[0][2][:4], sys.byteorder))  # taken and dropped
        _, stderr = proc.communicate(timeout=60)
    finally:
        os.close(fd)
        host.close()
        guard.stop()
    assert proc.returncode == 125, stderr
    assert "not refused by the connect guard (ENOSYS)" in stderr
    assert not marker.exists()
