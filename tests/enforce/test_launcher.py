"""The inner launcher: spec format, build cache, strict checks, and real toolchains."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from stockade._exceptions import Unavailable
from stockade.enforce import launcher
from stockade.enforce.launcher import LauncherSpec, prepare, serialize

from .conftest import BWRAP, NOBODY, SITE_PACKAGES, SYSTEM_PYTHON, Box, bwrap_works, require

# --- format and build (no kernel features needed) ------------------------------------


def test_serialize_format() -> None:
    spec = LauncherSpec(
        read_paths=("/usr",),
        write_paths=("/w",),
        landlock=True,
        scope=False,
        seccomp_bpf=b"\x06\x00\x00\x00\x00\x00\xff\x7f",
        deny_probe="/",
    )
    assert serialize(spec) == (
        b"stockade-spec/1\0L=1\0S=0\0E=1\0D=0\0r=/usr\0w=/w\0p=/\0B=8\0"
        b"\x06\x00\x00\x00\x00\x00\xff\x7f"
        b"END\0"
    )


def test_serialize_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not absolute"):
        serialize(LauncherSpec(read_paths=("usr",)))
    with pytest.raises(ValueError, match="NUL"):
        serialize(LauncherSpec(write_paths=("/a\0b",)))
    with pytest.raises(ValueError, match="insns"):
        serialize(LauncherSpec(seccomp_bpf=b"\0" * 7))
    with pytest.raises(ValueError, match="insns"):
        serialize(LauncherSpec(seccomp_bpf=b""))
    with pytest.raises(ValueError, match="mount kind"):
        serialize(LauncherSpec(mounts=(("x", "/etc"),)))
    with pytest.raises(ValueError, match="not absolute"):
        serialize(LauncherSpec(mounts=(("b", "etc"),)))


def test_build_is_cached_private_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = launcher.build_launcher()
    assert first.parent == tmp_path / "stockade"
    assert first.name.startswith("launcher-")
    assert len(first.name) == len("launcher-") + 16
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert os.access(first, os.X_OK)
    mtime = first.stat().st_mtime_ns
    assert launcher.build_launcher() == first
    assert first.stat().st_mtime_ns == mtime
    # No temporary build directory is left behind.
    assert [p.name for p in first.parent.iterdir()] == [first.name]


def test_untrusted_cached_binary_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = launcher.launcher_path()
    target.parent.mkdir(mode=0o700, parents=True)
    target.write_text("#!/bin/sh\necho planted\n")
    target.chmod(0o777)  # world-writable: anyone could have planted it
    built = launcher.build_launcher()
    assert built == target
    assert not built.read_bytes().startswith(b"#!")
    assert stat.S_IMODE(built.stat().st_mode) == 0o700


def test_no_compiler_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(Unavailable) as info:
        launcher.build_launcher()
    assert info.value.feature == "the inner launcher (a C compiler to build it)"
    assert "apt-get install gcc" in info.value.fix


def test_prepare_gives_a_sealed_memfd(launcher_bin: Path) -> None:
    prefix, fd = prepare(LauncherSpec(landlock=False, scope=False))
    try:
        assert prefix[1:] == [str(fd), "--"]
        assert Path(prefix[0]).name.startswith("launcher-")
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE
        with pytest.raises(OSError) as info:
            os.write(fd, b"x")
        assert info.value.errno == errno.EPERM
        assert os.pread(fd, 15, 0) == launcher.SPEC_MAGIC
    finally:
        os.close(fd)


def _raw(
    launcher_bin: Path, argv: list[str], spec: bytes | None
) -> subprocess.CompletedProcess[str]:
    """Run the launcher with a spec given through a pipe (the non-memfd path)."""
    r_fd, w_fd = os.pipe()
    cmd = [str(launcher_bin), *(a.replace("{fd}", str(r_fd)) for a in argv)]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    try:
        if spec is not None:
            os.write(w_fd, spec)
        os.close(w_fd)
        return subprocess.run(
            cmd, pass_fds=(r_fd,), capture_output=True, text=True, check=False, cwd="/"
        )
    finally:
        os.close(r_fd)


@pytest.mark.parametrize(
    ("argv", "spec", "needle"),
    [
        (["3"], b"", "usage"),
        (["x", "--", "true"], b"", "bad SPEC_FD"),
        (["1", "--", "true"], b"", "bad SPEC_FD"),
        (["{fd}", "--", "true"], b"garbage\0END\0", "magic"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0L=0\0", "truncated"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0L=2\0END\0", "not 0 or 1"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0Q=1\0END\0", "unknown key"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0r=rel\0END\0", "not absolute"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0B=7\0abcdefgEND\0", "seccomp program"),
        (["{fd}", "--", "true"], b"stockade-spec/1\0END\0junk", "after END"),
    ],
)
def test_bad_invocation_exits_125_with_one_line(
    launcher_bin: Path, argv: list[str], spec: bytes, needle: str
) -> None:
    r = _raw(launcher_bin, argv, spec)
    assert r.returncode == 125
    assert needle in r.stderr
    assert r.stderr.startswith("stockade: ")
    assert r.stderr.count("\n") == 1


def test_pipe_spec_runs(launcher_bin: Path) -> None:
    spec = serialize(LauncherSpec(landlock=False, scope=False))
    r = _raw(launcher_bin, ["{fd}", "--", "/bin/echo", "ran"], spec)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ran\n", "")


# --- strict checks against the real kernel -----------------------------------------------


@pytest.mark.kernel
def test_capabilities_left_abort(box: Box) -> None:
    require(os.geteuid() == 0, "needs root to start with capabilities")
    prefix, fd = prepare(box.spec())
    prefix[0] = str(box.launcher)
    marker = box.ws / "ran"
    try:
        r = subprocess.run(
            [*prefix, "/bin/touch", str(marker)],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
    assert r.returncode == 125
    assert "capabilities remain" in r.stderr
    assert "--cap-drop ALL" in r.stderr
    assert not marker.exists()


@pytest.mark.kernel
def test_root_bwrap_without_cap_drop_aborts(box: Box) -> None:
    require(os.geteuid() == 0, "needs root")
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    prefix, fd = prepare(box.spec())
    prefix[0] = str(box.launcher)
    try:
        r = subprocess.run(
            [*BWRAP, "--", *prefix, "/bin/true"],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
    assert r.returncode == 125
    assert "capabilities remain" in r.stderr


@pytest.mark.kernel
def test_root_bwrap_with_cap_drop_runs(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    r = box.run(["/bin/cat", "/proc/self/status"], root_in_bwrap=True)
    assert r.returncode == 0, r.stderr
    assert "Seccomp:\t2" in r.stdout
    assert "NoNewPrivs:\t1" in r.stdout


@pytest.mark.kernel
def test_bwrap_as_nobody_status_and_layers(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    r = box.sh("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; unshare -U true", bwrap=True)
    assert r.stdout.split() == ["NoNewPrivs:", "1", "Seccomp:", "2"]
    assert r.returncode != 0


@pytest.mark.kernel
def test_bwrap_seccomp_fd_verified_by_launcher(box: Box) -> None:
    """bwrap loads the filter (--seccomp FD); the spec only asks the launcher to verify."""
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    bpf_r, bpf_w = os.pipe()
    os.write(bpf_w, box.spec().seccomp_bpf or b"")
    os.close(bpf_w)
    prefix, fd = prepare(box.spec(seccomp_bpf=None, seccomp_expected=True))
    prefix[0] = str(box.launcher)
    cmd = [*BWRAP, "--cap-drop", "ALL", "--seccomp", str(bpf_r), "--", *prefix]
    try:
        ok = subprocess.run(
            [*cmd, "unshare", "-U", "true"],
            pass_fds=(fd, bpf_r),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
        os.close(bpf_r)
    assert ok.returncode == 1
    assert "Operation not permitted" in ok.stderr


@pytest.mark.kernel
def test_seccomp_expected_but_absent_aborts(box: Box) -> None:
    r = box.run(["/bin/echo", "ran"], spec=box.spec(seccomp_bpf=None, seccomp_expected=True))
    assert r.returncode == 125
    assert r.stdout == ""
    assert "Seccomp is not 2" in r.stderr


@pytest.mark.kernel
def test_inherited_fds_closed(box: Box) -> None:
    extra = os.open("/etc/hostname", os.O_RDONLY)
    prefix, fd = prepare(box.spec())
    prefix[0] = str(box.launcher)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    outer = drop if os.geteuid() == 0 else []
    try:
        r = subprocess.run(
            [
                *outer,
                *prefix,
                "/usr/bin/python3",
                "-c",
                "import json, os; print(json.dumps([int(x) for x in os.listdir('/proc/self/fd')]))",
            ],
            pass_fds=(fd, extra),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)
        os.close(extra)
    assert r.returncode == 0, r.stderr
    # 0-2 and the fd listdir itself opened; neither the spec fd nor the extra one.
    assert sorted(json.loads(r.stdout)) == [0, 1, 2, 3]


@pytest.mark.kernel
def test_exec_not_found_127(box: Box) -> None:
    r = box.run(["no-such-command-stockade"])
    assert r.returncode == 127
    assert r.stderr == "stockade: cannot run no-such-command-stockade: No such file or directory\n"


@pytest.mark.kernel
def test_exec_not_executable_126(box: Box) -> None:
    f = box.ws / "script"
    f.write_text("#!/bin/sh\n")
    f.chmod(0o644)
    r = box.run([str(f)])
    assert r.returncode == 126
    assert r.stderr == f"stockade: cannot run {f}: Permission denied\n"


@pytest.mark.kernel
def test_exit_code_passes_through(box: Box) -> None:
    assert box.sh("exit 42").returncode == 42


def test_under_gvisor_one_close_range_closes_every_inherited_descriptor(
    launcher_bin: Path, runsc: str, tmp_path: Path
) -> None:
    """gVisor's Sentry refuses close_range with a bound above INT_MAX (EINVAL). The
    launcher's bound is INT_MAX, so there too one call closes every descriptor above 2,
    not one close() per possible descriptor (RLIMIT_NOFILE of them: some 50 ms of every
    gVisor run, more on a loaded machine)."""
    spec = tmp_path / "spec"
    spec.write_bytes(
        serialize(LauncherSpec(landlock=False, scope=False, debug=True, drop_caps=True))
    )
    script = f"exec 7</dev/null 1000</dev/null; exec {launcher_bin} {spec} -- ls /proc/self/fd"
    r = subprocess.run(
        [runsc, "--rootless", "--network=none", "do", "bash", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    assert "closed every descriptor above 2 with close_range" in r.stderr
    assert "one by one" not in r.stderr
    # 0-2, and ls's own descriptor of the directory it lists: neither 7 nor 1000.
    assert sorted(r.stdout.split(), key=int) == ["0", "1", "2", "3"]


# --- toolchains keep working with both layers ----------------------------------------


@pytest.mark.kernel
def test_python_asyncio_loopback(box: Box) -> None:
    code = textwrap.dedent(
        """
        import asyncio
        async def handle(r, w):
            w.write((await r.readline()).upper()); await w.drain(); w.close()
        async def main():
            srv = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"ping\\n"); await w.drain()
            print((await r.readline()).decode().strip())
            srv.close(); await srv.wait_closed()
        asyncio.run(main())
        """
    )
    r = box.run([SYSTEM_PYTHON, "-c", code])
    assert (r.returncode, r.stdout) == (0, "PING\n"), r.stderr


@pytest.mark.kernel
def test_python_multiprocessing_pool(box: Box) -> None:
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        if __name__ == "__main__":
            with mp.Pool(2) as p:
                print(sum(p.map(abs, range(-10, 0))))
        """
    )
    (box.ws / "mp.py").write_text(code)
    r = box.run([SYSTEM_PYTHON, "mp.py"])
    assert (r.returncode, r.stdout) == (0, "55\n"), r.stderr


@pytest.mark.kernel
def test_git_init_commit(box: Box) -> None:
    require(shutil.which("git") is not None, "git not installed")
    r = box.sh(
        "git init -q repo && cd repo && echo x > f && git add f && "
        "git -c user.name=t -c user.email=t@example.test commit -qm init && "
        "git log --oneline | wc -l"
    )
    assert (r.returncode, r.stdout.strip()) == (0, "1"), r.stderr


@pytest.mark.kernel
def test_gcc_hello_and_make(box: Box) -> None:
    require(
        shutil.which("gcc") is not None and shutil.which("make") is not None, "gcc/make missing"
    )
    (box.ws / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("hello");return 0;}\n')
    (box.ws / "Makefile").write_text("hello: hello.c\n\tgcc -O2 -o hello hello.c\n")
    r = box.sh("make -s && ./hello")
    assert (r.returncode, r.stdout) == (0, "hello\n"), r.stderr


@pytest.mark.kernel
def test_node_child_process_and_worker(box: Box) -> None:
    require(shutil.which("node") is not None, "node not installed")
    code = (
        "const {execFileSync}=require('child_process');"
        "const {Worker}=require('worker_threads');"
        "const out=execFileSync('/bin/echo',['child']).toString().trim();"
        "new Worker('require(\"worker_threads\").parentPort.postMessage(6*7)',{eval:true})"
        ".on('message',m=>{console.log(out,m);});"
    )
    r = box.run(["node", "-e", code])
    assert (r.returncode, r.stdout) == (0, "child 42\n"), r.stderr


@pytest.mark.kernel
def test_npm_and_pip_version(box: Box) -> None:
    require(shutil.which("npm") is not None, "npm not installed")
    r = box.run(["npm", "--version"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()[0].isdigit()
    r = box.run([SYSTEM_PYTHON, "-m", "pip", "--version"])
    require(r.returncode == 0 or "No module named pip" not in r.stderr, "pip not installed")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("pip ")


@pytest.mark.kernel
def test_pytest_inside(box: Box) -> None:
    require(SITE_PACKAGES is not None and (SITE_PACKAGES / "pytest").is_dir(), "pytest missing")
    (box.ws / "test_tiny.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    env = {"PYTHONPATH": str(SITE_PACKAGES), "PYTHONDONTWRITEBYTECODE": "1"}
    r = box.run(
        [SYSTEM_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py"], env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


@pytest.mark.kernel
def test_toolchain_inside_bwrap(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    (box.ws / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("hello");return 0;}\n')
    r = box.sh(
        "gcc -o hello hello.c && ./hello && git init -q r && "
        "node -e \"require('child_process').execFileSync('/bin/true')\" && echo node",
        bwrap=True,
    )
    assert (r.returncode, r.stdout) == (0, "hello\nnode\n"), r.stderr


LAUNCHER_CAPS = ("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP")


def _mount_layout(box: Box) -> list[tuple[str, str]]:
    """Files for each kind of launcher mount, and the spec's mounts over them."""
    (box.ws / "prot").write_text("orig\n")
    (box.ws / "pindir").mkdir()
    (box.ws / "pindir" / "inner").write_text("x\n")
    (box.ws / "maskme").write_text("MASKED-FILE\n")
    (box.ws / "maskdir").mkdir()
    (box.ws / "maskdir" / "secret").write_text("MASKED-DIR\n")
    if os.geteuid() == 0:
        for path in box.ws.rglob("*"):
            os.chown(path, NOBODY, NOBODY)
    return [
        ("k", str(box.ws / "pindir")),
        ("b", str(box.ws / "prot")),
        ("n", str(box.ws / "maskme")),
        ("t", str(box.ws / "maskdir")),
    ]


@pytest.mark.kernel
def test_launcher_mounts_then_gives_up_every_capability(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    mounts = _mount_layout(box)
    r = box.sh(
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status;"
        " echo evil > prot; cat maskme; ls -A maskdir; touch maskdir/new;"
        " mv pindir pinned2; echo ok > free; echo done",
        spec=box.spec(mounts=tuple(mounts)),
        bwrap=True,
        bwrap_args=LAUNCHER_CAPS,
    )
    assert r.returncode == 0, r.stderr
    caps = r.stdout.splitlines()[:5]
    assert [line.split()[1] for line in caps] == ["0000000000000000"] * 5, caps
    assert "MASKED" not in r.stdout
    assert (box.ws / "prot").read_text() == "orig\n"
    assert (box.ws / "pindir" / "inner").exists()
    assert not (box.ws / "maskdir" / "new").exists()
    assert "Device or resource busy" in r.stderr  # the pinned directory cannot move
    # The twin: the rest of the workspace stays writable, and the masked files are intact.
    assert (box.ws / "free").read_text() == "ok\n"
    assert (box.ws / "maskme").read_text() == "MASKED-FILE\n"
    assert r.stdout.endswith("done\n")


@pytest.mark.kernel
def test_launcher_mounts_need_landlock(box: Box) -> None:
    """Its mounts live in a mount namespace of its own; bubblewrap's init keeps the old
    one, and only Landlock keeps a sandboxed process out of /proc/1/root."""
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    mounts = _mount_layout(box)
    r = box.sh(
        "echo ran > free",
        spec=box.spec(mounts=tuple(mounts), landlock=False, scope=False, deny_probe=None),
        bwrap=True,
        bwrap_args=LAUNCHER_CAPS,
    )
    assert r.returncode == 125
    assert "need Landlock" in r.stderr
    assert not (box.ws / "free").exists()
    # The twin: with Landlock, the same mounts are made and the command runs.
    ok = box.sh(
        "echo ran > free", spec=box.spec(mounts=tuple(mounts)), bwrap=True, bwrap_args=LAUNCHER_CAPS
    )
    assert ok.returncode == 0, ok.stderr
    assert (box.ws / "free").read_text() == "ran\n"


@pytest.mark.kernel
def test_launcher_mounts_without_the_capability_fail_closed(box: Box) -> None:
    require(bwrap_works(), "bubblewrap cannot create namespaces here")
    mounts = _mount_layout(box)
    r = box.sh("echo ran > free", spec=box.spec(mounts=tuple(mounts)), bwrap=True)
    assert r.returncode == 125
    assert "EPERM" in r.stderr
    assert not (box.ws / "free").exists()
    # The twin: given the capabilities, the same spec runs.
    ok = box.sh(
        "echo ran > free", spec=box.spec(mounts=tuple(mounts)), bwrap=True, bwrap_args=LAUNCHER_CAPS
    )
    assert ok.returncode == 0, ok.stderr
    assert (box.ws / "free").read_text() == "ran\n"
