"""The ``container`` layer on gVisor: the OCI bundle and the ``runsc`` invocation.

With ``[container] backend = "gvisor"`` the command runs on gVisor's own kernel in user
space (the Sentry) instead of on the host kernel: a kernel bug in a system call the
command makes is then a bug in the Sentry, which itself runs under a tight host seccomp
filter. The file system is built from the very :class:`~.bubblewrap.ContainerPlan` that
bubblewrap's argv comes from, mapped to OCI mounts (``docs/gvisor.md``, and the research
in ``transparent-gvisor.md`` §B.3/§B.8):

=================  ==========================================================
plan field         mount
=================  ==========================================================
system paths       read-only binds (merged-/usr symlinks recreated in rootfs)
secret files       ``/dev/null`` binds; secret directories an empty tmpfs
home               a fresh tmpfs (Sentry memory, gone with the sandbox)
toolchains, read   read-only binds
workspace, write   read-write binds (never runsc's overlay: writes reach the disk;
                   an overlay workspace is overlayfs the entry mounts host-side,
                   and the bind is of its merged view, see _gvisor_entry.c)
protected          read-only binds over the writable ones
masked files/dirs  ``/dev/null`` binds / empty tmpfs
files              read-only file binds (resolver files, CA bundle); the launcher
                   and its spec are files of the read-only rootfs
=================  ==========================================================

Landlock does not exist under gVisor (ENOSYS), so the inner launcher runs with it off and
the mount plan *is* the files layer; the launcher still applies seccomp (where a KILL
action stops only the offending thread) and the rlimits.

Networking: runsc runs with ``--network=host`` inside a user and network namespace that
stockade makes itself (the entry, a small C program: :func:`build_entry`), so the egress
proxy's listener, the resolver and the transparent capture are put there by the same
helper as for bubblewrap, and the egress layer applies unchanged. With the egress layer off the entry
makes the user namespace alone, and ``--network=host`` is the caller's network, as
bubblewrap's ``--share-net`` is.

Limits: the inner launcher's rlimits are the Sentry's (RLIMIT_NPROC, FSIZE, CPU and AS
are enforced there; RLIMIT_DATA is not, on mmap); the run's cgroup holds the runsc tree,
whose ``pids.max`` is :func:`host_pids` (host tasks are not the command's tasks).

Everything but :func:`find_runsc` / :func:`runsc_version` / :func:`require_runsc` and
:func:`build_entry` is pure, so the bundle can be tested without running anything.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade import _build, _roots
from stockade._exceptions import Unavailable
from stockade._fs import replace_file
from stockade._record import record
from stockade.enforce.bubblewrap import ContainerPlan, _secret_masks

__all__ = [
    "MIN_RELEASE",
    "PREFERRED_RELEASE",
    "Runsc",
    "build_bundle",
    "build_entry",
    "cache_dir",
    "entry_argv",
    "find_runsc",
    "host_pids",
    "inside_gvisor",
    "parse_version",
    "platform_for",
    "require_runsc",
    "runsc_argv",
    "runsc_version",
    "start_failure",
]

#: The oldest runsc accepted: release-20230227.0 stopped refusing statx's
#: AT_NO_AUTOMOUNT, without which coreutils' ``ls`` and ``stat`` fail (Debian 12's
#: release-20221219 breaks them: "ls: cannot access '/': Invalid argument").
MIN_RELEASE: tuple[int, int] = (20230227, 0)
#: From here the caller's uid can be used inside (otherwise the command runs as uid 0 in
#: the Sentry, which tools that refuse root notice); informational only.
PREFERRED_RELEASE: tuple[int, int] = (20250915, 0)
#: systrap replaced ptrace as the default platform in release-20230621.0.
_SYSTRAP_SINCE: tuple[int, int] = (20230621, 0)

_VERSION_RE = re.compile(r"(?:release-|0\.0~)?(\d{8})\.(\d+)")

#: How to get a usable runsc, for every refusal.
GET_RUNSC = (
    "run 'STOCKADE_GVISOR=1 scripts/setup' (or scripts/get-runsc) to put Debian 13's runsc "
    "in ~/.cache/stockade/runsc, or put a runsc release >= release-20230227.0 on PATH "
    "(https://gvisor.dev/docs/user_guide/install/)"
)


@record
class Runsc:
    """A runsc binary and the release it reported."""

    path: Path
    release: tuple[int, int]
    text: str

    @property
    def platform(self) -> str:
        """The platform stockade selects for it (never KVM)."""
        return platform_for(self.release)


def parse_version(text: str) -> tuple[int, int] | None:
    """The release in ``runsc --version`` output: upstream ``release-20240729.0`` or
    Debian's ``0.0~20240729.0``, as ``(20240729, 0)``; None when there is none."""
    for line in text.splitlines():
        if "version" in line:
            match = _VERSION_RE.search(line)
            if match:
                return int(match.group(1)), int(match.group(2))
    return None


def platform_for(release: tuple[int, int]) -> str:
    """systrap where the release has it, else ptrace. KVM is never chosen: it needs
    /dev/kvm (it hangs under nested virtualisation) and gVisor advises systrap in VMs."""
    return "systrap" if release >= _SYSTRAP_SINCE else "ptrace"


#: Host tasks of the runsc tree itself, whatever the command does: runsc run (5
#: threads), the gofer (about 36) and the Sentry (about 81) on this 2-core machine,
#: measured as 127 in the run's cgroup with one process in the sandbox; with room for the
#: Go runtimes to start threads for blocked host calls.
RUNSC_HOST_TASKS = 256
#: Host tasks per task in the sandbox, at most: under systrap every address space (each
#: process) has a stub process and stub threads on the host; measured 219 at 64
#: processes and 482 at 200 (fork bombs held at the Sentry's RLIMIT_NPROC), about 1.8
#: each; threads of one process cost none (199 threads: 139).
HOST_TASKS_PER_TASK = 4


def host_pids(pids: int) -> int:
    """The host cgroup's ``pids.max`` for a gVisor sandbox whose command may have
    ``pids`` tasks.

    Inside, the bound is the Sentry's own: the launcher's ``RLIMIT_NPROC`` (= ``pids``),
    which the Sentry enforces on every clone (fork and thread alike: EAGAIN), for uid 0
    as well (it holds no CAP_SYS_RESOURCE). The host cgroup counts something else, the
    runsc tree's host tasks, and must never be what stops a fork first: the Sentry
    cannot start a stub for a new address space then and panics ("unable to activate
    mm: createSysmsgThread: failed to get clone"), taking the whole sandbox down; with
    ``pids = 64`` as is, the sandbox could not even start. It stays a bound, a generous
    one, on what the runsc tree can take from the host.
    """
    return RUNSC_HOST_TASKS + HOST_TASKS_PER_TASK * pids


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/stockade/runsc`` (``~/.cache`` when unset): where
    ``scripts/get-runsc`` puts ``<version>/runsc``."""
    # stockade's cache trust root (read-only in every sandbox), spelt once (_roots)
    return _roots.cache_dir(env) / "runsc"


def find_runsc(env: Mapping[str, str] | None = None) -> Path | None:
    """``$STOCKADE_RUNSC`` if set; else the newest runsc in the cache; else on PATH."""
    env = os.environ if env is None else env
    named = env.get("STOCKADE_RUNSC")
    if named:
        return Path(named)
    try:
        cached = [
            entry / "runsc"
            for entry in cache_dir(env).iterdir()
            if os.access(entry / "runsc", os.X_OK)
        ]
    except OSError:
        cached = []
    if cached:
        # Directory names are versions; compare them as releases, not as strings.
        return max(cached, key=lambda p: parse_version(f"version {p.parent.name}") or (0, 0))
    found = shutil.which("runsc", path=env.get("PATH"))
    return Path(found) if found else None


def _within(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def runsc_version(path: Path) -> Runsc:
    """Ask ``path --version``; raise :class:`Unavailable` when it cannot be read.

    The answer is kept in stockade's state (out of every sandbox's reach) with the file's
    identity (device, inode, size, mtime, ctime; see :mod:`stockade._digests`): asking a
    Go binary costs some 20 ms of CPU (100 ms of wall time on a loaded machine) of every
    gVisor run, and while the identity holds the file, and so its answer, is the same.
    The version is a compatibility check (the oldest release that works), never the
    proof of which file runs: that is the digest check of :func:`require_runsc`.
    """
    out = _cached_version(path)
    if out is None:
        try:
            out = subprocess.run(
                [str(path), "--version"],
                capture_output=True,
                timeout=10,
                check=False,
                env=_roots.host_environment(),
            ).stdout.decode(errors="replace")
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"runsc at {path} ({exc})", GET_RUNSC) from None
        release = parse_version(out)
        if release is not None:
            _remember_version(path, out)
    release = parse_version(out)
    if release is None:
        raise Unavailable(
            f"runsc at {path} (no release in its --version output {out.strip()[:80]!r})",
            GET_RUNSC,
        )
    return Runsc(path, release, out.strip().splitlines()[0] if out.strip() else "")


def _version_record(path: Path) -> tuple[Path, str, list[int]] | None:
    """Where the answer of ``path --version`` is kept, its real path and its identity."""
    from stockade._hash import sha256_hex

    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    key = sha256_hex(os.fsencode(real))[:32]
    ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return _roots.state_dir() / "runsc-versions" / f"{key}.json", real, ident


def _cached_version(path: Path) -> str | None:
    import json

    where = _version_record(path)
    if where is None:
        return None
    record_path, real, ident = where
    try:
        entry = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(entry, dict)
        or entry.get("path") != real
        or entry.get("identity") != ident
        or not isinstance(entry.get("output"), str)
    ):
        return None
    output: str = entry["output"]
    return output


def _remember_version(path: Path, output: str) -> None:
    import contextlib
    import json

    where = _version_record(path)
    if where is None:
        return
    record_path, real, ident = where
    with contextlib.suppress(OSError):
        record_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = json.dumps({"path": real, "identity": ident, "output": output}).encode()
        replace_file(record_path, data)


def require_runsc(env: Mapping[str, str] | None = None) -> Runsc:
    """The runsc to use, or :class:`Unavailable` (missing, unreadable or too old).

    There is never a fallback to bubblewrap: a policy that asks for a kernel of its own
    does not get the host's instead.
    """
    path = find_runsc(env)
    if path is None:
        raise Unavailable('runsc (gVisor) for [container] backend = "gvisor"', GET_RUNSC)
    if not (env if env is not None else os.environ).get("STOCKADE_RUNSC") and _within(
        path, cache_dir(env)
    ):
        # runsc runs on the host. One in stockade's cache is run only as the file that
        # scripts/get-runsc fetched (its digest is in stockade's state, out of every
        # sandbox's reach): the sandbox writes as this user, so owner and mode prove
        # nothing. A runsc named with STOCKADE_RUNSC is the user's own choice.
        from stockade import _digests

        why = _digests.verify(path)
        if why is not None:
            raise Unavailable(f"runsc from stockade's cache: {why}", GET_RUNSC)
    found = runsc_version(path)
    if found.release < MIN_RELEASE:
        have = f"{found.release[0]:08d}.{found.release[1]}"
        raise Unavailable(
            f"runsc release-{have} at {path} is older than release-20230227.0 (its statx "
            "breaks ls and stat on Debian 12's coreutils)",
            GET_RUNSC,
        )
    return found


def inside_gvisor(proc_version: str | None = None, dmesg: str | None = None) -> bool:
    """Whether this process itself runs on gVisor (GKE Sandbox, Modal): its fake
    ``/proc/version`` (Linux 4.4.0 and no build host) and its ``dmesg`` banner."""
    if dmesg is not None and "Starting gVisor" in dmesg:
        return True
    if proc_version is None:
        try:
            proc_version = Path("/proc/version").read_text()
        except OSError:
            return False
    return proc_version.startswith("Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016")


# --- the bundle ------------------------------------------------------------------------

_MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def rootfs_symlinks(system_paths: Sequence[str]) -> list[tuple[str, str]]:
    """``(name, target)`` for each system path that is a symlink on the host (merged
    /usr: ``/lib64 -> usr/lib64``); the rootfs holds them, or the ELF interpreter is
    missing ("failed to load /usr/bin/sh")."""
    out = []
    for path in system_paths:
        if os.path.islink(path) and path.count("/") == 1:
            out.append((path.lstrip("/"), os.readlink(path)))
    return out


def _maskable(path: Path) -> bool:
    """Whether a file to hide can be a ``/dev/null`` bind under runsc, whose gofer opens
    every mount point as the caller (the sandbox never starts when one fails). Two kinds
    cannot, and need no mask:

    * a unix socket or a FIFO (ENXIO; a dev server's socket in the workspace would stop
      every run): runsc ``--host-uds=none`` and ``--host-fifo=none`` (:func:`runsc_argv`)
      refuse to connect to or open any host socket or FIFO from inside;
    * a file the caller cannot read (``/etc/shadow`` for anyone but root: EACCES): with
      directfs or without, every host file is opened by the Sentry or the gofer, both
      running as the caller, so it cannot be read inside either (the command's uid 0 in
      the Sentry has no capability).
    """
    try:
        mode = path.lstat().st_mode
    except OSError:
        return True  # not there: the bind is made as for any other mask
    if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
        return False
    return not stat.S_ISREG(mode) or os.access(path, os.R_OK)


def _bind(source: str, destination: str, *, ro: bool) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro" if ro else "rw"],
    }


def _tmpfs(destination: str, *, ro: bool = False, mode: str = "") -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "ro" if ro else "rw", *([f"mode={mode}"] if mode else [])],
    }


def _empty_dir(path: Path) -> bool:
    """Whether ``path`` is an empty directory itself (not through a symlink)."""
    try:
        if not stat.S_ISDIR(path.lstat().st_mode):
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _protect(path: Path) -> dict[str, Any]:
    """The mount that holds a protected path read-only.

    An empty directory (a placeholder of a missing ``.vscode``, ``.claude``, ...:
    ``paths.protect_paths(absent_dirs=True)``) gets an empty read-only tmpfs: what the
    command sees is the same (an empty directory it can neither write in, remove nor
    rename), and a tmpfs is the Sentry's own, where a bind costs a gofer mount: about
    0.9 ms against 2.4 ms of every run here, for each of seven names. Anything else is
    bound read-only. Should something appear in the directory after this check, the
    tmpfs hides it: never more than the bind would show.
    """
    if _empty_dir(path):
        return _tmpfs(str(path), ro=True, mode="755")
    return _bind(str(path), str(path), ro=True)


def bundle_mounts(plan: ContainerPlan) -> list[dict[str, Any]]:
    """The OCI mounts for ``plan``, in the order they must be made (later ones cover
    earlier ones, as bubblewrap's arguments do)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": []},
        # gVisor fills a tmpfs /dev with its own null, zero, random, tty, ...
        _tmpfs("/dev"),
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []},
        _tmpfs("/dev/shm"),
    ]
    for path in plan.system_paths:
        if os.path.islink(path):
            continue  # a symlink in the rootfs (rootfs_symlinks)
        if os.path.exists(path):
            mounts.append(_bind(path, path, ro=True))
    for kind, secret in _secret_masks():
        if kind == "t":
            mounts.append(_tmpfs(secret, ro=True))
        elif _maskable(Path(secret)):
            mounts.append(_bind("/dev/null", secret, ro=True))
    tmp = _bind(str(plan.tmp), "/tmp", ro=False) if plan.tmp is not None else _tmpfs("/tmp")
    mounts += [tmp, _tmpfs("/var/tmp"), _tmpfs("/run"), _tmpfs(str(plan.home))]
    mounts += [_bind(str(p), str(p), ro=True) for p in plan.toolchains]
    mounts += [_bind(str(p), str(p), ro=True) for p in plan.read if p.exists()]
    mounts.append(_bind(str(plan.workspace), str(plan.workspace), ro=False))
    mounts += [_bind(str(p), str(p), ro=False) for p in plan.write if p.exists()]
    mounts += [_bind(str(host), str(inside), ro=False) for host, inside in plan.staged]
    # Pinned directories need nothing here: a rename of a bind mount point fails with
    # EBUSY in the Sentry as on the host, and every protected path is a mount below.
    mounts += [_protect(p) for p in plan.protected]
    mounts += [_tmpfs(str(p), ro=True) for p in plan.masked_dirs]
    mounts += [_bind("/dev/null", str(p), ro=True) for p in plan.masked_files if _maskable(p)]
    mounts += [_bind(str(host), inside, ro=True) for host, inside in plan.files]
    return mounts


def host_binds(mounts: Sequence[Mapping[str, Any]], extra: Sequence[tuple[str, str]] = ()) -> bytes:
    """The binds the gVisor entry repeats on the host side, in its own mount namespace,
    before runsc starts: one NUL-terminated record per bind mount of ``mounts``, in their
    order, ``r/path`` (read-only) or ``w/path`` (read-write), then each of ``extra``
    (``("w", path)``: where runsc itself writes, the run's scratch; ``("r", path)``).

    Why: with directfs the Sentry opens host files itself, and runsc 20240729 then
    truncates a host file opened with O_TRUNC below a read-only bind before it answers
    EROFS (a hook in a protected ``.git/hooks``, a file of a read-only toolchain the
    caller owns, ``/etc/passwd`` for root). Bound read-only on the host as well, every
    such open is refused by the host kernel, whatever the Sentry does. A read-write
    bind below a read-only one is made read-write again, as the bundle's order says;
    ``/dev/null`` (the masks) is a device, which no open truncates, and is left out.
    Sources are resolved (a symlink's target is what runsc binds); a path with a NUL
    or an empty one cannot be a record and is refused.
    """
    out = bytearray()
    records = [
        ("r" if "ro" in m["options"] else "w", m["source"])
        for m in mounts
        if m["type"] == "bind" and m["source"] != "/dev/null"
    ]
    records += list(extra)
    for kind, source in records:
        real = os.path.realpath(source)
        if "\0" in real or not real.startswith("/"):
            raise ValueError(f"a bind source that cannot be a record: {source!r}")
        out += f"{kind}{real}\0".encode("utf-8", "surrogateescape")
    return bytes(out)


def build_bundle(
    plan: ContainerPlan,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    rootfs: str = "rootfs",
    terminal: bool = False,
) -> dict[str, Any]:
    """The OCI ``config.json`` document that runs ``args`` under ``plan``.

    ``env`` is the child's environment, built from the allow-list (placeholders, never a
    credential the proxy binds). The document is written to a private directory, and
    nothing in it is visible inside the sandbox.
    """
    if not plan.isolate:
        raise ValueError("the gvisor backend is the container layer; it has no netns-only form")
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": terminal,
            # uid 0 of the Sentry, mapped to the caller: runsc before release-20250915
            # cannot map another uid onto a single-uid namespace. It holds no capability.
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": str(plan.cwd or plan.workspace),
            "capabilities": {
                name: []
                for name in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": plan.hostname,
        "mounts": bundle_mounts(plan),
        "linux": {
            # No "network": runsc --network=host keeps the Sentry in the namespace
            # stockade made and equipped. No "seccomp": runsc ignores it without
            # --oci-seccomp, and the launcher loads stockade's filter itself.
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
        },
    }


def runsc_argv(
    runsc: Runsc,
    state: str,
    bundle: str,
    container_id: str,
    *,
    platform: str | None = None,
    log: str | None = None,
    pid_file: str | None = None,
    console_socket: str | None = None,
    panic_log: str | None = None,
    directfs: bool = False,
) -> list[str]:
    """``runsc ... run`` for a bundle; ``platform`` overrides :func:`platform_for` (the
    user asked for one, e.g. kvm).

    ``log`` and ``pid_file`` are how a sandbox that never started is told from a command
    that failed (:func:`start_failure`); ``panic_log`` receives the Sentry's Go panic (it
    goes nowhere otherwise), how a sandbox that died under the command is told from the
    command's own status; ``console_socket`` receives the pty runsc makes for a
    ``terminal`` bundle. ``directfs``: the Sentry opens host files itself, only where
    the entry binds every read-only source read-only on the host first (:func:`host_binds`).
    """
    return [
        str(runsc.path),
        f"--root={state}",
        *([f"--log={log}"] if log else []),
        *([f"--panic-log={panic_log}"] if panic_log else []),
        # rootless: the runsc tree lives in stockade's cgroup, which the runtime made.
        "--ignore-cgroups",
        "--network=host",
        f"--platform={platform or runsc.platform}",
        # Pinned, not left to the defaults: no host unix socket and no host FIFO is
        # reachable from inside, whatever the mounts show (the workspace's sockets are
        # left unmasked under gVisor, see _maskable).
        "--host-uds=none",
        "--host-fifo=none",
        # Pinned: the default changed in 2023 (root:self), and the workspace must never
        # be runsc's overlay (writes must reach the disk, or an overlay workspace's layer
        # on the host: that one is overlayfs mounted around runsc, _gvisor_entry.c, since
        # runsc's upper is a memory file of its own format). The rootfs is read-only.
        "--overlay2=none",
        # directfs (the Sentry opens host files itself: about 60 ms less of a served run)
        # only over host-side read-only binds: runsc 20240729 truncates a host file
        # opened with O_TRUNC below a read-only bind before it answers EROFS
        # (host_binds). Without them the gofer opens every file.
        f"--directfs={'true' if directfs else 'false'}",
        "run",
        *([f"--pid-file={pid_file}"] if pid_file else []),
        *([f"--console-socket={console_socket}"] if console_socket else []),
        f"--bundle={bundle}",
        container_id,
    ]


#: runsc's exit status when it fails itself (``util.Fatalf``); a command's own status is
#: passed through (128 + n for a signal), so 128 alone does not tell them apart.
RUNSC_FAILED = 128


def start_failure(returncode: int, pid_file: str | None, log: str, panic: str = "") -> str | None:
    """Why a ``runsc run`` that exited with ``returncode`` is the sandbox's failure, not
    the command's; None when the status is the command's own.

    ``pid_file`` is the content of ``--pid-file`` (None: runsc never wrote it, so it never
    created the container: a bad bundle, a broken or fake runsc); ``log`` is what runsc
    wrote to ``--log``, which a running command cannot reach (a host file outside every
    mount). After the container was created, only runsc's own "running container:"
    error with its exit status 128 is a failure of the sandbox: the command may exit 128
    itself, and then runsc logs nothing. ``panic`` is what the Sentry wrote to
    ``--panic-log``: a Go panic there ended the whole sandbox, whatever the status (Go
    exits 2 on one, which a command can exit with too).
    """
    if not (pid_file or "").strip():
        return "not-started"
    if "panic:" in panic or "fatal error:" in panic:
        return "failed"
    if returncode != RUNSC_FAILED:
        return None
    for line in log.replace("}{", "}\n{").splitlines():
        if "running container: " not in line:
            continue
        if "creating container" in line or "starting container" in line:
            return "not-started"
        return "failed"
    return None


# --- the entry: a user and network namespace of stockade's own, then runsc -------------

_ENTRY_SOURCE = Path(__file__).with_name("_gvisor_entry.c")


def build_entry() -> Path:
    """The gVisor entry (``_gvisor_entry.c``, whose header comment says what it does and
    why), compiled on first use into stockade's cache and checked against its recorded
    digest before each use, as the launcher and the network namespace helper are
    (:func:`stockade._build.build_shipped`): it runs on the host, before runsc, with the
    user's own rights, so a copy replaced on disk is rebuilt, never run. Raises
    :class:`Unavailable` without a compiler and :class:`SandboxError` when the compile
    fails: no gVisor run starts without it.

    Why C: it runs on every gVisor run before runsc starts, and a Python interpreter
    cost about 10 ms of that (and about 10 MB per sandbox); the program costs about 1 ms.
    """
    return _build.build_shipped(_ENTRY_SOURCE, "gvisor-entry", "the gVisor entry")


def entry_argv(
    entry: str,
    uid: int,
    gid: int,
    ppid: int,
    info_fd: int,
    block_fd: int,
    runsc: Sequence[str],
    *,
    state: str,
    container_id: str,
    share_net: bool = False,
    overlay: tuple[str, str] | None = None,
    refused: str = "",
    binds: str = "",
) -> list[str]:
    """The outermost argv of a gVisor run: the entry (``entry``, the path of the binary
    :func:`build_entry` gives; ``_gvisor_entry.c``), then ``runsc``: ``entry UID GID PPID
    INFO_FD BLOCK_FD NET ROOT ID OVERLAY LAYER REFUSED BINDS -- RUNSC...``. ``ppid`` is the
    process that spawns it (the entry gives up under any other parent); ``info_fd`` and
    ``block_fd`` are bubblewrap's ``--info-fd``/``--block-fd`` pipe ends; ``state``
    (runsc's ``--root``) and ``container_id`` are how the entry forwards a signal
    (``runsc kill``); ``share_net`` keeps the caller's network namespace (the egress
    layer is off); ``overlay`` is ``(workspace, layer directory)`` for an overlay
    workspace, which the entry mounts host-side, and ``refused`` the file where it says
    why the kernel refused that mount (both absolute); ``binds`` the file of
    :func:`host_binds` records the entry applies on the host side before runsc starts
    (absolute; empty: none, and runsc must then run without directfs)."""
    if overlay is not None and not (refused and all(p.startswith("/") for p in overlay)):
        raise ValueError("an overlay entry needs absolute paths and a refusal file")
    if binds and not binds.startswith("/"):
        raise ValueError("the binds file must be an absolute path")
    return [
        entry,
        str(uid),
        str(gid),
        str(ppid),
        str(info_fd),
        str(block_fd),
        "0" if share_net else "1",
        f"--root={state}",
        container_id,
        *(overlay if overlay is not None else ("", "")),
        refused,
        binds,
        "--",
        *runsc,
    ]


#: the directory of the bundle's read-only rootfs that holds the launcher and its spec
#: (runsc passes no fds in): files of the rootfs cost no mount (GvisorRun.launcher_files)
ROOTFS_STOCKADE_DIR = ".stockade"
#: where the launcher and its spec appear inside a gVisor sandbox
LAUNCHER_INSIDE = f"/{ROOTFS_STOCKADE_DIR}/launcher"
SPEC_INSIDE = f"/{ROOTFS_STOCKADE_DIR}/launcher.spec"
