"""The seccomp filter of the ``syscalls`` layer, as a classic-BPF program built here.

The bytes returned by :func:`build_filter` are an array of ``struct sock_filter``
(``struct.pack("HBBI", code, jt, jf, k)``, native byte order); give them to
``bwrap --seccomp FD`` or put them in the launcher spec (``LauncherSpec.seccomp_bpf``).

Why an in-house builder instead of libseccomp (or pyseccomp over it):

* no runtime library dependency: ``libseccomp.so`` is not on every host, the Python
  bindings are hard to install into a venv, and a sandbox must not fail to start (or,
  worse, start without the layer) because a shared library is missing;
* deterministic bytes: the same arguments give the same program on every host and
  version, so the filter can be hashed, cached, compared in tests and audited;
* testable: the program is small enough (about 120 instructions) to read, and the tests
  run it against the real kernel.

The seccomp ABI used here (``struct seccomp_data``, ``SECCOMP_RET_*``, the cBPF opcodes
and ``AUDIT_ARCH_*``) has been stable since Linux 3.5.

Policy: default allow; the kernel surface that build tools do not need is refused.

* Architecture: ``seccomp_data.arch`` is checked first; a syscall made through a foreign
  ABI (i386 ``int 0x80`` on x86_64, arm32 compat on aarch64) kills the process, because
  the syscall numbers below mean something else there and ``socketcall`` would bypass
  the ``socket`` rule.  On x86_64 the x32 ABI (``nr >= 0x40000000``) is killed too: x32
  numbers alias the native ones with a bit set, which would skip every rule.
* ``unshare``, ``setns``: EPERM outright.  New namespaces are how a sandboxed process
  rebuilds its own mount view and undoes read-only binds (isolation.md §9.2); build tools
  do not create them.
* ``clone``: EPERM only when a ``CLONE_NEW*`` flag is set in the flags argument (arg0 on
  both x86_64 and aarch64), so ``fork`` and threads keep working.
* ``clone3``: ENOSYS, not EPERM.  Its flags live in a struct behind a pointer that seccomp
  cannot read; ENOSYS makes glibc and musl fall back to ``clone``, which is checked.
* ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API (``fsopen``,
  ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``,
  ``open_tree_attr``, ``mount_setattr``): EPERM; changing the mount topology is the
  container layer's job and never the command's.
* ``keyctl``, ``add_key``, ``request_key``: EPERM; the keyring is shared with the host
  user's session and is a frequent source of kernel bugs.
* ``bpf``, ``perf_event_open``, ``userfaultfd``: EPERM; verifier and perf bugs are a
  classic escape path, and userfaultfd makes kernel races easy to win.
* ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: EPERM; io_uring performs
  operations (for example ``IORING_OP_SOCKET``) without the syscalls being filtered.
* ``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``pidfd_getfd``: EPERM unless
  ``allow_ptrace=True`` (debuggers, ``strace``).  They read and write the memory and
  file descriptors of other processes of the same user.
* ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``, ``swapon``, ``swapoff``, ``reboot``, ``acct``, ``quotactl``,
  ``quotactl_fd``, ``lookup_dcookie``: EPERM; administrative calls that need
  capabilities the sandbox never has — denying them here keeps that true even if a
  capability leaks.
* ``name_to_handle_at``, ``open_by_handle_at``: EPERM; file handles open files by inode
  number and bypass path-based checks (the "shocker" container escape).
* setting a set-user-ID or set-group-ID bit (``chmod``, ``fchmod``, ``fchmodat``,
  ``fchmodat2``, and ``open``/``openat``/``creat``/``mknod``/``mknodat`` with such a mode):
  the bit would survive on the host, where a later run of the file gains its owner's
  privileges (root's, when stockade runs as root). ``openat2`` gets ENOSYS, since its mode
  sits in a struct the filter cannot read, and libcs fall back to ``openat``;
* ``ioctl`` with request ``TIOCSTI`` (0x5412, push bytes into the terminal's input) or
  ``TIOCLINUX`` (0x541C, which can do the same through the console selection): EPERM.
  Only the low 32 bits of the request are compared, because the kernel truncates it to
  ``unsigned int`` (a 64-bit compare is bypassed by setting high bits, CVE-2019-10063).
* ``socket``: an allow-list of families, everything else EPERM.  ``AF_UNIX``,
  ``AF_INET`` and ``AF_INET6`` are what tools use (the network itself is confined by the
  network namespace and the proxy); ``AF_NETLINK`` only with protocol ``NETLINK_ROUTE``
  (arg2 == 0), which glibc's ``getaddrinfo(AI_ADDRCONFIG)``, ``if_nameindex`` and Node's
  ``os.networkInterfaces`` need.  Refused on purpose: ``AF_PACKET`` (raw frames, a
  long CVE history), ``AF_VSOCK`` (reaches the hypervisor host and WSL interop outside
  every namespace), ``AF_KEY``, ``AF_ALG`` (the kernel crypto API has had several
  exploitable bugs and builds do not use it: OpenSSL does not load its afalg engine by
  default), the other netlink protocols (audit, sock_diag, uevent…) and the rare
  families (RDS, TIPC, Bluetooth…) that account for much of the socket CVE history.
  The family and protocol are compared on their low 32 bits (they are ``int``).

EPERM is the one errno for "refused by this layer", so messages from tools point at a
policy rather than at a missing kernel feature; ``clone3`` is the exception above.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

from stockade._record import record

__all__ = [
    "ARCHES",
    "ProcessStatus",
    "build_filter",
    "native_arch",
    "parse_status",
    "verify_status",
]

# cBPF opcodes (linux/filter.h, linux/bpf_common.h).
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
_BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
_BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
_BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00
_BPF_RET_K = 0x06 | 0x00

# Return actions (linux/seccomp.h).
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_EPERM = 1
_ENOSYS = 38

# struct seccomp_data offsets; arguments are u64, and both supported arches are little
# endian, so the low 32 bits of args[i] sit at 16 + 8*i.
_OFF_NR = 0
_OFF_ARCH = 4


def _arg_lo(i: int) -> int:
    return 16 + 8 * i


_X32_SYSCALL_BIT = 0x40000000

_CLONE_NEW_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
# CLONE_NEWTIME (0x80) is not in the mask: for clone() that bit is part of the exit
# signal, and the kernel only accepts CLONE_NEWTIME through unshare and clone3.

#: S_ISUID | S_ISGID: a file the sandbox marks set-id keeps the bit on the host, where a
#: later run of it would gain the owner's (for a root caller: root's) privileges.
_SETID_BITS = 0o6000
#: syscall -> index of its mode argument
_MODE_ARG = {
    "open": 2,
    "creat": 1,
    "chmod": 1,
    "fchmod": 1,
    "mknod": 1,
    "openat": 3,
    "mknodat": 2,
    "fchmodat": 2,
    "fchmodat2": 2,
}

_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_AF_UNIX = 1
_AF_INET = 2
_AF_INET6 = 10
_AF_NETLINK = 16
_NETLINK_ROUTE = 0
_SOCK_TYPE_MASK = 0xF
_SOCK_STREAM = 1
_IPPROTO_TCP = 6
_MSG_FASTOPEN = 0x20000000
#: flags argument of sendto, sendmsg and sendmmsg
_SEND_FLAGS_ARG = {"sendto": 3, "sendmsg": 2, "sendmmsg": 3}
_BPF_ALU_AND_K = 0x04 | 0x50 | 0x00


@record
class _Arch:
    audit_arch: int
    x32_check: bool
    nr: dict[str, int]


# Syscall numbers from asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64).
ARCHES: dict[str, _Arch] = {
    "x86_64": _Arch(
        audit_arch=0xC000003E,
        x32_check=True,
        nr={
            "open": 2,
            "creat": 85,
            "chmod": 90,
            "fchmod": 91,
            "mknod": 133,
            "openat": 257,
            "mknodat": 259,
            "fchmodat": 268,
            "openat2": 437,
            "fchmodat2": 452,
            "ioctl": 16,
            "socket": 41,
            "sendto": 44,
            "sendmsg": 46,
            "sendmmsg": 307,
            "clone": 56,
            "ptrace": 101,
            "pivot_root": 155,
            "chroot": 161,
            "acct": 163,
            "mount": 165,
            "umount2": 166,
            "swapon": 167,
            "swapoff": 168,
            "reboot": 169,
            "init_module": 175,
            "delete_module": 176,
            "quotactl": 179,
            "lookup_dcookie": 212,
            "kexec_load": 246,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "unshare": 272,
            "perf_event_open": 298,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "finit_module": 313,
            "kexec_file_load": 320,
            "bpf": 321,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "clone3": 435,
            "pidfd_getfd": 438,
            "mount_setattr": 442,
            "quotactl_fd": 443,
            "open_tree_attr": 467,
        },
    ),
    "aarch64": _Arch(
        audit_arch=0xC00000B7,
        x32_check=False,
        nr={
            "lookup_dcookie": 18,
            "mknodat": 33,
            "fchmod": 52,
            "fchmodat": 53,
            "openat": 56,
            "openat2": 437,
            "fchmodat2": 452,
            "ioctl": 29,
            "umount2": 39,
            "mount": 40,
            "pivot_root": 41,
            "chroot": 51,
            "quotactl": 60,
            "acct": 89,
            "unshare": 97,
            "kexec_load": 104,
            "init_module": 105,
            "delete_module": 106,
            "ptrace": 117,
            "reboot": 142,
            "socket": 198,
            "sendto": 206,
            "sendmsg": 211,
            "sendmmsg": 269,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "clone": 220,
            "swapon": 224,
            "swapoff": 225,
            "perf_event_open": 241,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "setns": 268,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "finit_module": 273,
            "bpf": 280,
            "userfaultfd": 282,
            "kexec_file_load": 294,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "clone3": 435,
            "pidfd_getfd": 438,
            "mount_setattr": 442,
            "quotactl_fd": 443,
            "open_tree_attr": 467,
        },
    ),
}

# Refused with EPERM whatever the arguments.
_DENY_ALWAYS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "name_to_handle_at",
    "open_by_handle_at",
)
_PTRACE_FAMILY = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd")


def native_arch() -> str:
    """Return this machine's architecture name as used in :data:`ARCHES`."""
    machine = os.uname().machine  # platform.machine() would cost an import of platform
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _ret(action: int) -> bytes:
    return _insn(_BPF_RET_K, 0, 0, action)


def _load(offset: int) -> bytes:
    return _insn(_BPF_LD_W_ABS, 0, 0, offset)


def _block(nr: int, body: list[bytes]) -> Iterator[bytes]:
    """``if nr == NR: body`` — body must end in a return (it never falls through)."""
    if len(body) > 255:
        raise ValueError("seccomp block longer than a cBPF jump can skip")
    yield _insn(_BPF_JMP_JEQ_K, 0, len(body), nr)
    yield from body


def build_filter(
    *,
    allow_ptrace: bool = False,
    arch: str | None = None,
    no_netns: bool = False,
    net_only: bool = False,
    guard: bool = False,
) -> bytes:
    """Build the syscalls-layer seccomp program for ``arch`` (default: this machine).

    Returns ``struct sock_filter[]`` bytes in native byte order, ready for
    ``seccomp(SECCOMP_SET_MODE_FILTER)`` or ``bwrap --seccomp FD``.  ``allow_ptrace``
    keeps ``ptrace``, ``process_vm_readv/writev`` and ``pidfd_getfd`` available (for
    debuggers).  ``no_netns`` is for the landlock backend, which has no network
    namespace: an ``AF_INET``/``AF_INET6`` socket may then only be TCP (``SOCK_STREAM``
    with protocol 0 or ``IPPROTO_TCP``), the one protocol Landlock's network rules
    confine (no UDP, so no DNS of its own; no raw, ICMP, SCTP or MPTCP sockets), and
    ``sendto``/``sendmsg``/``sendmmsg`` with ``MSG_FASTOPEN`` (a connect that is not a
    ``connect()``) are refused.  Raises ``ValueError`` for an architecture other than
    x86_64 or aarch64.  ``net_only`` keeps the architecture check and the
    ``no_netns`` rules alone (the egress layer's part, with the syscalls layer off).
    """
    name = arch if arch is not None else native_arch()
    spec = ARCHES.get(name)
    if spec is None:
        raise ValueError(
            f"seccomp filter: architecture {name!r} is not supported "
            f"(supported: {', '.join(sorted(ARCHES))}); use --disable syscalls"
        )
    deny = _ret(_RET_ERRNO | _EPERM)
    allow = _ret(_RET_ALLOW)
    kill = _ret(_RET_KILL_PROCESS)
    prog: list[bytes] = [
        # A syscall through a foreign ABI has other numbers: kill rather than misjudge.
        _load(_OFF_ARCH),
        _insn(_BPF_JMP_JEQ_K, 1, 0, spec.audit_arch),
        kill,
        _load(_OFF_NR),
    ]
    if spec.x32_check:
        # x32 syscalls are native numbers | 0x40000000; none of them may pass.
        prog += [_insn(_BPF_JMP_JGE_K, 0, 1, _X32_SYSCALL_BIT), kill]

    if guard and not no_netns:
        raise ValueError("seccomp filter: guard needs no_netns")
    if net_only:
        if not no_netns:
            raise ValueError("seccomp filter: net_only needs no_netns")
        if guard:
            for syscall_name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
                prog += _block(spec.nr[syscall_name], [deny])
        prog += _net_rules(spec, deny, allow)
        prog.append(allow)
        return b"".join(prog)
    names = list(_DENY_ALWAYS)
    if not allow_ptrace:
        names += _PTRACE_FAMILY
    for syscall_name in names:
        prog += _block(spec.nr[syscall_name], [deny])
    prog += _block(spec.nr["clone3"], [_ret(_RET_ERRNO | _ENOSYS)])
    # openat2 passes its mode inside a struct the filter cannot read: ENOSYS makes libcs
    # and runtimes fall back to openat, whose mode it can.
    prog += _block(spec.nr["openat2"], [_ret(_RET_ERRNO | _ENOSYS)])
    # No set-user-ID or set-group-ID bit on any file, made or changed.
    for syscall_name, index in _MODE_ARG.items():
        if syscall_name in spec.nr:
            prog += _block(
                spec.nr[syscall_name],
                [_load(_arg_lo(index)), _insn(_BPF_JMP_JSET_K, 0, 1, _SETID_BITS), deny, allow],
            )

    # clone: refuse only namespace-creating flags; fork and threads pass.
    prog += _block(
        spec.nr["clone"],
        [_load(_arg_lo(0)), _insn(_BPF_JMP_JSET_K, 0, 1, _CLONE_NEW_FLAGS), deny, allow],
    )
    # ioctl: compare the low 32 bits of the request (the kernel truncates it).
    prog += _block(
        spec.nr["ioctl"],
        [
            _load(_arg_lo(1)),
            _insn(_BPF_JMP_JEQ_K, 2, 0, _TIOCSTI),
            _insn(_BPF_JMP_JEQ_K, 1, 0, _TIOCLINUX),
            allow,
            deny,
        ],
    )
    if no_netns:
        prog += _net_rules(spec, deny, allow)
    # socket: an allow-list of families; netlink only for NETLINK_ROUTE.
    prog += _block(
        spec.nr["socket"],
        [
            _load(_arg_lo(0)),
            _insn(_BPF_JMP_JEQ_K, 5, 0, _AF_UNIX),
            _insn(_BPF_JMP_JEQ_K, 4, 0, _AF_INET),
            _insn(_BPF_JMP_JEQ_K, 3, 0, _AF_INET6),
            _insn(_BPF_JMP_JEQ_K, 0, 3, _AF_NETLINK),
            _load(_arg_lo(2)),
            _insn(_BPF_JMP_JEQ_K, 0, 1, _NETLINK_ROUTE),
            allow,
            deny,
        ],
    )
    prog.append(allow)
    return b"".join(prog)


def _net_rules(spec: _Arch, deny: bytes, allow: bytes) -> list[bytes]:
    """The ``no_netns`` rules: no ``MSG_FASTOPEN``; an inet socket is TCP alone (the
    protocol whose ``connect()`` Landlock's rule confines); the families as without."""
    prog: list[bytes] = []
    for name, index in _SEND_FLAGS_ARG.items():
        prog += _block(
            spec.nr[name],
            [_load(_arg_lo(index)), _insn(_BPF_JMP_JSET_K, 0, 1, _MSG_FASTOPEN), deny, allow],
        )
    prog += _block(
        spec.nr["socket"],
        [
            _load(_arg_lo(0)),
            _insn(_BPF_JMP_JEQ_K, 11, 0, _AF_UNIX),  # -> allow
            _insn(_BPF_JMP_JEQ_K, 4, 0, _AF_INET),  # -> inet
            _insn(_BPF_JMP_JEQ_K, 3, 0, _AF_INET6),  # -> inet
            _insn(_BPF_JMP_JEQ_K, 0, 9, _AF_NETLINK),  # else deny
            _load(_arg_lo(2)),
            _insn(_BPF_JMP_JEQ_K, 6, 7, _NETLINK_ROUTE),
            # inet: the type without SOCK_NONBLOCK/SOCK_CLOEXEC, then the protocol
            _load(_arg_lo(1)),
            _insn(_BPF_ALU_AND_K, 0, 0, _SOCK_TYPE_MASK),
            _insn(_BPF_JMP_JEQ_K, 0, 4, _SOCK_STREAM),
            _load(_arg_lo(2)),
            _insn(_BPF_JMP_JEQ_K, 1, 0, 0),
            _insn(_BPF_JMP_JEQ_K, 0, 1, _IPPROTO_TCP),
            allow,
            deny,
        ],
    )
    return prog


@record
class ProcessStatus:
    """The confinement-related fields of ``/proc/<pid>/status``."""

    no_new_privs: bool
    #: 0 disabled, 1 strict, 2 filter.
    seccomp_mode: int
    #: Number of stacked filters (``Seccomp_filters``); 0 when the kernel does not say.
    seccomp_filters: int
    cap_eff: int
    cap_prm: int
    cap_amb: int

    @property
    def confined(self) -> bool:
        """True when no_new_privs is set, a filter is active and no capability is left."""
        return (
            self.no_new_privs
            and self.seccomp_mode == 2
            and not (self.cap_eff or self.cap_prm or self.cap_amb)
        )


def parse_status(text: str) -> dict[str, str]:
    """Parse ``/proc/<pid>/status`` text into ``{key: value}`` (values stripped)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def verify_status(pid: int | str = "self", *, text: str | None = None) -> ProcessStatus:
    """Read (or take ``text`` of) ``/proc/<pid>/status`` and return its confinement fields.

    Raises ``ValueError`` when a field the check needs is missing (a kernel without
    seccomp support, or not a status file).
    """
    if text is None:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            text = f.read()
    fields = parse_status(text)
    try:
        return ProcessStatus(
            no_new_privs=fields["NoNewPrivs"] == "1",
            seccomp_mode=int(fields["Seccomp"]),
            seccomp_filters=int(fields.get("Seccomp_filters", "0")),
            cap_eff=int(fields["CapEff"], 16),
            cap_prm=int(fields["CapPrm"], 16),
            cap_amb=int(fields["CapAmb"], 16),
        )
    except KeyError as e:
        raise ValueError(f"/proc/{pid}/status has no {e.args[0]} line") from e
