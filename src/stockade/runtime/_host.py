"""What this host can enforce: bubblewrap, user namespaces, Landlock, seccomp, cgroups.

Checks are cheap and cached per process; ``stockade doctor`` prints them all and
``run`` refuses to start when a layer the policy asks for is missing (fail closed).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from stockade import _roots
from stockade._exceptions import Unavailable
from stockade._record import record


@record
class Check:
    """One host feature: whether it works, what was found, and the fix when it does not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def find_bwrap() -> str | None:
    """The bubblewrap binary: ``$STOCKADE_BWRAP`` or the first ``bwrap`` on PATH.

    A bwrap inside the current directory is refused: a workspace could plant one.
    """
    explicit = os.environ.get("STOCKADE_BWRAP")
    if explicit:
        # Named by the user: used if it is an executable file, else treated as missing
        # (require_bwrap then names the variable in its fix).
        return (
            str(Path(explicit).resolve())
            if os.access(explicit, os.X_OK) and os.path.isfile(explicit)
            else None
        )
    real = _bwrap_on_path(os.environ.get("PATH"))
    if real is None:
        return None
    cwd = Path.cwd().resolve()
    if real == cwd or cwd in real.parents:
        return None
    return str(real)


# Keyed on the PATH it searched, not cached blindly: a warm process (a Sandbox, the run
# server's workers) may be asked again with another environment.
@functools.cache
def _bwrap_on_path(path: str | None) -> Path | None:
    candidate = which("bwrap", path)
    return Path(candidate).resolve() if candidate else None


def which(name: str, path: str | None) -> str | None:
    """:func:`shutil.which` for a plain ``name`` (no directory part) on ``path`` (the
    ``PATH`` variable when None), without importing shutil (~5 ms of every cold run);
    the same search, entry by entry (an empty entry is the working directory, as there)."""
    if path is None:
        path = os.environ.get("PATH")
        if path is None:
            path = os.confstr("CS_PATH") or os.defpath
    if not path:
        return None
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if (
            os.path.exists(candidate)
            and os.access(candidate, os.X_OK)
            and not os.path.isdir(candidate)
        ):
            return candidate
    return None


def require_bwrap() -> str:
    """The bwrap path, or :class:`Unavailable` naming the fix."""
    path = find_bwrap()
    if path is None:
        explicit = os.environ.get("STOCKADE_BWRAP")
        if explicit:
            raise Unavailable(
                f"bubblewrap at STOCKADE_BWRAP={explicit}",
                "point STOCKADE_BWRAP at an executable bwrap, or unset it to use the one on PATH",
            )
        raise Unavailable(
            "bubblewrap (bwrap)",
            "install it: sudo apt-get install bubblewrap (or: stockade doctor)",
        )
    return path


def userns_check() -> Check:
    """Whether bwrap can create an unprivileged user namespace here."""
    return _userns_check(find_bwrap())


@functools.cache
def _userns_check(bwrap: str | None) -> Check:
    if bwrap is None:
        return Check(
            "user namespaces", False, "bwrap not installed", "sudo apt-get install bubblewrap"
        )
    proc = subprocess.run(
        [
            bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--disable-userns",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
            "/bin/true",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=_roots.host_environment(),
    )
    if proc.returncode == 0:
        return Check("user namespaces", True, "bwrap can create user, pid and net namespaces")
    err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    fix = "enable unprivileged user namespaces: sudo sysctl -w kernel.unprivileged_userns_clone=1"
    restrict = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if restrict.exists() and restrict.read_text().strip() == "1":
        fix = (
            "Ubuntu's AppArmor restricts unprivileged user namespaces: install an AppArmor "
            "profile for bwrap (abi <abi/4.0>, 'userns,') or run: "
            "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        )
    if "disable-userns" in err:
        fix = "bubblewrap 0.8 or newer is needed for --disable-userns; upgrade bubblewrap"
    return Check("user namespaces", False, err, fix)


@functools.cache
def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel, 0 when Landlock is unavailable
    (:func:`stockade.enforce.landlock.abi_version`, asked once per process)."""
    from stockade.enforce.landlock import abi_version

    return abi_version()


@functools.cache
def mount_api() -> bool:
    """Whether the kernel has open_tree, move_mount and mount_setattr (Linux 5.12+),
    with which the launcher binds protected paths (bubblewrap does it otherwise)."""
    import ctypes
    import errno

    from stockade._libc import libc

    mount_setattr = 442  # same number on every architecture
    # An invalid call: EBADF or EINVAL where the syscall exists; ENOSYS where it does
    # not; EPERM where a seccomp profile of the host refuses it.
    libc().syscall(mount_setattr, -1, None, 0, None, 0)
    return ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM)


@functools.cache
def seccomp_available() -> bool:
    """Whether the kernel has seccomp filters (``Seccomp:`` in /proc/self/status)."""
    try:
        return "\nSeccomp:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


def require_landlock() -> int:
    """The Landlock ABI, or :class:`Unavailable` naming the fix."""
    abi = landlock_abi()
    if abi < 1:
        raise Unavailable(
            "Landlock (files layer)",
            "use a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and landlock in lsm=, "
            "or run with --disable files",
        )
    return abi


def transparent_check() -> Check:
    """Whether transparent egress can be set up here, tried for real.

    A throw-away bubblewrap sandbox (user, pid and network namespaces, as a run makes
    them) gets what a run's does: the AnyIP routes, stockade's resolver on port 53 and
    capture listeners on 80 and 443, made by the same helper. Nothing is sent anywhere.
    """
    name = "transparent egress"
    bwrap = find_bwrap()
    if bwrap is None:
        return Check(name, False, "bwrap not installed", "sudo apt-get install bubblewrap")
    if os.stat(bwrap).st_mode & 0o4000:
        return Check(
            name,
            False,
            f"{bwrap} is setuid: the sandbox's namespaces belong to root, not to you",
            "install a bubblewrap that is not setuid (the distribution's package), or set "
            "network.transparent = false (then only proxy-aware clients reach the network)",
        )
    from stockade.egress._netns import sockets_in_netns
    from stockade.enforce.bubblewrap import read_child_pid

    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--disable-userns"]
    argv += ["--ro-bind", "/", "/", "--proc", "/proc", "--info-fd", str(info_w)]
    argv += ["--block-fd", str(block_r), "--", "/bin/true"]
    proc = subprocess.Popen(
        argv,
        pass_fds=(info_w, block_r),
        env=_roots.host_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    os.close(info_w)
    os.close(block_r)
    try:
        pid = read_child_pid(info_r)
        socks = sockets_in_netns(pid, 0, dns=True, capture_ports=(80, 443))
        socks.close()
    except Exception as exc:
        return Check(
            name,
            False,
            str(exc),
            "runs that allow hosts will refuse to start (exit 125) until this works; "
            "set network.transparent = false to use the proxy variables alone",
        )
    finally:
        os.close(block_w)
        proc.wait()
    resolv = Path("/etc/resolv.conf")
    where = (
        f"; /etc/resolv.conf links to {os.path.realpath(resolv)}, bound over there"
        if resolv.is_symlink()
        else ""
    )
    return Check(
        name,
        True,
        "stockade's resolver and capture of ports 80 and 443 work in a sandbox's "
        f"network namespace{where}",
    )
