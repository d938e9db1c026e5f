"""The container runtime in the probe: the host-kernel action measured for real.

Under bubblewrap the control message reaches the host kernel (the kernel identity seen
inside is the host's) whatever layers are on; under gVisor (opt-in, as every gVisor test:
``STOCKADE_GVISOR=1``) the Sentry answers it, and the probe's table agrees with the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade import Unavailable
from stockade.probe._html import render_html
from stockade.probe._runner import EXIT_AGREE, Report, probe
from stockade.probe._terminal import render
from tests.conftest import bwrap_works, require


def _disagreements(report: Report) -> list[tuple[tuple[str, ...], str, str]]:
    return [(r.layers, c.action, c.detail) for r in report.runs for c in r.cells if not c.agree]


def test_on_bubblewrap_the_control_message_reaches_the_host_kernel() -> None:
    require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")
    report = probe("extended", layers=("container", "syscalls"), cost_repeat=0)
    assert report.backend == "bubblewrap"
    assert report.fixed == ()
    assert _disagreements(report) == []
    assert report.kernel_only == ("host-kernel",)
    cells = {r.layers: next(c for c in r.cells if c.action == "host-kernel") for r in report.runs}
    assert set(cells) == {(), ("container",), ("syscalls",), ("container", "syscalls")}
    for layers, cell in cells.items():
        # Through in every subset, the container and seccomp on included: the identity
        # the agent read inside was the host kernel's.
        assert cell.predicted_through, layers
        assert cell.measured_through, (layers, cell.detail)
        assert f"answered by Linux {os.uname().release}" in cell.detail


@pytest.fixture(scope="module")
def gvisor_report(runsc: str) -> Iterator[Report]:
    """The extended scenario under gVisor, switching seccomp only (two subsets, each with
    the container held on and egress off: the caller's network, as under bubblewrap), with
    one timed run per cost figure."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOCKADE_RUNSC", runsc)
        yield probe("extended", layers=("container", "syscalls"), backend="gvisor", cost_repeat=1)


def test_gvisor_probe_agrees_with_the_model(gvisor_report: Report) -> None:
    report = gvisor_report
    assert report.backend == "gvisor"
    assert report.runsc.startswith("runsc version")
    assert report.fixed == ("container",)
    assert report.switchable == ("syscalls",)
    assert _disagreements(report) == []
    assert [r.layers for r in report.runs] == [
        ("container",),
        ("container", "syscalls"),
    ]
    assert report.exit_code == EXIT_AGREE, report.missing
    assert report.build["container"].enforceable
    assert "a kernel of its own" in report.build["container"].detail


def test_gvisor_stops_the_host_kernel_action_and_bubblewrap_layers_do_not(
    gvisor_report: Report,
) -> None:
    for run in gvisor_report.runs:
        cell = next(c for c in run.cells if c.action == "host-kernel")
        assert cell.predicted_by == ("container",), run.layers
        assert not cell.measured_through, (run.layers, cell.detail)
        # The call was answered, by another kernel: the Sentry's.
        assert "answered by Linux" in cell.detail
        assert f"answered by Linux {os.uname().release}" not in cell.detail
    # Without seccomp the Sentry lets a user namespace be made (its own); with it, not.
    userns = {
        r.layers: next(c for c in r.cells if c.action == "nested-userns")
        for r in gvisor_report.runs
    }
    assert userns[("container",)].measured_through
    assert not userns[("container", "syscalls")].measured_through


def test_gvisor_cost_is_measured_beside_what_it_stops(gvisor_report: Report) -> None:
    figures = gvisor_report.backend_ms
    bwrap, gvisor = figures["bubblewrap"], figures["gvisor"]
    assert bwrap is not None
    assert gvisor is not None
    assert min(bwrap, gvisor) > 0
    assert gvisor_report.cost_ms["container"] is None  # held on: the runtime's cost instead
    data = gvisor_report.to_json()
    json.dumps(data)
    assert data["backend"] == "gvisor"
    assert data["kernel_only"] == ["host-kernel"]
    assert data["cost_ms"]["backends"]["gvisor"] == round(gvisor, 2)
    text = render(data)
    assert "container runtime gvisor" in text
    assert "(always on under gvisor)" in text
    # The terminal shows the JSON's figure (rounded there), not the raw one.
    assert f"gvisor {data['cost_ms']['backends']['gvisor']:.1f} ms" in text
    only = "what only gvisor's own kernel stops: host-kernel (under gvisor: stopped in 2 of 2"
    assert only in text
    page = render_html(data)
    assert "always on under gvisor" in page
    assert "host-kernel" in page


def test_probe_refuses_gvisor_without_a_usable_runsc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_RUNSC", "/nonexistent/runsc")
    with pytest.raises(Unavailable, match="runsc"):
        probe("seed", backend="gvisor", cost_repeat=0)
    proc = subprocess.run(
        [sys.executable, "-m", "stockade", "probe", "--backend", "gvisor", "--json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "STOCKADE_RUNSC": "/nonexistent/runsc"},
        timeout=60,
    )
    # Exit 125 with the way to get runsc; no probe ran on bubblewrap instead.
    assert proc.returncode == 125, proc.stderr
    assert "runsc" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
def test_gvisor_html_holds_the_fixed_rings_on(
    gvisor_report: Report, chromium: str, tmp_path: Path
) -> None:
    from tests.probe.test_html import _arrows, _chrome

    page = tmp_path / "probe.html"
    page.write_text(render_html(gvisor_report.to_json()))
    # The fixed layers cannot be switched off: an empty selection is the fixed run.
    fixed = _chrome(chromium, tmp_path, "--dump-dom", page.as_uri() + "#layers=")
    seccomp = _chrome(chromium, tmp_path, "--dump-dom", page.as_uri() + "#layers=syscalls")
    only_fixed, with_seccomp = _arrows(fixed.stdout), _arrows(seccomp.stdout)
    assert only_fixed["host-kernel"][0] == "container"
    assert only_fixed["nested-userns"][0] == "target"
    assert with_seccomp["nested-userns"][0] == "syscalls"
    assert only_fixed["download"][0] == with_seccomp["download"][0] == "target"
    assert 'data-layers="container"' in fixed.stdout
