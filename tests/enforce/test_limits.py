"""Where runs make their cgroups (enforce/limits.py), against the real cgroup file system."""

from __future__ import annotations

import json
import subprocess
import sys

from stockade.enforce import limits
from tests.conftest import require

MOVE_AND_DETECT = """
import json, os
from stockade.enforce import limits

first = limits.detect()
assert limits.detect() is first  # remembered for this process's cgroups
# Move this process into a child cgroup of each place it may create them in.
children = []
for parent in first.parents.values():
    child = parent / f"stockade-test-{os.getpid()}"
    child.mkdir(exist_ok=True)
    children.append(child)
try:
    for child in dict.fromkeys(children):
        (child / "cgroup.procs").write_text(str(os.getpid()))
    second = limits.detect()
    print(json.dumps(sorted(str(p) for p in first.parents.values())))
    print(json.dumps(sorted(str(p) for p in second.parents.values())))
finally:
    for child in dict.fromkeys(children):
        (child.parent / "cgroup.procs").write_text(str(os.getpid()))
        child.rmdir()
"""


def test_detect_follows_the_cgroup_this_process_is_in() -> None:
    """A warm process remembers where it may make cgroups, for the cgroups it is in:
    moved elsewhere, it looks again."""
    require(limits.detect() is not None, "no cgroup this user may create (rlimits only)")
    proc = subprocess.run(
        [sys.executable, "-c", MOVE_AND_DETECT], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(line) for line in proc.stdout.splitlines())
    assert first != second
    assert all("stockade-test-" in p for p in second)
    assert not any("stockade-test-" in p for p in first)
