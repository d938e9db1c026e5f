"""The syscalls layer: the cBPF filter, loaded by the launcher, against the real kernel.

"Without the filter" twins run the same probe with ``seccomp_bpf=None`` (Landlock still
on), so each refusal is shown to come from the filter and not from the test setup.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess

import pytest

from stockade.enforce import seccomp
from stockade.enforce.launcher import LauncherSpec

from .conftest import PROBE, Box, require

pytestmark = pytest.mark.kernel

CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000


def no_filter(box: Box) -> LauncherSpec:
    return box.spec(seccomp_bpf=None, seccomp_expected=False)


# --- the builder ----------------------------------------------------------------------


def test_filter_is_deterministic_and_well_formed() -> None:
    a = seccomp.build_filter(arch="x86_64")
    assert a == seccomp.build_filter(arch="x86_64")
    assert len(a) % 8 == 0
    assert 0 < len(a) // 8 <= 4096
    # The first instruction loads seccomp_data.arch, the second compares it.
    assert struct.unpack("HBBI", a[:8]) == (0x20, 0, 0, 4)
    assert struct.unpack("HBBI", a[8:16])[3] == 0xC000003E
    # The last instruction allows (default allow).
    assert struct.unpack("HBBI", a[-8:]) == (0x06, 0, 0, 0x7FFF0000)


def test_filter_per_arch_and_ptrace_option() -> None:
    x86 = seccomp.build_filter(arch="x86_64")
    arm = seccomp.build_filter(arch="aarch64")
    assert x86 != arm
    assert struct.unpack("HBBI", arm[8:16])[3] == 0xC00000B7
    # aarch64 has no x32-style alias range (two instructions) and no legacy open, creat,
    # chmod and mknod (a five-instruction mode check each).
    assert len(x86) - len(arm) == 16 + 4 * 40
    # The ptrace family is four two-instruction blocks.
    assert len(x86) - len(seccomp.build_filter(arch="x86_64", allow_ptrace=True)) == 4 * 16
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.build_filter(arch="riscv64")


def test_arch_tables_cover_the_same_syscalls() -> None:
    # The same syscalls but the legacy path calls aarch64 never had (only the *at forms).
    legacy = {"open", "creat", "chmod", "mknod"}
    assert set(seccomp.ARCHES["x86_64"].nr) - legacy == set(seccomp.ARCHES["aarch64"].nr)


def test_verify_status_parses() -> None:
    text = (
        "Name:\tx\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
        "CapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n"
    )
    st = seccomp.verify_status(text=text)
    assert st.confined
    assert (st.no_new_privs, st.seccomp_mode, st.seccomp_filters) == (True, 2, 1)
    assert not seccomp.verify_status(text=text.replace("Seccomp:\t2", "Seccomp:\t0")).confined
    with pytest.raises(ValueError, match="NoNewPrivs"):
        seccomp.verify_status(text="Seccomp:\t2\n")


# --- inside the sandbox ------------------------------------------------------------------


def test_status_inside_shows_seccomp_and_nnp(box: Box) -> None:
    r = box.run(["/bin/cat", "/proc/self/status"])
    assert r.returncode == 0, r.stderr
    assert "Seccomp:\t2" in r.stdout
    assert "NoNewPrivs:\t1" in r.stdout
    assert seccomp.verify_status(text=r.stdout).confined


def test_status_without_filter(box: Box) -> None:
    r = box.run(["/bin/cat", "/proc/self/status"], spec=no_filter(box))
    assert "Seccomp:\t0" in r.stdout
    assert "NoNewPrivs:\t1" in r.stdout


def test_unshare_user_cmd_fails(box: Box) -> None:
    for args in (["unshare", "-U", "true"], ["unshare", "-m", "true"]):
        r = box.run(args)
        assert r.returncode != 0
        assert "Operation not permitted" in r.stderr


def test_unshare_user_cmd_without_filter(box: Box) -> None:
    r = box.run(["unshare", "-U", "true"], spec=no_filter(box))
    require(r.returncode == 0, f"unprivileged user namespaces unavailable: {r.stderr.strip()}")


def test_unshare_ctypes(box: Box) -> None:
    assert box.probe("unshare", hex(CLONE_NEWUSER)) == "EPERM"
    assert box.probe("unshare", hex(CLONE_NEWNS)) == "EPERM"
    assert box.probe("unshare", hex(CLONE_NEWUSER), spec=no_filter(box)) == "ok"


def test_mount_refused(box: Box) -> None:
    assert box.probe("mount") == "EPERM"


def test_mount_possible_without_layers(box: Box) -> None:
    # Twin: with no layer at all a nested user+mount namespace can mount a tmpfs, which
    # is the trick (isolation.md §9.2) the filter and Landlock must stop.
    spec = box.spec(landlock=False, seccomp_bpf=None, seccomp_expected=False, deny_probe=None)
    r = box.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /mnt"], spec=spec)
    require(r.returncode == 0, f"unprivileged user namespaces unavailable: {r.stderr.strip()}")


def test_clone3_enosys(box: Box) -> None:
    assert box.probe("clone3") == "ENOSYS"


def test_clone3_reachable_without_filter(box: Box) -> None:
    assert box.probe("clone3", spec=no_filter(box)) == "EINVAL"


def test_fork_and_threads_work(box: Box) -> None:
    assert box.probe("fork_and_thread") == "ok"


def test_io_uring_refused(box: Box) -> None:
    assert box.probe("io_uring_setup") == "EPERM"


def test_io_uring_without_filter(box: Box) -> None:
    got = box.probe("io_uring_setup", spec=no_filter(box))
    require(got == "ok", f"io_uring unavailable on this kernel ({got})")


def test_bpf_refused(box: Box) -> None:
    assert box.probe("bpf") == "EPERM"


def test_bpf_reachable_without_filter(box: Box) -> None:
    # An unknown command reaches the kernel's dispatcher and gets EINVAL.
    assert box.probe("bpf", spec=no_filter(box)) == "EINVAL"


def test_keyctl_refused(box: Box) -> None:
    assert box.probe("keyctl") == "EPERM"


def test_keyctl_without_filter(box: Box) -> None:
    assert box.probe("keyctl", spec=no_filter(box)) == "ok"


def test_ptrace_refused(box: Box) -> None:
    assert box.probe("ptrace_traceme") == "EPERM"
    assert box.probe("process_vm_readv") == "EPERM"


def test_ptrace_allowed_by_option(box: Box) -> None:
    spec = box.spec(seccomp_bpf=seccomp.build_filter(allow_ptrace=True))
    assert box.probe("ptrace_traceme", spec=spec) == "ok"
    assert box.probe("process_vm_readv", spec=spec) == "ok"


def test_userfaultfd_refused(box: Box) -> None:
    assert box.probe("userfaultfd") == "EPERM"


def test_userfaultfd_without_filter(box: Box) -> None:
    got = box.probe("userfaultfd", spec=no_filter(box))
    require(got == "ok", f"userfaultfd unavailable on this kernel ({got})")


def test_name_to_handle_at_refused(box: Box) -> None:
    assert box.probe("name_to_handle_at") == "EPERM"


def test_name_to_handle_at_without_filter(box: Box) -> None:
    assert box.probe("name_to_handle_at", spec=no_filter(box)) == "ok"


@pytest.mark.parametrize("request_", ["0x5412", "0x100005412", "0xffffffff00005412", "0x541c"])
def test_tiocsti_refused(box: Box, request_: str) -> None:
    assert box.probe("tiocsti", request_) == "EPERM"


def test_tiocsti_works_without_filter(box: Box) -> None:
    got = box.probe("tiocsti", spec=no_filter(box))
    require(got == "ok", f"TIOCSTI disabled by the kernel (dev.tty.legacy_tiocsti=0?): {got}")


def test_other_tty_ioctl_works(box: Box) -> None:
    assert box.probe("tiocgwinsz") == "ok"


@pytest.mark.parametrize(
    ("family", "type_", "proto"),
    [
        ("17", "3", "0"),  # AF_PACKET
        ("16", "3", "9"),  # AF_NETLINK, NETLINK_AUDIT
        ("16", "3", "4"),  # AF_NETLINK, NETLINK_SOCK_DIAG
        ("40", "1", "0"),  # AF_VSOCK
        ("38", "5", "0"),  # AF_ALG
        ("15", "3", "2"),  # AF_KEY
    ],
)
def test_socket_family_refused(box: Box, family: str, type_: str, proto: str) -> None:
    assert box.probe("sock", family, type_, proto) == "EPERM"


@pytest.mark.parametrize(
    ("family", "type_", "proto"),
    [
        ("16", "3", "0"),  # AF_NETLINK, NETLINK_ROUTE
        ("2", "1", "0"),  # AF_INET
        ("10", "2", "0"),  # AF_INET6
        ("1", "1", "0"),  # AF_UNIX
    ],
)
def test_socket_family_allowed(box: Box, family: str, type_: str, proto: str) -> None:
    assert box.probe("sock", family, type_, proto) == "ok"


def test_netlink_audit_without_filter(box: Box) -> None:
    assert box.probe("sock", "16", "3", "9", spec=no_filter(box)) == "ok"


def test_x32_syscall_kills(box: Box) -> None:
    require(os.uname().machine == "x86_64", "x32 exists only on x86_64")
    r = box.run(["/usr/bin/python3", str(PROBE), "x32_getpid"])
    assert r.returncode == -signal.SIGSYS, (r.returncode, r.stderr)


def test_mknod_char_device_fails(box: Box) -> None:
    assert box.probe("mknod_char", str(box.ws / "null2")) == "EPERM"
    assert not (box.ws / "null2").exists()


def test_mkfifo_works(box: Box) -> None:
    assert box.probe("mkfifo", str(box.ws / "fifo")) == "ok"


def test_setuid_copy_gains_nothing(box: Box) -> None:
    require(os.geteuid() == 0, "needs root to create a setuid-root copy")
    suid = box.ws / "id-suid"
    shutil.copy("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    suid.chmod(0o4755)
    r = box.run([str(suid), "-u"])
    assert (r.returncode, r.stdout) == (0, "65534\n"), r.stderr


def test_setuid_copy_works_outside(box: Box) -> None:
    # Twin: the same binary run as uid 65534 without the launcher does become root.
    require(os.geteuid() == 0, "needs root to create a setuid-root copy")
    suid = box.ws / "id-suid"
    shutil.copy("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    suid.chmod(0o4755)
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(suid), "-u"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.stdout == "0\n"
