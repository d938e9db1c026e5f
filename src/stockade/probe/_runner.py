"""Run a scenario for real under every subset of the switchable layers.

For each subset the model predicts every action's outcome from the policy alone, the
sandbox runs the scenario's "test suite", and the world judges what really happened.
Before that, one short run per layer collects evidence that the layer's mechanism is in
force in this build (a namespace, a seccomp mode, a refused control read, a proxy): a
layer without evidence is reported as not enforceable and left out of the subsets, never
assumed.

Under bubblewrap the ``overlay`` layer needs the container and files layers (the
runtime refuses an overlay workspace without them, :data:`REQUIRES`): the subsets that
hold it without both are not run. Under gVisor it needs the container alone (the overlay
is mounted around runsc, not by the launcher under Landlock), so every subset runs. After an overlay run the probe acts as the person reviewing: it applies the
changes of the actions marked ``approved`` with ``stockade apply``'s own function, then
discards the layer, and only then judges what reached the host.

The container's runtime is chosen per probe (``backend``): every run of the probe uses
it, and the model judges with it. Under ``gvisor`` the container is held on in every run
(:data:`FIXED`): runsc cannot run without it (the runtime refuses, rather than run on the
host kernel). The subsets range over the other layers (egress off under gVisor is the
caller's network, as under bubblewrap). When runsc is usable, the cost measurement times
the start-up under both runtimes in the same probe, beside what only gVisor stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade._exceptions import StockadeError
from stockade._record import replace
from stockade.api import run as stockade_run
from stockade.model import (
    Action,
    Boundary,
    Kind,
    Route,
    canonical,
    evaluate,
    exercised_layers,
    kernel_only,
    lost_without_namespaces,
    subsets,
)
from stockade.policy import LAYERS, Policy
from stockade.policy._model import BACKENDS, ContainerPolicy
from stockade.probe import scenarios
from stockade.probe._world import AGENT_NAME, CONTROL_ENV, PLAN_NAME, World, world

#: Exit codes of ``stockade probe``.
EXIT_AGREE = 0
EXIT_DISAGREE = 1
EXIT_INCOMPLETE = 3

RUN_TIMEOUT = 30.0

#: The layers the probe keeps on in every run under each backend, with the reason shown.
FIXED: dict[str, dict[str, str]] = {
    "bubblewrap": {},
    "gvisor": {
        "container": "always on under gvisor: runsc is the container, and the runtime "
        "refuses gvisor without it rather than run on the host kernel",
    },
    "landlock": {},
}


#: A layer the runtime runs only beside others (it refuses it alone, fail closed), under
#: bubblewrap and landlock (runtime/_overlay.refusal).
REQUIRES: dict[str, tuple[str, ...]] = {"overlay": ("container", "files")}
#: The same, per backend where it differs: gVisor's overlay is mounted host-side, around
#: runsc, and needs no files layer (its container is always on, :data:`FIXED`).
REQUIRES_UNDER: dict[str, dict[str, tuple[str, ...]]] = {"gvisor": {"overlay": ("container",)}}


def requires(backend: str = "bubblewrap") -> dict[str, tuple[str, ...]]:
    """The layers each layer needs beside it under ``backend``."""
    return REQUIRES_UNDER.get(backend, REQUIRES)


def runnable(layers: Sequence[str], backend: str = "bubblewrap") -> bool:
    """True when the runtime accepts ``layers`` together under ``backend`` (see
    :data:`REQUIRES`)."""
    return all(
        all(need in layers for need in needs)
        for lay, needs in requires(backend).items()
        if lay in layers
    )


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
    #: layer -> added start-up milliseconds, 0 when below noise (None when the layer is
    #: not enforceable or held on)
    cost_ms: dict[str, float | None] = field(default_factory=dict)
    #: layer -> half the range of its paired differences (see :func:`layer_cost`)
    cost_spread_ms: dict[str, float | None] = field(default_factory=dict)
    baseline_ms: float = 0.0
    all_on_ms: float = 0.0
    #: the container's runtime every run used (``bubblewrap`` or ``gvisor``)
    backend: str = "bubblewrap"
    #: layers on in every run (under gvisor: the container, see :data:`FIXED`)
    fixed: tuple[str, ...] = ()
    #: ``runsc --version``'s first line and the platform, when runsc was found
    runsc: str = ""
    #: backend -> start-up milliseconds of ``true`` with every enforced layer on, both
    #: measured in this probe (None: runsc not usable here, or costs not measured)
    backend_ms: dict[str, float | None] = field(default_factory=dict)
    #: the scenario's actions that only a kernel of the sandbox's own stops (the model:
    #: through every bubblewrap layer, stopped under gvisor)
    kernel_only: tuple[str, ...] = ()
    #: the scenario's attacks the bubblewrap backend stops and the landlock backend (no
    #: namespaces) lets through, by the model with every layer on
    lost_without_namespaces: tuple[str, ...] = ()

    @property
    def measured_layers(self) -> tuple[str, ...]:
        """The switchable layers the build enforces (the ones the subsets range over)."""
        return tuple(lay for lay in self.switchable if self.build[lay].enforceable)

    @property
    def missing(self) -> tuple[str, ...]:
        """Switchable or fixed layers this build cannot enforce."""
        return tuple(
            lay for lay in (*self.fixed, *self.switchable) if not self.build[lay].enforceable
        )

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
            "backend": self.backend,
            "runsc": self.runsc,
            "fixed": list(self.fixed),
            "fixed_why": {lay: FIXED[self.backend][lay] for lay in self.fixed},
            # the HTML figure's rings: every layer that is on in some run
            "rings": list(canonical((*self.fixed, *self.switchable))),
            "kernel_only": list(self.kernel_only),
            "lost_without_namespaces": list(self.lost_without_namespaces),
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
                "per_layer_spread": {
                    k: (None if v is None else round(v, 2)) for k, v in self.cost_spread_ms.items()
                },
                "backends": {
                    k: (None if v is None else round(v, 2)) for k, v in self.backend_ms.items()
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


def on_backend(scenario: scenarios.Scenario, backend: str) -> scenarios.Scenario:
    """``scenario`` with its policy's ``[container] backend`` set to ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; backends are {', '.join(BACKENDS)}")
    policy = replace(scenario.policy, container=ContainerPolicy(backend=backend))
    return dataclasses.replace(scenario, policy=policy)


def backend_of(scenario: scenarios.Scenario) -> str:
    """The container's runtime ``scenario``'s runs use (``auto`` as bubblewrap)."""
    backend = scenario.policy.container.backend
    return backend if backend in BACKENDS else "bubblewrap"


def _landlock_scopes(backend: str = "bubblewrap") -> bool:
    """Whether the runs apply Landlock's scopes: the kernel's ABI, or under the landlock
    backend the ABI it uses (``STOCKADE_LANDLOCK_ABI_MAX`` may lower it)."""
    if backend == "landlock":
        from stockade.runtime import _landlock

        return _landlock.usable_abi() >= 6
    from stockade.runtime import _host

    return _host.landlock_abi() >= 6


def _run(
    w: World,
    policy: Policy,
    env: dict[str, str],
    argv: Sequence[str],
    layers: Sequence[str],
    approve: Sequence[str] = (),
    on_layer: Callable[[Path], None] | None = None,
) -> tuple[int, str, float]:
    """Run ``argv`` with ``layers`` on: (exit code, stdout or ``!`` and the error, seconds).

    An overlay run's layer is settled at once: ``on_layer`` (when given) sees it first,
    then the workspace-relative ``approve`` paths are applied (as a reviewer would) and
    the layer is discarded.
    """
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
    if result.layer is not None:
        if on_layer is not None:
            on_layer(result.layer)
        _settle(result.layer, approve, policy)
    out = (result.stdout or b"").decode(errors="replace")
    err = (result.stderr or b"").decode(errors="replace")
    if result.returncode != 0 and not out.strip():
        out = ""
        err = err.strip().splitlines()[-1] if err.strip() else f"exit {result.returncode}"
        return result.returncode, f"!{err}", elapsed
    return result.returncode, out, elapsed


def _settle(root: Path, approve: Sequence[str], policy: Policy) -> None:
    """Apply ``approve`` from the overlay layer at ``root`` (refusals are apply's), then
    throw the layer away."""
    from stockade import workspace

    layer = workspace.Layer(root)
    try:
        if approve:
            workspace.apply(layer, tuple(approve), protect=policy.filesystem.protect)
    finally:
        layer.discard()


def _overlay_check(
    w: World, scenario: scenarios.Scenario, fixed: tuple[str, ...] = ()
) -> LayerBuild:
    """Run with the overlay (and the container and files it needs) on: did a workspace
    write stay in the layer, and does apply bring it to the host?"""
    ws = scenario.policy.filesystem.workspace
    policy = replace(scenario.policy, filesystem=replace(scenario.policy.filesystem, overlay=True))
    name = f".probe-overlay-{uuid.uuid4().hex[:8]}"
    target = ws / name
    step = {"op": "write", "id": "overlay", "path": str(target), "data": w.canary}
    seen: dict[str, bool] = {}

    def held(root: Path) -> None:
        from stockade import workspace

        listed = any(c.path == name for c in workspace.changes(workspace.Layer(root)))
        seen["held"] = listed and not target.exists()

    (ws / PLAN_NAME).write_text(json.dumps({"steps": [step]}))
    try:
        _, out, _ = _run(
            w,
            policy,
            w.caller_env(scenario.env),
            [_python(), AGENT_NAME, PLAN_NAME],
            canonical(("overlay", *requires(backend_of(scenario))["overlay"], *fixed)),
            approve=(name,),
            on_layer=held,
        )
        seen["applied"] = target.exists() and w.canary in target.read_text(errors="replace")
    except StockadeError as exc:
        return LayerBuild("overlay", False, f"the run was refused: {exc}")
    finally:
        with contextlib.suppress(OSError):
            target.unlink()
    if out.startswith("!"):
        return LayerBuild("overlay", False, f"the run was refused: {out[1:]}")
    if seen.get("held") and seen.get("applied"):
        return LayerBuild(
            "overlay",
            True,
            "a workspace write stayed in the run's layer (the host file absent, the "
            "change listed) and reached the host once applied",
        )
    return LayerBuild(
        "overlay",
        False,
        "a workspace write under the overlay "
        + ("reached the host before apply" if not seen.get("held") else "was not applied"),
    )


def _inspect_check(
    w: World, scenario: scenarios.Scenario, scopes: bool, fixed: tuple[str, ...] = ()
) -> tuple[bool | None, str]:
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
        canonical(("egress", "inspect", *fixed)),
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
    w: World, scenario: scenarios.Scenario, scopes: bool = True, fixed: tuple[str, ...] = ()
) -> dict[str, LayerBuild]:
    """One run per layer with only that layer (and the ``fixed`` ones) on; judge from the
    evidence it prints.

    ``inspect`` acts only in the proxy, so its evidence is a run with egress on too (see
    :func:`_inspect_check`). The backend is the scenario policy's.
    """
    gvisor = scenario.policy.container.backend == "gvisor"
    landlock = scenario.policy.container.backend == "landlock"
    plan = {"evidence": {"env": CONTROL_ENV, "file": str(w.control_file), "content": w.canary}}
    ws = scenario.policy.filesystem.workspace
    (ws / PLAN_NAME).write_text(json.dumps(plan))
    host_ns = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "net")}
    facts: dict[str, dict[str, Any] | str] = {}
    env = w.caller_env(scenario.env)
    for layer in LAYERS:
        if layer in requires(backend_of(scenario)):
            continue  # never run alone: judged by its own check below
        try:
            code, out, _ = _run(
                w,
                scenario.policy,
                env,
                [_python(), AGENT_NAME, PLAN_NAME],
                canonical((layer, *fixed)),
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

    if gvisor:
        inside = get("container", "kernel") or {}
        verdict(
            "container",
            bool(inside)
            and inside != w.kernel
            and get("container", "ns_pid") not in (None, host_ns["pid"])
            and get("container", "hostname") == "stockade",
            f"a kernel of its own: Linux {inside.get('release')} inside (the host runs "
            f"{w.kernel.get('release')}, another boot id), own PID namespace and hostname",
            "the command saw the host's kernel (or no PID namespace of its own) under gvisor",
        )
        verdict(
            "files",
            get("files", "control_read") is False,
            "no Landlock under gVisor (ENOSYS; the launcher runs with it off): the files "
            "policy is the container's mount plan, which hid an ungranted host file "
            f"({get('files', 'control_error')}); switching files changes nothing here",
            "an ungranted host file was readable under gvisor: the mount plan exposes it",
        )
    elif landlock:
        verdict(
            "container",
            get("container", "ns_pid") == host_ns["pid"],
            "no namespaces (landlock backend): the launcher stays the command's parent as "
            "a child subreaper and kills what it leaves (the leave-a-process row shows it)",
            "the command ran in a PID namespace of its own under the landlock backend",
        )
        verdict(
            "files",
            get("files", "control_read") is False,
            f"a read of an ungranted host file failed ({get('files', 'control_error')})",
            "with only the files layer on, a host file outside every grant was readable",
        )
    else:
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
    if landlock:
        from stockade.runtime import _landlock

        by = (
            "address alone (the connect guard: Landlock has no network rules below ABI 4)"
            if _landlock.needs_guard(egress=True)
            else "port alone (Landlock)"
        )
        verdict(
            "egress",
            netns == host_ns["net"] and proxy,
            f"no network namespace (landlock backend): connect() reaches the proxy's {by} "
            "and inet sockets are TCP alone (seccomp); proxy variables set",
            "no proxy variables under the landlock backend",
        )
    else:
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
        inspected, why = _inspect_check(w, scenario, scopes, fixed)
        out_builds["inspect"] = LayerBuild("inspect", inspected is True, why)
    want = scenario.policy.limits.file_size
    verdict(
        "limits",
        get("limits", "rlimit_fsize") == want,
        f"RLIMIT_FSIZE = {want} inside",
        f"RLIMIT_FSIZE = {get('limits', 'rlimit_fsize')} inside, policy says {want}",
    )
    out_builds["overlay"] = _overlay_check(w, scenario, fixed)
    return {layer: out_builds[layer] for layer in LAYERS}


def _run_subset(
    w: World, name: str, layers: tuple[str, ...], scopes: bool, backend: str = "bubblewrap"
) -> SubsetRun:
    nonce = uuid.uuid4().hex[:12]
    layout = w.layout(nonce)
    sc = on_backend(scenarios.build(name, layout), backend)
    ev = evaluate(Boundary(sc.policy, landlock_scopes=scopes), sc.actions, layers)
    steps = [{**s.attempt, "id": s.action.id, "address": s.action.address} for s in sc.steps]
    ws = sc.policy.filesystem.workspace
    (ws / PLAN_NAME).write_text(json.dumps({"steps": steps}))
    # The reviewer applies what it approves (the overlay's own refusals are apply's).
    approve = tuple(
        str(Path(s.action.target).relative_to(ws))
        for s in sc.steps
        if s.action.approved and Path(s.action.target).is_relative_to(ws)
    )
    code, out, seconds = _run(
        w, sc.policy, w.caller_env(sc.env), [_python(), AGENT_NAME, PLAN_NAME], layers, approve
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


def layer_cost(with_layer: Sequence[float], without: Sequence[float]) -> tuple[float, float]:
    """(cost, spread) in the samples' unit: what one layer adds, from paired samples.

    Sample ``i`` of each list was taken in the same turn (every layer on, then all but
    this one), so the machine's drift between turns cancels in each difference. The
    cost is the median of the differences, the spread half their range. A difference
    that is not above its spread is noise, not a cost: the cost is then 0 (so a layer
    is never shown as making a command faster, which the old "median with minus
    median without" did whenever the second set happened to run on a busier moment).
    """
    diffs = [a - b for a, b in zip(with_layer, without, strict=True)]
    if not diffs:
        return 0.0, 0.0
    cost = statistics.median(diffs)
    spread = (max(diffs) - min(diffs)) / 2
    return (cost if cost > spread else 0.0), spread


def _measure_cost(
    w: World,
    scenario: scenarios.Scenario,
    layers: tuple[str, ...],
    repeat: int,
    fixed: tuple[str, ...] = (),
) -> tuple[float, float, dict[str, float | None], dict[str, float | None]]:
    """(bare, every layer on, each layer's share, each share's spread) in milliseconds
    of ``true``; the share is :func:`layer_cost` of runs in turns.

    A fixed layer cannot be taken out, so its share is None: under gvisor the
    container's cost is the runtime's, which :func:`_backend_cost` measures.
    """
    env = w.caller_env(scenario.env)

    def once_ms(active: Sequence[str], policy: Policy = scenario.policy) -> float:
        return _run(w, policy, env, ["true"], active)[2] * 1000

    fs = scenario.policy.filesystem
    # The overlay's share is measured on an overlay workspace even when the scenario has
    # none (then "every layer on" is without it, as the scenario's runs are).
    with_overlay = replace(scenario.policy, filesystem=replace(fs, overlay=True))
    counted = layers if fs.overlay else tuple(x for x in layers if x != "overlay")
    once_ms(counted)  # warm caches (launcher build, page cache) before timing
    # No layer at all: no container, so no runtime either (gvisor would refuse it).
    bare_policy = on_backend(scenario, "bubblewrap").policy
    baseline = statistics.median(once_ms((), bare_policy) for _ in range(repeat))
    on_samples: list[float] = []
    cost: dict[str, float | None] = {}
    spread: dict[str, float | None] = {}
    for layer in LAYERS:
        if layer not in layers or layer in fixed:
            cost[layer] = spread[layer] = None
            continue
        top, top_policy = counted, scenario.policy
        if layer == "overlay" and not fs.overlay:
            top, top_policy = layers, with_overlay
        elif not runnable([x for x in counted if x != layer], backend_of(scenario)):
            # A layer the overlay needs: measured with the overlay off on both sides.
            needs = requires(backend_of(scenario))
            top = tuple(x for x in counted if layer not in needs.get(x, ()))
        rest = [x for x in top if x != layer]
        with_layer: list[float] = []
        without: list[float] = []
        for _ in range(repeat):
            # In turns: each pair sees the machine in the same state.
            with_layer.append(once_ms(top, top_policy))
            without.append(once_ms(rest))
        if top == counted and top_policy is scenario.policy:
            on_samples += with_layer
        cost[layer], spread[layer] = layer_cost(with_layer, without)
    if not on_samples:
        on_samples = [once_ms(counted) for _ in range(repeat)]
    return baseline, statistics.median(on_samples), cost, spread


def _backend_cost(
    w: World, scenario: scenarios.Scenario, layers: tuple[str, ...], repeat: int, runsc: bool
) -> dict[str, float | None]:
    """Start-up of ``true`` under each runtime with the same layers on (the container's
    among them: it is what the runtime builds); gvisor is None when runsc is not usable."""
    env = w.caller_env(scenario.env)
    # The runtimes compared on the layers all three run: landlock refuses an overlay.
    active = canonical(("container", *(x for x in layers if x != "overlay")))
    out: dict[str, float | None] = {}
    for backend in BACKENDS:
        if backend == "gvisor" and not runsc:
            out[backend] = None
            continue
        policy = on_backend(scenario, backend).policy
        _run(w, policy, env, ["true"], active)  # warm: the launcher, runsc's page cache
        times = [_run(w, policy, env, ["true"], active)[2] for _ in range(repeat)]
        out[backend] = statistics.median(times) * 1000
    return out


def _usable_runsc() -> str | None:
    """``runsc --version``'s first line and its platform, or None when there is no
    usable runsc (missing, unreadable or too old)."""
    from stockade._exceptions import Unavailable
    from stockade.enforce import gvisor

    try:
        found = gvisor.require_runsc()
    except Unavailable:
        return None
    return f"{found.text} ({found.platform})"


def probe(
    scenario: str = "seed",
    layers: Sequence[str] | None = None,
    *,
    backend: str = "bubblewrap",
    cost_repeat: int = 3,
    base: Path | None = None,
) -> Report:
    """Run ``scenario`` under every subset of ``layers`` (default: those it exercises),
    with the container's runtime ``backend``.

    Layers this build cannot enforce are reported and left out of the subsets. Under
    ``gvisor`` the layers of :data:`FIXED` are on in every run and the subsets range
    over the others.

    Raises:
        Unavailable: ``backend`` is ``gvisor`` and there is no usable runsc (never a
            fallback to bubblewrap).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; backends are {', '.join(BACKENDS)}")
    runsc = _usable_runsc()
    if backend == "gvisor" and runsc is None:
        from stockade.enforce import gvisor

        gvisor.require_runsc()  # raises the Unavailable that says how to get one
    fixed = canonical(FIXED[backend])
    scopes = _landlock_scopes(backend)
    with world(base) as w:
        first = on_backend(scenarios.build(scenario, w.layout("setup")), backend)
        boundary = Boundary(first.policy, landlock_scopes=scopes)
        chosen = canonical(layers) if layers else exercised_layers(boundary, first.actions)
        switchable = tuple(lay for lay in chosen if lay not in fixed)
        build = capabilities(w, first, scopes, fixed)
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
            backend=backend,
            fixed=fixed,
            runsc=runsc or "",
            kernel_only=kernel_only(boundary, first.actions),
            lost_without_namespaces=lost_without_namespaces(boundary, first.actions),
        )
        if all(build[lay].enforceable for lay in fixed):
            for subset in subsets(report.measured_layers):
                if not runnable((*subset, *fixed), backend):
                    continue  # the runtime refuses it (REQUIRES): nothing to measure
                report.runs.append(
                    _run_subset(w, scenario, canonical((*subset, *fixed)), scopes, backend)
                )
        enforceable = tuple(lay for lay in LAYERS if build[lay].enforceable)
        if cost_repeat > 0:
            (
                report.baseline_ms,
                report.all_on_ms,
                report.cost_ms,
                report.cost_spread_ms,
            ) = _measure_cost(w, first, enforceable, cost_repeat, fixed)
            report.backend_ms = _backend_cost(w, first, enforceable, cost_repeat, runsc is not None)
    return report
