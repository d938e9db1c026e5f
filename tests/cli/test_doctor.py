"""``stockade doctor``: what this host can enforce, checked against the host itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stockade.runtime import _host


def doctor(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None if path is None else dict(os.environ, PATH=path)
    return subprocess.run(
        [sys.executable, "-m", "stockade", "doctor", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


@pytest.mark.usefixtures("kernel")
def test_doctor_reports_what_this_host_has() -> None:
    proc = doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert set(checks) == {
        "bubblewrap",
        "user namespaces",
        "userns restrictions",
        "landlock backend",
        "landlock",
        "seccomp",
        "mount API",
        "limits",
        "transparent egress",
        "upstream proxy",
        "gvisor",
        "kubernetes pod",
        "learn mode",
    }
    assert all(c["ok"] for c in checks.values())
    assert "seccomp user notification" in checks["learn mode"]["detail"]
    assert checks["landlock"]["detail"].startswith(f"ABI {_host.landlock_abi()}")
    assert ("launcher makes" in checks["mount API"]["detail"]) == _host.mount_api()
    assert "resolver and capture" in checks["transparent egress"]["detail"]
    assert checks["kubernetes pod"]["detail"].startswith("not in a Kubernetes pod")
    text = doctor()
    assert "[ok  ] bubblewrap" in text.stdout


def test_doctor_names_a_missing_bubblewrap_and_the_fix() -> None:
    proc = doctor("--json", path="/nonexistent")
    assert proc.returncode == 1
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["bubblewrap"]["ok"] is False
    assert "apt-get install bubblewrap" in checks["bubblewrap"]["fix"]
