"""Landlock detection and the ABI table (the launcher applies the ruleset, not Python).

Landlock restricts file access by inode hierarchy, so mount tricks and links cannot
route around it; it is the ``files`` layer.  This module only answers "which ABI does
the kernel offer" and "what does each ABI add", for the runtime's fail-closed checks and
for ``stockade doctor``.
"""

from __future__ import annotations

from stockade._record import record

__all__ = [
    "ABI_FEATURES",
    "AbiFeature",
    "abi_version",
    "describe",
    "missing_for",
]

_SYS_LANDLOCK_CREATE_RULESET = 444  # same number on x86_64 and aarch64
_LANDLOCK_CREATE_RULESET_VERSION = 1 << 0


@record
class AbiFeature:
    """What one Landlock ABI version added, and what stockade uses it for."""

    abi: int
    kernel: str
    adds: str
    stockade_use: str


ABI_FEATURES: tuple[AbiFeature, ...] = (
    AbiFeature(
        1,
        "5.13",
        "filesystem rights: execute, read/write files, read dirs, remove, make "
        "char/dir/reg/sock/fifo/block/sym",
        "read-only system paths and a writable workspace; cross-directory rename "
        "and link are always refused",
    ),
    AbiFeature(
        2,
        "5.19",
        "REFER: rename and link across directories",
        "renames between directories inside the workspace work",
    ),
    AbiFeature(
        3,
        "6.2",
        "TRUNCATE",
        "truncate() outside the workspace is refused (before ABI 3 it is uncontrolled)",
    ),
    AbiFeature(
        4,
        "6.7",
        "network: bind/connect TCP by port",
        "the landlock backend (no network namespace): connect() only to the proxy's "
        "port; below it, the connect guard (seccomp user notification) instead",
    ),
    AbiFeature(
        5,
        "6.10",
        "IOCTL_DEV: ioctl on device files",
        "device ioctls only on devices listed as writable (e.g. /dev/tty)",
    ),
    AbiFeature(
        6,
        "6.12",
        "scopes: abstract unix sockets and signals limited to the sandbox's domain",
        "no connecting to host abstract sockets, no signalling host processes",
    ),
    AbiFeature(
        7,
        "6.15",
        "audit logging flags for restrict_self",
        "not used: the kernel's default logging applies",
    ),
)


def abi_version() -> int:
    """Return the Landlock ABI version the running kernel offers, or 0 if it has none.

    0 covers a kernel without ``CONFIG_SECURITY_LANDLOCK`` (ENOSYS), Landlock missing
    from the ``lsm=`` boot list (EOPNOTSUPP) and a seccomp filter that refuses the call.
    """
    import ctypes  # lazy: keep the package cheap to import

    from stockade._libc import libc as _libc

    libc = _libc()
    abi = libc.syscall(
        ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
        ctypes.c_void_p(None),
        ctypes.c_size_t(0),
        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(abi), 0)


def missing_for(abi: int, *, scope: bool = True) -> str | None:
    """Say what the ``files`` layer lacks at ``abi``, or ``None`` if it has everything.

    ABI 0 means the layer cannot be applied at all; ``scope`` asks for ABI 6.
    """
    if abi < 1:
        return (
            "Landlock (kernel 5.13+ with CONFIG_SECURITY_LANDLOCK and landlock in lsm=); "
            "use --disable files to run without it"
        )
    if scope and abi < 6:
        return (
            f"Landlock scopes (ABI 6, Linux 6.12; this kernel has ABI {abi}); "
            "upgrade the kernel or turn off the scope option"
        )
    return None


def describe(abi: int | None = None) -> list[str]:
    """Return one line per known ABI, marked present or absent, for ``stockade doctor``."""
    current = abi_version() if abi is None else abi
    return [
        f"[{'x' if f.abi <= current else ' '}] ABI {f.abi} (Linux {f.kernel}): {f.adds} "
        f"- {f.stockade_use}"
        for f in ABI_FEATURES
    ]
