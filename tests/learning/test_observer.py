"""The seccomp observer observes and never decides: what the layers refuse stays refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.enforce.observe import Observation, SyscallObserver, available, build_filter
from stockade.policy import load_policy
from stockade.runtime import RunRequest, execute
from tests.conftest import World, require


def test_the_filter_is_whole_instructions() -> None:
    program = build_filter()
    assert program
    assert len(program) % 8 == 0


@pytest.mark.usefixtures("kernel")
def test_observed_calls_are_decided_by_the_layers_as_without_observer(world: World) -> None:
    ok, why = available()
    require(ok, why)
    outside = world.root / "outside.txt"  # outside every grant of the default policy
    outside.write_text("not for the sandbox\n")
    (world.workspace / "inside.txt").write_text("inside\n")
    policy = load_policy(None, workspace=world.workspace)
    observer = SyscallObserver()
    try:
        run = execute(
            RunRequest(
                ["sh", "-c", f"cat inside.txt; cat {outside}; echo x > {world.root}/new.txt"],
                policy,
                cwd=world.workspace,
                audit_to_file=False,
                capture_output=True,
                caller_env=world.env,
                observer=observer,
            )
        )
    finally:
        observer.stop()
    assert observer.attached
    assert observer.error is None
    # the allowed read works (the twin), the refused read and write stay refused ...
    assert run.stdout == b"inside\n"
    assert b"not for the sandbox" not in (run.stdout or b"")
    assert not (world.root / "new.txt").exists()
    # ... and all three were seen, the relative path made absolute
    assert Observation("read", str(world.workspace / "inside.txt")) in observer.seen
    assert Observation("read", str(outside)) in observer.seen
    assert Observation("write", str(world.root / "new.txt")) in observer.seen
    assert any(o.kind == "exec" and Path(o.path).name == "cat" for o in observer.seen)
