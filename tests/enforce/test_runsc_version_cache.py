"""``runsc --version`` is asked once per file: its answer is kept in stockade's state with
the file's identity (issue 23, item 5: a gVisor run no longer pays a Go start-up for it).

A changed file (any write changes its ctime) is asked again, and a release too old is
refused whether the answer came from the file or from the record.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade import Unavailable
from stockade.enforce import gvisor

FAKE = """#!/bin/sh
echo asked >> {log}
echo "runsc version release-{release}"
echo "spec: 1.1.0"
"""


def _fake(tmp_path: Path, release: str) -> tuple[Path, Path]:
    runsc, log = tmp_path / "bin" / "runsc", tmp_path / "asked.log"
    runsc.parent.mkdir(exist_ok=True)
    runsc.write_text(FAKE.format(log=log, release=release))
    runsc.chmod(0o755)
    return runsc, log


def _asked(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_the_version_is_asked_once_while_the_file_is_unchanged(tmp_path: Path) -> None:
    runsc, log = _fake(tmp_path, "20240729.0")
    assert gvisor.runsc_version(runsc).release == (20240729, 0)
    assert gvisor.runsc_version(runsc).release == (20240729, 0)
    assert _asked(log) == 1


def test_a_changed_file_is_asked_again(tmp_path: Path) -> None:
    runsc, log = _fake(tmp_path, "20240729.0")
    assert gvisor.runsc_version(runsc).release == (20240729, 0)
    # Replaced by an older release of the same length: a new identity, a new answer.
    _fake(tmp_path, "20220101.0")
    st = runsc.stat()
    os.utime(runsc, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert gvisor.runsc_version(runsc).release == (20220101, 0)
    assert _asked(log) == 2


def test_a_release_too_old_is_refused_from_the_record_too(tmp_path: Path) -> None:
    runsc, log = _fake(tmp_path, "20220101.0")
    for _ in range(2):
        assert gvisor.runsc_version(runsc).release < gvisor.MIN_RELEASE
        with pytest.raises(Unavailable, match="older than"):
            gvisor.require_runsc({"STOCKADE_RUNSC": str(runsc), "PATH": "/usr/bin"})
    assert _asked(log) == 1


def test_an_answer_without_a_release_is_not_remembered(tmp_path: Path) -> None:
    runsc, log = tmp_path / "runsc", tmp_path / "asked.log"
    runsc.write_text(f"#!/bin/sh\necho asked >> {log}\necho garbage\n")
    runsc.chmod(0o755)
    for _ in range(2):
        with pytest.raises(Unavailable, match="no release"):
            gvisor.runsc_version(runsc)
    assert _asked(log) == 2
