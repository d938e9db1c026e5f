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
has threads (asyncio's resolver pool). The helper is therefore a fresh ``fork()``: the
child has exactly one thread, does only system calls, and leaves with ``os._exit``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
import time

from stockade._exceptions import SandboxError
from stockade._libc import libc
from stockade._record import field, record
from stockade.egress.dns._pool import POOL

__all__ = ["Netns", "NetnsSockets", "listener_in_netns", "open_netns", "sockets_in_netns"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
#: ioctl on a namespace fd: a new fd for the user namespace that owns it (Linux 4.9)
_NS_GET_USERNS = 0xB701
_TIMEOUT = 5.0
#: SCM_RIGHTS carries at most 253 descriptors in one message (SCM_MAX_FD)
MAX_CAPTURE_PORTS = 200
#: the resolver's port inside the sandbox, named by its /etc/resolv.conf
DNS_PORT = 53

# rtnetlink (linux/rtnetlink.h): one RTM_NEWROUTE for "local <family default> dev lo"
_RTM_NEWROUTE = 24
_NLMSG_ERROR = 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_RT_TABLE_LOCAL = 255
_RTPROT_STATIC = 4
_RT_SCOPE_HOST = 254
_RTN_LOCAL = 2
_RTA_OIF = 4
_RTM_NEWADDR = 20
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
#: the resolver's receive buffer: a burst of queries is queued, not dropped
_DNS_RCVBUF = 1 << 20
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1


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


def _setns(fd: int, nstype: int) -> None:
    # os.setns arrived in Python 3.12; on 3.11 call libc directly.
    if libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _wait_for_loopback() -> None:
    """Wait until bubblewrap has brought ``lo`` up in the new namespace.

    bubblewrap configures loopback in its child concurrently with our helper; binding
    127.0.0.1 or routing through ``lo`` before that fails (or, worse, races). Bringing it
    up ourselves would make bubblewrap's own exclusive address request fail.
    """
    request = struct.pack("16sH14x", b"lo", 0)
    deadline = time.monotonic() + _TIMEOUT
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        while True:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFFLAGS, request)
            (flags,) = struct.unpack_from("H", answer, 16)
            if flags & _IFF_UP:
                return
            if time.monotonic() > deadline:
                raise OSError(errno.ENETDOWN, "loopback did not come up")
            time.sleep(0.0002)


def _add_pool_address() -> None:
    """Put the synthetic pool's network address on ``lo`` (``127.64.0.0/16``).

    glibc's ``AI_ADDRCONFIG`` disregards loopback when it asks whether the host has IPv4
    at all: with only 127.0.0.1 on ``lo``, an IPv4-only lookup with that flag (``getent
    ahostsv4``, some runtimes) failed before any query was sent. Another address on
    ``lo``, in the pool's own range (never issued to a name), makes IPv4 count.
    """
    ifindex = socket.if_nametoindex("lo")
    address = POOL.network_address.packed
    body = struct.pack("=BBBBI", socket.AF_INET, POOL.prefixlen, 0, _RT_SCOPE_HOST, ifindex)
    for kind in (_IFA_LOCAL, _IFA_ADDRESS):
        body += struct.pack("=HH", 8, kind) + address
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
    message = struct.pack("=IHHII", 16 + len(body), _RTM_NEWADDR, flags, 1, 0) + body
    _netlink(message)


def _netlink(message: bytes) -> int:
    """Send one rtnetlink request; its error (0 or a negative errno) from the ACK."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.sendall(message)
        answer = nl.recv(4096)
    _length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", answer)
    if kind != _NLMSG_ERROR:
        raise OSError(errno.EPROTO, "rtnetlink answered with no acknowledgement")
    (error,) = struct.unpack_from("=i", answer, 16)
    if error not in (0, -errno.EEXIST):
        raise OSError(-error, os.strerror(-error))
    return int(error)


def _add_local_default(family: int) -> bool:
    """Add ``local <default> dev lo`` to the local table; False when the family is off."""
    ifindex = socket.if_nametoindex("lo")
    rtm = struct.pack(
        "=BBBBBBBBI",
        family,
        0,
        0,
        0,
        _RT_TABLE_LOCAL,
        _RTPROT_STATIC,
        _RT_SCOPE_HOST,
        _RTN_LOCAL,
        0,
    )
    body = rtm + struct.pack("=HHi", 8, _RTA_OIF, ifindex)
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
    message = struct.pack("=IHHII", 16 + len(body), _RTM_NEWROUTE, flags, 1, 0) + body
    try:
        _netlink(message)
    except OSError as exc:
        if family == socket.AF_INET6 and exc.errno in (errno.EAFNOSUPPORT, errno.EOPNOTSUPP):
            return False  # IPv6 is off in this kernel: v6 destinations stay unreachable
        raise
    return True


def _capture_listener(port: int) -> socket.socket:
    """A listener on every address (IPv4 and IPv6 where the kernel has IPv6)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address: tuple[str, int] = ("0.0.0.0", port)  # noqa: S104 - inside the sandbox's netns
    else:
        # Dual-stack: IPv4 connections arrive as ::ffff:a.b.c.d.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(1024)
    return sock


@record
class _Request:
    port: int
    dns: bool
    capture_ports: tuple[int, ...]
    #: the proxy listener on 127.0.0.1:``port`` (False: capture listeners only, later)
    proxy: bool = True
    #: add the AnyIP routes (once per namespace, with the first capture listeners)
    routes: bool = True


def _child(channel: socket.socket, user_fd: int, net_fd: int, request: _Request) -> None:
    """Runs in the forked helper; reports ``OK`` with the fds, or ``ERR step: reason``."""
    step = "setns(user)"
    try:
        if user_fd >= 0:
            _setns(user_fd, _CLONE_NEWUSER)
        step = "setns(net)"
        _setns(net_fd, _CLONE_NEWNET)
        made: list[socket.socket] = []
        step = "wait for lo"
        _wait_for_loopback()
        if request.capture_ports and request.routes:
            step = "route add local 0.0.0.0/0 dev lo"
            _add_local_default(socket.AF_INET)
            step = "route add local ::/0 dev lo"
            _add_local_default(socket.AF_INET6)
        if request.dns:
            step = f"address add {POOL} dev lo"
            _add_pool_address()
        if request.proxy:
            step = f"bind 127.0.0.1:{request.port}"
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", request.port))
            listener.listen(1024)
            made.append(listener)
        if request.dns:
            step = f"bind udp 127.0.0.1:{DNS_PORT}"
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _DNS_RCVBUF)
            udp.bind(("127.0.0.1", DNS_PORT))
            made.append(udp)
            step = f"bind tcp 127.0.0.1:{DNS_PORT}"
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind(("127.0.0.1", DNS_PORT))
            tcp.listen(128)
            made.append(tcp)
        for port in request.capture_ports:
            step = f"bind [::]:{port}"
            made.append(_capture_listener(port))
        step = "send fds"
        socket.send_fds(channel, [b"OK"], [s.fileno() for s in made])
    except BaseException as exc:
        message = f"ERR {step}: {getattr(exc, 'strerror', None) or exc}"
        with contextlib.suppress(BaseException):
            channel.sendall(message.encode("utf-8", "replace")[:500])


def listener_in_netns(pid: int, port: int = 0) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` inside the network namespace of ``pid``.

    ``port`` 0 lets the kernel pick; read it back with ``getsockname()``. Raises
    :class:`SandboxError` naming the step that failed.
    """
    return sockets_in_netns(pid, port).proxy


class Netns:
    """A sandbox's network namespace, held open by descriptor (a pid can be reused; an
    open namespace cannot be swapped), and the user namespace to join to act in it.

    Made by :func:`open_netns`; every call of :meth:`sockets` forks a fresh helper.
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
        if self.net_fd < 0:
            raise SandboxError("the sandbox's network namespace is closed")
        libc()  # loaded before fork, so the helper only makes system calls
        request = _Request(port, dns, tuple(capture_ports), proxy, routes)
        return _fork_helper(self.user_fd, self.net_fd, request)

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


#: a helper forked in advance and waiting for its request (see :func:`prepare_helper`):
#: the parent's end of its channel and its pid
_prepared: tuple[socket.socket, int] | None = None


def prepare_helper() -> None:
    """Fork the next helper now, while nothing waits: the first :meth:`Netns.sockets`
    of this process hands it the namespace instead of forking then.

    For a run server's worker (stockade.cli.server), which forks it while it waits for
    a caller: forking a process of the size of a warm server is the larger part of the
    helper's cost, and it lies on the path of every served run otherwise. The helper is
    single-threaded like a fresh one (a fork has one thread), dies with this process
    (PR_SET_PDEATHSIG) or when this process closes the channel, and does nothing but
    what a fresh helper does, for the one request it gets.
    """
    global _prepared
    libc()  # loaded before fork, so the helper only makes system calls
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the waiting helper; its answers are checked by the caller
        code = 1
        try:
            parent.close()
            # Nothing of the parent's but the channel: a run server's listener, above
            # all, must not stay open in a process that never accepts on it.
            for name in os.listdir("/proc/self/fd"):
                if int(name) > 2 and int(name) != child.fileno():
                    with contextlib.suppress(OSError):
                        os.close(int(name))
            pr_set_pdeathsig = 1
            libc().prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() == 1:
                os._exit(0)  # its parent is gone already
            message, fds, _, _ = socket.recv_fds(child, 4096, 2)
            if message:
                fields = message.decode().split(" ")
                user_fd = fds[0] if fields[0] == "1" else -1
                port, dns, proxy, routes = (int(f) for f in fields[1:5])
                ports = tuple(int(p) for p in fields[5].split(",") if p)
                request = _Request(port, bool(dns), ports, bool(proxy), bool(routes))
                _child(child, user_fd, fds[-1], request)
            code = 0
        finally:
            os._exit(code)
    child.close()
    _prepared = (parent, pid)


def _hand_to_prepared(user_fd: int, net_fd: int, request: _Request) -> tuple[socket.socket, int]:
    """Give ``request`` to the helper forked in advance, if there is one that takes it:
    its channel and pid. Otherwise a ValueError (there is none) or an OSError (it is
    gone): the caller forks one."""
    global _prepared
    if _prepared is None:
        raise ValueError("no helper prepared")
    (channel, pid), _prepared = _prepared, None
    ports = ",".join(str(p) for p in request.capture_ports)
    has_user = "1" if user_fd >= 0 else "0"
    fields = f"{has_user} {request.port} {int(request.dns)} {int(request.proxy)} "
    fields += f"{int(request.routes)} {ports}"
    try:
        socket.send_fds(channel, [fields.encode()], [*([user_fd] if user_fd >= 0 else []), net_fd])
    except OSError:
        channel.close()
        _reap(pid, kill=True)
        raise
    return channel, pid


def _fork_helper(user_fd: int, net_fd: int, request: _Request) -> list[socket.socket]:
    wanted = (1 if request.proxy else 0) + (2 if request.dns else 0) + len(request.capture_ports)
    child: socket.socket | None = None  # a prepared helper has its own end already
    try:
        parent, pid = _hand_to_prepared(user_fd, net_fd, request)
    except (ValueError, OSError):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the helper child; its result is checked below
            code = 1
            try:
                parent.close()
                _child(child, user_fd, net_fd, request)
                code = 0
            finally:
                os._exit(code)
    try:
        if child is not None:
            child.close()
        answered = False
        try:
            ready, _, _ = select.select([parent], [], [], _TIMEOUT)
            if not ready:
                raise SandboxError("netns helper did not answer in time")
            message, fds, _, _ = socket.recv_fds(parent, 1024, wanted)
            answered = True
        finally:
            _reap(pid, kill=not answered)
    finally:
        parent.close()
        if child is not None:
            child.close()
    if message != b"OK" or len(fds) != wanted:
        for fd in fds:
            os.close(fd)
        text = message.decode("utf-8", "replace").removeprefix("ERR ") or "helper exited"
        raise SandboxError(f"cannot create a listener in the sandbox network namespace: {text}")
    socks = [socket.socket(fileno=fd) for fd in fds]
    for sock in socks:
        sock.set_inheritable(False)
    return socks


def _reap(pid: int, kill: bool) -> None:
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
