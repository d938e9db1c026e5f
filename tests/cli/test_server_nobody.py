"""``stockade server`` for an unprivileged user (uid 65534), as most users are."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

from stockade.cli import _prefault
from tests.conftest import NOBODY, World, _nobody_python, as_nobody, require

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
        # Its worker read its own pagemap and recorded the pages a run writes, as the
        # user's own file (cli/_prefault.py), after the caller had its status.
        record = logs[0].with_suffix(".pages")
        deadline = time.monotonic() + 5
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        st = record.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o600)
        token = record.read_bytes()[: _prefault.TOKEN_SIZE]
        assert len(_prefault.load(str(record), token)) > 10
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
