"""Run a scenario for real under every subset of the switchable layers.

For each subset the model predicts every action's outcome from the policy alone, the
sandbox runs the scenario's "test suite", and the world judges what really happened.
Before that, one short run per layer collects evidence that the layer's mechanism is in
force in this build (a namespace, a seccomp mode, a refused control read, a proxy): a
layer without evidence is reported as not enforceable and left out of the subsets, never
assumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade._exceptions import StockadeError
from stockade.api import run as stockade_run
from stockade.model import (
    Action,
    Boundary,
    Kind,
    Route,
    canonical,
    evaluate,
    exercised_layers,
    subsets,
)
from stockade.policy import LAYERS, Policy
from stockade.probe import scenarios
from stockade.probe._world import AGENT_NAME, CONTROL_ENV, PLAN_NAME, World, world

#: Exit codes of ``stockade probe``.
EXIT_AGREE = 0
EXIT_DISAGREE = 1
EXIT_INCOMPLETE = 3

RUN_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class LayerBuild:
    """Whether this build enforces a layer here, and the evidence for the verdict."""

    layer: str
    enforceable: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Cell:
    """One action under one subset: the model's prediction and what really happened."""

    action: str
    predicted_through: bool
    predicted_by: tuple[str, ...]
    measured_through: bool
    detail: str

    @property
    def agree(self) -> bool:
        """True when the model and the run agree."""
        return self.predicted_through == self.measured_through


@dataclass(frozen=True, slots=True)
class SubsetRun:
    """The scenario under one subset of layers."""

    layers: tuple[str, ...]
    cells: tuple[Cell, ...]
    needed: frozenset[str]
    returncode: int
    seconds: float

    def count(self, *, measured: bool) -> tuple[int, int]:
        """(open unneeded, broken needed), measured or predicted."""
        open_unneeded = broken = 0
        for c in self.cells:
            through = c.measured_through if measured else c.predicted_through
            if c.action in self.needed:
                broken += not through
            else:
                open_unneeded += through
        return open_unneeded, broken


@dataclass
class Report:
    """Everything a probe found; :meth:`to_json` is the ``--json`` document."""

    scenario: str
    actions: list[dict[str, Any]]
    build: dict[str, LayerBuild]
    switchable: tuple[str, ...]
    runs: list[SubsetRun] = field(default_factory=list)
    #: layer -> added start-up milliseconds (None when the layer is not enforceable)
    cost_ms: dict[str, float | None] = field(default_factory=dict)
    baseline_ms: float = 0.0
    all_on_ms: float = 0.0

    @property
    def measured_layers(self) -> tuple[str, ...]:
        """The switchable layers the build enforces (the ones the subsets range over)."""
        return tuple(lay for lay in self.switchable if self.build[lay].enforceable)

    @property
    def missing(self) -> tuple[str, ...]:
        """Switchable layers this build cannot enforce."""
        return tuple(lay for lay in self.switchable if not self.build[lay].enforceable)

    @property
    def agreement(self) -> tuple[int, int]:
        """(cells where model and reality agree, all cells)."""
        cells = [c for r in self.runs for c in r.cells]
        return sum(c.agree for c in cells), len(cells)

    @property
    def exit_code(self) -> int:
        """0 all agree and every switchable layer measured; 1 disagreement; 3 incomplete."""
        agree, total = self.agreement
        if agree != total:
            return EXIT_DISAGREE
        return EXIT_INCOMPLETE if self.missing else EXIT_AGREE

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        agree, total = self.agreement
        return {
            "scenario": self.scenario,
            "actions": self.actions,
            "build": {
                k: {"enforceable": v.enforceable, "detail": v.detail} for k, v in self.build.items()
            },
            "switchable": list(self.switchable),
            "measured_layers": list(self.measured_layers),
            "not_enforceable": list(self.missing),
            "runs": [
                {
                    "layers": list(r.layers),
                    "seconds": round(r.seconds, 4),
                    "returncode": r.returncode,
                    "open_unneeded": dict(
                        zip(
                            ("model", "measured"),
                            (r.count(measured=False)[0], r.count(measured=True)[0]),
                            strict=True,
                        )
                    ),
                    "broken_needed": dict(
                        zip(
                            ("model", "measured"),
                            (r.count(measured=False)[1], r.count(measured=True)[1]),
                            strict=True,
                        )
                    ),
                    "cells": {
                        c.action: {
                            "predicted": "through" if c.predicted_through else "stopped",
                            "predicted_by": list(c.predicted_by),
                            "measured": "through" if c.measured_through else "stopped",
                            "agree": c.agree,
                            "detail": c.detail,
                        }
                        for c in r.cells
                    },
                }
                for r in self.runs
            ],
            "agreement": {"agree": agree, "total": total},
            "cost_ms": {
                "baseline": round(self.baseline_ms, 2),
                "all_on": round(self.all_on_ms, 2),
                "per_layer": {
                    k: (None if v is None else round(v, 2)) for k, v in self.cost_ms.items()
                },
            },
            "exit_code": self.exit_code,
        }


def _python() -> str:
    """The interpreter the suite runs under: the system's, which the sandbox can see."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("python3")
    return str(Path(found).resolve()) if found else str(Path(sys.executable).resolve())


def _landlock_scopes() -> bool:
    from stockade.runtime import _host

    return _host.landlock_abi() >= 6


def _run(
    w: World, policy: Policy, env: dict[str, str], argv: Sequence[str], layers: Sequence[str]
) -> tuple[int, str, float]:
    disable = [lay for lay in LAYERS if lay not in layers]
    start = time.perf_counter()
    result = stockade_run(
        list(argv),
        policy=policy,
        cwd=policy.filesystem.workspace,
        disable=disable,
        capture_output=True,
        env=env,
        timeout=RUN_TIMEOUT,
    )
    elapsed = time.perf_counter() - start
    out = (result.stdout or b"").decode(errors="replace")
    err = (result.stderr or b"").decode(errors="replace")
    if result.returncode != 0 and not out.strip():
        out = ""
        err = err.strip().splitlines()[-1] if err.strip() else f"exit {result.returncode}"
        return result.returncode, f"!{err}", elapsed
    return result.returncode, out, elapsed


def _inspect_check(w: World, scenario: scenarios.Scenario, scopes: bool) -> tuple[bool | None, str]:
    """Run with egress and inspect on: is a request the rules refuse stopped by the proxy?

    Two requests go to the registry through the proxy only: one the model says the rules
    let on (the control: the route works) and one they refuse. Returns (True, why) when
    the control got through and the refused one never reached the registry, (False, why)
    when the refused one reached it, (None, why) when the run says nothing either way.
    """
    lo = w.layout(f"inspect-{uuid.uuid4().hex[:8]}")
    mark = f"{lo.nonce}:inspect-check"
    boundary = Boundary(scenario.policy, landlock_scopes=scopes)
    https = {
        "op": "http",
        "host": scenarios.REGISTRY,
        "port": lo.registry_port,
        "tls": True,
        "ca": str(lo.ca_file),
        "proxy_only": True,
    }
    control = {
        **https,
        "id": "control",
        "method": "GET",
        "path": "/pkg/left-pad.tgz",
        "expect": scenarios.PACKAGE_BODY.decode(),
    }
    refused = {**https, "id": "refused", "method": "PUT", "path": "/inspect-check", "data": mark}
    for step in (control, refused):
        action = Action(
            str(step["id"]),
            Kind.NET_REQUEST,
            f"https://{scenarios.REGISTRY}:{lo.registry_port}{step['path']}",
            False,
            host=scenarios.REGISTRY,
            port=lo.registry_port,
            method=str(step["method"]),
            path=str(step["path"]),
            address=scenarios.LOOPBACK,
        )
        # The check means something only if the policy's rules really treat it so.
        expected = step is refused
        got = boundary.stops("inspect", action, Route.PROXY) is not None
        if got != expected:
            return (
                None,
                f"the policy's rules do not {'refuse' if expected else 'allow'} {action.target}",
            )
    ws = scenario.policy.filesystem.workspace
    (ws / PLAN_NAME).write_text(json.dumps({"steps": [control, refused]}))
    code, out, _ = _run(
        w,
        scenario.policy,
        w.caller_env(scenario.env),
        [_python(), AGENT_NAME, PLAN_NAME],
        ("egress", "inspect"),
    )
    time.sleep(0.15)
    reports = {}
    for line in out.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                reports[str(record.get("id"))] = record
    if w.servers["registry"].saw(mark):
        return False, (
            "with egress and inspect on, a PUT that network.rules refuse reached the registry "
            "through the proxy: this build's runtime does not hand its proxy an inspect layer"
        )
    if not reports.get("control", {}).get("done"):
        detail = reports.get("control", {}).get("detail", out[1:] if out else f"exit {code}")
        return None, f"an allowed GET through the proxy failed too ({detail}); nothing measured"
    return True, "a PUT the rules refuse was stopped by the proxy, an allowed GET went through"


def capabilities(
    w: World, scenario: scenarios.Scenario, scopes: bool = True
) -> dict[str, LayerBuild]:
    """One run per layer with only that layer on; judge from the evidence it prints.

    ``inspect`` acts only in the proxy, so its evidence is a run with egress on too (see
    :func:`_inspect_check`).
    """
    plan = {"evidence": {"env": CONTROL_ENV, "file": str(w.control_file), "content": w.canary}}
    ws = scenario.policy.filesystem.workspace
    (ws / PLAN_NAME).write_text(json.dumps(plan))
    host_ns = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "net")}
    facts: dict[str, dict[str, Any] | str] = {}
    env = w.caller_env(scenario.env)
    for layer in LAYERS:
        try:
            code, out, _ = _run(
                w, scenario.policy, env, [_python(), AGENT_NAME, PLAN_NAME], [layer]
            )
        except StockadeError as exc:
            facts[layer] = f"the run was refused: {exc}"
            continue
        line = next((ln for ln in out.splitlines() if ln.startswith('{"evidence"')), None)
        facts[layer] = json.loads(line)["evidence"] if line else f"no evidence (exit {code}) {out}"
    out_builds: dict[str, LayerBuild] = {}

    def verdict(layer: str, ok: bool, yes: str, no: str) -> None:
        fact = facts[layer]
        if isinstance(fact, str):
            out_builds[layer] = LayerBuild(layer, False, fact)
        else:
            out_builds[layer] = LayerBuild(layer, ok, yes if ok else no)

    def get(layer: str, key: str) -> Any:
        fact = facts[layer]
        return None if isinstance(fact, str) else fact.get(key)

    verdict(
        "container",
        get("container", "ns_pid") not in (None, host_ns["pid"])
        and get("container", "hostname") == "stockade",
        "own PID namespace and hostname inside bubblewrap",
        "no PID namespace of its own with only the container layer on",
    )
    verdict(
        "files",
        get("files", "control_read") is False,
        f"a read of an ungranted host file failed ({get('files', 'control_error')})",
        "with only the files layer on, a host file outside every grant was readable: "
        "the Landlock ruleset is not applied by this build's runtime",
    )
    verdict(
        "syscalls",
        get("syscalls", "Seccomp") == "2",
        "Seccomp: 2 (filter) inside",
        f"Seccomp: {get('syscalls', 'Seccomp')} inside: no seccomp filter is loaded by this build",
    )
    verdict(
        "secrets",
        get("secrets", "control_env") is False,
        "a caller variable not on the allow-list was absent",
        "a caller variable not on the allow-list was passed",
    )
    netns = get("egress", "ns_net")
    proxy = get("egress", "proxy") is True
    verdict(
        "egress",
        netns not in (None, host_ns["net"]) and proxy,
        "own network namespace, proxy variables set",
        (
            "own network namespace but no proxy: this build starts no egress proxy, so "
            "allowed hosts are unreachable"
            if netns not in (None, host_ns["net"])
            else "the host network namespace is shared"
        ),
    )
    if not out_builds["egress"].enforceable:
        out_builds["inspect"] = LayerBuild(
            "inspect", False, "inspect acts in the egress proxy, which this build does not run"
        )
    else:
        inspected, why = _inspect_check(w, scenario, scopes)
        out_builds["inspect"] = LayerBuild("inspect", inspected is True, why)
    want = scenario.policy.limits.file_size
    verdict(
        "limits",
        get("limits", "rlimit_fsize") == want,
        f"RLIMIT_FSIZE = {want} inside",
        f"RLIMIT_FSIZE = {get('limits', 'rlimit_fsize')} inside, policy says {want}",
    )
    return {layer: out_builds[layer] for layer in LAYERS}


def _run_subset(w: World, name: str, layers: tuple[str, ...], scopes: bool) -> SubsetRun:
    nonce = uuid.uuid4().hex[:12]
    layout = w.layout(nonce)
    sc = scenarios.build(name, layout)
    ev = evaluate(Boundary(sc.policy, landlock_scopes=scopes), sc.actions, layers)
    steps = [{**s.attempt, "id": s.action.id, "address": s.action.address} for s in sc.steps]
    ws = sc.policy.filesystem.workspace
    (ws / PLAN_NAME).write_text(json.dumps({"steps": steps}))
    code, out, seconds = _run(
        w, sc.policy, w.caller_env(sc.env), [_python(), AGENT_NAME, PLAN_NAME], layers
    )
    inside: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            inside[str(record.get("id"))] = record
    # A surviving process, a byte at a sink: give the host's side a moment to show it.
    time.sleep(0.15)
    cells = []
    for step in sc.steps:
        record = inside.get(step.action.id, {})
        detail = str(record.get("detail", out[1:] if out.startswith("!") else "no report"))
        outcome = ev.outcome(step.action.id)
        cells.append(
            Cell(
                step.action.id,
                outcome.through,
                tuple(layer for layer, _ in outcome.stopped_by),
                w.judge(step, layout, record),
                detail,
            )
        )
    w.reset(sc, layout)
    needed = frozenset(a.id for a in sc.actions if a.needed)
    return SubsetRun(layers, tuple(cells), needed, code, seconds)


def _measure_cost(
    w: World, scenario: scenarios.Scenario, layers: tuple[str, ...], repeat: int
) -> tuple[float, float, dict[str, float | None]]:
    env = w.caller_env(scenario.env)

    def mean_ms(active: Sequence[str]) -> float:
        times = [_run(w, scenario.policy, env, ["true"], active)[2] for _ in range(repeat)]
        return statistics.median(times) * 1000

    mean_ms(layers)  # warm caches (launcher build, page cache) before timing
    baseline = mean_ms(())
    all_on = mean_ms(layers)
    cost: dict[str, float | None] = {}
    for layer in LAYERS:
        if layer in layers:
            cost[layer] = all_on - mean_ms([x for x in layers if x != layer])
        else:
            cost[layer] = None
    return baseline, all_on, cost


def probe(
    scenario: str = "seed",
    layers: Sequence[str] | None = None,
    *,
    cost_repeat: int = 3,
    base: Path | None = None,
) -> Report:
    """Run ``scenario`` under every subset of ``layers`` (default: those it exercises).

    Layers this build cannot enforce are reported and left out of the subsets.
    """
    scopes = _landlock_scopes()
    with world(base) as w:
        first = scenarios.build(scenario, w.layout("setup"))
        boundary = Boundary(first.policy, landlock_scopes=scopes)
        switchable = canonical(layers) if layers else exercised_layers(boundary, first.actions)
        build = capabilities(w, first, scopes)
        report = Report(
            scenario,
            [
                {
                    "id": a.id,
                    "kind": str(a.kind),
                    "target": a.target,
                    "needed": a.needed,
                    "description": a.description,
                }
                for a in first.actions
            ],
            build,
            switchable,
        )
        for subset in subsets(report.measured_layers):
            report.runs.append(_run_subset(w, scenario, subset, scopes))
        enforceable = tuple(lay for lay in LAYERS if build[lay].enforceable)
        if cost_repeat > 0:
            report.baseline_ms, report.all_on_ms, report.cost_ms = _measure_cost(
                w, first, enforceable, cost_repeat
            )
    return report
