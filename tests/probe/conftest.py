"""Fixtures: one probe run of the seed scenario shared by the tests of this package."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from stockade.probe._runner import Report, probe
from tests.conftest import bwrap_works, require


@pytest.fixture(scope="session")
def seed_report() -> Report:
    """The seed scenario over every subset this build can enforce (costs not measured)."""
    require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")
    return probe("seed", cost_repeat=0)


@pytest.fixture(scope="session")
def chromium() -> str:
    """A headless Chromium; installed with apt-get (as root) only when missing."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], capture_output=True, check=False
        )
        found = shutil.which("chromium")
    require(found is not None, "chromium is not installed (apt-get install chromium)")
    assert found is not None
    return found
