"""The gVisor backend's pure parts: the OCI bundle from a ContainerPlan, the runsc argv,
the version parser and gate (a fake ``--version`` script stands in for an old runsc: it
is only ever asked its version, never used as a sandbox); and the entry
(``_gvisor_entry.c``) run for real, with a plain program in runsc's place."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade import Unavailable
from stockade._record import record, replace
from stockade.enforce import gvisor
from stockade.enforce.bubblewrap import ContainerPlan
from tests.conftest import NOBODY, require


def plan(tmp_path: Path) -> ContainerPlan:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit.sample").write_text("#!/bin/sh\n")
    extra = tmp_path / "extra"
    extra.mkdir()
    return ContainerPlan(
        workspace=ws,
        home=Path("/home/u"),
        read=(extra,),
        write=(extra,),
        toolchains=(Path("/opt"),),
        masked_files=(ws / ".env",),
        masked_dirs=(ws / "secrets",),
        protected=(ws / ".git" / "hooks",),
        files=((tmp_path / "resolv.conf", "/etc/resolv.conf"),),
        cwd=ws,
    )


def mounts_by_destination(doc: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for m in doc["mounts"]:  # type: ignore[attr-defined]
        out.setdefault(m["destination"], []).append(m)
    return out


def test_each_plan_field_becomes_its_mount(tmp_path: Path) -> None:
    p = plan(tmp_path)
    doc = gvisor.build_bundle(p, ["/run/stockade/launcher", "x"], {"PATH": "/usr/bin"})
    by = mounts_by_destination(doc)
    ws = str(p.workspace)
    assert by[ws] == [{"destination": ws, "type": "bind", "source": ws, "options": ["rbind", "rw"]}]
    assert by["/usr"][0]["options"] == ["rbind", "ro"]
    assert by[str(p.home)][0]["type"] == "tmpfs"  # a fresh HOME, gone with the sandbox
    assert by["/tmp"][0]["type"] == "tmpfs"
    assert by[str(p.workspace / ".env")][0]["source"] == "/dev/null"
    assert by[str(p.workspace / "secrets")][0]["type"] == "tmpfs"
    assert "ro" in by[str(p.workspace / "secrets")][0]["options"]  # type: ignore[operator]
    assert by[str(p.workspace / ".git" / "hooks")][0]["options"] == ["rbind", "ro"]
    extra = str(tmp_path / "extra")
    assert [m["options"] for m in by[extra]] == [["rbind", "ro"], ["rbind", "rw"]]
    assert by["/etc/resolv.conf"][0]["source"] == str(tmp_path / "resolv.conf")
    assert by["/opt"][-1]["options"] == ["rbind", "ro"]
    if os.path.exists("/etc/shadow"):
        assert by["/etc/shadow"][0]["source"] == "/dev/null"
    # Protected paths come after the workspace bind they cover; masks after both.
    order = [m["destination"] for m in doc["mounts"]]
    assert order.index(ws) < order.index(str(p.workspace / ".git" / "hooks"))
    assert order.index("/tmp") < order.index(str(p.home))


def test_an_empty_protected_directory_is_a_read_only_tmpfs(tmp_path: Path) -> None:
    # A placeholder of a missing .vscode (paths.protect_paths(absent_dirs=True)) is an
    # empty directory: the Sentry's own read-only tmpfs holds it, not a gofer bind. What
    # has content, and what is reached through a symlink, is still bound read-only.
    ws = tmp_path / "ws"
    (ws / ".vscode").mkdir(parents=True)
    (ws / ".idea").mkdir()
    (ws / ".idea" / "workspace.xml").write_text("<x/>")
    (ws / "real").mkdir()
    (ws / ".claude").symlink_to(ws / "real")
    p = replace(plan(tmp_path), protected=(ws / ".vscode", ws / ".idea", ws / ".claude"))
    by = mounts_by_destination(gvisor.build_bundle(p, ["true"], {}))
    assert by[str(ws / ".vscode")] == [
        {
            "destination": str(ws / ".vscode"),
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "ro", "mode=755"],
        }
    ]
    assert by[str(ws / ".idea")][0]["type"] == "bind"
    assert by[str(ws / ".idea")][0]["options"] == ["rbind", "ro"]
    assert by[str(ws / ".claude")][0]["type"] == "bind"
    assert by[str(ws / ".claude")][0]["options"] == ["rbind", "ro"]


def test_no_overlay_and_no_network_namespace(tmp_path: Path) -> None:
    doc = gvisor.build_bundle(plan(tmp_path), ["true"], {})
    assert all(m["type"] != "overlay" for m in doc["mounts"])
    kinds = {n["type"] for n in doc["linux"]["namespaces"]}
    assert kinds == {"pid", "ipc", "uts", "mount"}  # the network is stockade's namespace
    assert "seccomp" not in doc["linux"]  # the launcher loads stockade's own filter
    assert doc["root"] == {"path": "rootfs", "readonly": True}


def test_the_process(tmp_path: Path) -> None:
    p = plan(tmp_path)
    doc = gvisor.build_bundle(p, ["/run/stockade/launcher", "/s", "--", "make"], {"A": "1"})
    proc = doc["process"]
    assert proc["args"] == ["/run/stockade/launcher", "/s", "--", "make"]
    assert proc["env"] == ["A=1"]
    assert proc["cwd"] == str(p.workspace)
    assert proc["noNewPrivileges"] is True
    assert all(v == [] for v in proc["capabilities"].values())
    assert proc["terminal"] is False


def test_no_secret_in_the_bundle(tmp_path: Path) -> None:
    """The child's environment is built from the allow-list: a credential of the caller
    never reaches config.json (and no secret file is bound in)."""
    from stockade.enforce import environment
    from stockade.policy import EnvPolicy

    secret = "ghp_" + "S" * 36
    env = environment.build_environment(
        {"GH_TOKEN": secret, "PATH": "/usr/bin", "HOME": "/home/u"},
        EnvPolicy(),
        home="/home/u",
        enabled=True,
    ).env
    text = json.dumps(gvisor.build_bundle(plan(tmp_path), ["true"], env))
    assert secret not in text
    assert "/.ssh" not in text
    assert "id_ed25519" not in text


def test_the_netns_only_form_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        gvisor.build_bundle(ContainerPlan(tmp_path, tmp_path, isolate=False), ["true"], {})


def test_runsc_argv_never_picks_kvm() -> None:
    new = gvisor.Runsc(Path("/x/runsc"), (20240729, 0), "")
    argv = gvisor.runsc_argv(new, "/s", "/b", "id1")
    assert argv[0] == "/x/runsc"
    assert "--platform=systrap" in argv
    assert "--network=host" in argv
    assert "--overlay2=none" in argv
    assert "--ignore-cgroups" in argv
    assert argv[-3:] == ["run", "--bundle=/b", "id1"]
    assert not any("kvm" in a for a in argv)
    old = gvisor.Runsc(Path("/x/runsc"), (20230301, 0), "")
    assert "--platform=ptrace" in gvisor.runsc_argv(old, "/s", "/b", "i")
    assert "--platform=kvm" in gvisor.runsc_argv(new, "/s", "/b", "i", platform="kvm")


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("runsc version release-20240729.0\nspec: 1.1.0\n", (20240729, 0)),
        ("runsc version 0.0~20240729.0\nspec: 1.2.0\n", (20240729, 0)),
        ("runsc version 0.0~20221219.0\n", (20221219, 0)),
        ("runsc version release-20230227.12\n", (20230227, 12)),
        ("runsc version VERSION_MISSING\n", None),
        ("", None),
    ],
)
def test_parse_version(text: str, release: tuple[int, int] | None) -> None:
    assert gvisor.parse_version(text) == release


def fake_runsc(tmp_path: Path, version: str) -> Path:
    """A script that only answers --version (the gate's parser test; never a sandbox)."""
    path = tmp_path / "runsc"
    path.write_text(f"#!/bin/sh\necho 'runsc version {version}'\necho 'spec: 1.0.2'\n")
    path.chmod(0o755)
    return path


def test_the_gate_refuses_an_old_runsc_and_says_how_to_get_one(tmp_path: Path) -> None:
    path = fake_runsc(tmp_path, "0.0~20221219.0")
    with pytest.raises(Unavailable) as info:
        gvisor.require_runsc({"STOCKADE_RUNSC": str(path)})
    text = str(info.value)
    assert "release-20221219.0" in text
    assert "release-20230227.0" in text
    assert "scripts/get-runsc" in text or "STOCKADE_GVISOR=1" in text


def test_the_gate_takes_a_new_enough_runsc(tmp_path: Path) -> None:
    path = fake_runsc(tmp_path, "release-20230227.0")
    found = gvisor.require_runsc({"STOCKADE_RUNSC": str(path)})
    assert found.release == (20230227, 0)
    assert found.platform == "ptrace"


def test_a_missing_runsc_is_unavailable(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path / "nothing")}
    assert gvisor.find_runsc(env) is None
    with pytest.raises(Unavailable, match="runsc"):
        gvisor.require_runsc(env)


def test_the_cache_is_searched_first_newest_release(tmp_path: Path) -> None:
    for version in ("20230301.0", "20240729.0", "20231001.0"):
        d = tmp_path / ".cache" / "stockade" / "runsc" / version
        d.mkdir(parents=True)
        fake_runsc(d, version)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert gvisor.find_runsc(env) == tmp_path / ".cache/stockade/runsc/20240729.0/runsc"


def test_inside_gvisor() -> None:
    fake = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016\n"
    assert gvisor.inside_gvisor(fake)
    assert gvisor.inside_gvisor("Linux version 6.1.0 (debian)", dmesg="[ 0.0] Starting gVisor...")
    assert not gvisor.inside_gvisor("Linux version 6.18.0 (gcc 12) #1 SMP\n")


def test_without_a_compiler_no_gvisor_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry cannot be built (no compiler, an empty cache): a clear error naming it,
    raised where the run is made (GvisorRun), before anything of the run exists. Its
    twin: with a compiler, every gVisor run builds it (runtime/test_gvisor_run.py)."""
    from stockade.runtime._gvisor import GvisorRun

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    runsc = gvisor.Runsc(Path("/nonexistent/runsc"), (20240729, 0), "")
    with pytest.raises(Unavailable, match="the gVisor entry") as info:
        GvisorRun(runsc, tmp_path / "scratch", "r1")
    assert "gcc" in str(info.value)
    assert not (tmp_path / "scratch").exists()
    assert not list((tmp_path / "cache").glob("stockade/gvisor-entry-*"))


def test_the_entry_argv_is_the_binary_then_its_arguments_then_runsc() -> None:
    argv = gvisor.entry_argv(
        "/c/gvisor-entry-0123",
        1000,
        1001,
        42,
        5,
        6,
        ["/x/runsc", "run", "id"],
        state="/s",
        container_id="stockade-r",
        overlay=("/ws", "/layer"),
        refused="/scratch/entry.refused",
        binds="/scratch/binds",
    )
    assert argv == [
        "/c/gvisor-entry-0123",
        "1000",
        "1001",
        "42",
        "5",
        "6",
        "1",
        "--root=/s",
        "stockade-r",
        "/ws",
        "/layer",
        "/scratch/entry.refused",
        "/scratch/binds",
        "--",
        "/x/runsc",
        "run",
        "id",
    ]
    plain = gvisor.entry_argv(
        "/e", 0, 0, 1, 3, 4, ["/r"], state="/s", container_id="c", share_net=True
    )
    assert plain[6] == "0"
    assert plain[9:13] == ["", "", "", ""]
    with pytest.raises(ValueError):
        gvisor.entry_argv(
            "/e",
            0,
            0,
            1,
            3,
            4,
            ["/r"],
            state="/s",
            container_id="c",
            overlay=("ws", "/l"),
            refused="/f",
        )


# --- the entry (_gvisor_entry.c), run for real: its namespaces, handshake and statuses --
#
# Every runtime test under runsc runs it (runtime/test_gvisor_run.py, the overlay tests);
# here a plain program stands in for runsc's argv, so that each step of the entry, and
# each refusal, is seen on its own, as root and as uid 65534.

WHO = ("root", "nobody")


@pytest.fixture(scope="module")
def entry_bin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The entry built in a private cache (and state: its digest record), copied where
    uid 65534 can run it."""
    home = tmp_path_factory.mktemp("entry")
    old = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "XDG_STATE_HOME")}
    os.environ["XDG_CACHE_HOME"] = str(home / "cache")
    os.environ["XDG_STATE_HOME"] = str(home / "state")
    try:
        built = gvisor.build_entry()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert built == home / "cache" / "stockade" / built.name
    assert built.name.startswith("gvisor-entry-")
    shared = Path(tempfile.mkdtemp(prefix="stockade-entry-", dir="/tmp"))
    shared.chmod(0o755)
    target = shared / "gvisor-entry"
    shutil.copy(built, target)
    target.chmod(0o755)
    yield target
    shutil.rmtree(shared, ignore_errors=True)


@record
class Entry:
    """One entry run: its status, output, and what it said on the info fd."""

    returncode: int
    stdout: str
    stderr: str
    info: str


def _as(who: str) -> tuple[list[str], int, int]:
    """The prefix that runs a program as ``who``, and that user's uid and gid."""
    if who == "root" and os.getuid() == 0:
        return [], 0, 0
    if os.getuid() != 0:
        require(who == "root", "running as uid 65534 needs root")
        return [], os.getuid(), os.getgid()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) is not installed")
    return (
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"],
        NOBODY,
        NOBODY,
    )


def run_entry(
    entry: Path,
    runsc: list[str],
    *,
    who: str = "root",
    ppid: int | None = None,
    info_fd: int | None = None,
    release: bytes | None = b"1",
    net: bool = True,
    binds: str = "",
) -> Entry:
    """Run the entry with ``runsc`` as the program it starts; ``release`` is what the
    block fd holds before it is closed (None: nothing); ``info_fd`` replaces the info
    pipe's descriptor (one that is not open); ``ppid`` the parent it is told of."""
    prefix, uid, gid = _as(who)
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    try:
        if release is not None:
            os.write(block_w, release)
        os.close(block_w)
        block_w = -1
        argv = gvisor.entry_argv(
            str(entry),
            uid,
            gid,
            os.getpid() if ppid is None else ppid,
            info_w if info_fd is None else info_fd,
            block_r,
            runsc,
            state="/nonexistent/state",
            container_id="stockade-test",
            share_net=not net,
            binds=binds,
        )
        proc = subprocess.run(
            [*prefix, *argv],
            pass_fds=(info_w, block_r),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        os.close(info_w)
        info_w = -1
        info = os.read(info_r, 4096).decode()
    finally:
        for fd in (info_r, info_w, block_r, block_w):
            if fd >= 0:
                os.close(fd)
    if "Operation not permitted" in proc.stderr and "unshare" in proc.stderr:
        require(False, f"user namespaces are not available to {who}: {proc.stderr.strip()}")
    return Entry(proc.returncode, proc.stdout, proc.stderr, info)


def _marker_script(marker: Path) -> list[str]:
    """A stand-in for runsc that leaves a mark when it runs."""
    return ["/bin/sh", "-c", f"touch {marker}; echo RAN"]


@pytest.fixture
def marker() -> Iterator[Path]:
    """Where the stand-in for runsc leaves its mark: a file in a directory uid 65534 can
    write to (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="stockade-entry-mark-", dir="/tmp"))
    d.chmod(0o777)
    yield d / "ran"
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("who", WHO)
def test_the_entry_starts_runsc_in_its_namespaces_and_passes_its_status(
    entry_bin: Path, who: str
) -> None:
    """The twin of every refusal below: the handshake answered, the uid mapped to 0, a
    network namespace of its own with lo up, nothing of the entry's descriptors but the
    standard three, and runsc's exit status passed through."""
    require(shutil.which("ip") is not None, "ip (iproute2) is not installed")
    _, uid, _ = _as(who)
    script = (
        "cat /proc/self/uid_map; readlink /proc/self/ns/net; ip -o link show lo; "
        "ls /proc/$$/fd; exit 7"
    )
    got = run_entry(entry_bin, ["/bin/sh", "-c", script], who=who)
    assert got.returncode == 7, got.stderr
    assert got.stderr == ""
    info = json.loads(got.info)
    assert list(info) == ["child-pid"]
    assert info["child-pid"] > 1
    lines = got.stdout.splitlines()
    assert lines[0].split() == ["0", str(uid), "1"]
    assert lines[1] != os.readlink("/proc/self/ns/net")
    assert "UP" in lines[2].split("<", 1)[1].split(">", 1)[0].split(",")
    assert lines[3:] == ["0", "1", "2"]


@pytest.mark.parametrize("who", WHO)
def test_with_egress_off_the_entry_keeps_the_callers_network(entry_bin: Path, who: str) -> None:
    got = run_entry(entry_bin, ["/bin/sh", "-c", "readlink /proc/self/ns/net"], who=who, net=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize("who", WHO)
def test_under_another_parent_the_entry_runs_nothing(
    entry_bin: Path, who: str, marker: Path
) -> None:
    """A parent that is not the spawner it was told of (the spawner died, and the entry
    was reparented) means nobody will release it: 125 before any namespace is made,
    and runsc never starts. The twin: the test above."""
    got = run_entry(entry_bin, _marker_script(marker), who=who, ppid=1)
    assert got.returncode == 125
    assert got.info == ""
    assert not marker.exists()
    assert "RAN" not in got.stdout


@pytest.mark.parametrize("who", WHO)
def test_the_entry_names_the_step_that_failed(entry_bin: Path, who: str, marker: Path) -> None:
    """An info fd that is not open: the step is named and runsc never starts."""
    got = run_entry(entry_bin, _marker_script(marker), who=who, info_fd=1000)
    assert got.returncode == 125
    assert got.stderr == (
        "stockade: gvisor entry: writing to the info fd failed: Bad file descriptor\n"
    )
    assert not marker.exists()


@pytest.mark.parametrize("release", [None, b"0"])
def test_a_block_fd_closed_without_1_ends_the_entry_before_runsc(
    entry_bin: Path, release: bytes | None, marker: Path
) -> None:
    """The runtime gives up on a run (its handshake failed) by closing the block fd: the
    entry ends 125 and runsc never starts. The twin: released with '1', it runs."""
    got = run_entry(entry_bin, _marker_script(marker), release=release)
    assert got.returncode == 125
    assert json.loads(got.info)["child-pid"] > 1  # it got as far as the handshake
    assert not marker.exists()
    twin = run_entry(entry_bin, _marker_script(marker))
    assert twin.returncode == 0, twin.stderr
    assert marker.exists()


@pytest.mark.parametrize(("command", "status"), [("kill -KILL $$", -9), ("kill -TERM $$", -15)])
def test_a_runsc_that_dies_by_a_signal_is_the_same_death(
    entry_bin: Path, command: str, status: int
) -> None:
    """runsc killed (SIGKILL by the OOM killer, say) is the entry's own death by that
    signal, not a status of 1 that the runtime would take for the command's."""
    got = run_entry(entry_bin, ["/bin/sh", "-c", command])
    assert got.returncode == status, got.stderr
    assert got.stderr == ""


def test_the_entry_keeps_no_descriptor_of_its_spawners(entry_bin: Path) -> None:
    """The entry is spawned by a process that holds other descriptors (a run server's
    listener, inheritable here on purpose): it keeps only the standard three and the
    two of its handshake, and runsc gets the standard three alone. A SIGTERM it cannot
    hand over with ``runsc kill`` (the stand-in cannot) goes to runsc itself, and its
    death by it is the entry's."""
    bystander = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bystander.set_inheritable(True)
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    argv = gvisor.entry_argv(
        str(entry_bin),
        os.getuid(),
        os.getgid(),
        os.getpid(),
        info_w,
        block_r,
        ["/bin/sleep", "30"],
        state="/nonexistent/state",
        container_id="stockade-test",
    )
    proc = subprocess.Popen(
        argv,
        pass_fds=(info_w, block_r, bystander.fileno()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        os.close(info_w)
        info_w = -1
        os.close(block_r)
        block_r = -1
        # Read to the end: the entry has closed the info fd then, and waits on the block
        # fd, holding its own descriptors alone.
        text = b""
        while chunk := os.read(info_r, 4096):
            text += chunk
        assert json.loads(text)["child-pid"] == proc.pid
        held = sorted(int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd"))
        mine = os.readlink(f"/proc/self/fd/{bystander.fileno()}")
        assert mine not in {os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in held}
        assert held == [0, 1, 2, int(argv[5])]
        os.write(block_w, b"1")
        deadline = time.monotonic() + 10
        children: list[str] = []
        while not children and time.monotonic() < deadline:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                children = f.read().split()
            time.sleep(0.01)
        (child,) = children
        deadline = time.monotonic() + 10
        while "sleep" not in os.readlink(f"/proc/{child}/exe"):
            assert time.monotonic() < deadline, "the stand-in for runsc never started"
            time.sleep(0.01)
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{child}/fd")) == [0, 1, 2]
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd")) == [0, 1, 2]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
        bystander.close()
        for fd in (info_r, info_w, block_r, block_w):
            if fd >= 0:
                os.close(fd)


# --- the host-side binds (gvisor.host_binds): what makes directfs safe ----------------


def test_host_binds_repeat_the_bundles_binds_in_order(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    p = replace(
        plan(tmp_path),
        read=(tmp_path / "link",),
        write=(),
        masked_files=(ws / ".env",),
    )
    (ws / ".env").write_text("SECRET=1\n")
    doc = gvisor.build_bundle(p, ["true"], {})
    records = gvisor.host_binds(doc["mounts"], (("w", "/scratch"), ("r", "/scratch/rootfs/x")))
    assert records.endswith(b"\0")
    got = [(r[:1].decode(), r[1:].decode()) for r in records[:-1].split(b"\0")]
    binds = [m for m in doc["mounts"] if m["type"] == "bind" and m["source"] != "/dev/null"]
    # every bind but the /dev/null masks (a device: no open truncates it), in order,
    # its kind from its options, a symlink's target for the link (what runsc binds)
    assert got[: len(binds)] == [
        ("r" if "ro" in m["options"] else "w", os.path.realpath(m["source"])) for m in binds
    ]
    assert ("r", str(tmp_path / "real")) in got
    assert ("w", str(ws)) in got
    assert got.index(("w", str(ws))) < got.index(("r", str(ws / ".git" / "hooks")))
    assert ("r", "/usr") in got
    assert all(path != "/dev/null" for _, path in got)
    assert got[-2:] == [("w", "/scratch"), ("r", "/scratch/rootfs/x")]


def _bind_world(who: str) -> tuple[Path, Path]:
    """A directory tree ``who`` owns (so every write there is its to make, binds aside)
    and a binds file for it: ``ro`` read-only with ``ro/ws`` read-write below it, the
    file ``lone`` read-only; ``free`` has no record."""
    _, uid, gid = _as(who)
    top = Path(tempfile.mkdtemp(prefix="stockade-entry-binds-", dir="/tmp"))
    os.chmod(top, 0o755)
    (top / "ro" / "ws").mkdir(parents=True)
    (top / "free").mkdir()
    for rel in ("ro/f", "lone", "free/g"):
        (top / rel).write_text("keep\n")
    for path in (top, *top.rglob("*")):
        os.chown(path, uid, gid)
    binds = top / "binds"
    binds.write_bytes(f"r{top}/ro\0w{top}/ro/ws\0r{top}/lone\0".encode())
    os.chmod(binds, 0o644)
    return top, binds


@pytest.mark.parametrize("who", WHO)
def test_the_entry_binds_read_only_on_the_host_side(entry_bin: Path, who: str) -> None:
    """What runsc runs in: every "r" path read-only to the host kernel itself (an
    O_TRUNC open fails before it truncates anything), a "w" path below one writable
    again, and what has no record untouched (the twins)."""
    top, binds = _bind_world(who)
    try:
        trunc = (
            "python3 -c 'import os,sys; os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))'"
        )
        script = (
            f"{trunc} {top}/ro/f 2>/dev/null || echo ro-refused; "
            f"{trunc} {top}/lone 2>/dev/null || echo lone-refused; "
            f"echo new > {top}/ro/ws/new && echo ws-written; "
            f"{trunc} {top}/free/g && echo free-truncated; "
            "pwd"
        )
        got = run_entry(entry_bin, ["/bin/sh", "-c", script], who=who, binds=str(binds))
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == [
            "ro-refused",
            "lone-refused",
            "ws-written",
            "free-truncated",
            "/",
        ]
        assert (top / "ro" / "f").read_text() == "keep\n"
        assert (top / "lone").read_text() == "keep\n"
        assert (top / "ro" / "ws" / "new").read_text() == "new\n"
        assert (top / "free" / "g").read_text() == ""
        # the binds were the entry's own mount namespace's: the host sees none
        assert (top / "ro" / "f").stat().st_dev == top.stat().st_dev
        trunc_host = os.open(top / "ro" / "f", os.O_WRONLY | os.O_TRUNC)
        os.close(trunc_host)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize(
    ("records", "step"),
    [
        (b"r/nonexistent/stockade-test\0", "open_tree of /nonexistent/stockade-test"),
        (b"x/etc\0", "a record that is not r/path or w/path"),
        (b"r/etc", "a record without its end"),
    ],
)
def test_a_bind_the_entry_cannot_make_runs_nothing(
    entry_bin: Path, marker: Path, records: bytes, step: str
) -> None:
    """Fail closed: never runsc over a read-only bind left writable on the host."""
    binds = marker.parent / "binds"
    binds.write_bytes(records)
    got = run_entry(entry_bin, _marker_script(marker), binds=str(binds))
    assert got.returncode == 125
    assert step in got.stderr
    assert not marker.exists()
    assert got.stdout == ""
