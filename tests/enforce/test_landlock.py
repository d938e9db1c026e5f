"""The files layer: Landlock applied by the launcher, against the real kernel.

Every refusal has a twin showing the allowed operation (or the same operation with the
layer off) still works, so a test cannot pass because the setup itself is broken.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import time

import pytest

from stockade.enforce import landlock

from .conftest import Box, bwrap_works, require

pytestmark = pytest.mark.kernel


def test_abi_version_is_an_int_and_described(abi: int) -> None:
    require(abi >= 1, "kernel without Landlock")
    assert landlock.abi_version() == abi
    lines = landlock.describe(abi)
    assert len(lines) == len(landlock.ABI_FEATURES)
    assert lines[0].startswith("[x] ABI 1")
    assert landlock.missing_for(0) is not None
    assert landlock.missing_for(5, scope=True) is not None
    assert landlock.missing_for(5, scope=False) is None
    assert landlock.missing_for(abi, scope=abi >= 6) is None


def test_canary_unreadable(box: Box) -> None:
    assert box.probe("read", str(box.canary)) == "EACCES"


def test_canary_readable_without_landlock(box: Box) -> None:
    # The twin: only Landlock stands between the sandbox user and the canary.
    spec = box.spec(landlock=False, deny_probe=None)
    assert box.probe("read", str(box.canary), spec=spec) == "ok"


def test_workspace_read_write(box: Box) -> None:
    f = box.ws / "file.txt"
    assert box.probe("write", str(f)) == "ok"
    assert box.probe("read", str(f)) == "ok"
    assert f.read_text() == "written\n"


def test_write_outside_workspace_fails(box: Box) -> None:
    assert box.probe("write", str(box.outside / "x")) == "EACCES"
    assert not (box.outside / "x").exists()
    assert box.probe("write", str(box.home / ".bashrc")) == "EACCES"


def test_write_outside_works_without_landlock(box: Box) -> None:
    spec = box.spec(landlock=False, deny_probe=None)
    assert box.probe("write", str(box.outside / "x"), spec=spec) == "ok"


def test_truncate_outside_fails(box: Box, abi: int) -> None:
    require(abi >= 3, "Landlock TRUNCATE needs ABI 3 (Linux 6.2)")
    target = box.outside / "t"
    target.write_text("keep")
    target.chmod(0o666)
    assert box.probe("truncate", str(target)) == "EACCES"
    assert target.read_text() == "keep"
    inside = box.ws / "t"
    inside.write_text("drop")
    if os.geteuid() == 0:
        os.chown(inside, 65534, 65534)
    assert box.probe("truncate", str(inside)) == "ok"
    assert inside.read_text() == ""


def test_symlink_to_canary_unreadable(box: Box) -> None:
    (box.ws / "link").symlink_to(box.canary)
    assert box.probe("read", str(box.ws / "link")) == "EACCES"


def test_symlink_inside_workspace_readable(box: Box) -> None:
    (box.ws / "real").write_text("fine")
    (box.ws / "link").symlink_to(box.ws / "real")
    assert box.probe("read", str(box.ws / "link")) == "ok"


def test_write_through_symlink_out_fails(box: Box) -> None:
    (box.ws / "out").symlink_to(box.outside)
    assert box.probe("write", str(box.ws / "out" / "x")) == "EACCES"


def test_hard_link_to_canary_refused(box: Box) -> None:
    assert box.probe("link", str(box.canary), str(box.ws / "hl")) in {"EXDEV", "EACCES"}
    assert not (box.ws / "hl").exists()


def test_hard_link_to_canary_without_landlock(box: Box) -> None:
    # Twin: the canary is owned by the sandbox user, so fs.protected_hardlinks allows it.
    spec = box.spec(landlock=False, deny_probe=None)
    assert box.probe("link", str(box.canary), str(box.ws / "hl"), spec=spec) == "ok"


def test_hard_link_inside_workspace(box: Box) -> None:
    script = "echo a > a && mkdir sub && ln a sub/b && cat sub/b"
    r = box.sh(script)
    assert (r.returncode, r.stdout) == (0, "a\n"), r.stderr


def test_rename_out_of_workspace_fails(box: Box) -> None:
    (box.ws / "f").write_text("x")
    assert box.probe("rename", str(box.ws / "f"), str(box.outside / "f")) in {"EXDEV", "EACCES"}
    assert (box.ws / "f").exists()
    assert not (box.outside / "f").exists()


def test_rename_within_workspace(box: Box, abi: int) -> None:
    require(abi >= 2, "cross-directory rename needs Landlock REFER (ABI 2)")
    (box.ws / "f").write_text("x")
    (box.ws / "sub").mkdir()
    os.chmod(box.ws / "sub", 0o777)
    assert box.probe("rename", str(box.ws / "f"), str(box.ws / "sub" / "f")) == "ok"
    assert (box.ws / "sub" / "f").read_text() == "x"


def test_rename_in_from_outside_fails(box: Box) -> None:
    (box.outside / "g").write_text("x")
    os.chmod(box.outside / "g", 0o666)
    assert box.probe("rename", str(box.outside / "g"), str(box.ws / "g")) in {"EXDEV", "EACCES"}


def test_missing_path_is_skipped(box: Box) -> None:
    spec = box.spec(read_paths=(*box.spec().read_paths, "/nonexistent/stockade"), debug=True)
    r = box.run(["/bin/true"], spec=spec)
    assert r.returncode == 0, r.stderr
    assert "skipping read path /nonexistent/stockade" in r.stderr


def test_missing_path_silent_without_debug(box: Box) -> None:
    spec = box.spec(read_paths=(*box.spec().read_paths, "/nonexistent/stockade"))
    r = box.run(["/bin/true"], spec=spec)
    assert (r.returncode, r.stderr) == (0, "")


def test_unreachable_rule_path_aborts(box: Box) -> None:
    # Any error other than ENOENT on a rule path fails closed.
    spec = box.spec(read_paths=(*box.spec().read_paths, f"{box.canary}/below"))
    r = box.run(["/bin/true"], spec=spec)
    assert r.returncode == 125
    assert "ENOTDIR" in r.stderr
    assert r.stderr.count("\n") == 1


def test_deny_probe_that_is_allowed_aborts(box: Box) -> None:
    (box.ws / "p").write_text("x")
    r = box.run(["/bin/echo", "ran"], spec=box.spec(deny_probe=str(box.ws / "p")))
    assert r.returncode == 125
    assert r.stdout == ""
    assert "verification failed" in r.stderr


def test_deny_probe_root_dir(box: Box) -> None:
    # "/" itself is outside every rule here, so it works as a probe that always exists.
    r = box.run(["/bin/echo", "ran"], spec=box.spec(deny_probe="/"))
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr


def test_default_probe_is_root(box: Box) -> None:
    spec = box.spec(deny_probe=None, debug=True)
    r = box.run(["/bin/echo", "ran"], spec=spec)
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    assert "verified: / denied with EACCES" in r.stderr


def test_default_probe_skipped_when_root_is_a_rule(box: Box) -> None:
    spec = box.spec(deny_probe=None, read_paths=("/",), debug=True)
    r = box.run(["/bin/cat", str(box.canary)], spec=spec)
    # "/" readable means the canary is too: the policy, not the launcher, decides that.
    assert (r.returncode, r.stdout) == (0, "CANARY-SECRET\n"), r.stderr
    assert "verified" not in r.stderr


def test_deny_probe_missing_aborts(box: Box) -> None:
    r = box.run(["/bin/true"], spec=box.spec(deny_probe=str(box.home / "absent")))
    assert r.returncode == 125
    assert "ENOENT" in r.stderr


def _enosys_landlock_filter() -> bytes:
    """A seccomp program making landlock_create_ruleset (444) fail with ENOSYS."""
    ld_nr = struct.pack("HBBI", 0x20, 0, 0, 0)
    jeq = struct.pack("HBBI", 0x15, 0, 1, 444)
    ret_enosys = struct.pack("HBBI", 0x06, 0, 0, 0x00050000 | 38)
    ret_allow = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)
    return ld_nr + jeq + ret_enosys + ret_allow


def test_fail_closed_without_landlock_in_kernel(box: Box) -> None:
    """A kernel without Landlock (simulated by seccomp ENOSYS) must not run the command."""
    from stockade.enforce.launcher import serialize

    inner = box.ws / "inner.spec"
    inner.write_bytes(serialize(box.spec()))
    outer = box.spec(landlock=False, deny_probe=None, seccomp_bpf=_enosys_landlock_filter())
    marker = box.ws / "ran"
    script = f'exec "$0" 3 -- /bin/touch {marker} 3< {inner}'
    r = box.run(["/bin/sh", "-c", script, str(box.launcher)], spec=outer)
    assert r.returncode == 125, r.stderr
    assert "landlock_create_ruleset failed: ENOSYS" in r.stderr
    assert "--disable files" in r.stderr
    assert not marker.exists()


def test_spec_from_a_file_fd_runs(box: Box) -> None:
    # Twin of the fail-closed test: the same chain without the ENOSYS filter runs.
    from stockade.enforce.launcher import serialize

    inner = box.ws / "inner.spec"
    inner.write_bytes(serialize(box.spec()))
    marker = box.ws / "ran"
    script = f'exec "$0" 3 -- /bin/touch {marker} 3< {inner}'
    outer = box.spec(landlock=False, deny_probe=None)
    r = box.run(["/bin/sh", "-c", script, str(box.launcher)], spec=outer)
    assert r.returncode == 0, r.stderr
    assert marker.exists()


# --- scopes (ABI 6) ---------------------------------------------------------------


@pytest.fixture
def outside_listener() -> tuple[socket.socket, str]:
    name = f"stockade-outside-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("\0" + name)
    srv.listen(4)
    return srv, name


def test_abstract_socket_outside_refused(
    box: Box, abi: int, outside_listener: tuple[socket.socket, str]
) -> None:
    require(abi >= 6, "Landlock scopes need ABI 6 (Linux 6.12)")
    srv, name = outside_listener
    with srv:
        assert box.probe("abstract_connect", name) == "EPERM"


def test_abstract_socket_outside_reachable_without_scope(
    box: Box, outside_listener: tuple[socket.socket, str]
) -> None:
    srv, name = outside_listener
    with srv:
        assert box.probe("abstract_connect", name, spec=box.spec(scope=False)) == "ok"


def test_abstract_socket_inside_works(box: Box, abi: int) -> None:
    require(abi >= 6, "Landlock scopes need ABI 6 (Linux 6.12)")
    assert box.probe("abstract_inside") == "ok"


@pytest.fixture
def outside_process() -> subprocess.Popen[bytes]:
    cmd = ["sleep", "60"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.Popen(cmd)
    return proc


def test_kill_outside_refused(box: Box, abi: int, outside_process: subprocess.Popen[bytes]) -> None:
    require(abi >= 6, "Landlock signal scope needs ABI 6 (Linux 6.12)")
    try:
        assert box.probe("kill", str(outside_process.pid)) == "EPERM"
        assert outside_process.poll() is None
    finally:
        outside_process.kill()
        outside_process.wait()


def test_kill_outside_without_scope(box: Box, outside_process: subprocess.Popen[bytes]) -> None:
    try:
        assert box.probe("kill", str(outside_process.pid), spec=box.spec(scope=False)) == "ok"
        assert outside_process.wait(timeout=10) == -signal.SIGTERM
    finally:
        outside_process.kill()
        outside_process.wait()


def test_kill_inside_works(box: Box, abi: int) -> None:
    require(abi >= 6, "Landlock signal scope needs ABI 6 (Linux 6.12)")
    assert box.probe("kill_child") == "ok"


# --- inside bubblewrap --------------------------------------------------------------


def test_in_bwrap_canary_denied_workspace_writable(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    script = f"cat {box.canary}; echo rc=$?; echo hi > out && cat out"
    r = box.sh(script, bwrap=True)
    assert r.returncode == 0, r.stderr
    assert "CANARY" not in r.stdout
    assert "Permission denied" in r.stderr
    assert r.stdout.splitlines() == ["rc=1", "hi"]
