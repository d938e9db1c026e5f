"""The probe end to end on the seed scenario: the model agrees with every real run."""

from __future__ import annotations

import json
import subprocess
import sys

from stockade.policy import LAYERS
from stockade.probe._runner import EXIT_AGREE, EXIT_INCOMPLETE, Report
from stockade.probe._terminal import render


def test_model_agrees_with_reality_on_every_measured_cell(seed_report: Report) -> None:
    agree, total = seed_report.agreement
    assert total == len(seed_report.runs) * 8
    assert agree == total, [
        (r.layers, c.action, c.detail) for r in seed_report.runs for c in r.cells if not c.agree
    ]
    assert len(seed_report.runs) == 2 ** len(seed_report.measured_layers)


def test_subsets_are_the_exercised_layers_the_build_enforces(seed_report: Report) -> None:
    assert seed_report.switchable == ("files", "container", "egress", "inspect")
    assert "container" in seed_report.measured_layers
    for layer in seed_report.missing:
        assert not seed_report.build[layer].enforceable
        assert seed_report.build[layer].detail
    expected = EXIT_INCOMPLETE if seed_report.missing else EXIT_AGREE
    assert seed_report.exit_code == expected


def test_needed_actions_never_broken_and_empty_subset_leaves_all_open(seed_report: Report) -> None:
    for run in seed_report.runs:
        assert run.count(measured=True)[1] == 0, run.layers
    bare = seed_report.runs[0]
    assert bare.layers == ()
    assert bare.count(measured=True) == (5, 0)


def test_the_seed_table_where_measurable(seed_report: Report) -> None:
    by_layers = {r.layers: r for r in seed_report.runs}
    fce = by_layers.get(("files", "container", "egress"))
    if fce is not None:
        assert fce.count(measured=True) == (1, 0)
        through = [c.action for c in fce.cells if c.measured_through and c.action not in fce.needed]
        assert through == ["upload"]
    container = by_layers[("container",)]
    stopped = {c.action for c in container.cells if not c.measured_through}
    assert {"read-ssh-key", "write-system", "survive"} <= stopped


def test_report_json_and_terminal(seed_report: Report) -> None:
    data = seed_report.to_json()
    json.dumps(data)
    assert set(data["build"]) == set(LAYERS)
    text = render(data, colour=False)
    assert "\x1b[" not in text
    assert f"{data['agreement']['agree']}/{data['agreement']['total']}" in text
    assert "\x1b[" in render(data, colour=True)


def test_cli_probe_json_and_bad_layer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stockade",
            "probe",
            "--layers",
            "container",
            "--json",
            "--cost-runs",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    data = json.loads(proc.stdout)
    assert data["switchable"] == ["container"]
    assert data["agreement"]["agree"] == data["agreement"]["total"] == 16
    assert proc.returncode == EXIT_AGREE
    assert data["cost_ms"]["per_layer"]["container"] is not None
    bad = subprocess.run(
        [sys.executable, "-m", "stockade", "probe", "--layers", "firewall"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 125
    assert "unknown layer 'firewall'" in bad.stderr
