"""The ``container`` layer: a pure builder of the bubblewrap argv.

bubblewrap gives the command new user, mount, PID, IPC, UTS and cgroup namespaces, drops
every capability, forbids further user namespaces (``--disable-userns``: with a nested
user namespace a process could rebuild its mount table and move a read-only carve-out
aside), and shows it a file system built from binds: system directories read-only, a
fresh tmpfs HOME and /tmp, a fresh /proc, a minimal /dev, and the workspace read-write
at its own path.

What it does NOT stop: reads of whatever is bound in (that is what the binds are for),
and anything on the network when ``share_net`` is set. Landlock (the ``files`` layer)
checks the same accesses again on the real files, so a mistake here is not an escape.

Everything in this module is a pure function of its inputs, so the argv can be tested
and shown (``stockade check --json``) without running anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from stockade._record import field, record
from stockade.policy._tables import SYSTEM_PATHS, SYSTEM_SECRETS

#: Where stockade's own files (launcher, CA bundle) appear inside the sandbox.
STOCKADE_DIR = "/run/stockade"
#: Where an overlay workspace's layer (upper/ and work/) is bound for the launcher to
#: mount the overlay; the launcher masks it right after, so the command never sees it.
OVERLAY_DIR = STOCKADE_DIR + "/overlay"
#: Where a learning run's scratch layers are bound (one directory each, numbered), for
#: the launcher to mount each copy-on-write view; masked right after, as OVERLAY_DIR is.
SCRATCH_DIR = STOCKADE_DIR + "/scratch"


@record
class ContainerPlan:
    """Everything the argv depends on, already resolved to absolute paths."""

    workspace: Path
    #: the sandbox's HOME: a fresh tmpfs at the caller's home path
    home: Path
    read: tuple[Path, ...] = ()
    write: tuple[Path, ...] = ()
    #: toolchain directories from the caller's PATH, bound read-only inside HOME or elsewhere
    toolchains: tuple[Path, ...] = ()
    #: paths that must read as empty: files get /dev/null, directories an empty tmpfs
    masked_files: tuple[Path, ...] = ()
    masked_dirs: tuple[Path, ...] = ()
    #: existing paths inside writable areas that are re-bound read-only
    protected: tuple[Path, ...] = ()
    #: directories re-bound onto themselves so they cannot be renamed (mount points)
    pinned: tuple[Path, ...] = ()
    #: the inner launcher makes the masks and binds of :func:`launcher_mounts` (with
    #: the new mount API, where bubblewrap 0.8 parses /proc/self/mountinfo for each);
    #: bubblewrap leaves it CAP_SYS_ADMIN and CAP_SETPCAP for that
    launcher_binds: bool = False
    #: host file -> path inside (read-only), e.g. the launcher and the CA bundle
    files: tuple[tuple[Path, str], ...] = ()
    #: a run's private directory -> the path it stands for inside (read-write), e.g. a
    #: staged ``.git`` (runtime/_newrepo.py): bound after the writable paths
    staged: tuple[tuple[Path, Path], ...] = ()
    share_net: bool = False
    #: a pid namespace etc.; False only for the "network namespace only" form used when
    #: the container layer is off but egress needs a namespace of its own
    isolate: bool = True
    hostname: str = "stockade"
    #: working directory inside; the workspace when the caller's cwd is outside it
    cwd: Path | None = None
    #: a host directory bound at /tmp, kept across runs (``Sandbox(tmp="session")``);
    #: None: a fresh tmpfs
    tmp: Path | None = None
    #: an overlay workspace: the host directory holding the layer's upper/ and work/.
    #: The workspace is then bound read-only and the launcher mounts the overlay over it
    #: (needs ``launcher_binds``; see stockade.runtime._overlay)
    overlay: Path | None = None
    #: a learning run's copy-on-write views, as (directory, host layer holding its
    #: upper/ and work/): the directory stays bound read-only and the launcher mounts an
    #: overlay over it whose writes land in the layer, which the runtime reads and
    #: removes after the run (needs ``launcher_binds``; see stockade.runtime._learnscratch)
    scratch: tuple[tuple[Path, Path], ...] = ()
    system_paths: tuple[str, ...] = field(default=SYSTEM_PATHS)


def _secret_masks() -> list[tuple[str, str]]:
    """Masks over the host's secret files ("n") and directories ("t") that exist."""
    masks = []
    for secret in SYSTEM_SECRETS:
        if os.path.isdir(secret) and not os.path.islink(secret):
            masks.append(("t", secret))
        elif os.path.exists(secret):
            masks.append(("n", secret))
    return masks


def launcher_mounts(plan: ContainerPlan) -> list[tuple[str, str]]:
    """The masks and binds the inner launcher makes when ``plan.launcher_binds``, in the
    order bubblewrap would make them (see ``LauncherSpec.mounts``); else none."""
    if not (plan.launcher_binds and plan.isolate):
        return []
    # The overlay first: the protected binds and pins below then bind the overlay's
    # paths (read-only inside the merged view), not the lower layer's.
    overlay = [("o", str(plan.workspace)), ("t", OVERLAY_DIR)] if plan.overlay is not None else []
    # Each scratch view names its own layer first ("u"); masked right after mounting.
    # Before the masks below, so that a masked path inside a view is masked in it.
    for index, (directory, _) in enumerate(plan.scratch):
        inside = f"{SCRATCH_DIR}/{index}"
        overlay += [("u", inside), ("o", str(directory)), ("t", inside)]
    return [
        *overlay,
        *_secret_masks(),
        *(("k", str(p)) for p in plan.pinned),
        *(("b", str(p)) for p in plan.protected),
        *(("t", str(p)) for p in plan.masked_dirs),
        *(("n", str(p)) for p in plan.masked_files),
    ]


def _bind_system(paths: Iterable[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            # Merged-/usr systems make /bin a symlink to usr/bin: recreate the symlink
            # rather than binding the target twice.
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def build_argv(
    plan: ContainerPlan,
    command: Sequence[str],
    *,
    bwrap: str = "bwrap",
    info_fd: int | None = None,
    block_fd: int | None = None,
    seccomp_fd: int | None = None,
    status_fd: int | None = None,
    args_fd: int | None = None,
) -> list[str]:
    """Return the full bubblewrap argv that runs ``command`` under ``plan``.

    No secret may appear here: the argv of bwrap is readable inside the sandbox as
    ``/proc/1/cmdline``. The command's environment comes from ``args_fd`` (see
    :func:`environment_fd`), never from bwrap's own environment, which is stockade's
    fixed host environment (bwrap runs unconfined on the host before any namespace).
    """
    argv = [bwrap]
    if args_fd is not None:
        argv += ["--args", str(args_fd)]
    if not plan.isolate:
        # Only a private network namespace: the container layer is off, but egress still
        # needs a namespace with nothing in it but loopback.
        argv += ["--unshare-user", "--unshare-net", "--cap-drop", "ALL"]
        argv += ["--bind", "/", "/", "--dev-bind", "/dev", "/dev"]
        argv += ["--proc", "/proc", "--die-with-parent"]
        for host, inside in plan.files:
            argv += ["--ro-bind", str(host), inside]
    else:
        argv += [
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            plan.hostname,
        ]
        in_launcher = bool(launcher_mounts(plan))
        if in_launcher:
            # In the sandbox's own user namespace, for the launcher's mounts only: it
            # gives up every capability before anything else runs (see _launcher.c).
            # CAP_SETPCAP lets it empty the bounding set too, as --cap-drop ALL would.
            argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
            if plan.overlay is not None or plan.scratch:
                # overlayfs makes its work directory with mode 0 and works in it with
                # the mounter's credentials: without this the mount comes up read-only.
                argv += ["--cap-add", "CAP_DAC_OVERRIDE"]
        if not plan.share_net:
            argv.append("--unshare-net")
        argv += _bind_system(plan.system_paths)
        if not in_launcher:
            for kind, secret in _secret_masks():
                if kind == "t":
                    argv += ["--tmpfs", secret, "--remount-ro", secret]
                else:
                    argv += ["--ro-bind", "/dev/null", secret]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        if plan.tmp is not None:
            argv += ["--bind", str(plan.tmp), "/tmp", "--tmpfs", "/var/tmp"]
        else:
            argv += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        argv += ["--tmpfs", str(plan.home)]
        for path in plan.toolchains:
            argv += ["--ro-bind", str(path), str(path)]
        for path in plan.read:
            argv += ["--ro-bind-try", str(path), str(path)]
        if plan.overlay is not None:
            # The real workspace is only the overlay's lower layer: read-only even in
            # bubblewrap's own mount namespace, whatever happens above it.
            argv += ["--ro-bind", str(plan.workspace), str(plan.workspace)]
            argv += ["--bind", str(plan.overlay), OVERLAY_DIR]
        else:
            argv += ["--bind", str(plan.workspace), str(plan.workspace)]
        for path in plan.write:
            argv += ["--bind-try", str(path), str(path)]
        for private, stands_for in plan.staged:
            argv += ["--bind", str(private), str(stands_for)]
        for index, (_, layer) in enumerate(plan.scratch):
            argv += ["--bind", str(layer), f"{SCRATCH_DIR}/{index}"]
        if not in_launcher:
            for path in plan.pinned:
                argv += ["--bind", str(path), str(path)]
            for path in plan.protected:
                argv += ["--ro-bind", str(path), str(path)]
            for path in plan.masked_dirs:
                argv += ["--tmpfs", str(path), "--remount-ro", str(path)]
            for path in plan.masked_files:
                argv += ["--ro-bind", "/dev/null", str(path)]
        for host, inside in plan.files:
            argv += ["--ro-bind", str(host), inside]
        argv += ["--chdir", str(plan.cwd or plan.workspace)]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    argv.append("--")
    argv += list(command)
    return argv


def environment_fd(env: Mapping[str, str]) -> int:
    """A sealed memfd holding ``--clearenv`` and one ``--setenv NAME VALUE`` per variable
    of ``env``, NUL-separated, for bwrap's ``--args FD``; the caller passes and closes it.

    bwrap applies them to its own process while it parses its arguments, long after its
    dynamic loader ran, and execs the sandbox's first process with the result: what the
    policy sets for the command (``LD_PRELOAD`` included) takes effect inside only.
    ``/proc/1/environ`` inside is the memory bwrap started with: the host environment.
    """
    from stockade._memfd import sealed_memfd

    parts = [b"--clearenv"]
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"environment variable {name!r} cannot be passed to bwrap")
        parts += [b"--setenv", os.fsencode(name), os.fsencode(value)]
    return sealed_memfd("stockade-env", b"\0".join(parts) + b"\0")


def read_child_pid(info_fd: int) -> int:
    """Read bubblewrap's ``--info-fd`` document and return the sandbox's pid.

    Reads until the JSON object is complete rather than until end of file, so that a
    copy of the fd held elsewhere cannot stall the start.
    """
    import contextlib
    import json

    from stockade._exceptions import SandboxError

    buf = b""
    info: object = None
    try:
        while True:
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            buf += chunk
            with contextlib.suppress(json.JSONDecodeError):
                info = json.loads(buf)
                break
    finally:
        os.close(info_fd)
    pid = info.get("child-pid") if isinstance(info, dict) else None
    if not isinstance(pid, int):
        raise SandboxError("bubblewrap did not report the sandbox's pid on --info-fd")
    return pid
