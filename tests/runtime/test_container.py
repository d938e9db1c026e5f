"""The container layer on its own (files and syscalls off): real bubblewrap, real kernel.

Each "blocked" test has its "allowed" twin right next to it.

The tests of a mechanism that gVisor's backend implements its own way (signals and exit
statuses through runsc, SIGTERM forwarding, a killed run's leftovers, the audit log's
ends, the protected mounts and the working directory inside one, git on the gofer,
placeholders shared by concurrent runs) run under ``--backend gvisor`` too, through the
session ``runsc`` fixture (STOCKADE_GVISOR=1). What tests/attacks (every PROC, SEC, WRT,
NET, HOST and RES case under both backends) and tests/runtime/test_gvisor_run.py already
cover under gVisor (secrets in HOME and the environment, host pids and signals, writes
outside, wall-time kill, the unprivileged user) is not repeated here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import SECRET_ENV, SECRET_FILES, World, as_nobody

pytestmark = pytest.mark.usefixtures("kernel")
ONLY_CONTAINER = ("--disable", "files", "--disable", "syscalls")

#: the container backends of the tests parametrised over them
BACKENDS = ("bubblewrap", "gvisor")


def backend_flags(request: pytest.FixtureRequest, world: World, backend: str) -> tuple[str, ...]:
    """``stockade run``'s flags for ``backend``. gvisor goes through the session ``runsc``
    fixture (opt-in with STOCKADE_GVISOR=1; under STOCKADE_MUST_WORK=1 a missing runsc
    fails) and names that runsc to stockade, since the world's HOME is a fake one."""
    if backend == "bubblewrap":
        return ()
    world.env["STOCKADE_RUNSC"] = str(request.getfixturevalue("runsc"))
    return ("--backend", backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, world: World) -> tuple[str, ...]:
    """The test once per container backend: the flags to put after ``run``."""
    return backend_flags(request, world, request.param)


def gvisor_flags(world: World, runsc: str) -> tuple[str, ...]:
    """The flags of a gVisor twin. The tests that tests/cli/test_server.py collects again
    (with a served world, and no ``backend`` fixture there) keep their bubblewrap form
    and get a separate ``..._under_gvisor`` twin instead of the parametrised fixture."""
    world.env["STOCKADE_RUNSC"] = runsc
    return ("--backend", "gvisor")


def cli_run_argv(world: World, *cmd: str, backend: tuple[str, ...] = ()) -> list[str]:
    """``stockade run`` with only the container layer, for ``cmd``, as ``world`` runs it."""
    return [*world.command, "run", *backend, *ONLY_CONTAINER, "--", *cmd]


def run(
    world: World, *cmd: str, extra: tuple[str, ...] = ONLY_CONTAINER
) -> subprocess.CompletedProcess[str]:
    return world.stockade("run", *extra, "--", *cmd)


def test_canary_files_in_home_are_invisible(world: World) -> None:
    script = "; ".join(f"cat ~/{rel} 2>/dev/null" for rel in SECRET_FILES) + "; ls -la ~; true"
    proc = run(world, "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert world.canary not in proc.stdout + proc.stderr


def test_workspace_file_is_readable(world: World) -> None:
    proc = run(world, "cat", "README")
    assert proc.returncode == 0
    assert proc.stdout == "workspace file\n"


def test_write_outside_workspace_fails(world: World) -> None:
    target = world.root / "outside.txt"
    proc = run(
        world,
        "sh",
        "-c",
        f"echo x > {target}; echo x >> {world.home}/.bashrc; echo x > /etc/stockade-test",
    )
    assert not target.exists()
    assert (world.home / ".bashrc").read_text() == "# bashrc\n"
    assert not Path("/etc/stockade-test").exists()
    assert proc.returncode != 0


def test_write_inside_workspace_works(world: World) -> None:
    proc = run(world, "sh", "-c", "mkdir -p build && echo built > build/out")
    assert proc.returncode == 0, proc.stderr
    assert (world.workspace / "build" / "out").read_text() == "built\n"


def test_credential_env_is_absent(world: World) -> None:
    proc = run(
        world,
        "sh",
        "-c",
        "env; echo ---; tr '\\0' '\\n' < /proc/1/environ; echo ---; tr '\\0' ' ' < /proc/1/cmdline",
    )
    assert proc.returncode == 0, proc.stderr
    assert world.canary not in proc.stdout
    for name in SECRET_ENV:
        assert f"{name}=" not in proc.stdout


def test_allowed_env_passes(world: World) -> None:
    (world.workspace / "p.toml").write_text('[env]\npass = ["MY_SETTING"]\nset = { FIXED = "1" }\n')
    env = dict(world.env, MY_SETTING="visible")
    proc = world.stockade(
        "run",
        *ONLY_CONTAINER,
        "--policy",
        "p.toml",
        "--",
        "sh",
        "-c",
        "echo $MY_SETTING $FIXED $HOME",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["visible", "1", str(world.home)]


def test_host_pids_are_invisible(world: World) -> None:
    host = subprocess.Popen(["sleep", "30", world.canary])
    try:
        proc = run(
            world,
            "sh",
            "-c",
            "ls /proc | grep -c '^[0-9]'; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '",
        )
        assert proc.returncode == 0
        count = int(proc.stdout.split()[0])
        assert count < 10
        assert world.canary not in proc.stdout
        # The twin: the sandbox's own processes are visible to it.
        own = run(world, "sh", "-c", "sleep 5 & ls /proc | grep -c '^[0-9]'")
        assert int(own.stdout.split()[0]) >= 2
    finally:
        host.kill()
        host.wait()


def test_signal_to_host_process_fails(world: World) -> None:
    host = subprocess.Popen(["sleep", "30"])
    try:
        proc = run(world, "sh", "-c", f"kill -9 {host.pid}; kill -9 -1; echo done")
        assert host.poll() is None
        assert "done" in proc.stdout or proc.returncode != 0
    finally:
        host.kill()
        host.wait()


def _pids_with(marker: str) -> list[int]:
    """Pids of the sandboxed marker processes (``sh -c sleep N MARKER``), not of stockade or bwrap."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                if cmdline.startswith("sh\0-c\0sleep") and marker in cmdline:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def test_background_process_does_not_survive(world: World) -> None:
    marker = f"{world.canary}-bg"
    alive = run(
        world, "sh", "-c", f"sh -c 'sleep 30' {marker} & sleep 0.5; ps -eo args | grep -c {marker}"
    )
    assert int(alive.stdout.split()[0]) >= 1  # the twin: it does start inside
    proc = run(
        world,
        "sh",
        "-c",
        f"setsid sh -c 'sleep 60' {marker} >/dev/null 2>&1 & (sh -c 'sleep 61' {marker} &); sleep 0.2; exit 0",
    )
    assert proc.returncode == 0
    time.sleep(0.3)
    assert _pids_with(marker) == []


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (children of every thread: runsc forks from any)."""
    out = [pid]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            out += _tree(int(child))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_stockade_mid_run(world: World, marker: str, *, backend: tuple[str, ...] = ()) -> int:
    """Start a run holding two marked processes, SIGKILL the stockade process, and
    check that the marked processes go too; return the killed process's pid.

    Under bubblewrap the marked processes are host processes, found by their command
    line. Under gVisor they live in the Sentry (the host sees runsc's processes and the
    systrap stubs): there the check is that every process of the run's tree, recorded
    once the command said it had started both, is gone.
    """
    script = f"sh -c 'sleep 60' {marker} & sh -c 'sleep 61' {marker} & echo started; wait"
    p = subprocess.Popen(
        cli_run_argv(world, "sh", "-c", script, backend=backend),
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"started\n"
    gvisor = "gvisor" in backend
    if not gvisor:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(_pids_with(marker)) < 2:
            time.sleep(0.05)
        assert len(_pids_with(marker)) >= 2, "the sandboxed processes never started"
    tree = [pid for pid in _tree(p.pid) if pid != p.pid]
    if gvisor:
        assert len(tree) >= 3, tree  # runsc run, the sandbox, the gofer (and the stubs)
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_pids_with(marker) or any(map(_alive, tree))):
        time.sleep(0.05)
    assert _pids_with(marker) == []
    assert [pid for pid in tree if _alive(pid)] == []
    return p.pid


def test_nothing_survives_sigkill_of_stockade(world: World, backend: tuple[str, ...]) -> None:
    pid = kill_stockade_mid_run(world, f"{world.canary}-kill", backend=backend)
    # What the killed run left (the placeholders of protected paths; a run with egress
    # leaves a scratch directory too: tests/robustness/test_faults.py; under gVisor the
    # scratch directory holds runsc's bundle, state and logs) goes with the next run.
    assert os.path.lexists(world.workspace / ".vscode")
    assert run(world, "true", extra=(*backend, *ONLY_CONTAINER)).returncode == 0
    assert not list(Path(tempfile.gettempdir()).glob(f"stockade-{pid}-*"))
    assert sorted(os.listdir(world.workspace)) == ["README"]


@pytest.mark.parametrize("code", [0, 1, 3, 42])
def test_exit_codes_pass_through(world: World, code: int) -> None:
    assert run(world, "sh", "-c", f"exit {code}").returncode == code


def _killed_by_signal(world: World, backend: tuple[str, ...]) -> None:
    proc = run(world, "sh", "-c", "kill -TERM $$", extra=(*backend, *ONLY_CONTAINER))
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr


def test_killed_by_signal_is_128_plus_n(world: World) -> None:
    _killed_by_signal(world, ())


def test_killed_by_signal_is_128_plus_n_under_gvisor(world: World, runsc: str) -> None:
    _killed_by_signal(world, gvisor_flags(world, runsc))


def _command_not_found(world: World, backend: tuple[str, ...]) -> None:
    proc = run(world, "no-such-command-stockade", extra=(*backend, *ONLY_CONTAINER))
    assert proc.returncode == 127, proc.stderr
    assert "not found" in proc.stderr


def test_command_not_found_is_127(world: World) -> None:
    _command_not_found(world, ())


def test_command_not_found_is_127_under_gvisor(world: World, runsc: str) -> None:
    # The launcher's 127, not runsc's failure to start (125): test_gvisor_run.py's
    # runsc-failure tests are the other side.
    _command_not_found(world, gvisor_flags(world, runsc))


def test_sigterm_reaches_the_command(world: World) -> None:
    _sigterm_reaches_the_command(world, ())


def test_sigterm_reaches_the_command_under_gvisor(world: World, runsc: str) -> None:
    _sigterm_reaches_the_command(world, gvisor_flags(world, runsc))


def _sigterm_reaches_the_command(world: World, backend: tuple[str, ...]) -> None:
    p = subprocess.Popen(
        cli_run_argv(
            world,
            "sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
            backend=backend,
        ),
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert "got-term" in out
    assert p.returncode == 7


def test_timeout_kills_the_tree_and_exits_124(world: World) -> None:
    marker = f"{world.canary}-timeout"
    start = time.monotonic()
    proc = run(
        world,
        "sh",
        "-c",
        f"sh -c 'sleep 60' {marker} & sh -c 'sleep 61' {marker}",
        extra=(*ONLY_CONTAINER, "--timeout", "1"),
    )
    assert proc.returncode == 124
    assert time.monotonic() - start < 10
    assert _pids_with(marker) == []
    assert "limits limit-wall-time" in proc.stderr


def test_within_timeout_runs_normally(world: World) -> None:
    assert run(world, "true", extra=(*ONLY_CONTAINER, "--timeout", "20")).returncode == 0


def test_malformed_policy_exits_125_naming_the_key(world: World) -> None:
    (world.workspace / "bad.toml").write_text("[limits]\nmemory = 'lots'\n")
    proc = world.stockade("run", "--policy", "bad.toml", "--", "true")
    assert proc.returncode == 125
    assert "limits.memory" in proc.stderr
    missing = world.stockade("run", "--policy", "missing.toml", "--", "true")
    assert missing.returncode == 125
    assert "missing.toml" in missing.stderr


def test_audit_log_records_start_end_and_denials(world: World) -> None:
    _audit_log_records_start_end_and_denials(world, ())


def test_audit_log_records_start_end_and_denials_under_gvisor(world: World, runsc: str) -> None:
    _audit_log_records_start_end_and_denials(world, gvisor_flags(world, runsc))


def _audit_log_records_start_end_and_denials(world: World, backend: tuple[str, ...]) -> None:
    audit = world.root / "audit.jsonl"
    proc = run(world, "true", extra=(*backend, *ONLY_CONTAINER, "--audit", str(audit)))
    assert proc.returncode == 0
    import json

    events = [json.loads(line) for line in audit.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_start"
    assert kinds[-1] == "run_end"
    assert events[0]["policy_hash"].startswith("sha256:")
    assert "container" in events[0]["layers"]
    assert "files" not in events[0]["layers"]
    assert events[-1]["returncode"] == 0
    for e in events:
        assert {"time", "run_id", "event", "layer", "verdict", "reason"} <= e.keys()
    withheld = {e["name"] for e in events if e["reason"] == "credential-env"}
    assert set(SECRET_ENV) <= withheld
    assert all(world.canary not in json.dumps(e) for e in events)


def test_unwritable_audit_log_refuses_to_run(world: World, backend: tuple[str, ...]) -> None:
    marker = world.workspace / "ran"
    proc = run(
        world,
        "touch",
        str(marker),
        extra=(*backend, *ONLY_CONTAINER, "--audit", "/proc/stockade/audit.jsonl"),
    )
    assert proc.returncode == 125
    assert not marker.exists()
    assert "audit" in proc.stderr


@pytest.mark.parametrize(
    "extra",
    [ONLY_CONTAINER, ()],
    ids=["bubblewrap-binds", "launcher-binds"],  # without and with Landlock (_launcher.c)
)
def test_protected_paths_are_read_only(world: World, extra: tuple[str, ...]) -> None:
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True)
    proc = run(
        world,
        "sh",
        "-c",
        "echo evil > .git/hooks/pre-commit; echo '[core]' >> .git/config; mkdir -p .vscode;"
        " echo '{}' > .vscode/tasks.json; echo x > .envrc; echo ok > normal.txt",
        extra=extra,
    )
    assert not (world.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert (world.workspace / ".git" / "config").read_text()[-7:] != "[core]\n"
    assert not (world.workspace / ".vscode").exists()
    assert not (world.workspace / ".envrc").exists()
    assert (world.workspace / "normal.txt").read_text() == "ok\n"
    assert "Read-only file system" in proc.stderr


#: who makes the protected binds: bubblewrap (Landlock off), the launcher in a mount
#: namespace of its own (Landlock on), or runsc from the OCI bundle's mounts (gVisor,
#: where Landlock does not exist and the launcher binds nothing)
PROTECTED_BINDS = [
    pytest.param("bubblewrap", ONLY_CONTAINER, id="bubblewrap-binds"),
    pytest.param("bubblewrap", (), id="launcher-binds"),
    pytest.param("gvisor", (), id="gvisor-mounts"),
]


@pytest.mark.parametrize(("runtime", "layers"), PROTECTED_BINDS)
def test_protected_paths_stay_read_only_through_proc_1_root(
    request: pytest.FixtureRequest, world: World, runtime: str, layers: tuple[str, ...]
) -> None:
    """With every layer on, the launcher makes the protected binds in a mount namespace of
    its own, and bubblewrap's init (pid 1) keeps the one without them: its root must be out
    of reach (Landlock denies ptrace access to a process outside the domain). Without
    Landlock, bubblewrap makes the binds, in the one namespace there is. Under gVisor,
    pid 1 is the launcher in the Sentry's one mount namespace, which has the binds."""
    extra = (*backend_flags(request, world, runtime), *layers)
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True)
    ws = world.workspace
    proc = run(
        world,
        "sh",
        "-c",
        f"echo evil > /proc/1/root{ws}/.git/hooks/pre-commit;"
        f" echo x > /proc/1/root{ws}/.envrc; cat /proc/1/root/etc/shadow;"
        f" echo ok > /proc/self/root{ws}/normal.txt; echo done",
        extra=extra,
    )
    assert proc.stdout.endswith("done\n"), proc.stderr
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / ".envrc").exists()
    assert "root:" not in proc.stdout  # /etc/shadow stays masked (or out of reach)
    # The twin: the sandbox's own root still leads to the writable workspace.
    assert (ws / "normal.txt").read_text() == "ok\n"


@pytest.mark.parametrize(("runtime", "layers"), PROTECTED_BINDS)
def test_a_working_directory_inside_a_protected_one_is_protected_too(
    request: pytest.FixtureRequest, world: World, runtime: str, layers: tuple[str, ...]
) -> None:
    """Started from inside .vscode/, relative writes land on the read-only bind, not on the
    directory below it (the launcher binds after bubblewrap chose the directory; under
    gVisor the bundle's ``cwd`` is resolved on its mounts)."""
    extra = (*backend_flags(request, world, runtime), *layers)
    inside = world.workspace / ".vscode"
    inside.mkdir()
    proc = world.stockade(
        "run",
        "--workspace",
        str(world.workspace),  # else the directory it starts in would be the workspace
        *extra,
        "--",
        "sh",
        "-c",
        "pwd; echo '{}' > settings.json; mkdir sub; echo ok > ../normal.txt",
        cwd=inside,
    )
    assert proc.stdout.splitlines()[0] == str(inside), proc.stderr
    assert list(inside.iterdir()) == []
    assert "Read-only file system" in proc.stderr
    # The twin: outside the protected directory, the same relative write works.
    assert (world.workspace / "normal.txt").read_text() == "ok\n"


def test_git_still_works_inside(world: World, backend: tuple[str, ...]) -> None:
    # Under gVisor every file git touches goes through the gofer (--directfs=false),
    # with .git/hooks and .git/config read-only binds inside the read-write .git.
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True)
    proc = run(
        world,
        "sh",
        "-c",
        "git -c user.email=a@b -c user.name=n add README && git -c user.email=a@b -c user.name=n commit -qm x && git log --oneline | wc -l",
        extra=(*backend, *ONLY_CONTAINER),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1"


def test_renaming_git_dir_to_plant_hooks_fails(world: World) -> None:
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True)
    run(
        world,
        "sh",
        "-c",
        "mv .git .git2 && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit",
    )
    assert (world.workspace / ".git" / "HEAD").exists()
    assert not (world.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert not (world.workspace / ".git2").exists()


@pytest.mark.parametrize("layers", [ONLY_CONTAINER, ()], ids=["container", "all-layers"])
def test_unprivileged_user(world: World, layers: tuple[str, ...]) -> None:
    (world.root / "state").mkdir(exist_ok=True)
    script = (
        f"cat ~/.ssh/id_ed25519; echo $GH_TOKEN; echo ok > {world.workspace}/o; "
        f"echo x > {world.root}/outside; id -u; sh -c 'sleep 60' {world.canary}-nobody &"
    )
    proc = as_nobody(world, "run", *layers, "--", "sh", "-c", script)
    assert world.canary not in proc.stdout
    assert (world.workspace / "o").exists(), proc.stderr
    assert (world.workspace / "o").read_text() == "ok\n"
    assert not (world.root / "outside").exists()
    assert proc.stdout.split()[-1] == str(os.getuid() if os.getuid() else 65534)
    time.sleep(0.2)
    assert _pids_with(f"{world.canary}-nobody") == []


def test_srt_settings_run_directly(world: World) -> None:
    import json

    settings = world.root / "srt.json"
    settings.write_text(
        json.dumps(
            {
                "network": {"allowedDomains": ["example.test"], "deniedDomains": []},
                "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
            }
        )
    )
    proc = world.stockade(
        "run",
        "--srt-settings",
        str(settings),
        *ONLY_CONTAINER,
        "--",
        "sh",
        "-c",
        "echo ok > srt.txt; cat ~/.ssh/id_ed25519",
    )
    assert (world.workspace / "srt.txt").read_text() == "ok\n", proc.stderr
    assert world.canary not in proc.stdout
    both = world.stockade(
        "run", "--srt-settings", str(settings), "--policy", "x.toml", "--", "true"
    )
    assert both.returncode == 125
    settings.write_text(json.dumps({"network": {"allowedDomains": [], "tlsTerminate": {}}}))
    bad = world.stockade("run", "--srt-settings", str(settings), "--", "true")
    assert bad.returncode == 125
    assert "tlsTerminate" in bad.stderr


def test_concurrent_runs_share_placeholders(world: World, backend: tuple[str, ...]) -> None:
    long = subprocess.Popen(
        cli_run_argv(
            world,
            "sh",
            "-c",
            "sleep 2; mkdir -p .vscode && echo x > .vscode/tasks.json; echo wrote=$?",
            backend=backend,
        ),
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    # A second run starts and ends while the first still runs: it binds the first's
    # placeholders, and must not remove them on its way out.
    seen = run(world, "sh", "-c", "test -e .vscode && echo seen", extra=(*backend, *ONLY_CONTAINER))
    assert seen.stdout.strip() == "seen", seen.stderr
    assert os.path.lexists(world.workspace / ".vscode")
    out, err = long.communicate(timeout=30)
    assert long.returncode == 0, err
    assert "wrote=0" not in out
    # The last run out removes them.
    assert sorted(os.listdir(world.workspace)) == ["README"]
