"""Writes outside the workspace in a learning run: they succeed in a throwaway
copy-on-write view, are recorded, and never reach the host (runtime/_learnscratch.py).

Each test checks the host's files after the run (the thing the view protects) and the
task's own view of its writes (the thing learning needs); the twins: the same write is
refused in a normal run, and no view is given where one would show the host beneath the
sandbox's own mounts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import World, as_nobody, require

pytestmark = pytest.mark.usefixtures("kernel")

TASK = (
    "set -e; cat {d}/app.conf; echo new > {d}/app.conf; mkdir {d}/made; echo x > {d}/made/f; "
    "rm {d}/sub/k; rm -r {d}/gone; mkdir {d}/gone; cat {d}/app.conf {d}/made/f; "
    "{{ ls -A {d}/sub; ls -A {d}/gone; }} | wc -l"
)


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text() if p.is_file() else "<dir>"
        for p in sorted(root.rglob("*"))
    }


def _shown(world: World) -> Path:
    shown = world.root / "app-config"
    (shown / "sub").mkdir(parents=True)
    (shown / "app.conf").write_text("old\n")
    (shown / "sub" / "k").write_text("keep\n")
    (shown / "gone").mkdir()
    (shown / "gone" / "old").write_text("old\n")
    return shown


def _writes(run_dir: Path) -> dict[str, str]:
    lines = (run_dir / "observations.jsonl").read_text().splitlines()
    return {o["path"]: o.get("change", "") for o in map(json.loads, lines) if o["kind"] == "write"}


def test_writes_outside_the_workspace_succeed_in_a_view_and_the_host_is_unchanged(
    world: World,
) -> None:
    shown = _shown(world)
    before = _tree(shown)
    run_dir = world.root / "learnt"
    proc = world.stockade(
        "learn", "--see", str(shown), "-o", str(run_dir), "--", "sh", "-c", TASK.format(d=shown)
    )
    # the task ran to its end as it would on the host: every write succeeded for it
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["old", "new", "x", "0"], proc.stdout
    # the host's directory is exactly as it was
    assert _tree(shown) == before
    # and each write was recorded, with what it did
    assert _writes(run_dir) == {
        str(shown / "app.conf"): "written",
        str(shown / "made"): "made",
        str(shown / "made" / "f"): "written",
        str(shown / "sub" / "k"): "deleted",
        str(shown / "gone"): "replaced",
    }
    # suggest grants the directory, named as a widening, each write its reason
    from stockade.learning import suggest_from

    write = suggest_from([run_dir]).section("write")
    assert [line.value for line in write] == [str(shown)]
    assert write[0].widening
    assert len(write[0].needs) == 5
    # the twin: a normal run refuses the same write (nothing grants it)
    policy = world.root / "read-only.toml"
    policy.write_text(f'[filesystem]\nread = ["{shown}"]\n')
    refused = world.stockade("run", "--policy", str(policy), "--", "sh", "-c", TASK.format(d=shown))
    assert refused.returncode != 0
    assert refused.stdout.split() == ["old"], refused.stdout
    assert _tree(shown) == before


def test_no_view_over_a_directory_holding_the_sandboxs_own_home(world: World) -> None:
    """A view's lower layer does not cross mounts: over the caller's HOME (a tmpfs in
    the sandbox) it would show the real HOME. No view: the write is refused as before,
    and recorded; the read still works (the twin)."""
    home = world.home
    (home / "notes.txt").write_text("mine\n")
    run_dir = world.root / "learnt"
    task = f"cat {home}/notes.txt; echo bad > {home}/notes.txt; echo wrote=$?"
    proc = world.stockade("learn", "--see", str(home), "-o", str(run_dir), "--", "sh", "-c", task)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "mine"
    assert proc.stdout.splitlines()[-1] != "wrote=0", proc.stdout
    assert (home / "notes.txt").read_text() == "mine\n"
    assert str(home / "notes.txt") in _writes(run_dir)


def test_no_view_over_a_directory_with_a_host_mount_inside(world: World) -> None:
    """The host's mount beneath a directory: the view would show what lies under it."""
    require(os.getuid() == 0, "mounting a tmpfs on the host needs root")
    shown = _shown(world)
    inner = shown / "mnt"
    inner.mkdir()
    (inner / "under").write_text("hidden by the mount\n")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    try:
        (inner / "over").write_text("on the mount\n")
        run_dir = world.root / "learnt"
        task = f"ls {inner}; echo new > {shown}/app.conf; echo wrote=$?"
        proc = world.stockade(
            "learn", "--see", str(shown), "-o", str(run_dir), "--", "sh", "-c", task
        )
        assert proc.returncode == 0, proc.stderr
        assert "under" not in proc.stdout
        assert "over" in proc.stdout
        assert proc.stdout.splitlines()[-1] != "wrote=0", proc.stdout
        assert (shown / "app.conf").read_text() == "old\n"
    finally:
        subprocess.run(["umount", str(inner)], check=True)


def test_the_view_works_for_an_unprivileged_user(world: World) -> None:
    require(os.getuid() == 0, "switching to uid 65534 needs root")
    shown = _shown(world)
    run_dir = world.root / "nobody-learnt"
    proc = as_nobody(
        world, "learn", "--see", str(shown), "-o", str(run_dir), "--",
        "sh", "-c", TASK.format(d=shown),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["old", "new", "x", "0"], proc.stdout
    assert (shown / "app.conf").read_text() == "old\n"
    assert (shown / "sub" / "k").exists()
    assert not (shown / "made").exists()
    assert _writes(run_dir)[str(shown / "sub" / "k")] == "deleted"
