"""doctor's gvisor line: optional when missing, the gate's refusal, and a host that is
itself gVisor (where bubblewrap cannot make a network namespace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.cli import doctor
from stockade.enforce import gvisor


def test_missing_runsc_is_fine_and_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gvisor, "inside_gvisor", lambda: False)
    monkeypatch.setattr(gvisor, "find_runsc", lambda env=None: None)
    check = doctor.gvisor_check()
    assert check["ok"] is True
    assert "not installed" in str(check["detail"])
    assert "get-runsc" in str(check["fix"])


def test_an_old_runsc_is_reported_as_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "runsc"
    fake.write_text("#!/bin/sh\necho 'runsc version 0.0~20221219.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("STOCKADE_RUNSC", str(fake))
    monkeypatch.setattr(gvisor, "inside_gvisor", lambda: False)
    check = doctor.gvisor_check()
    assert "release-20230227.0" in str(check["detail"])
    assert "refused" in str(check["detail"])


def test_inside_gvisor_says_so_and_what_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gvisor, "inside_gvisor", lambda: True)
    check = doctor.gvisor_check()
    assert check["ok"] is False
    assert "inside gVisor" in str(check["detail"])
    assert "network namespace" in str(check["detail"])
    assert check["fix"]
