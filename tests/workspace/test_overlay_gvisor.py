"""Overlay runs under the gvisor backend, end to end: real runsc, a real overlayfs mounted
host-side by the gVisor entry around runsc (``enforce/_gvisor_entry.c``), as root and
as uid 65534; review, apply, discard, a Sandbox's checkpoints and a killed run's layer
read the same layer format as under bubblewrap.

Each "refused" test has its "works" twin beside it: the read-write gVisor workspace, the
inside symlink applied, the plain workspace where a nested one is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from tests.conftest import World, nobody_gvisor, require
from tests.workspace.test_overlay import SCRIPT, _populate, _tree, run_id_of

WHO = ("root", "nobody")

#: the bubblewrap overlay test's script, plus a symlink leading out of the workspace and
#: a directory of the workspace removed and made again (an opaque directory: its
#: user.overlay.opaque mark hides what the workspace held in it)
GVISOR_SCRIPT = f"{SCRIPT}; ln -s /etc/passwd out.lnk; rm -r dir3; mkdir dir3; echo n > dir3/new"

_CHOWNED: set[Path] = set()
_NOBODY_PYTHON: dict[Path, list[str]] = {}


def _command(world: World, who: str, runsc: str) -> tuple[list[str], dict[str, str]]:
    """How to run the CLI as ``who`` with a gVisor it may run.

    uid 65534 gets a runsc of its own and a Python it can exec from any process (the
    gVisor entry is the interpreter started again); the world is handed to it once: a
    chown between a run and its apply is a change on the host, which apply refuses.
    """
    if who == "root" or os.getuid() != 0:
        if who == "root":
            require(os.getuid() == 0, "the root variant needs root (run the suite as root)")
        world.env["STOCKADE_RUNSC"] = runsc
        return list(world.command), dict(world.env)
    require(shutil.which("setpriv") is not None, "no setpriv")
    if world.root not in _NOBODY_PYTHON:
        # Once per world: a copy over a runsc that still runs (the runsc tree of a killed
        # run dies by its parent-death signal, a moment later) fails with ETXTBSY.
        _NOBODY_PYTHON[world.root] = nobody_gvisor(world, runsc)
    python = _NOBODY_PYTHON[world.root]
    if world.root not in _CHOWNED:
        subprocess.run(["chown", "-R", "65534:65534", str(world.root)], check=True)
        _CHOWNED.add(world.root)
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(
        world.env,
        PYTHONPATH=f"{src}:{sysconfig.get_paths()['purelib']}",
        XDG_CACHE_HOME=str(world.root / "cache"),
    )
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return [*setpriv, *python], env


def cli(
    world: World, who: str, runsc: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The stockade CLI as ``who``; ``run`` gets ``--backend gvisor``."""
    cmd, env = _command(world, who, runsc)
    if args and args[0] == "run":
        args = ("run", "--backend", "gvisor", *args[1:])
    return subprocess.run(
        [*cmd, *args],
        cwd=world.workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def changes_of(world: World, who: str, runsc: str, run: str) -> dict[str, dict[str, object]]:
    proc = cli(world, who, runsc, "changes", "--json", run)
    assert proc.returncode == 0, proc.stderr
    return {c["path"]: c for c in json.loads(proc.stdout)["changes"]}


@pytest.mark.parametrize("who", WHO)
def test_gvisor_overlay_keeps_the_workspace_and_lists_every_change(
    world: World, who: str, runsc: str
) -> None:
    _populate(world.workspace)
    (world.workspace / "dir3").mkdir()
    (world.workspace / "dir3" / "old").write_text("old\n")
    (world.workspace / "dir3" / "keep").write_text("keep\n")
    before = _tree(world.workspace)
    proc = cli(
        world, who, runsc, "run", "--overlay", "--", "sh", "-c", f"{GVISOR_SCRIPT}; cat a.txt dir2"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "changed\nf\n"  # the sandbox sees its own writes
    assert _tree(world.workspace) == before  # the real workspace does not
    changes = changes_of(world, who, runsc, run_id_of(proc))
    kinds = {path: c["kind"] for path, c in changes.items()}
    # the same as under bubblewrap (test_overlay.py): one layer format for both
    assert kinds == {
        "a.txt": "modified",
        "del.txt": "deleted",
        "new.txt": "renamed",
        "run.sh": "mode",
        "hard.txt": "added",
        "in.lnk": "added",
        "out.lnk": "added",
        "dir2": "replaced",
        "dir2/inner.txt": "deleted",
        "nd": "added",
        "nd/sub": "added",
        "nd/sub/z.txt": "added",
        "blob.bin": "added",
        "dir3/old": "deleted",
        "dir3/keep": "deleted",
        "dir3/new": "added",
    }
    assert changes["new.txt"]["old_path"] == "old.txt"
    assert changes["run.sh"]["mode"] == "0o755"
    assert changes["run.sh"]["old_mode"] == "0o644"
    assert changes["out.lnk"]["target"] == "/etc/passwd"
    assert changes["a.txt"]["size"] == 8
    diff = cli(world, who, runsc, "diff", run_id_of(proc), "a.txt", "blob.bin")
    assert "-hello\n+changed\n" in diff.stdout
    assert "Binary files /dev/null and b/blob.bin differ" in diff.stdout


@pytest.mark.parametrize("who", WHO)
def test_apply_gives_what_a_read_write_gvisor_run_gives(world: World, who: str, runsc: str) -> None:
    # The twin: the same script in a read-write gVisor workspace still writes the disk.
    twin = world.root / "twin"
    twin.mkdir()
    shutil.copy(world.workspace / "README", twin / "README")
    _populate(twin)
    _populate(world.workspace)
    if who == "nobody" and os.getuid() == 0:
        subprocess.run(["chown", "-R", "65534:65534", str(twin)], check=True)
    rw = cli(world, who, runsc, "run", "--workspace", str(twin), "--", "sh", "-c", SCRIPT)
    assert rw.returncode == 0, rw.stderr
    assert (twin / "a.txt").read_text() == "changed\n"
    proc = cli(world, who, runsc, "run", "--overlay", "--", "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)
    assert (world.workspace / "a.txt").read_text() == "hello\n"  # untouched until apply
    applied = cli(world, who, runsc, "apply", run)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert _tree(world.workspace) == _tree(twin)
    assert changes_of(world, who, runsc, run) == {}


@pytest.mark.parametrize("who", WHO)
def test_protected_paths_and_symlinks_out_are_never_applied(
    world: World, who: str, runsc: str
) -> None:
    _populate(world.workspace)
    (world.workspace / ".git").mkdir()
    (world.workspace / ".git" / "config").write_text("[core]\n")
    proc = cli(
        world,
        who,
        runsc,
        "run",
        "--overlay",
        "--",
        "sh",
        "-c",
        # .git/config and .husky/ are read-only binds of the merged view inside; a
        # nested repository's hook and a symlink out are written, for apply to meet
        "echo x > .git/config 2>/dev/null && echo WROTE-GIT; "
        "mkdir -p .husky 2>/dev/null; echo evil > .husky/pre-commit 2>/dev/null && echo WROTE-HUSKY; "
        "mkdir -p sub/.git/hooks && echo evil > sub/.git/hooks/pre-commit; "
        "ln -s /etc/passwd out.lnk; ln -s keep.txt in.lnk; echo fine > sub/ok.txt; true",
    )
    assert proc.returncode == 0, proc.stderr
    assert "WROTE" not in proc.stdout
    run = run_id_of(proc)
    out = cli(world, who, runsc, "apply", "--json", run)
    assert out.returncode == 1, out.stdout + out.stderr
    outcomes = {o["path"]: o for o in json.loads(out.stdout)["outcomes"]}
    assert outcomes["sub/.git/hooks/pre-commit"]["action"] == "refused"
    assert outcomes["out.lnk"]["action"] == "refused"
    assert "leads out of the workspace" in outcomes["out.lnk"]["reason"]
    assert not (world.workspace / "sub" / ".git").exists()
    assert not (world.workspace / "out.lnk").is_symlink()
    assert (world.workspace / ".git" / "config").read_text() == "[core]\n"
    assert not (world.workspace / ".husky" / "pre-commit").exists()
    # the twins: an ordinary file and a symlink inside are applied
    assert outcomes["sub/ok.txt"]["action"] == "applied"
    assert outcomes["in.lnk"]["action"] == "applied"
    assert (world.workspace / "sub" / "ok.txt").read_text() == "fine\n"
    assert os.readlink(world.workspace / "in.lnk") == "keep.txt"


@pytest.mark.parametrize("who", WHO)
def test_discard_drops_the_layer_and_keeps_the_workspace(
    world: World, who: str, runsc: str
) -> None:
    _populate(world.workspace)
    before = _tree(world.workspace)
    proc = cli(world, who, runsc, "run", "--overlay", "--", "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)
    assert changes_of(world, who, runsc, run)  # the twin: there was something to drop
    assert cli(world, who, runsc, "discard", run).returncode == 0
    assert _tree(world.workspace) == before
    gone = cli(world, who, runsc, "changes", run)
    assert gone.returncode == 125
    assert "no overlay layer" in gone.stderr


def test_the_layer_is_out_of_the_sandboxs_reach(world: World, runsc: str) -> None:
    """Even a policy that binds the directory above the state and the workspace, read
    and write, shows neither the layer nor the real workspace: the layer is covered in
    the namespace runsc runs in, and every path to the workspace crosses the overlay."""
    _populate(world.workspace)
    world.env["STOCKADE_RUNSC"] = runsc
    state = world.root / "state"
    policy = world.root / "policy.toml"
    policy.write_text(f'[filesystem]\nwrite = ["{world.root}"]\n')
    proc = world.stockade(
        "run",
        "--backend",
        "gvisor",
        "--overlay",
        "--policy",
        str(policy),
        "--",
        "sh",
        "-c",
        f"ls -A {state}/stockade/layers/* 2>&1; "
        f"echo sneak > {state}/stockade/layers/x 2>/dev/null; "
        f"echo w > a.txt; echo via-parent > {world.workspace}/b.txt; "
        f"touch {world.root}/outside.txt; cat a.txt",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "upper" not in proc.stdout
    assert "layer.json" not in proc.stdout
    assert proc.stdout.splitlines()[-1] == "w"  # the twin: the workspace is writable
    run = run_id_of(proc)
    # The write through the parent's bind landed in the layer too, not on the disk.
    assert not (world.workspace / "b.txt").exists()
    assert (world.workspace / "a.txt").read_text() == "hello\n"
    assert set(changes_of(world, "root", runsc, run)) == {"a.txt", "b.txt"}
    assert (world.root / "outside.txt").exists()  # the twin: the granted path is writable
    assert not (state / "stockade" / "layers" / "x").exists()


def _nested_overlays(world: World, who: str) -> tuple[list[str], Path]:
    """A shell prefix that mounts two overlays (root, in a mount namespace of its own),
    and the workspace inside the second: an overlay over it would be overlayfs's third
    level, which the kernel refuses (its maximum stacking depth is 2)."""
    base = world.root / "nest"
    dirs = ["l1", "u1", "w1", "m1", "u2", "w2", "m2"]
    for name in dirs:
        (base / name).mkdir(parents=True)
    (base / "l1" / "ws").mkdir()
    (base / "l1" / "ws" / "a.txt").write_text("hello\n")
    if who == "nobody":
        subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
    b = str(base)
    script = (
        f"mount -t overlay overlay -o lowerdir={b}/l1,upperdir={b}/u1,workdir={b}/w1 {b}/m1 && "
        f"mount -t overlay overlay -o lowerdir={b}/m1,upperdir={b}/u2,workdir={b}/w2 {b}/m2 && "
        'exec "$@"'
    )
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]
    return prefix, base / "m2" / "ws"


@pytest.mark.parametrize("who", WHO)
def test_an_overlay_the_kernel_refuses_fails_closed_with_its_reason(
    world: World, who: str, runsc: str
) -> None:
    require(os.getuid() == 0, "mounting the nested overlays needs root")
    prefix, ws = _nested_overlays(world, who)
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    require(probe.returncode == 0, f"no nested overlayfs here: {probe.stderr.strip()}")
    cmd, env = _command(world, who, runsc)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, *cmd, "run", "--backend", "gvisor", "--workspace", str(ws), *args],
            cwd=world.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    inside = "cd " + str(ws) + " && echo x > a.txt && cat a.txt"
    refused = run("--overlay", "--", "sh", "-c", inside)
    assert refused.returncode == 125, refused.stdout + refused.stderr
    assert "an overlay workspace with the gVisor backend on this host" in refused.stderr
    assert "Invalid argument" in refused.stderr  # the kernel's answer, and its cause
    assert "lies on overlayfs" in refused.stderr
    assert "stacks file systems at most 2 deep" in refused.stderr
    assert refused.stdout == ""  # the command never ran, read-write or otherwise
    # nothing reached the workspace: no a.txt in the upper layer of the overlay it lies
    # on (stockade's placeholders of protected paths came and went there)
    assert not (world.root / "nest" / "u2" / "ws" / "a.txt").exists()
    # the twin: the same workspace read-write under gVisor runs
    ok = run("--", "sh", "-c", inside)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "x\n"


@pytest.mark.parametrize("who", WHO)
def test_a_gvisor_sandbox_shares_its_layer_with_checkpoints(
    world: World, who: str, runsc: str
) -> None:
    """The runs of one overlay Sandbox on gVisor mount one layer in turn: checkpoint and
    rollback round trips, as under bubblewrap (test_api.py's script, on gVisor)."""
    from tests.workspace.test_api import CHECKPOINT_SCRIPT

    ws = world.workspace
    (ws / "a.txt").write_text("hello\n")
    (ws / "gone.txt").write_text("gone\n")
    policy = world.root / "gvisor.toml"
    policy.write_text('[container]\nbackend = "gvisor"\n')
    sandbox = "stockade.Sandbox(workspace=ws, overlay=True)"
    assert sandbox in CHECKPOINT_SCRIPT
    last = '    out["changes"] = [c.path for c in sb.changes()]\n'
    assert last in CHECKPOINT_SCRIPT
    script = CHECKPOINT_SCRIPT.replace(
        sandbox, "stockade.Sandbox(sys.argv[2], workspace=ws, overlay=True)"
    ).replace(
        last,
        last + '    out["kernel"] = sb.run(["cat", "/proc/version"], capture_output=True, '
        "text=True).stdout\n",
    )
    cmd, env = _command(world, who, runsc)
    python = cmd[:-2]  # [setpriv ...,] python
    proc = subprocess.run(
        [*python, "-c", script, str(ws), str(policy)],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["two"] == "two\nREADME\na.txt\nb\ngone.txt\n"
    assert out["one"] == "one\nREADME\na.txt\nd\n"
    assert out["one_again"] == out["one"]
    assert out["empty"] == "hello\nREADME\na.txt\ngone.txt\n"
    assert out["names"] == ["empty", "one"]
    assert "Linux version 4.4.0" in out["kernel"]  # gVisor's Sentry, not the host kernel
    assert (ws / "a.txt").read_text() == "hello\n"  # the real workspace never changed
    assert (ws / "gone.txt").read_text() == "gone\n"
    assert not (ws / "d").exists()


@pytest.mark.parametrize("who", WHO)
def test_a_killed_gvisor_run_leaves_the_workspace_untouched_and_its_layer_listable(
    world: World, who: str, runsc: str
) -> None:
    _populate(world.workspace)
    before = _tree(world.workspace)
    cmd, env = _command(world, who, runsc)
    proc = subprocess.Popen(
        [
            *cmd,
            "run",
            "--backend",
            "gvisor",
            "--overlay",
            "--",
            "sh",
            "-c",
            "echo mine > a.txt; echo n > b.txt; sleep 60",
        ],
        cwd=world.workspace,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    layers = world.root / "state" / "stockade" / "layers"
    deadline = time.monotonic() + 60
    found: list[Path] = []
    while time.monotonic() < deadline and not found:
        found = list(layers.glob("*/upper/b.txt")) if layers.is_dir() else []
        time.sleep(0.05)
    assert found, "the run never wrote into its layer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # The entry and runsc die with stockade (PDEATHSIG), and the overlay with their
    # mount namespace; the next run removes the killed run's placeholders.
    tidy = cli(world, who, runsc, "run", "--", "true")
    assert tidy.returncode == 0, tidy.stderr
    assert _tree(world.workspace) == before
    run = found[0].parent.parent.name
    listed = json.loads(cli(world, who, runsc, "changes", "--list", "--json").stdout)["layers"]
    (row,) = [r for r in listed if r["run"] == run]
    assert row["state"] == "interrupted"
    assert set(changes_of(world, who, runsc, run)) == {"a.txt", "b.txt"}
    # the twin: its changes still apply
    out = cli(world, who, runsc, "apply", run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (world.workspace / "a.txt").read_text() == "mine\n"


@pytest.mark.parametrize("who", WHO)
def test_a_scratch_directory_inside_the_workspace_is_refused(
    world: World, who: str, runsc: str
) -> None:
    """runsc's state lives in the run's scratch directory, reached by path from the
    namespace where the workspace is an overlay: inside the workspace it would land in
    the layer, so the run is refused with the fix, before anything starts."""
    _populate(world.workspace)
    inside = world.workspace / "tmp"
    inside.mkdir()
    if who == "nobody" and os.getuid() == 0:
        subprocess.run(["chown", "65534:65534", str(inside)], check=True)
    cmd, env = _command(world, who, runsc)

    def run(tmpdir: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, "run", "--backend", "gvisor", "--overlay", "--", "sh", "-c", "echo x > a.txt"],
            cwd=world.workspace,
            env=dict(env, TMPDIR=str(tmpdir)),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    refused = run(inside)
    assert refused.returncode == 125, refused.stderr
    assert "scratch directory" in refused.stderr
    assert "set TMPDIR to a directory outside the workspace" in refused.stderr
    assert (world.workspace / "a.txt").read_text() == "hello\n"
    # the twin: with the scratch outside, the same run works (and keeps its write)
    ok = run(world.root)
    assert ok.returncode == 0, ok.stderr
    assert "a.txt" in changes_of(world, who, runsc, run_id_of(ok))
    assert (world.workspace / "a.txt").read_text() == "hello\n"


@pytest.mark.parametrize("who", WHO)
def test_a_workspace_path_with_a_colon_or_a_comma_is_one_lower_layer(
    world: World, who: str, runsc: str
) -> None:
    """The entry passes the workspace whole (lowerdir+ from Linux 6.8; before, such a path
    is refused by name): never split into two lower layers at the ':'."""
    ws = world.root / "w:a,b"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    proc = cli(
        world,
        who,
        runsc,
        "run",
        "--overlay",
        "--workspace",
        str(ws),
        "--",
        "sh",
        "-c",
        "cat a.txt; echo x > a.txt",
    )
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    if release < (6, 8):
        assert proc.returncode == 125, proc.stderr
        assert "',', ':' or a backslash" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\n"
    assert (ws / "a.txt").read_text() == "hello\n"
    assert "a.txt" in changes_of(world, who, runsc, run_id_of(proc))
