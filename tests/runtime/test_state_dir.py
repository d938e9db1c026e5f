"""A HOME that cannot be written (a read-only home, a service account's) refuses the run
with exit 125 and a message that names the directory and ``XDG_STATE_HOME``, before any
audit log is opened; with ``XDG_STATE_HOME`` set to a writable directory it runs.

Run as uid 65534 (as root the mode bits would not stop stockade).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import World, as_nobody

pytestmark = pytest.mark.usefixtures("kernel")


@pytest.fixture
def readonly_home(world: World) -> Iterator[World]:
    world.home.chmod(0o555)
    try:
        yield world
    finally:
        world.home.chmod(0o755)  # so that the world can be removed by a user without root


@pytest.mark.parametrize("audit", [False, True], ids=["default-audit", "audit-file"])
def test_a_read_only_home_is_a_clear_error(readonly_home: World, audit: bool) -> None:
    world = readonly_home
    del world.env["XDG_STATE_HOME"]
    log = world.workspace / "run.jsonl"
    extra = ("--audit", str(log)) if audit else ()
    proc = as_nobody(world, "run", *extra, "--", "sh", "-c", "echo ran > ran.txt")
    assert proc.returncode == 125, proc.stderr
    state = world.home / ".local" / "state" / "stockade"
    assert f"cannot create {state}" in proc.stderr, proc.stderr
    assert "XDG_STATE_HOME" in proc.stderr
    assert "internal error" not in proc.stderr
    assert not (world.workspace / "ran.txt").exists()
    # Refused before the log was opened: no log that only says it was closed.
    assert not log.exists()


def test_xdg_state_home_makes_a_read_only_home_work(readonly_home: World) -> None:
    # The twin: the same HOME, the state kept where XDG_STATE_HOME says.
    world = readonly_home
    proc = as_nobody(world, "run", "--", "sh", "-c", "echo ran > ran.txt")
    assert proc.returncode == 0, proc.stderr
    assert (world.workspace / "ran.txt").read_text() == "ran\n"
    assert list((world.root / "state" / "stockade" / "runs").glob("*.jsonl"))
