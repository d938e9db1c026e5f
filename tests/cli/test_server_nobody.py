"""``stockade server`` for an unprivileged user (uid 65534), as most users are."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.conftest import World, _nobody_python, as_nobody, require

pytestmark = pytest.mark.usefixtures("kernel")


def test_an_unprivileged_user_is_served(world: World) -> None:
    start = as_nobody(world, "server", "start")
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        proc = as_nobody(world, "run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo ok")
        assert "ok" in proc.stdout, proc.stderr
        assert world.canary not in proc.stdout + proc.stderr
        logs = list((world.root / "state" / "stockade" / "server").glob("*.jsonl"))
        assert len(logs) == 1
        events = [json.loads(line)["event"] for line in logs[0].read_text().splitlines()]
        assert "server_run" in events
    finally:
        stop = as_nobody(world, "server", "stop")
        assert stop.returncode == 0, stop.stdout + stop.stderr
    # The twin: with the server stopped, the run happens in-process, just the same.
    proc = as_nobody(world, "run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; echo ok")
    assert "ok" in proc.stdout
    assert world.canary not in proc.stdout + proc.stderr


def test_an_unprivileged_user_is_served_by_the_compiled_front_end(world: World) -> None:
    """The front end an installation's users share hands their runs to their own servers."""
    from stockade.cli import _frontend

    python = _nobody_python(from_any_process=True) if os.getuid() == 0 else sys.executable
    require(python is not None, "no Python >= 3.11 executable by uid 65534")
    assert python is not None
    bin_dir = world.root / "bin"
    bin_dir.mkdir()
    # Installed as an administrator would: owned by the installer, executable by all.
    shutil.copy(_frontend.build_frontend(python), bin_dir / "stockade")
    (bin_dir / "stockade").chmod(0o755)
    front = [str(bin_dir / "stockade")]
    start = as_nobody(world, "server", "start", command=front)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        proc = as_nobody(
            world, "run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; id -u; exit 5", command=front
        )
        assert proc.returncode == 5, proc.stderr
        assert world.canary not in proc.stdout + proc.stderr
        logs = list((world.root / "state" / "stockade" / "server").glob("*.jsonl"))
        runs = [
            json.loads(line)
            for line in logs[0].read_text().splitlines()
            if json.loads(line)["event"] == "server_run"
        ]
        assert len(runs) == 1
        assert runs[0]["argv"][-1] == "cat ~/.ssh/id_ed25519; id -u; exit 5"
    finally:
        stop = as_nobody(world, "server", "stop", command=front)
        assert stop.returncode == 0, stop.stdout + stop.stderr
    # The twin: no server, and the front end runs the command in Python, just the same
    # (starting none: tests/cli/test_server_autostart.py).
    world.env["STOCKADE_SERVER"] = "manual"
    proc = as_nobody(world, "run", "--", "sh", "-c", "cat ~/.ssh/id_ed25519; exit 5", command=front)
    assert proc.returncode == 5, proc.stderr
    assert world.canary not in proc.stdout + proc.stderr
