"""Build, find and feed the inner launcher (``_launcher.c``).

The launcher is a small C program that bubblewrap (or the runtime directly) execs as
``LAUNCHER SPEC_FD -- CMD ARGS...``.  It reads a :class:`LauncherSpec` from ``SPEC_FD``,
checks that no capability is left, sets no_new_privs, applies Landlock, loads the
seccomp filter, verifies all of it, closes inherited fds and execs the command.  See the
header of ``_launcher.c`` for the byte format, which :func:`serialize` produces.

Typical use::

    spec = LauncherSpec(read_paths=("/usr", "/etc"), write_paths=(ws,), landlock=True,
                        scope=True, seccomp_bpf=seccomp.build_filter(),
                        seccomp_expected=True, deny_probe="/")
    prefix, fd = prepare(spec)
    try:
        subprocess.run([*bwrap_argv, *prefix, *command], pass_fds=(fd,))
    finally:
        os.close(fd)

This module is stdlib-only and imports nothing heavy: it runs on every ``stockade run``.
"""

from __future__ import annotations

from pathlib import Path

from stockade import _build
from stockade._memfd import sealed_memfd
from stockade._record import record

__all__ = [
    "SPEC_MAGIC",
    "LauncherSpec",
    "build_launcher",
    "launcher_path",
    "prepare",
    "serialize",
]

SPEC_MAGIC = b"stockade-spec/1"
_SOURCE_NAME = "_launcher.c"
_BPF_INSN_SIZE = 8
_MAX_BPF_INSNS = 4096


@record
class LauncherSpec:
    """What the launcher applies before exec.

    ``read_paths`` get read+execute, ``write_paths`` every handled Landlock right
    (absolute paths; a missing path is skipped by the launcher).  ``landlock`` applies
    the ruleset; ``scope`` adds the ABI 6 scopes (abstract unix sockets, signals) and
    fails closed on an older kernel.  ``seccomp_bpf`` is a program to load (``None`` when
    bwrap loads it with ``--seccomp FD``); ``seccomp_expected`` makes the launcher verify
    ``Seccomp: 2`` either way.  ``deny_probe`` is a path outside every allowed path that
    must then fail to open with EACCES; without one the launcher probes ``"/"`` unless a
    rule names ``/`` itself (then the ruleset's effect is not verified).
    Devices that need ioctls (``/dev/tty``, ``/dev/pts``) belong in ``write_paths``: read
    paths do not get ``IOCTL_DEV``.
    """

    read_paths: tuple[str, ...] = ()
    write_paths: tuple[str, ...] = ()
    landlock: bool = True
    scope: bool = True
    seccomp_bpf: bytes | None = None
    seccomp_expected: bool = False
    deny_probe: str | None = None
    debug: bool = False
    #: rlimits set as soft and hard limit: "nproc", "as", "data", "fsize", "cpu", "nofile", "core"
    rlimits: tuple[tuple[str, int], ...] = ()
    #: make stdin (the sandbox's own pty) the controlling terminal of a new session
    ctty: bool = False
    #: give up every capability first (the container layer is off and the caller is root)
    drop_caps: bool = False
    #: mounts the launcher makes first, in order, as (kind, path): "k" pins a directory
    #: (binds it onto itself), "b" binds a path onto itself read-only, "n" masks a file
    #: with /dev/null, "t" masks a directory with an empty read-only tmpfs. It needs
    #: CAP_SYS_ADMIN and CAP_SETPCAP in its user namespace for them, gives up every
    #: capability after them, and refuses them without Landlock (see _launcher.c);
    #: "o" mounts an overlay over the path (the path is its lower layer) whose upper and
    #: work directories are in ``overlay_layer`` (it needs CAP_DAC_OVERRIDE too), or in
    #: the directory of the last "u" record before it (a learning run's scratch views)
    mounts: tuple[tuple[str, str], ...] = ()
    #: the command's environment, as (name, value) pairs: the launcher execs with exactly
    #: these instead of its own environment. Given when the launcher starts on the host
    #: (no bubblewrap around it): it is then started with stockade's fixed host
    #: environment, so that nothing of the command's (an ``LD_PRELOAD`` of the policy's
    #: ``env.set``) is loaded before Landlock and seccomp are in place. None: inherit.
    environment: tuple[tuple[str, str], ...] | None = None
    #: directories that may only be listed (READ_DIR): their entries are granted one by
    #: one (the landlock backend hides /etc's secret files this way)
    list_paths: tuple[str, ...] = ()
    #: handle Landlock's TCP connect right (ABI 4, refused before it): connect() reaches
    #: only ``connect_ports`` (the landlock backend, which has no network namespace)
    handle_net: bool = False
    connect_ports: tuple[int, ...] = ()
    #: stay the command's parent as a child subreaper and kill what is left of its tree
    #: when it ends (the landlock backend, which has no PID namespace)
    reaper: bool = False
    #: an inherited fd to read one byte from before anything else (None: no hold): the
    #: runtime moves the launcher into the run's cgroup meanwhile
    hold_fd: int | None = None
    #: the directory (inside the sandbox) holding the overlay's ``upper/`` and ``work/``
    overlay_layer: str | None = None
    #: the learn mode's observer (:mod:`stockade.enforce.observe`): an inherited unix
    #: socket to hand the listener of ``observer_bpf`` (a user-notification filter) over
    observer_fd: int | None = None
    observer_bpf: bytes | None = None
    #: the observer's fields carry the landlock backend's connect guard below Landlock
    #: ABI 4 (:mod:`stockade.enforce.netguard`): the launcher loads it so that a notified
    #: call waits killably, and verifies that it refuses a connect before exec
    guard: bool = False
    #: use at most this Landlock ABI (``STOCKADE_LANDLOCK_ABI_MAX``; None: the kernel's)
    abi_max: int | None = None


def serialize(spec: LauncherSpec) -> bytes:
    """Encode ``spec`` in the launcher's format (NUL-terminated ``K=VALUE`` records).

    Raises ``ValueError`` for a relative path, a path containing NUL, or a seccomp
    program that is not a whole number of instructions (1..4096).
    """

    def rec(key: str, value: str) -> bytes:
        return f"{key}={value}".encode("utf-8", "surrogateescape") + b"\0"

    def path(p: str) -> str:
        if not p.startswith("/"):
            raise ValueError(f"launcher spec: path {p!r} is not absolute")
        if "\0" in p:
            raise ValueError(f"launcher spec: path {p!r} contains NUL")
        return p

    out = [SPEC_MAGIC + b"\0"]
    out.append(rec("L", str(int(spec.landlock))))
    out.append(rec("S", str(int(spec.scope))))
    out.append(rec("E", str(int(spec.seccomp_expected or spec.seccomp_bpf is not None))))
    out.append(rec("D", str(int(spec.debug))))
    if spec.ctty:
        out.append(rec("T", "1"))
    if spec.drop_caps:
        out.append(rec("C", "1"))
    if spec.handle_net:
        out.append(rec("N", "1"))
    for port in spec.connect_ports:
        if not 0 < port < 65536:
            raise ValueError(f"launcher spec: connect port {port} is not 1..65535")
        out.append(rec("c", str(port)))
    if spec.reaper:
        out.append(rec("R", "1"))
    if spec.hold_fd is not None:
        if spec.hold_fd < 3:
            raise ValueError(f"launcher spec: hold fd {spec.hold_fd} is not above 2")
        out.append(rec("W", str(spec.hold_fd)))
    for name, value in spec.rlimits:
        if name not in ("nproc", "as", "fsize", "cpu", "nofile", "core", "data") or value < 0:
            raise ValueError(f"launcher spec: rlimit {name}={value} is not valid")
        out.append(rec("l", f"{name}:{value}"))
    if spec.overlay_layer is not None:
        out.append(rec("u", path(spec.overlay_layer)))
    layer = spec.overlay_layer
    for kind, where in spec.mounts:
        if kind not in ("k", "b", "n", "t", "o", "u"):
            raise ValueError(f"launcher spec: mount kind {kind!r} is not k, b, n, t, o or u")
        if kind == "u":
            layer = where  # the layer of the "o" records after it
        elif kind == "o" and layer is None:
            raise ValueError(f"launcher spec: overlay over {where!r} without overlay_layer")
        out.append(rec(kind, path(where)))
    out += [rec("r", path(p)) for p in spec.read_paths]
    out += [rec("w", path(p)) for p in spec.write_paths]
    out += [rec("d", path(p)) for p in spec.list_paths]
    if spec.deny_probe is not None:
        out.append(rec("p", path(spec.deny_probe)))
    if spec.environment is not None:
        out.append(rec("X", "1"))
        for name, text in spec.environment:
            if not name or "=" in name or "\0" in name or "\0" in text:
                raise ValueError(f"launcher spec: environment variable {name!r} is not valid")
            out.append(rec("e", f"{name}={text}"))
    if (spec.observer_fd is None) != (spec.observer_bpf is None):
        raise ValueError("launcher spec: an observer needs both its fd and its program")
    if spec.abi_max is not None:
        if spec.abi_max < 1:
            raise ValueError(f"launcher spec: Landlock ABI cap {spec.abi_max} is not above 0")
        out.append(rec("A", str(spec.abi_max)))
    if spec.guard and spec.observer_fd is None:
        raise ValueError("launcher spec: the connect guard needs an observer fd and program")
    if spec.observer_fd is not None and spec.observer_bpf is not None:
        if spec.observer_fd < 3:
            raise ValueError(f"launcher spec: observer fd {spec.observer_fd} is not above 2")
        n = len(spec.observer_bpf)
        if n == 0 or n % _BPF_INSN_SIZE or n // _BPF_INSN_SIZE > _MAX_BPF_INSNS:
            raise ValueError(f"launcher spec: observer program of {n} bytes is not 1..4096 insns")
        if spec.guard:
            out.append(rec("G", "1"))
        out.append(rec("F", str(spec.observer_fd)))
        out.append(rec("P", str(n)))
        out.append(spec.observer_bpf)
    if spec.seccomp_bpf is not None:
        n = len(spec.seccomp_bpf)
        if n == 0 or n % _BPF_INSN_SIZE or n // _BPF_INSN_SIZE > _MAX_BPF_INSNS:
            raise ValueError(f"launcher spec: seccomp program of {n} bytes is not 1..4096 insns")
        out.append(rec("B", str(n)))
        out.append(spec.seccomp_bpf)
    out.append(b"END\0")
    return b"".join(out)


_SOURCE = Path(__file__).with_name(_SOURCE_NAME)


def launcher_path() -> Path:
    """Return where the launcher for this source lives (built or not): named by the
    source's digest (:func:`stockade._build.shipped_path`)."""
    return _build.shipped_path(_SOURCE, "launcher")


def build_launcher() -> Path:
    """Return the path of an executable launcher, compiling it on first use.

    Compiled into ``$XDG_CACHE_HOME/stockade`` by :func:`stockade._build.build` (which
    see: static when possible, atomic, reused only when only this user could have
    written it). Keep that directory out of every sandbox's writable paths.
    Raises :class:`Unavailable` without a compiler and :class:`SandboxError` when the
    compile fails.
    """
    return _build.build_shipped(_SOURCE, "launcher", "the inner launcher")


def prepare(spec: LauncherSpec) -> tuple[list[str], int]:
    """Serialise ``spec`` into a sealed memfd and return ``(argv_prefix, fd)``.

    ``argv_prefix`` is ``[launcher, str(fd), "--"]``; append the command to it.  Pass
    ``fd`` with ``subprocess``'s ``pass_fds`` (the memfd is close-on-exec otherwise) and
    close it in the parent after the child started.  The memfd is sealed against writes
    so nothing can change the spec between here and the launcher reading it.
    """
    binary = build_launcher()
    data = serialize(spec)
    fd = sealed_memfd("stockade-spec", data)
    return [str(binary), str(fd), "--"], fd
