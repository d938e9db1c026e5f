"""The model's actions on host processes' /proc files, host IPC and the host's /dev/shm.

Added for the attack suite under the landlock backend (tests/attacks/
test_landlock_attacks.py measures each one): without namespaces a host process's
``cmdline`` and the host's SysV IPC and POSIX shared memory are in reach, its
``environ`` and memory are not (Landlock's ptrace restriction).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.model import (
    HOST_SHARED_DIRS,
    PTRACE_READ_FILES,
    Action,
    Boundary,
    Kind,
    check_monotonic,
    evaluate,
)
from stockade.policy import LAYERS, Reason, load_policy
from stockade.runtime._landlock import DEVICES


def _boundary(tmp_path: Path, backend: str) -> Boundary:
    return Boundary(load_policy(None, workspace=tmp_path), runtime=backend)


ACTIONS = (
    Action("cmdline", Kind.PROCESS_READ, "cmdline", False),
    Action("environ", Kind.PROCESS_READ, "environ", False),
    Action("mem", Kind.PROCESS_READ, "mem", False),
    Action("shm", Kind.HOST_IPC, "sysv_shm", False),
    Action("dev-shm-read", Kind.FILE_READ, "/dev/shm/other", False),
    Action("dev-shm-write", Kind.FILE_WRITE, "/dev/shm/mine", False),
)


@pytest.mark.parametrize("backend", ["bubblewrap", "gvisor"])
def test_namespaces_hide_host_processes_ipc_and_shm(tmp_path: Path, backend: str) -> None:
    ev = evaluate(_boundary(tmp_path, backend), ACTIONS, LAYERS)
    assert ev.through == ()
    b = _boundary(tmp_path, backend)
    for action in ACTIONS[:4]:
        assert b.stops("container", action) is Reason.PROCESS_CONTAINED, action.id


def test_landlock_keeps_environ_and_memory_and_loses_the_rest(tmp_path: Path) -> None:
    b = _boundary(tmp_path, "landlock")
    ev = evaluate(b, ACTIONS, LAYERS)
    assert {a.id for a in ev.through} == {"cmdline", "shm", "dev-shm-read", "dev-shm-write"}
    # Landlock's ptrace restriction comes with any domain: the egress layer's network
    # rule is one even with the files layer off
    both = (("files", Reason.PROCESS_CONTAINED), ("egress", Reason.PROCESS_CONTAINED))
    assert ev.outcome("environ").stopped_by == both
    assert ev.outcome("mem").stopped_by == both
    # the twin: the files layer still refuses a host path outside the shared directory
    other = Action("dev-other", Kind.FILE_WRITE, "/dev/sda", False)
    assert b.stops("files", other) is Reason.PATH_NOT_GRANTED


def test_ptrace_files_are_landlocks_on_the_host_kernel_only(tmp_path: Path) -> None:
    environ = ACTIONS[1]
    assert _boundary(tmp_path, "bubblewrap").stops("files", environ) is Reason.PROCESS_CONTAINED
    assert _boundary(tmp_path, "gvisor").stops("files", environ) is None
    assert "cmdline" not in PTRACE_READ_FILES


def test_shared_dirs_are_the_backends_device_grants() -> None:
    # the model's list is the directories the runtime grants (the rest are device nodes)
    assert set(HOST_SHARED_DIRS) == {d for d in DEVICES if Path(d).is_dir()}


@pytest.mark.parametrize("backend", ["bubblewrap", "gvisor", "landlock"])
def test_monotonic_with_the_new_actions(tmp_path: Path, backend: str) -> None:
    assert check_monotonic(_boundary(tmp_path, backend), ACTIONS) == []
