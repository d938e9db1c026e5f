"""Probes run inside the sandbox: ``python3 _probe.py NAME [ARG...]``.

Each probe attempts one kernel operation and prints one token: ``ok`` when it
succeeded, otherwise the errno name (``EPERM``, ``ENOSYS``…).  It runs under the
system interpreter, with only the standard library, as the sandboxed user.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import sys
import threading
from collections.abc import Callable

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 and aarch64 numbers for the syscalls probed through syscall(2).
_NR = {
    "x86_64": {
        "clone3": 435,
        "io_uring_setup": 425,
        "bpf": 321,
        "keyctl": 250,
        "ptrace": 101,
        "userfaultfd": 323,
        "perf_event_open": 298,
        "name_to_handle_at": 303,
        "ioctl": 16,
        "getpid": 39,
        "process_vm_readv": 310,
    },
    "aarch64": {
        "clone3": 435,
        "io_uring_setup": 425,
        "bpf": 280,
        "keyctl": 219,
        "ptrace": 117,
        "userfaultfd": 282,
        "perf_event_open": 241,
        "name_to_handle_at": 264,
        "ioctl": 29,
        "getpid": 172,
        "process_vm_readv": 270,
    },
}[os.uname().machine]


def _sys(name: str, *args: object) -> int:
    cargs = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(_NR[name]), *cargs)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r)


def _ret(r: int) -> None:
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def unshare(flags: str) -> None:
    _ret(libc.unshare(ctypes.c_int(int(flags, 0))))


def mount() -> None:
    _ret(libc.mount(b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None))


def clone3() -> None:
    # size 0 is invalid: a reachable clone3 says EINVAL, a filtered one ENOSYS.
    buf = ctypes.create_string_buffer(88)
    _sys("clone3", buf, 0)


def fork_and_thread() -> None:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(1))
    t.start()
    t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    if out != [1] or os.waitstatus_to_exitcode(status) != 7:
        raise OSError(errno.EIO, "thread or fork misbehaved")


def io_uring_setup() -> None:
    params = ctypes.create_string_buffer(120)
    os.close(_sys("io_uring_setup", 1, params))


def bpf(cmd: str = "9999") -> None:
    attr = ctypes.create_string_buffer(128)
    _sys("bpf", int(cmd), attr, 128)


def keyctl() -> None:
    # KEYCTL_GET_KEYRING_ID(KEY_SPEC_SESSION_KEYRING, create=1)
    _sys("keyctl", 0, -3, 1)


def ptrace_traceme() -> None:
    _sys("ptrace", 0, 0, 0, 0)


def process_vm_readv() -> None:
    buf = ctypes.create_string_buffer(8)
    src = ctypes.create_string_buffer(b"abcdefg")
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(ctypes.cast(src, ctypes.c_void_p), 8)
    _sys("process_vm_readv", os.getpid(), local, 1, remote, 1, 0)


def userfaultfd() -> None:
    os.close(_sys("userfaultfd", 1 | os.O_CLOEXEC))  # UFFD_USER_MODE_ONLY


def name_to_handle_at() -> None:
    handle = ctypes.create_string_buffer(8 + 128)
    ctypes.c_uint.from_buffer(handle).value = 128
    mount_id = ctypes.c_int()
    _sys("name_to_handle_at", -100, ctypes.c_char_p(b"/usr"), handle, ctypes.byref(mount_id), 0)


def tiocsti(request: str = "0x5412") -> None:
    """Make a fresh pty our controlling terminal, then push a byte into its input."""
    _master, slave = os.openpty()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setsid()
            fcntl.ioctl(slave, 0x540E, 0)  # TIOCSCTTY
            ch = ctypes.c_char(b"x")
            _sys("ioctl", slave, ctypes.c_ulong(int(request, 0)), ctypes.byref(ch))
        except OSError as e:
            code = e.errno or 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise OSError(code, os.strerror(code))


def tiocgwinsz() -> None:
    _master, slave = os.openpty()
    fcntl.ioctl(slave, 0x5413, b"\0" * 8)  # TIOCGWINSZ


def sock(family: str, type_: str = "1", proto: str = "0") -> None:
    socket.socket(int(family), int(type_), int(proto)).close()


def x32_getpid() -> None:
    libc.syscall(ctypes.c_long(0x40000000 | _NR["getpid"]))


def mknod_char(path: str) -> None:
    os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))


def mkfifo(path: str) -> None:
    os.mkfifo(path)


def abstract_connect(name: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.connect("\0" + name)
    s.close()


def abstract_inside() -> None:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(f"\0stockade-inside-{os.getpid()}")
    srv.listen(1)
    cli = socket.socket(socket.AF_UNIX)
    cli.connect(srv.getsockname())
    conn, _ = srv.accept()
    cli.sendall(b"hi")
    if conn.recv(2) != b"hi":
        raise OSError(errno.EIO, "no data")


def read(path: str) -> None:
    with open(path, "rb") as f:
        f.read()


def write(path: str) -> None:
    with open(path, "w") as f:
        f.write("written\n")


def link(src: str, dst: str) -> None:
    os.link(src, dst)


def rename(src: str, dst: str) -> None:
    os.rename(src, dst)


def truncate(path: str) -> None:
    os.truncate(path, 0)


def kill(pid: str) -> None:
    os.kill(int(pid), 15)


def kill_child() -> None:
    pid = os.fork()
    if pid == 0:
        import time

        time.sleep(30)
        os._exit(0)
    os.kill(pid, 15)
    os.waitpid(pid, 0)


PROBES: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (
        unshare,
        mount,
        clone3,
        fork_and_thread,
        io_uring_setup,
        bpf,
        keyctl,
        ptrace_traceme,
        process_vm_readv,
        userfaultfd,
        name_to_handle_at,
        tiocsti,
        tiocgwinsz,
        sock,
        x32_getpid,
        mknod_char,
        mkfifo,
        abstract_connect,
        abstract_inside,
        kill,
        kill_child,
        read,
        write,
        link,
        rename,
        truncate,
    )
}


def main() -> None:
    name, *args = sys.argv[1:]
    try:
        PROBES[name](*args)
    except OSError as e:
        print(errno.errorcode.get(e.errno or 0, str(e.errno)))
        return
    print("ok")


if __name__ == "__main__":
    main()
