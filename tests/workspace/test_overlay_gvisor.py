"""An overlay workspace under the gvisor backend is refused with its reason (exit 125),
never run with a read-write workspace instead; the same run without the overlay works."""

from __future__ import annotations

from tests.conftest import World


def test_overlay_under_gvisor_fails_closed_and_the_plain_run_works(
    world: World, runsc: str
) -> None:
    world.env["STOCKADE_RUNSC"] = runsc
    (world.workspace / "a.txt").write_text("hello\n")
    proc = world.stockade(
        "run", "--overlay", "--backend", "gvisor", "--", "sh", "-c", "echo x > a.txt"
    )
    assert proc.returncode == 125
    assert "overlay workspace with the gVisor backend" in proc.stderr
    assert "no review can read it" in proc.stderr
    assert (world.workspace / "a.txt").read_text() == "hello\n"
    # the twin: the same backend without the overlay runs, read-write
    ok = world.stockade("run", "--backend", "gvisor", "--", "sh", "-c", "echo x > a.txt")
    assert ok.returncode == 0, ok.stderr
    assert (world.workspace / "a.txt").read_text() == "x\n"
