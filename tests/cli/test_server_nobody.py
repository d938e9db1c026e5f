"""``stockade server`` for an unprivileged user (uid 65534), as most users are."""

from __future__ import annotations

import json

import pytest

from tests.conftest import World, as_nobody

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
