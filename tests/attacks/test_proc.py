"""attacks.md A.3 (PROC): process containment, through ``stockade run`` with all layers.

Not applicable here:
* PROC-10 (getting around a command denylist): stockade has no command denylist; it
  enforces on file and network capability, whatever the executable's name. The four
  bypass spellings are still run below against an egress denial, to show they gain
  nothing.
* PROC-13 (TOCTOU on a supervised unix-socket allow-list): stockade does not use seccomp
  user notification or any per-path socket allow-list that a racing thread could flip; the
  unix sockets of the host are simply not in the sandbox's mount namespace (HOST-01/04).
* PROC-08 ``screen``: not installed on this host; the tmux variant covers the class.
* PROC-09 (b) by turning off user namespaces host-wide (``sysctl``) would disturb every
  other process on this machine; a bubblewrap that fails the way it fails without user
  namespaces (``STOCKADE_BWRAP``) stands in for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.attacks.conftest import Arena, Result


def pids_with(marker: str) -> list[int]:
    """Host pids whose argv contains ``marker`` (and that are not stockade itself)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if any(marker.encode() in a for a in argv) and b"stockade" not in argv[:3]:
                out.append(int(entry.name))
    return out


def wait_gone(marker: str, seconds: float = 5) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and pids_with(marker):
        time.sleep(0.05)
    return pids_with(marker)


# ---------------------------------------------------------------------------------------
# PROC-01/02: background and daemonised processes.

LEFTOVERS = {
    "disown": "(while :; do date >> tick-{m}; sleep 0.2; done) & disown",
    "setsid-nohup": "setsid -f nohup sh -c 'sleep 1000' {m} >/dev/null 2>&1",
    "double-fork": (
        "python3 -c $'import os,time\\nif os.fork()==0:\\n os.setsid()\\n"
        " if os.fork()==0: time.sleep(1000)' {m}"
    ),
    "nohup-bg": "nohup sh -c 'sleep 1000' {m} >/dev/null 2>&1 & true",
}


@pytest.mark.parametrize("name", sorted(LEFTOVERS))
def test_proc_01_02_nothing_outlives_the_run(arena: Arena, name: str) -> None:
    marker = f"m{uuid.uuid4().hex}"
    script = LEFTOVERS[name].format(m=marker)
    # The twin: the same process does start and run inside while the command lives.
    alive = arena.run("bash", "-c", f"{script}; sleep 0.6; ps -eo args")
    assert marker in alive.proc.stdout or (arena.workspace / f"tick-{marker}").exists(), (
        alive.proc.stdout + alive.proc.stderr
    )
    res = arena.run("bash", "-c", f"{script}; exit 0")
    assert res.proc.returncode == 0, res.proc.stderr
    assert wait_gone(marker) == []
    tick = arena.workspace / f"tick-{marker}"
    if tick.exists():
        size = tick.stat().st_size
        time.sleep(1)
        assert tick.stat().st_size == size
        tick.unlink()


# ---------------------------------------------------------------------------------------
# PROC-04/05: signals, ptrace and memory of host processes (F-HOSTPROC).

SIGNAL_PROBE = r"""
import ctypes, signal
hostpid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *a):
    r = getattr(libc, name)(*a)
    return {"r": r, "errno": errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}
isolated = len([p for p in os.listdir("/proc") if p.isdigit()]) < 30 and not os.path.exists(f"/proc/{hostpid}")
emit("isolated", ok=isolated)
if isolated:  # a safety interlock: "kill -1" only where it cannot reach the host
    emit("kill-stop", **sh(f"kill -STOP {hostpid}"))
    emit("kill-9", **sh(f"kill -9 {hostpid}"))
    emit("pidfd", **call("syscall", 434, hostpid, 0))  # pidfd_open
    emit("ptrace", **call("ptrace", 16, hostpid, 0, 0))  # PTRACE_ATTACH
    emit("ptrace-seize", **call("ptrace", 0x4206, hostpid, 0, 0))
    buf = ctypes.create_string_buffer(64)
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = iovec(0x400000, 64)
    emit("vm_readv", **call("process_vm_readv", hostpid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
    emit("mem", **read(f"/proc/{hostpid}/mem"))
    emit("gdb", **sh(f"gdb -p {hostpid} -batch -ex 'info proc' 2>&1", timeout=20))
    emit("pkill", **sh("pkill -u $(id -u) -f 'time.sleep(600)'; true"))
    emit("kill-1", **sh("kill -9 -1 2>/dev/null; echo after"))
"""


def test_proc_04_05_host_process_untouched(arena: Arena) -> None:
    pid = arena.hostproc.pid
    res = arena.py(SIGNAL_PROBE, str(pid), timeout=60)
    assert res["isolated"]["ok"] is True, "the sandbox sees the host's processes"
    for key in ("kill-stop", "kill-9"):
        assert res[key]["rc"] != 0, res[key]
    for key in ("pidfd", "ptrace", "ptrace-seize", "vm_readv"):
        assert res[key]["r"] == -1, res[key]
        if arena.gvisor and key == "pidfd":
            # runsc 20240729 has no pidfd_open at all (its twin below gets the same).
            assert res[key]["errno"] == "ENOSYS", res[key]
        else:
            assert res[key]["errno"] in ("ESRCH", "EPERM"), res[key]
    assert res["mem"]["ok"] is False
    assert arena.canary not in json.dumps(res.lines)
    arena.assert_no_leak(res)
    assert arena.hostproc.poll() is None
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in ("S", "R"), state


def test_proc_04_05_twin_own_processes(arena: Arena) -> None:
    probe = r"""
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
child = subprocess.Popen(["sleep", "30"])
os.kill(child.pid, signal.SIGSTOP); os.kill(child.pid, signal.SIGKILL)
emit("kill", rc=child.wait())
emit("self-mem", ok=os.path.getsize("/proc/self/cmdline") >= 0 and len(open("/proc/self/cmdline","rb").read()) > 0)
emit("pidfd", fd=libc.syscall(434, os.getpid(), 0))
"""
    res = arena.py(probe)
    assert res["kill"]["rc"] == -9
    assert res["self-mem"]["ok"] is True
    if arena.gvisor:
        assert res["pidfd"]["fd"] == -1  # ENOSYS in the Sentry, for every pid alike
    else:
        assert res["pidfd"]["fd"] >= 0


# ---------------------------------------------------------------------------------------
# PROC-07/08: systemd, D-Bus and tmux servers outside.

SPAWN_PROBE = r"""
mark, bus, tmux, xdg = sys.argv[1:5]
user = f"XDG_RUNTIME_DIR={xdg} DBUS_SESSION_BUS_ADDRESS=unix:path={bus}"
emit("systemd-run-user", **sh(f"{user} systemd-run --user --scope touch {mark}", timeout=20))
emit("systemd-run", **sh(f"systemd-run --scope touch {mark}", timeout=20))
emit("busctl", **sh(f"{user} busctl --user call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager StartTransientUnit 'ssa(sv)a(sa(sv))' x.scope fail 0 0", timeout=20))
emit("tmux", **sh(f"tmux -S {tmux} run-shell 'touch {mark}'", timeout=20))
emit("tmux-default", **sh(f"tmux run-shell 'touch {mark}'", timeout=20))
# The twin: a tmux server of the sandbox's own works.
emit("twin", **sh(f"tmux -S ./own-tmux new-session -d 'sleep 5' && tmux -S ./own-tmux run-shell 'echo own-ok > own-tmux.out' && sleep 0.3 && cat own-tmux.out; tmux -S ./own-tmux kill-server", timeout=20))
"""


def test_proc_07_08_no_spawning_through_host_services(arena: Arena) -> None:
    arena.reset()
    res = arena.py(
        SPAWN_PROBE,
        str(arena.mark),
        str(arena.unix["session_bus"]),
        str(arena.unix["tmux"]),
        str(arena.xdg_runtime),
    )
    try:
        for key in ("systemd-run-user", "systemd-run", "busctl", "tmux", "tmux-default"):
            assert res[key]["rc"] != 0, (key, res[key])
        arena.assert_marks_unchanged()
        arena.assert_sinks_quiet()
        assert res["twin"]["out"].strip() == "own-ok", res["twin"]
    finally:
        for name in ("own-tmux", "own-tmux.out"):
            with contextlib.suppress(FileNotFoundError):
                (arena.workspace / name).unlink()


# ---------------------------------------------------------------------------------------
# PROC-09: disabling the sandbox from inside, and failing closed when it is unavailable.

NESTED = r"""
home = os.path.expanduser("~")
src = sys.argv[1]
off = "--disable files --disable container --disable syscalls --disable secrets --disable egress"
emit("nested", **sh(f"PYTHONPATH={src} python3 -m stockade run {off} -- sh -c 'cat {home}/.ssh/id_ed25519; echo ran-inner'", timeout=60))
emit("env-off", **sh(f"STOCKADE_DISABLE=all STOCKADE_UNSANDBOXED=1 cat {home}/.ssh/id_ed25519"))
"""


def test_proc_09a_no_way_to_disable_from_inside(arena: Arena) -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    policy = arena.root / "nested.toml"
    site = Path(json.__file__).parent  # the stdlib; the venv's site-packages next to it
    purelib = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    policy.write_text(
        arena.policy_text() + f'[filesystem]\nread = ["{src}", "{purelib}", "{site}"]\n'
    )
    res = arena.py(NESTED, str(src), policy=policy, timeout=90)
    assert arena.canary not in json.dumps(res.lines)
    arena.assert_no_leak(res)


FAKE_BWRAP = """#!/bin/sh
echo "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged user namespaces" >&2
exit 1
"""


#: A runsc that reports a usable release but cannot make its sandbox, as runsc does on a
#: host without user namespaces; it runs nothing (and writes no --pid-file).
FAKE_RUNSC = """#!/bin/sh
case "$*" in *--version*) echo 'runsc version release-20240729.0'; exit 0;; esac
echo "running container: creating container: cannot create sandbox: unshare: operation not permitted (no user namespaces)" >&2
exit 1
"""


def test_proc_09b_fails_closed_without_namespaces(arena: Arena) -> None:
    fake = arena.root / "fake-bwrap"
    fake.write_text(FAKE_RUNSC if arena.gvisor else FAKE_BWRAP)
    fake.chmod(0o755)
    marker = arena.workspace / "ran-unsandboxed"
    # Under gVisor the stand-in is runsc's: never a fallback to bubblewrap, and its exit
    # 1 is the sandbox's failure (exit 125), not the command's.
    env = dict(arena.env, **{"STOCKADE_RUNSC" if arena.gvisor else "STOCKADE_BWRAP": str(fake)})
    proc = arena.stockade("run", "--", "touch", str(marker), env=env)
    assert proc.returncode == 125, proc.stdout + proc.stderr
    assert not marker.exists()
    assert "namespace" in proc.stderr or "bwrap" in proc.stderr
    if arena.gvisor:
        assert "runsc could not start the sandbox" in proc.stderr, proc.stderr
    # The twin: with the real bubblewrap the same command runs.
    ok = arena.stockade("run", "--", "touch", str(marker))
    assert ok.returncode == 0, ok.stderr
    assert marker.exists()
    marker.unlink()


# ---------------------------------------------------------------------------------------
# PROC-10: the denylist-bypass spellings gain nothing (see the module docstring).


def test_proc_10_bypass_spellings_gain_nothing(arena: Arena) -> None:
    arena.reset()
    url = f"http://evil.test:{arena.evil.http_port}/bypass"
    probe = rf"""
ld = [p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)][0]
cmds = {{
    "proc-root": "/proc/self/root/usr/bin/curl -s -m5 -o /dev/null -w '%{{http_code}}' {url}",
    "copy": "cp $(command -v curl) ./c-copy && ./c-copy -s -m5 -o /dev/null -w '%{{http_code}}' {url}; rm -f ./c-copy",
    "subprocess": "python3 -c \"import subprocess; subprocess.run(['curl','-s','-m5','-o','/dev/null','-w','%{{http_code}}','{url}'])\"",
    "ld.so": ld + " /usr/bin/curl -s -m5 -o /dev/null -w '%{{http_code}}' {url}",
    "noproxy": "curl --noproxy '*' -s -m5 -o /dev/null -w '%{{http_code}}' {url}",
}}
for k, c in cmds.items():
    emit(k, **sh(c))
emit("twin", **sh("/proc/self/root/usr/bin/curl -s -m5 -o /dev/null -w '%{{http_code}}' http://allowed.test:{arena.allowed.http_port}/twin"))
"""
    res = arena.py(probe)
    for key in ("proc-root", "copy", "subprocess", "ld.so", "noproxy"):
        assert res[key]["out"] in ("403", "000"), (key, res[key])
    arena.assert_sinks_quiet()
    assert res["twin"]["out"] == "200"


# ---------------------------------------------------------------------------------------
# PROC-15: reachable kernel attack surface (presence only).

SYSCALLS = {
    "bpf": (321, 5, 0, 0),  # BPF_PROG_LOAD with no attr
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "userfaultfd": (323, 0),
    "keyctl": (250, 0, 0),
    "add_key": (248, 0, 0, 0, 0, 0),
    "request_key": (249, 0, 0, 0, 0),
    "init_module": (175, 0, 0, 0),
    "finit_module": (313, -1, 0, 0),
    "kexec_load": (246, 0, 0, 0, 0),
    "io_uring_setup": (425, 1, 0),
    "unshare-user": (272, 0x10000000),
    "unshare-net": (272, 0x40000000),
    "unshare-mount": (272, 0x00020000),
    "setns": (308, -1, 0),
    "mount": (165, 0, 0, 0, 0, 0),
    "fsopen": (430, 0, 0),
    "open_tree": (428, -100, 0, 0),
    "pivot_root": (155, 0, 0),
    "ptrace-traceme": (101, 0, 0, 0, 0),
    "swapon": (167, 0, 0),
    "reboot": (169, 0, 0, 0, 0),
}

KERNEL_FILES = {
    "core_pattern": "/proc/sys/kernel/core_pattern",
    "drop_caches": "/proc/sys/vm/drop_caches",
    "sysrq": "/proc/sysrq-trigger",
    "release_agent": "/sys/fs/cgroup/release_agent",
    "cgroup_procs": "/sys/fs/cgroup/cgroup.procs",
    "uevent_helper": "/sys/kernel/uevent_helper",
    "kvm": "/dev/kvm",
    "mem": "/dev/mem",
    "kmsg": "/dev/kmsg",
}

KERNEL_PROBE = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, args in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    emit("sys:" + name, r=r, errno=errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
for name, path in json.loads(sys.argv[2]).items():
    emit("file:" + name, **write(path, "x\n", "r+"))  # no O_CREAT: /dev is a private tmpfs
emit("twin:getpid", r=libc.syscall(39) == os.getpid())
emit("twin:write", **write("kernel-twin", "x", "w"))
"""

#: Errors that mean "refused" (ENOSYS: the filter or the kernel has no such call here).
REFUSED = ("EPERM", "EACCES", "ENOSYS", "EROFS", "ENOENT", "EINVAL", "EBADF", "EFAULT")


@pytest.fixture(scope="module")
def kernel_probe(arena: Arena) -> Result:
    res = arena.py(KERNEL_PROBE, json.dumps(SYSCALLS), json.dumps(KERNEL_FILES))
    with contextlib.suppress(FileNotFoundError):
        (arena.workspace / "kernel-twin").unlink()
    return res


@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_proc_15_kernel_syscalls_denied(kernel_probe: Result, name: str) -> None:
    got = kernel_probe[f"sys:{name}"]
    assert got["r"] == -1, got
    # EPERM is the seccomp answer; what matters is that nothing was created.
    assert got["errno"] in REFUSED, got


@pytest.mark.parametrize("name", sorted(KERNEL_FILES))
def test_proc_15_kernel_files_not_writable(kernel_probe: Result, name: str) -> None:
    assert kernel_probe[f"file:{name}"]["ok"] is False, kernel_probe[f"file:{name}"]


def test_proc_15_twin(kernel_probe: Result) -> None:
    assert kernel_probe["twin:getpid"]["r"] is True
    assert kernel_probe["twin:write"]["ok"] is True


# ---------------------------------------------------------------------------------------
# PROC-16: host IPC objects (SysV shared memory, /dev/shm).


def test_proc_16_host_ipc_invisible(arena: Arena) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5B0C0000 | (os.getpid() & 0xFFFF)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    assert shmid >= 0
    shm_file = Path(f"/dev/shm/sbx-{uuid.uuid4().hex}")
    shm_file.write_text(arena.canary)
    probe = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
key, shmid, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
emit("ipcs", **sh("ipcs -m -q -s"))
r = libc.shmget(key, 0, 0); emit("shmget", r=r, errno=ctypes.get_errno())
libc.shmat.restype = ctypes.c_void_p
r = libc.shmat(shmid, None, 0); emit("shmat", r=r if r is None else ctypes.c_long(r).value)
emit("devshm", files=os.listdir("/dev/shm"), **read("/dev/shm/" + name))
own = libc.shmget(key, 4096, 0o1000 | 0o600); emit("twin", r=own)
"""
    try:
        res = arena.py(probe, str(key), str(shmid), shm_file.name)
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
        shm_file.unlink()
    assert res["shmget"]["r"] == -1
    assert res["shmat"]["r"] in (None, -1)
    assert shm_file.name not in res["devshm"]["files"]
    assert hex(key)[2:] not in res["ipcs"]["out"]
    arena.assert_no_leak(res)
    # The twin: the sandbox has an IPC namespace of its own and can use it.
    assert res["twin"]["r"] >= 0
