"""The overlay through the Python API: ``run(overlay=True).changes`` and an overlay
``Sandbox`` whose runs share one layer (changes, diff, apply, discard)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import stockade
from stockade.workspace import protected_reason
from tests.conftest import World, require

pytestmark = pytest.mark.usefixtures("kernel")


@pytest.fixture
def ws(world: World, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, world.env[name])
    (world.workspace / "a.txt").write_text("hello\n")
    return world.workspace


def test_run_with_overlay_returns_its_changes(ws: Path, world: World) -> None:
    result = stockade.run(
        ["sh", "-c", "echo new > a.txt; echo b > b.txt"],
        workspace=ws,
        overlay=True,
        env=world.env,
    )
    assert result.returncode == 0
    assert (ws / "a.txt").read_text() == "hello\n"
    assert {(c.path, c.kind) for c in result.changes} == {("a.txt", "modified"), ("b.txt", "added")}
    assert result.layer is not None
    assert (result.layer / "upper" / "b.txt").is_file()
    # the twin: without overlay the same run writes the workspace, and has no changes
    plain = stockade.run(["sh", "-c", "echo new > a.txt"], workspace=ws, env=world.env)
    assert plain.changes == []
    assert plain.layer is None
    assert (ws / "a.txt").read_text() == "new\n"


def test_sandbox_runs_share_one_layer_then_apply(ws: Path, world: World) -> None:
    with stockade.Sandbox(workspace=ws, overlay=True, env=world.env) as sb:
        assert sb.changes() == []
        assert sb.layer is None
        sb.run(["sh", "-c", "echo one > a.txt; mkdir d; echo x > d/x"], check=True)
        second = sb.run(["cat", "a.txt", "d/x"], capture_output=True, text=True, check=True)
        assert second.stdout == "one\nx\n"  # the second run sees the first's writes
        assert (ws / "a.txt").read_text() == "hello\n"
        assert [c.path for c in sb.changes()] == ["a.txt", "d", "d/x"]
        assert "-hello\n+one\n" in sb.diff(["a.txt"])
        outcomes = sb.apply(["a.txt"])
        assert [(o.path, o.action) for o in outcomes] == [("a.txt", "applied")], outcomes
        assert (ws / "a.txt").read_text() == "one\n"
        assert [c.path for c in sb.changes()] == ["d", "d/x"]
        # after an apply, a later run still works on the same layer, and applies again
        sb.run(["sh", "-c", "echo two > a.txt"], check=True)
        assert [o.action for o in sb.apply()] == ["applied", "applied", "applied"]
        assert (ws / "a.txt").read_text() == "two\n"
        assert (ws / "d" / "x").read_text() == "x\n"


def test_sandbox_discard_starts_over_from_the_workspace(ws: Path, world: World) -> None:
    with stockade.Sandbox(workspace=ws, overlay=True, env=world.env) as sb:
        sb.run(["sh", "-c", "echo gone > a.txt"], check=True)
        layer = sb.layer
        assert layer is not None
        sb.discard()
        assert not layer.exists()
        out = sb.run(["cat", "a.txt"], capture_output=True, text=True, check=True)
        assert out.stdout == "hello\n"
    with (
        stockade.Sandbox(workspace=ws, env=world.env) as plain,
        pytest.raises(stockade.SandboxError, match="no overlay workspace"),
    ):
        plain.changes()


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        (".git/hooks/pre-commit", True),
        (".git/config", True),
        (".git/modules/sub/hooks/x", True),
        (".husky/pre-commit", True),
        ("stockade.toml", True),
        (".envrc", True),
        ("vendor/lib/.git/config", True),
        ("vendor/lib/.git", True),
        (".git", True),
        # the twins: ordinary files, and the parts of .git that git writes as data
        ("src/app.py", False),
        (".git/refs/heads/main", False),
        (".github/workflows/ci.yml", False),
        ("docs/stockade.toml.example", False),
    ],
)
def test_protected_reason(path: str, refused: bool) -> None:
    assert (protected_reason(path) is not None) is refused, protected_reason(path)


def test_policy_protect_entries_are_refused_too() -> None:
    assert protected_reason("ci/deploy.sh", ("ci",)) is not None
    assert protected_reason("ci/deploy.sh") is None
    assert os.sep == "/"


CHECKPOINT_SCRIPT = """
import json, sys
import stockade

ws = sys.argv[1]
out = {}
with stockade.Sandbox(workspace=ws, overlay=True) as sb:
    sb.checkpoint("empty")
    sb.run(["sh", "-c", "echo one > a.txt; rm gone.txt; mkdir d; echo x > d/x"], check=True)
    sb.checkpoint("one")
    sb.run(["sh", "-c", "echo two > a.txt; echo back > gone.txt; rm -r d; echo b > b"], check=True)
    def view():
        # (HEAD and stockade.toml: the protected paths' empty placeholders)
        ls = "ls | grep -vx -e HEAD -e stockade.toml"
        r = sb.run(["sh", "-c", "cat a.txt; " + ls], capture_output=True, text=True, check=True)
        return r.stdout
    out["two"] = view()
    sb.rollback("one")
    out["one"] = view()
    sb.run(["sh", "-c", "echo three > a.txt"], check=True)
    sb.rollback("one")  # a second time: the checkpoint was restocked
    out["one_again"] = view()
    sb.rollback("empty")
    out["empty"] = view()
    out["names"] = [c["name"] for c in sb.checkpoints()]
    out["changes"] = [c.path for c in sb.changes()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_checkpoint_and_rollback_round_trips(ws: Path, world: World, who: str) -> None:
    import json
    import subprocess

    from tests.workspace.test_overlay import nobody_command

    (ws / "gone.txt").write_text("gone\n")
    if who == "nobody":
        cmd, env = nobody_command(world)
        python = cmd[:-2]  # [setpriv ..., python]
    else:
        require(os.getuid() == 0, "the root variant needs root (run the suite as root)")
        import sys

        python, env = [sys.executable], world.env
    proc = subprocess.run(
        [*python, "-c", CHECKPOINT_SCRIPT, str(ws)],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["two"] == "two\nREADME\na.txt\nb\ngone.txt\n"
    assert out["one"] == "one\nREADME\na.txt\nd\n"  # gone.txt deleted again, d back
    assert out["one_again"] == out["one"]
    assert out["empty"] == "hello\nREADME\na.txt\ngone.txt\n"  # the workspace as it is
    assert out["names"] == ["empty", "one"]
    assert out["changes"] == []
    # The real workspace never changed.
    assert (ws / "a.txt").read_text() == "hello\n"
    assert (ws / "gone.txt").read_text() == "gone\n"
    assert not (ws / "d").exists()
