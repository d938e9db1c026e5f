"""apply's two ways of putting a file in place, on a real file system: a file of one name
is moved out of the layer (one rename), a hard-linked one is copied; either way no
extended attribute of the layer and no setuid bit reaches the workspace."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from stockade.workspace import Layer, apply, changes


def _layer(tmp_path: Path) -> tuple[Layer, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "old.txt").write_text("old\n")
    time.sleep(0.05)  # past the coarse clock's tick: old.txt predates the run
    layer = Layer.create("move-test", ws, base=tmp_path / "layers")
    layer.update(state="finished", returncode=0)
    return layer, ws


def test_a_file_of_one_name_is_moved_and_cleaned(tmp_path: Path) -> None:
    layer, ws = _layer(tmp_path)
    up = Path(layer.upper)
    (up / "a.txt").write_text("a\n")
    os.setxattr(up / "a.txt", "user.overlay.origin", b"x")
    os.chmod(up / "a.txt", 0o4755)
    (up / "old.txt").write_text("new\n")
    ino = (up / "a.txt").stat().st_ino
    out = apply(layer)
    assert [(o.path, o.action) for o in out] == [("a.txt", "applied"), ("old.txt", "applied")]
    st = (ws / "a.txt").stat()
    assert st.st_ino == ino  # moved, not copied
    assert os.listxattr(ws / "a.txt") == []
    assert stat.S_IMODE(st.st_mode) == 0o755  # the setuid bit dropped
    assert (ws / "old.txt").read_text() == "new\n"
    assert changes(layer) == []  # what left the layer is in the workspace
    assert not (up / "a.txt").exists()


def test_a_hard_linked_file_is_copied_and_its_other_name_kept(tmp_path: Path) -> None:
    layer, ws = _layer(tmp_path)
    up = Path(layer.upper)
    (up / "b.txt").write_text("b\n")
    os.setxattr(up / "b.txt", "user.overlay.origin", b"x")
    os.link(up / "b.txt", up / "c.txt")
    ino = (up / "b.txt").stat().st_ino
    out = apply(layer, ("b.txt",))
    assert [(o.path, o.action) for o in out] == [("b.txt", "applied")]
    assert (ws / "b.txt").read_text() == "b\n"
    assert (ws / "b.txt").stat().st_ino != ino  # copied: the layer's inode stays its own
    assert os.listxattr(ws / "b.txt") == []
    # the twin: the other name is still in the layer, unchanged, and applies after
    assert (up / "c.txt").read_text() == "b\n"
    assert [c.path for c in changes(layer)] == ["c.txt"]
    assert [o.action for o in apply(layer)] == ["applied"]
    assert (ws / "c.txt").read_text() == "b\n"


def test_a_file_written_just_before_a_run_starts_is_not_taken_for_a_change_during_it(
    tmp_path: Path,
) -> None:
    # A run's start is the next tick of the clock that stamps ctime: a host file written
    # just before (in the same tick, as a test fixture or an editor's save can be) has a
    # ctime below it, and apply does not refuse it as changed while the run ran; a file
    # written after the start (the twin) still has a ctime at or above it.
    from stockade.workspace._layer import next_coarse_tick_ns

    path = tmp_path / "f"
    for i in range(50):
        path.write_text(str(i))
        start = next_coarse_tick_ns()
        assert path.stat().st_ctime_ns < start
        path.write_text("after")
        assert path.stat().st_ctime_ns >= start
