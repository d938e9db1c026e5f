"""Sockets inside another process's network namespace, handed back by fd.

The sandbox has its own network namespace with only loopback. Rather than a forwarder
process inside it (which the sandbox could kill or impersonate), a short-lived helper
enters the namespace, makes the sockets there, and passes them back over ``SCM_RIGHTS``:
the proxy listener on ``127.0.0.1:PORT``, and for transparent egress the resolver's UDP
and TCP sockets on ``127.0.0.1:53`` and one capture listener per port on the wildcard
address. The proxy, running outside, then serves them directly. A socket keeps the
namespace it was created in, whoever holds it.

For capture the helper also adds ``local 0.0.0.0/0`` and ``local ::/0`` routes to the
namespace (AnyIP): every destination becomes local, so a connection to any address
reaches a capture listener (and is decided and audited there) instead of failing with
"network unreachable" unseen. No nftables is involved.

``setns`` into a user namespace requires a single-threaded caller, and the proxy process
has threads (asyncio's resolver pool). The helper is therefore a process of its own: a
small C program (``_netns_helper.c``, compiled once into the user's cache like the
launcher), spawned with vfork and exec. A fork of the Python process did the same job,
but copying a warm server's page tables and faulting in what the child's interpreter
touched cost about 3 ms on the path of every run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
from pathlib import Path

from stockade import _build
from stockade._exceptions import SandboxError
from stockade._record import field, record
from stockade.egress.dns._pool import POOL

__all__ = ["Netns", "NetnsSockets", "listener_in_netns", "open_netns", "sockets_in_netns"]

#: ioctl on a namespace fd: a new fd for the user namespace that owns it (Linux 4.9)
_NS_GET_USERNS = 0xB701
_TIMEOUT = 5.0
#: SCM_RIGHTS carries at most 253 descriptors in one message (SCM_MAX_FD)
MAX_CAPTURE_PORTS = 200
#: the resolver's port inside the sandbox, named by its /etc/resolv.conf (the helper's
#: DNS_PORT)
DNS_PORT = 53
_SOURCE_NAME = "_netns_helper.c"


@record(frozen=False)
class NetnsSockets:
    """What the helper made inside the namespace (the caller owns and closes them)."""

    proxy: socket.socket
    dns_udp: socket.socket | None = None
    dns_tcp: socket.socket | None = None
    #: one listener per capture port, in the order asked for
    captures: list[socket.socket] = field(default_factory=list)

    def all(self) -> list[socket.socket]:
        """Every socket, for closing."""
        out = [self.proxy, *self.captures]
        out += [s for s in (self.dns_udp, self.dns_tcp) if s is not None]
        return out

    def close(self) -> None:
        """Close every socket."""
        for sock in self.all():
            sock.close()


def _same_namespace(path: str, ours: str) -> bool:
    try:
        theirs = os.stat(path)
        mine = os.stat(ours)
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)


def listener_in_netns(pid: int, port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` inside the network namespace of ``pid``.

    ``port`` 0 lets the kernel pick; read it back with ``getsockname()``. Raises
    :class:`SandboxError` naming the step that failed.
    """
    return sockets_in_netns(pid, port).proxy


class Netns:
    """A sandbox's network namespace, held open by descriptor (a pid can be reused; an
    open namespace cannot be swapped), and the user namespace to join to act in it.

    Made by :func:`open_netns`; every call of :meth:`sockets` spawns a fresh helper.
    """

    def __init__(self, net_fd: int, user_fd: int) -> None:
        self.net_fd = net_fd
        self.user_fd = user_fd

    def sockets(
        self,
        port: int = 0,
        *,
        dns: bool = False,
        capture_ports: tuple[int, ...] = (),
        proxy: bool = True,
        routes: bool = True,
    ) -> list[socket.socket]:
        """Make the sockets in the namespace (see :func:`sockets_in_netns`); in order:
        the proxy listener (``proxy``), the resolver's UDP and TCP sockets (``dns``),
        one capture listener per port."""
        return spawn_helper(
            port, dns=dns, capture_ports=capture_ports, proxy=proxy, routes=routes
        ).join(self)

    def close(self) -> None:
        """Let go of the namespace."""
        for fd in (self.net_fd, self.user_fd):
            if fd >= 0:
                os.close(fd)
        self.net_fd = self.user_fd = -1


def open_netns(pid: int) -> Netns:
    """Hold the network namespace of ``pid`` (and, when we are not root and it is not
    ours, the user namespace that owns it: binding ports below 1024 and adding routes
    need capabilities there; with bubblewrap's ``--disable-userns`` the sandboxed
    process sits in a nested user namespace, which does not own the network namespace).

    Raises :class:`SandboxError` when ``pid`` shares our namespace or is gone.
    """
    net_path = f"/proc/{pid}/ns/net"
    if _same_namespace(net_path, "/proc/self/ns/net"):
        raise SandboxError(
            f"process {pid} shares our network namespace; start the sandbox with "
            "--unshare-net so that the listener is the only way out"
        )
    try:
        net_fd = os.open(net_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"open {net_path}: {exc.strerror}; is process {pid} running?") from None
    user_fd = -1
    try:
        if os.geteuid() != 0:
            try:
                user_fd = fcntl.ioctl(net_fd, _NS_GET_USERNS)
            except OSError as exc:
                raise SandboxError(
                    f"cannot find the user namespace that owns {net_path}: {exc.strerror}"
                ) from None
            os.set_inheritable(user_fd, False)
            owner = os.fstat(user_fd)
            ours = os.stat("/proc/self/ns/user")
            if (owner.st_dev, owner.st_ino) == (ours.st_dev, ours.st_ino):
                os.close(user_fd)
                user_fd = -1
    except BaseException:
        os.close(net_fd)
        raise
    return Netns(net_fd, user_fd)


def sockets_in_netns(
    pid: int, port: int = 0, *, dns: bool = False, capture_ports: tuple[int, ...] = ()
) -> NetnsSockets:
    """The proxy listener, and optionally the resolver's and capture sockets, inside the
    network namespace of ``pid`` (:func:`open_netns` says which user namespace the
    helper joins). With ``capture_ports`` it adds the AnyIP routes (see the module's
    docstring). Raises :class:`SandboxError` naming the step that failed.
    """
    check_capture_count(len(capture_ports))
    netns = open_netns(pid)
    try:
        return split_sockets(netns.sockets(port, dns=dns, capture_ports=capture_ports), dns)
    finally:
        netns.close()


def check_capture_count(count: int) -> None:
    """Refuse more capture ports than one helper message can carry."""
    if count > MAX_CAPTURE_PORTS:
        raise SandboxError(
            f"{count} ports to capture; at most {MAX_CAPTURE_PORTS} "
            "(name fewer host:port entries in network.allow)"
        )


def split_sockets(socks: list[socket.socket], dns: bool) -> NetnsSockets:
    """The sockets of :meth:`Netns.sockets` with the proxy listener, by role."""
    out = NetnsSockets(socks.pop(0))
    if dns:
        out.dns_udp, out.dns_tcp = socks.pop(0), socks.pop(0)
    out.captures = socks
    return out


_SOURCE = Path(__file__).with_name(_SOURCE_NAME)


def build_helper() -> Path:
    """The path of an executable helper, compiled on first use into stockade's cache and
    named by its source's digest, as the launcher is (:func:`stockade._build.build_shipped`).
    Raises :class:`~stockade.Unavailable` without a compiler and :class:`SandboxError`
    when the compile fails."""
    return _build.build_shipped(_SOURCE, "netns-helper", "the network namespace helper")


class Helper:
    """A helper spawned before its namespace exists (:func:`spawn_helper`), waiting on
    its channel: :meth:`join` hands it the namespace and takes the sockets it made.

    Spawning it is most of what the sockets cost (about 1 ms of a run's 1.5): a run
    spawns it while bubblewrap makes the namespace, and only hands the namespace over
    once it exists. Exactly one of :meth:`join` and :meth:`cancel` ends it (either
    reaps it); a helper whose spawner dies sees its channel close and exits.
    """

    def __init__(self, pid: int, channel: socket.socket, wanted: int) -> None:
        self.pid = pid
        self._channel: socket.socket | None = channel
        self._wanted = wanted

    def join(self, netns: Netns) -> list[socket.socket]:
        """Hand the helper ``netns`` and return the sockets it made there, in order: the
        proxy listener, the resolver's UDP and TCP sockets, one per capture port (each
        as asked). Raises :class:`SandboxError` naming the helper's failed step."""
        channel = self._channel
        if channel is None:
            raise SandboxError("the network namespace helper was already used")
        if netns.net_fd < 0:
            self.cancel()
            raise SandboxError("the sandbox's network namespace is closed")
        self._channel = None
        answered = False
        try:
            fds = [netns.net_fd, *([netns.user_fd] if netns.user_fd >= 0 else [])]
            # A helper already gone (a bad argument) wrote why before it exited: its
            # answer is read below either way.
            with contextlib.suppress(OSError):
                socket.send_fds(channel, [b"U" if len(fds) == 2 else b"N"], fds)
            ready, _, _ = select.select([channel], [], [], _TIMEOUT)
            if not ready:
                raise SandboxError("netns helper did not answer in time")
            message, made, _, _ = socket.recv_fds(channel, 1024, max(self._wanted, 1))
            answered = True
        finally:
            channel.close()
            _reap(self.pid, kill=not answered)
        if message != b"OK" or len(made) != self._wanted:
            for fd in made:
                os.close(fd)
            text = message.decode("utf-8", "replace").removeprefix("ERR ") or "helper exited"
            raise SandboxError(f"cannot create a listener in the sandbox network namespace: {text}")
        socks = [socket.socket(fileno=fd) for fd in made]
        for sock in socks:
            sock.set_inheritable(False)
        return socks

    def cancel(self) -> None:
        """End the helper unused (the run ended before its namespace was handed over)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
            _reap(self.pid, kill=True)


def spawn_helper(
    port: int = 0,
    *,
    dns: bool = False,
    capture_ports: tuple[int, ...] = (),
    proxy: bool = True,
    routes: bool = True,
) -> Helper:
    """Spawn a helper that will make these sockets in a namespace handed to it later
    (see :meth:`Netns.sockets` for what each argument asks for)."""
    check_capture_count(len(capture_ports))
    binary = build_helper()
    wanted = (1 if proxy else 0) + (2 if dns else 0) + len(capture_ports)
    argv = [
        str(binary),
        str(port),
        str(int(dns)),
        str(int(proxy)),
        str(int(routes)),
        str(POOL.network_address),
        str(POOL.prefixlen),
        *(str(p) for p in capture_ports),
    ]
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # The helper finds its channel at 3; the namespace comes over it (Helper.join).
        pid = os.posix_spawn(
            str(binary), argv, {}, file_actions=[(os.POSIX_SPAWN_DUP2, child.fileno(), 3)]
        )
    except OSError as exc:
        parent.close()
        raise SandboxError(f"cannot start the network namespace helper: {exc.strerror}") from None
    finally:
        child.close()
    return Helper(pid, parent, wanted)


def _reap(pid: int, kill: bool) -> None:
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
