"""A listening socket inside another process's network namespace, handed back by fd.

The sandbox has its own network namespace with only loopback. Rather than a forwarder
process inside it (which the sandbox could kill or impersonate), a short-lived helper
enters the namespace, binds ``127.0.0.1:PORT`` there, and passes the listening socket back
over ``SCM_RIGHTS``. The proxy, running outside, then accepts the sandbox's connections
directly. A socket keeps the namespace it was created in, whoever holds it.

``setns`` into a user namespace requires a single-threaded caller, and the proxy process
has threads (asyncio's resolver pool). The helper is therefore a fresh ``fork()``: the
child has exactly one thread, does only system calls, and leaves with ``os._exit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket

from stockade._exceptions import SandboxError
from stockade._libc import libc

__all__ = ["listener_in_netns"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_TIMEOUT = 5.0


def _same_namespace(path: str, ours: str) -> bool:
    try:
        theirs = os.stat(path)
        mine = os.stat(ours)
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)


def _setns(fd: int, nstype: int) -> None:
    # os.setns arrived in Python 3.12; on 3.11 call libc directly.
    if libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _child(channel: socket.socket, user_fd: int, net_fd: int, port: int) -> None:
    """Runs in the forked helper; reports ``OK`` with the fd, or ``ERR step: reason``."""
    step = "setns(user)"
    try:
        if user_fd >= 0:
            _setns(user_fd, _CLONE_NEWUSER)
        step = "setns(net)"
        _setns(net_fd, _CLONE_NEWNET)
        step = "bind 127.0.0.1"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        step = "listen"
        listener.listen(1024)
        step = "send fd"
        socket.send_fds(channel, [b"OK"], [listener.fileno()])
    except BaseException as exc:
        message = f"ERR {step}: {getattr(exc, 'strerror', None) or exc}"
        with contextlib.suppress(BaseException):
            channel.sendall(message.encode("utf-8", "replace")[:500])


def listener_in_netns(pid: int, port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` inside the network namespace of ``pid``.

    Joins ``pid``'s user namespace first when it differs from ours and we are not root
    (an unprivileged owner needs it to act in that namespace; root outside may enter the
    network namespace directly). ``port`` 0 lets the kernel pick; read it back with
    ``getsockname()``. Raises :class:`SandboxError` naming the step that failed.
    """
    net_path = f"/proc/{pid}/ns/net"
    user_path = f"/proc/{pid}/ns/user"
    if _same_namespace(net_path, "/proc/self/ns/net"):
        raise SandboxError(
            f"process {pid} shares our network namespace; start the sandbox with "
            "--unshare-net so that the listener is the only way out"
        )
    join_user = os.geteuid() != 0 and not _same_namespace(user_path, "/proc/self/ns/user")
    try:
        net_fd = os.open(net_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"open {net_path}: {exc.strerror}; is process {pid} running?") from None
    user_fd = -1
    try:
        if join_user:
            try:
                user_fd = os.open(user_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxError(f"open {user_path}: {exc.strerror}") from None
        libc()  # loaded before fork, so the helper only makes system calls
        return _fork_helper(user_fd, net_fd, port)
    finally:
        os.close(net_fd)
        if user_fd >= 0:
            os.close(user_fd)


def _fork_helper(user_fd: int, net_fd: int, port: int) -> socket.socket:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the helper child; its result is checked below
            code = 1
            try:
                parent.close()
                _child(child, user_fd, net_fd, port)
                code = 0
            finally:
                os._exit(code)
        child.close()
        answered = False
        try:
            ready, _, _ = select.select([parent], [], [], _TIMEOUT)
            if not ready:
                raise SandboxError("netns helper did not answer in time")
            message, fds, _, _ = socket.recv_fds(parent, 1024, 1)
            answered = True
        finally:
            _reap(pid, kill=not answered)
    finally:
        parent.close()
        child.close()
    if message != b"OK" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        text = message.decode("utf-8", "replace").removeprefix("ERR ") or "helper exited"
        raise SandboxError(f"cannot create a listener in the sandbox network namespace: {text}")
    listener = socket.socket(fileno=fds[0])
    listener.set_inheritable(False)
    return listener


def _reap(pid: int, kill: bool) -> None:
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
