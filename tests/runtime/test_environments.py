"""A virtual environment (or another self-contained prefix) whose ``bin/`` is on PATH runs
inside the sandbox as it runs outside: its whole prefix is visible, read-only.

Python finds ``pyvenv.cfg`` and ``lib/`` beside the interpreter; with only ``bin/`` bound
it silently runs as the base Python (the wrong ``pytest``, the wrong ``pip``). The real
runs below use a venv made with the system's Python, one under HOME and one outside both
HOME and the workspace, as root and as uid 65534; the unit tests cover the other kinds
of prefix on real directories.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stockade.enforce.paths import env_prefix, toolchain_paths
from tests.conftest import World, as_nobody, require

MARKER = "stockade_venv_marker"

#: a venv needs a Python that uid 65534 can execute too: not one under /root
SYSTEM_PYTHON = "/usr/bin/python3"


def _make_venv(where: Path) -> Path:
    require(os.access(SYSTEM_PYTHON, os.X_OK), f"no {SYSTEM_PYTHON} to make a venv with")
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(proc.returncode == 0, f"python3 -m venv failed: {proc.stderr.strip()}")
    (site,) = (where / "lib").glob("python3*/site-packages")
    (site / f"{MARKER}.py").write_text("WHERE = 'venv'\n")
    return where


Runner = Callable[..., subprocess.CompletedProcess[str]]

RUNNERS: dict[str, Runner] = {
    "caller": lambda world, *args: world.stockade(*args),
    "uid-65534": lambda world, *args: as_nobody(world, *args),
}

SCRIPT = (
    "import sys, os\n"
    f"import {MARKER}\n"
    f"print(sys.prefix, {MARKER}.WHERE)\n"
    "try:\n"
    f"    open(os.path.join(sys.prefix, 'planted'), 'w')\n"
    "except OSError as exc:\n"
    "    print('write', type(exc).__name__)\n"
)


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("place", ["under-home", "outside-home-and-workspace"])
def test_a_venv_on_path_runs_as_itself(world: World, runner: str, place: str) -> None:
    base = world.home if place == "under-home" else world.root
    venv = _make_venv(base / "envs" / "proj")
    world.env["PATH"] = f"{venv}/bin:/usr/bin:/bin"
    proc = RUNNERS[runner](world, "run", "--", "python", "-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # pyvenv.cfg was found (sys.prefix is the venv) and the venv's site-packages with it.
    assert lines[0] == f"{venv} venv", proc.stdout + proc.stderr
    # Visible, but read-only: nothing the command plants lands in the environment.
    assert lines[1].startswith("write "), proc.stdout
    assert not (venv / "planted").exists()


@pytest.mark.usefixtures("kernel")
def test_the_rest_of_home_stays_hidden_beside_a_venv(world: World) -> None:
    # The twin of the test above: binding the venv under HOME shows that venv only.
    venv = _make_venv(world.home / "envs" / "proj")
    world.env["PATH"] = f"{venv}/bin:/usr/bin:/bin"
    proc = world.stockade(
        "run", "--", "sh", "-c", f"cat ~/.ssh/id_ed25519; ls {world.home}/envs; python -V"
    )
    assert proc.returncode == 0, proc.stderr
    assert world.canary not in proc.stdout + proc.stderr
    assert proc.stdout.split()[0] == "proj"


# --- which prefixes are bound (real directories, no sandbox) ---------------------------


def _tree(root: Path, *files: str) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("/"):
            path.mkdir(exist_ok=True)
        else:
            path.write_text("")


def test_env_prefix_recognises_environments(tmp_path: Path) -> None:
    _tree(tmp_path / "venv", "pyvenv.cfg", "bin/python")
    _tree(tmp_path / "conda", "conda-meta/history", "bin/python")
    _tree(tmp_path / "uvpy", "bin/python3", "lib/python3.12/os.py")
    _tree(tmp_path / "node", "bin/node", "lib/node_modules/npm/package.json")
    for name in ("venv", "conda", "uvpy", "node"):
        assert env_prefix(tmp_path / name / "bin") == tmp_path / name, name
    # The twins: a bin/ of a prefix that is no environment, and a directory not named bin.
    _tree(tmp_path / "plain", "bin/tool", "lib/libx.so")
    assert env_prefix(tmp_path / "plain" / "bin") is None
    assert env_prefix(tmp_path / "venv") is None


def test_a_venv_brings_its_prefix_and_its_base_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = home / ".local/share/uv/python/cpython-3.12"
    _tree(base, "bin/python3", "lib/python3.12/os.py")
    venv = tmp_path / "elsewhere" / "venv"
    _tree(venv, "bin/python")
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\n")
    _tree(tmp_path / "tools", "bin/tool", "lib/libx.so")
    _tree(home, ".ssh/id_ed25519")
    binds = toolchain_paths(f"{venv}/bin:{tmp_path}/tools/bin:/usr/bin", home)
    assert set(binds) == {venv, base, tmp_path / "tools" / "bin"}


def test_an_environment_holding_a_secret_is_bound_by_its_bin_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # A prefix that would expose a denied path keeps the old, narrow bind.
    _tree(tmp_path / "env", "pyvenv.cfg", "bin/python", "secret.key")
    binds = toolchain_paths(f"{tmp_path}/env/bin", home, denied=(tmp_path / "env/secret.key",))
    assert binds == (tmp_path / "env" / "bin",)
