"""The probe's overlay scenario end to end: the seed plus three workspace writes, run for
real over every subset the runtime accepts, the probe applying what a reviewer approves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stockade.probe._runner import EXIT_AGREE, Report, probe, runnable
from tests.conftest import bwrap_works, require


@pytest.fixture(scope="module")
def overlay_report() -> Report:
    require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")
    report = probe("overlay", cost_repeat=0)
    require(
        report.build["overlay"].enforceable,
        f"no overlay workspace here: {report.build['overlay'].detail}",
    )
    return report


def test_model_and_reality_agree_on_every_cell(overlay_report: Report) -> None:
    agree, total = overlay_report.agreement
    assert agree == total, [
        (r.layers, c.action, c.detail) for r in overlay_report.runs for c in r.cells if not c.agree
    ]
    # 16 subsets without the overlay, 4 with it and the container and files it needs
    assert overlay_report.switchable == ("files", "container", "egress", "inspect", "overlay")
    assert len(overlay_report.runs) == 20
    assert total == 20 * 11
    assert all(runnable(r.layers) for r in overlay_report.runs)
    assert overlay_report.exit_code == EXIT_AGREE


def test_the_overlay_keeps_the_tampering_and_lets_the_approved_write_through(
    overlay_report: Report,
) -> None:
    for run in overlay_report.runs:
        cells = {c.action: c for c in run.cells}
        on = "overlay" in run.layers
        assert cells["tamper-ci"].measured_through is not on, run.layers
        assert cells["link-out"].measured_through is not on, run.layers
        # the needed write is applied by the reviewer: never broken
        assert cells["write-workspace"].measured_through, run.layers
        if on:
            assert cells["tamper-ci"].predicted_by == ("overlay",)
            assert cells["hook-approved"].predicted_by == ("container", "overlay")


def test_the_overlay_build_check_and_the_not_run_subsets(overlay_report: Report) -> None:
    build = overlay_report.build["overlay"]
    assert "stayed in the run's layer" in build.detail
    assert not runnable(("overlay",))
    assert not runnable(("container", "overlay"))
    assert runnable(("files", "container", "overlay"))
    assert runnable(("files", "egress"))


@pytest.fixture(scope="module")
def gvisor_overlay_report(runsc: str) -> Iterator[Report]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOCKADE_RUNSC", runsc)
        yield probe("overlay", backend="gvisor", cost_repeat=0)


def test_under_gvisor_the_overlay_runs_and_the_model_agrees(gvisor_overlay_report: Report) -> None:
    """The overlay is mounted around runsc: the build check holds, the overlay is switched
    in the subsets (none refused), and the model, which now counts it under gVisor,
    agrees with every run."""
    report = gvisor_overlay_report
    assert report.build["overlay"].enforceable, report.build["overlay"].detail
    assert "overlay" in report.switchable
    assert any("overlay" in r.layers for r in report.runs)
    agree, total = report.agreement
    assert agree == total, [
        (r.layers, c.action, c.detail) for r in report.runs for c in r.cells if not c.agree
    ]
    assert report.exit_code == EXIT_AGREE
    # under gVisor the overlay needs no files layer (runtime/_overlay.refusal)
    assert runnable(("container", "overlay"), "gvisor")
    assert not runnable(("container", "overlay"))  # the twin: bubblewrap needs files too
    for run in report.runs:
        cells = {c.action: c for c in run.cells}
        on = "overlay" in run.layers
        assert cells["tamper-ci"].measured_through is not on, run.layers
        assert cells["write-workspace"].measured_through, run.layers
