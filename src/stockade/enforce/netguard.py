"""The landlock backend's connect guard, for kernels without Landlock's TCP rules.

Below Landlock ABI 4 (Linux 6.7) nothing in the kernel lets an unprivileged process
limit where its own ``connect()`` goes, and the landlock backend has no network
namespace. This guard is the fallback: a seccomp user-notification filter
(:func:`build_filter`) sends every ``connect()`` of the command's tree to a supervisor
thread in stockade (:class:`ConnectGuard`), which lets an inet socket reach the proxy's
address and nothing else. The other ways to a destination stay with stockade's own
filter (``seccomp.build_filter(no_netns=True, guard=True)``): an inet socket is TCP
alone (no UDP, raw, ICMP, SCTP, MPTCP; packet sockets and other families are refused),
``MSG_FASTOPEN`` (a connect inside ``sendto``/``sendmsg``) is refused, and so is
io_uring (whose ``IORING_OP_CONNECT`` no seccomp filter sees). A TCP ``sendto`` to an
address on a connected socket ignores the address, so ``connect()`` is the one call to
guard.

**Why the supervisor performs the connect itself.** ``connect()`` passes its address by
pointer. A supervisor that reads the address from the task's memory, checks it and
answers ``SECCOMP_USER_NOTIF_FLAG_CONTINUE`` has checked a copy, while the kernel then
reads the task's memory again: another thread of the task (or a process sharing its
memory) can rewrite the address in between, and the check is worth nothing
(seccomp_unotify(2): "the supervisor should not use CONTINUE ... for security
decisions" when the target can change the arguments). The same holds for the socket:
between a check of what descriptor N is and the kernel's look-up, another thread can
``dup2`` an inet socket onto N. So the guard never answers CONTINUE. For each
notification it:

1. copies the address out of the task's memory (``/proc/PID/mem``, opened after
   checking with ``SECCOMP_IOCTL_NOTIF_ID_VALID`` that PID is still the notifying task,
   and checked again after the read) into its own buffer;
2. takes the task's socket itself with ``pidfd_getfd`` (a descriptor for the same open
   socket, whatever happens to the task's descriptor number afterwards; ``ID_VALID``
   again after ``pidfd_open``, so the pidfd names the notifying task);
3. decides on its own copy and its own descriptor: an inet socket may connect to the
   proxy's address alone (``allowed``; IPv4-mapped IPv6 spellings of it too) or
   disconnect (``AF_UNSPEC``), anything else gets ``EACCES`` (what Landlock answers);
4. calls ``connect()`` on its descriptor with the bytes it checked, and answers the
   notification with that call's result (``EINPROGRESS`` for a non-blocking socket,
   which then completes in the task as usual: it is the same socket).

The task can change nothing the decision rests on after it is made. Sockets of other
families (unix, netlink route) are connected the same way, with the bytes the task gave
(a relative unix path resolved through ``/proc/PID/cwd``): no Landlock ABI below 4
confines a unix connect, so this grants nothing the task lacked. Performing a call on
the task's behalf must never grant more than the task itself holds, so the supervisor
thread first gives up every capability (capabilities are per thread; a run as root
would otherwise connect with ``CAP_DAC_OVERRIDE``), and its workers inherit that.
What a peer sees changes for unix sockets: ``SO_PEERCRED`` names stockade's process
(same uid and gid), not the command's.

The launcher loads the filter last (``G=1``, with ``SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV``
so that a signal cannot restart a connect the guard already made), hands the listener
over and verifies, before exec, that a connect to ``127.0.0.1:1`` is refused with
``EACCES``; the guard answers ``EPERM`` when it cannot inspect a call (and the kernel
``ENOSYS`` once the listener is gone), so a guard that does not work stops the run
(exit 125) instead of letting anything through.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import ipaddress
import os
import select
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from stockade.enforce.observe import (
    _IOCTL_RECV,
    _IOCTL_SEND,
    _NOTIF,
    _RESP,
    notify_program,
    receive_listener,
)
from stockade.enforce.seccomp import native_arch

__all__ = ["MECHANISM", "ConnectGuard", "available", "build_filter"]

#: what the run's log and ``stockade doctor`` name as the fallback
MECHANISM = (
    "seccomp user notification on connect(), performed by stockade on the command's "
    "behalf (the proxy's address only)"
)

#: _IOW('!', 2, __u64)
_IOCTL_ID_VALID = 0x40082102
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"connect": 42, "capset": 126, "pidfd_open": 434, "pidfd_getfd": 438},
    "aarch64": {"connect": 203, "capset": 91, "pidfd_open": 434, "pidfd_getfd": 438},
}
#: sizeof(struct sockaddr_storage): the kernel refuses a longer address (EINVAL)
_SOCKADDR_MAX = 128
_SUN_PATH_MAX = 108
_AF_UNSPEC = 0
#: pidfd_open flag (O_EXCL, Linux 6.9): the pidfd names the thread, not its process
_PIDFD_THREAD = 0o200


def available() -> tuple[bool, str]:
    """Whether the guard can work here (user notification, ``pidfd_getfd``: Linux
    5.6+), and a one-line reason when it cannot."""
    from stockade.enforce import observe

    ok, why = observe.available()
    if not ok:
        return ok, why
    arch = native_arch()
    if arch not in _SYSCALLS:
        return False, f"no connect guard for architecture {arch}"
    # The guard takes the command's sockets with pidfd_getfd: try it on this process.
    # A container's seccomp profile refuses it without CAP_SYS_PTRACE (Docker's and
    # containerd's defaults do), and so does stockade's own filter.
    libc = _libc()
    probe = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        pidfd = int(libc.syscall(ctypes.c_long(_SYSCALLS[arch]["pidfd_open"]), os.getpid(), 0))
        if pidfd < 0:
            err = ctypes.get_errno()
            return False, f"pidfd_open fails with {errno.errorcode.get(err, err)} (Linux 5.3+)"
        try:
            fd = int(libc.syscall(ctypes.c_long(_SYSCALLS[arch]["pidfd_getfd"]), pidfd, probe, 0))
            if fd < 0:
                err = ctypes.get_errno()
                return False, (
                    f"pidfd_getfd fails with {errno.errorcode.get(err, err)} (Linux 5.6+; a "
                    "container's seccomp profile allows it only with CAP_SYS_PTRACE)"
                )
            os.close(fd)
        finally:
            os.close(pidfd)
    finally:
        os.close(probe)
    return True, ""


def build_filter(arch: str | None = None) -> bytes:
    """The guard's program: ``USER_NOTIF`` for ``connect``, ``ALLOW`` for the rest."""
    arch = arch or native_arch()
    return notify_program(arch, [_SYSCALLS[arch]["connect"]])


def _libc() -> ctypes.CDLL:
    from stockade._libc import libc

    return libc()


def _drop_thread_capabilities(arch: str) -> None:
    """Give up every capability of the calling thread (and of the threads it starts).

    ``capset`` acts on the calling thread alone (glibc does not broadcast it), which is
    what is wanted: stockade's other threads keep theirs. Raises :class:`OSError` when a
    capability is left afterwards.
    """

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    status = f"/proc/self/task/{threading.get_native_id()}/status"

    def held() -> bool:
        with open(status, encoding="ascii") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("CapEff", "CapPrm", "CapAmb") and int(value.strip(), 16):
                    return True
        return False

    if not held():
        return
    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (Data * 2)()
    libc = _libc()
    if libc.syscall(ctypes.c_long(_SYSCALLS[arch]["capset"]), ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset(0) for the connect guard's thread: {os.strerror(err)}")
    if held():
        raise OSError(errno.EPERM, "the connect guard's thread still holds capabilities")


@dataclass
class ConnectGuard:
    """The host side of the connect guard (see the module docstring).

    ``allowed``: the ``(address, port)`` pairs an inet socket may connect to (the
    proxy's listener). Give :attr:`child_fd` to the launcher (``pass_fds``) with
    :attr:`program` (spec ``F``/``P``/``G``), call :meth:`start` before the command
    starts and :meth:`stop` after it ended. :attr:`refused` counts the refusals and
    :attr:`examples` keeps the first few destinations refused; :attr:`error` says why
    a call could not be inspected (each such call was refused).
    """

    allowed: Iterable[tuple[str, int]]
    arch: str = field(default_factory=native_arch)
    refused: int = 0
    performed: int = 0
    examples: list[str] = field(default_factory=list)
    error: str | None = None
    attached: bool = False

    def __post_init__(self) -> None:
        self._allowed = {(ipaddress.ip_address(host), int(port)) for host, port in self.allowed}
        self._host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._child = child
        self.child_fd = child.fileno()
        os.set_inheritable(self.child_fd, True)
        self.program = build_filter(self.arch)
        self._nr = _SYSCALLS[self.arch]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: set[threading.Thread] = set()
        self._thread = threading.Thread(target=self._serve, name="stockade-guard", daemon=True)

    def start(self) -> None:
        """Start the supervisor thread (it waits for the launcher's listener)."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop supervising (the command has ended) and close every descriptor."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._child.close()
        self._host.close()

    # -- the supervisor thread ---------------------------------------------------------

    def _serve(self) -> None:
        try:
            _drop_thread_capabilities(self.arch)
        except OSError as exc:
            # Without the listener the launcher's verification fails: the run stops.
            self.error = f"connect guard: {exc}"
            return
        listener, why = receive_listener(self._host, self._stop)
        if listener is None:
            if why is not None:
                self.error = f"connect guard: {why}"
            return
        self.attached = True
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        try:
            while True:
                events = poller.poll(100)
                if not events:
                    if self._stop.is_set():
                        return
                    continue
                mask = events[0][1]
                if mask & select.POLLIN:
                    buf = bytearray(_NOTIF.size)  # the kernel wants it zeroed
                    try:
                        fcntl.ioctl(listener, _IOCTL_RECV, buf, True)
                    except OSError as exc:
                        if exc.errno in (errno.ENOENT, errno.EINTR):
                            continue  # the task died between poll and receive
                        raise
                    # A connect may block (a full backlog): one worker per call, started
                    # from this capability-less thread, so they have none either. Each
                    # holds its own descriptor of the listener: one still connecting when
                    # this loop ends never answers through a number reused meanwhile.
                    own = os.dup(listener)
                    worker = threading.Thread(
                        target=self._answer, args=(own, bytes(buf)), daemon=True
                    )
                    with self._lock:
                        self._workers.add(worker)
                    worker.start()
                elif mask & (select.POLLHUP | select.POLLERR):
                    return  # every task of the filter has exited
        except OSError as exc:
            self.error = f"connect guard: {exc}"
        finally:
            with self._lock:
                workers = list(self._workers)
            for worker in workers:
                worker.join(1.0)
            os.close(listener)

    def _answer(self, listener: int, raw: bytes) -> None:
        notif_id, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(raw)
        try:
            if nr != self._nr["connect"]:
                error = errno.EPERM  # not a call this filter notifies: never let it pass
            else:
                error = self._connect(listener, notif_id, pid, args)
        except Exception as exc:  # any failure refuses the call
            self._fail(f"connect guard: {type(exc).__name__}: {exc}")
            error = errno.EPERM
        try:
            fcntl.ioctl(listener, _IOCTL_SEND, _RESP.pack(notif_id, 0, -error if error else 0, 0))
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the task was killed meanwhile
                self._fail(f"connect guard: answering: {exc}")
        finally:
            os.close(listener)  # this worker's own descriptor of it
            with self._lock:
                self._workers.discard(threading.current_thread())

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = why

    def _refuse(self, where: str) -> int:
        with self._lock:
            self.refused += 1
            if len(self.examples) < 5:
                self.examples.append(where)
        return errno.EACCES

    def _valid(self, listener: int, notif_id: int) -> bool:
        """Whether the notification is still pending: its task is alive and still in
        the call, so the PID it named is that task and not a reuse of the number."""
        try:
            fcntl.ioctl(listener, _IOCTL_ID_VALID, struct.pack("=Q", notif_id))
        except OSError:
            return False
        return True

    def _copy_address(self, listener: int, notif_id: int, pid: int, addr: int, size: int) -> bytes:
        """The task's address, copied once into stockade's memory (see the docstring)."""
        if size == 0:
            return b""
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if not self._valid(listener, notif_id):
                raise ProcessLookupError(pid)
            data = os.pread(fd, size, addr)
        finally:
            os.close(fd)
        if not self._valid(listener, notif_id):
            raise ProcessLookupError(pid)
        return data

    def _take_socket(self, listener: int, notif_id: int, pid: int, number: int) -> int:
        """A descriptor of stockade's for the task's open file ``number``.

        ``pid`` is the notifying thread's id, which may be any thread of its process (a
        resolver's or a pool's worker). ``PIDFD_THREAD`` (Linux 6.9) names that thread,
        so the descriptor comes from its own table; before 6.9 a pidfd names a process,
        and the table is its leader's: the one every thread shares unless it was made
        with ``clone(CLONE_THREAD)`` without ``CLONE_FILES`` (no libc does that). Either
        way the socket is the process's own and the address is checked all the same.
        """
        libc = _libc()
        nr = ctypes.c_long(self._nr["pidfd_open"])
        pidfd = int(libc.syscall(nr, pid, _PIDFD_THREAD))
        if pidfd < 0 and ctypes.get_errno() == errno.EINVAL:
            pidfd = int(libc.syscall(nr, _thread_group(pid), 0))
        if pidfd < 0:
            raise OSError(ctypes.get_errno(), f"pidfd_open({pid})")
        try:
            # the notification still pending: the pidfd names the notifying task's
            # thread (or process), not a later one given the same number
            if not self._valid(listener, notif_id):
                raise ProcessLookupError(pid)
            fd = int(libc.syscall(ctypes.c_long(self._nr["pidfd_getfd"]), pidfd, number, 0))
            if fd < 0:
                raise OSError(ctypes.get_errno(), f"pidfd_getfd({pid}, {number})")
        finally:
            os.close(pidfd)
        return fd

    def _connect(self, listener: int, notif_id: int, pid: int, args: list[int]) -> int:
        """Decide and perform one ``connect(fd, addr, len)``; the errno to answer (0)."""
        number = args[0] & 0xFFFFFFFF
        if number & 0x80000000:
            return errno.EBADF
        size = args[2] & 0xFFFFFFFF
        if size > _SOCKADDR_MAX or size & 0x80000000:
            return errno.EINVAL
        try:
            data = self._copy_address(listener, notif_id, pid, args[1], size)
        except ProcessLookupError:
            return errno.ESRCH  # the task is gone: nobody reads the answer
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EFAULT):
                return errno.EFAULT  # an unmapped address, as the kernel would say
            self._fail(f"connect guard: reading the address of pid {pid}: {exc}")
            return errno.EPERM
        if len(data) < size:
            return errno.EFAULT
        try:
            fd = self._take_socket(listener, notif_id, pid, number)
        except ProcessLookupError:
            return errno.ESRCH
        except OSError as exc:
            if exc.errno == errno.EBADF:
                return errno.EBADF
            self._fail(f"connect guard: taking the socket of pid {pid}: {exc}")
            return errno.EPERM
        try:
            try:
                family = _socket_family(fd)
            except OSError as exc:
                return exc.errno or errno.ENOTSOCK
            if family in (socket.AF_INET, socket.AF_INET6):
                where = self._inet_verdict(data)
                if where is not None:
                    return self._refuse(where)
            elif family == socket.AF_UNIX:
                try:
                    data = _unix_address(data, pid)
                except OSError as exc:
                    return exc.errno or errno.EINVAL
            elif family != socket.AF_NETLINK:
                return self._refuse(f"a socket of family {family}")
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            libc = _libc()
            if libc.connect(fd, buf, ctypes.c_uint(len(data))) != 0:
                return ctypes.get_errno() or errno.EIO
            with self._lock:
                self.performed += 1
            return 0
        finally:
            os.close(fd)

    def _inet_verdict(self, data: bytes) -> str | None:
        """None when an inet socket may connect to ``data``, else where it aimed."""
        if len(data) < 2:
            return "a short address"
        family = struct.unpack_from("=H", data)[0]
        if family == _AF_UNSPEC:
            return None  # a disconnect goes nowhere
        address: ipaddress.IPv4Address | ipaddress.IPv6Address
        if family == socket.AF_INET and len(data) >= 8:
            port = struct.unpack_from("!H", data, 2)[0]
            address = ipaddress.IPv4Address(data[4:8])
        elif family == socket.AF_INET6 and len(data) >= 24:
            port = struct.unpack_from("!H", data, 2)[0]
            address = ipaddress.IPv6Address(data[8:24])
            if address.ipv4_mapped is not None:
                address = address.ipv4_mapped
        else:
            return f"an address of family {family}"
        if (address, port) in self._allowed:
            return None
        return f"{address}:{port}" if address.version == 4 else f"[{address}]:{port}"


def _thread_group(tid: int) -> int:
    """The process (thread group) of the thread ``tid`` (ESRCH once it is gone)."""
    try:
        with open(f"/proc/{tid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    raise ProcessLookupError(tid)


def _socket_family(fd: int) -> int:
    """The family of the socket ``fd`` (``ENOTSOCK`` for anything else)."""
    value = socket.socket(fileno=os.dup(fd))
    try:
        return int(value.family)
    finally:
        value.close()


def _unix_address(data: bytes, pid: int) -> bytes:
    """``data`` with a relative path resolved from the task's working directory (the
    supervisor's own is not the task's); abstract and unnamed addresses as given."""
    path = data[2:]
    if not path or path[:1] in (b"\0", b"/"):
        return data
    path = path.split(b"\0", 1)[0]
    resolved = f"/proc/{pid}/cwd/".encode() + path
    if len(resolved) >= _SUN_PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, "a relative unix path too long to resolve")
    return data[:2] + resolved + b"\0"
