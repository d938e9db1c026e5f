"""The learn mode's file observer: seccomp user notification, watched from the host.

A learning run (``stockade learn``) must see which files the task opens outside the
workspace and which programs it executes, without refusing any of it. This host offers
three mechanisms; this module is the one that works for root *and* for an unprivileged
user, so it is the one stockade uses (``stockade doctor`` names it):

* Landlock's audit records (ABI 7) need ``CAP_AUDIT_READ`` and the netlink audit socket:
  root only.
* fanotify (``FAN_OPEN``/``FAN_OPEN_EXEC``/``FAN_MODIFY`` on mount marks) needs
  ``CAP_SYS_ADMIN`` in the initial user namespace: root only.
* seccomp user notification needs nothing but ``no_new_privs``: the inner launcher
  (``_launcher.c``, spec records ``F`` and ``P``) loads :func:`build_filter`'s program
  with ``SECCOMP_FILTER_FLAG_NEW_LISTENER`` as its last step (after Landlock, stockade's
  own filter and their verification, so none of its own probes is seen), sends the
  listener descriptor to the host over an inherited unix socket and closes it (the
  command never holds it). :class:`SyscallObserver` receives it and answers every
  notification with ``SECCOMP_USER_NOTIF_FLAG_CONTINUE``: the kernel then runs the
  system call as if no filter had asked, so stockade's own filter and Landlock still
  decide it (an ``ERRNO`` of stockade's filter outranks ``USER_NOTIF`` whatever the order).

The path argument is read from ``/proc/PID/mem`` *after* the notification and *before*
the call continues; another thread of the task could change it in between (the
time-of-check/time-of-use race seccomp notification is known for). That is acceptable
here and only here: the observer never decides anything, it only records what a learning
run touched, and what it records is untrusted input to ``stockade policy suggest``, which
a person reviews and ``stockade policy verify`` re-checks by running the task again under
the enforcing layers.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass, field

from stockade.enforce.seccomp import ARCHES, native_arch

__all__ = ["MECHANISM", "Observation", "SyscallObserver", "available", "build_filter"]

#: what ``stockade doctor`` prints as this host's learn-mode file observer
MECHANISM = "seccomp user notification (openat/openat2/open/execve/execveat, observed only)"

# linux/seccomp.h
_RET_ALLOW = 0x7FFF0000
_RET_USER_NOTIF = 0x7FC00000
_FLAG_CONTINUE = 1
# _IOWR('!', 0, struct seccomp_notif) (80 bytes), _IOWR('!', 1, struct seccomp_notif_resp)
_IOCTL_RECV = 0xC0502100
_IOCTL_SEND = 0xC0182101
_NOTIF = struct.Struct("=QII iIQ 6Q")
_RESP = struct.Struct("=QqiI")

# cBPF (linux/filter.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06
_OFF_NR = 0
_OFF_ARCH = 4

_O_ACCMODE = 0o3
_O_CREAT = 0o100
_O_TRUNC = 0o1000
_AT_FDCWD = -100
_PATH_MAX = 4096

#: observed calls: name → (index of the path argument, index of the flags argument or
#: None for an exec, True when the path is relative to a dirfd in argument 0)
_WATCHED: dict[str, tuple[int, int | None, bool]] = {
    "open": (0, 1, False),
    "openat": (1, 2, True),
    "openat2": (1, -1, True),  # flags are the first u64 of struct open_how at arg 2
    "execve": (0, None, False),
    "execveat": (1, None, True),
}
_EXTRA_NR: dict[str, dict[str, int]] = {
    "x86_64": {"execve": 59, "execveat": 322},
    "aarch64": {"execve": 221, "execveat": 281},
}


def _numbers(arch: str) -> dict[int, str]:
    table = {**ARCHES[arch].nr, **_EXTRA_NR[arch]}
    return {table[name]: name for name in _WATCHED if name in table}


def available() -> tuple[bool, str]:
    """Whether this kernel offers seccomp user notification (``user_notif`` among the
    actions), and a one-line reason when it does not."""
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail", encoding="ascii") as handle:
            actions = handle.read().split()
    except OSError:
        return False, "no /proc/sys/kernel/seccomp/actions_avail (kernel without seccomp)"
    if "user_notif" not in actions:
        return False, "the kernel has no seccomp user notification (Linux 5.5+ needed)"
    return True, ""


def build_filter(arch: str | None = None) -> bytes:
    """The observer's classic-BPF program: ``USER_NOTIF`` for the watched calls of the
    native architecture, ``ALLOW`` for everything else (stockade's own filter, loaded
    after it, refuses foreign architectures and the dangerous calls)."""
    arch = arch or native_arch()
    return notify_program(arch, sorted(_numbers(arch)))


def notify_program(arch: str, numbers: list[int]) -> bytes:
    """A classic-BPF program that answers ``USER_NOTIF`` for the system calls
    ``numbers`` of ``arch`` and ``ALLOW`` for every other call (another architecture's
    too: stockade's own filter refuses those). Shared by the observer and the landlock
    backend's connect guard (:mod:`stockade.enforce.netguard`)."""
    spec = ARCHES[arch]

    def insn(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    out = [insn(_LD_W_ABS, 0, 0, _OFF_ARCH), insn(_JEQ_K, 1, 0, spec.audit_arch)]
    out.append(insn(_RET_K, 0, 0, _RET_ALLOW))
    out.append(insn(_LD_W_ABS, 0, 0, _OFF_NR))
    for i, nr in enumerate(numbers):
        # jump to the USER_NOTIF return (after the remaining tests and the ALLOW)
        out.append(insn(_JEQ_K, len(numbers) - i, 0, nr))
    out.append(insn(_RET_K, 0, 0, _RET_ALLOW))
    out.append(insn(_RET_K, 0, 0, _RET_USER_NOTIF))
    return b"".join(out)


def receive_listener(host: socket.socket, stop: threading.Event) -> tuple[int | None, str | None]:
    """Wait on ``host`` for the listener descriptor the launcher sends (``F`` record),
    until ``stop`` is set: ``(fd, None)``, or ``(None, why)`` when none came."""
    fds = array.array("i")
    while not stop.is_set():
        ready, _, _ = select.select([host], [], [], 0.1)
        if not ready:
            continue
        try:
            _, ancdata, _, _ = host.recvmsg(1, socket.CMSG_SPACE(fds.itemsize))
        except OSError as exc:
            return None, f"receiving the listener: {exc}"
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        # more than one descriptor is not the launcher's message: keep none of them
        for extra in fds[1:]:
            os.close(extra)
        return (fds[0], None) if fds else (None, "no listener in the launcher's message")
    return None, None


@dataclass(frozen=True, slots=True)
class Observation:
    """One distinct thing the task did: ``kind`` is ``read``, ``write`` or ``exec``;
    ``path`` as the task named it, made absolute against its working directory or
    directory descriptor (the sandbox's view, which for bound paths is the host's)."""

    kind: str
    path: str


@dataclass
class SyscallObserver:
    """The host side of the learn mode's file observer (see the module docstring).

    Give :attr:`child_fd` to the sandbox (``pass_fds``) and :meth:`launcher_fields` to the
    launcher spec, call :meth:`start` before the sandbox starts and :meth:`stop` after it
    ended; :attr:`seen` then maps each :class:`Observation` to how often it happened.
    """

    arch: str = field(default_factory=native_arch)
    seen: dict[Observation, int] = field(default_factory=dict)
    #: notifications answered (a count of observed calls, repeats included)
    calls: int = 0
    #: True once the launcher handed the listener over
    attached: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        self._host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._child = child
        self.child_fd = child.fileno()
        os.set_inheritable(self.child_fd, True)
        self.program = build_filter(self.arch)
        self._names = _numbers(self.arch)
        self._stop = threading.Event()
        self._mem: dict[int, int] = {}
        self._thread = threading.Thread(target=self._serve, name="stockade-observer", daemon=True)

    def start(self) -> None:
        """Start the thread that receives the listener and answers notifications."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching (the sandbox has ended) and close every descriptor."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._child.close()
        self._host.close()

    def _serve(self) -> None:
        listener = self._receive()
        if listener is None:
            return
        self.attached = True
        buf = bytearray(_NOTIF.size)
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
                    # the kernel refuses (EINVAL) a receive buffer that is not zeroed
                    buf[:] = bytes(_NOTIF.size)
                    try:
                        fcntl.ioctl(listener, _IOCTL_RECV, buf, True)
                    except OSError as exc:
                        # ENOENT: the task died between poll and receive
                        if exc.errno in (errno.ENOENT, errno.EINTR):
                            continue
                        raise
                    notif_id = self._handle(bytes(buf))
                    try:
                        fcntl.ioctl(listener, _IOCTL_SEND, _RESP.pack(notif_id, 0, 0, 1))
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
                elif mask & (select.POLLHUP | select.POLLERR):
                    return  # every task of the filter has exited
        except OSError as exc:
            self.error = f"observer: {exc}"
        finally:
            os.close(listener)
            for fd in self._mem.values():
                os.close(fd)
            self._mem.clear()

    def _receive(self) -> int | None:
        """Wait for the launcher's listener descriptor (or the end of the run)."""
        fd, why = receive_listener(self._host, self._stop)
        if why is not None:
            self.error = f"observer: {why}"
        return fd

    def _handle(self, raw: bytes) -> int:
        notif_id, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(raw)
        self.calls += 1
        name = self._names.get(nr)
        if name is None:
            return int(notif_id)
        path_arg, flags_arg, relative = _WATCHED[name]
        path = _read_string(self._mem, pid, args[path_arg])
        if path is None:
            return int(notif_id)
        if not path.startswith("/"):
            if relative and _signed32(args[0]) != _AT_FDCWD:
                base = _readlink(f"/proc/{pid}/fd/{_signed32(args[0])}")
            else:
                base = _readlink(f"/proc/{pid}/cwd")
            if base is None:
                return int(notif_id)
            path = os.path.join(base, path)
        path = os.path.normpath(path)
        if flags_arg is None:
            kind = "exec"
        else:
            flags = _read_u64(self._mem, pid, args[2]) if flags_arg == -1 else args[flags_arg]
            writes = (flags or 0) & _O_ACCMODE or (flags or 0) & (_O_CREAT | _O_TRUNC)
            kind = "write" if writes else "read"
        key = Observation(kind, path)
        self.seen[key] = self.seen.get(key, 0) + 1
        return int(notif_id)


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


#: how many /proc/PID/mem descriptors an observer keeps open (a notification costs a
#: round trip to its thread: an open and a close less per call is a tenth of it)
_MEM_MAX = 256


def _mem_fd(mem: dict[int, int], pid: int, fresh: bool = False) -> int | None:
    fd = mem.pop(pid, None)
    if fd is not None and fresh:
        os.close(fd)
        fd = None
    if fd is None:
        if len(mem) >= _MEM_MAX:
            for old in list(mem):
                os.close(mem.pop(old))
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    mem[pid] = fd
    return fd


def _read_mem(cache: dict[int, int], pid: int, address: int, size: int) -> bytes | None:
    if not address:
        return None
    for fresh in (False, True):
        # a cached descriptor of an exited task (its pid reused, or an exec that
        # replaced its memory) reads nothing: open it again, once
        fd = _mem_fd(cache, pid, fresh)
        if fd is None:
            return None
        out = b""
        while len(out) < size:
            # the string may end close to the end of a mapping: a page at a time
            want = min(size - len(out), 4096 - (address + len(out)) % 4096)
            try:
                chunk = os.pread(fd, want, address + len(out))
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if b"\0" in chunk:
                break
        if out:
            return out
    return None


def _read_string(cache: dict[int, int], pid: int, address: int) -> str | None:
    raw = _read_mem(cache, pid, address, _PATH_MAX)
    if raw is None:
        return None
    end = raw.find(b"\0")
    if end < 0:
        return None
    return raw[:end].decode("utf-8", "surrogateescape") or None


def _read_u64(cache: dict[int, int], pid: int, address: int) -> int | None:
    raw = _read_mem(cache, pid, address, 8)
    if raw is None or len(raw) < 8:
        return None
    return int(struct.unpack("=Q", raw[:8])[0])
