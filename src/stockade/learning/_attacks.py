"""The probe's seed attack scenario, run for real under a candidate policy's grants.

The scenario lives in a throw-away world (:func:`stockade.probe._world.world`): a HOME
with canary secrets, a workspace, a registry, an API, an attacker's host and a sink, all
on loopback. The candidate's network allow-list, pins, request rules and file grants
replace the scenario's own; the scenario's layers, limits and TLS trust stay. Every
unneeded action (an attack) then either is stopped or stays open; each open one is
explained by the model as ``stockade explain`` does (the layers that could stop it and
why none did). The scenario's needed actions use the world's own hosts, which a
learnt policy does not name: they are not counted here (the task's own re-run is).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from stockade._record import replace
from stockade.policy import Policy

__all__ = ["attack_scenario"]


def attack_scenario(candidate: Policy) -> tuple[list[tuple[str, str]], list[str]]:
    """Run the seed scenario under ``candidate``'s grants with every layer the candidate
    has on; return (open unneeded actions as (id, explanation), stopped ones' ids)."""
    from stockade.model import Boundary, evaluate
    from stockade.probe import _runner, scenarios
    from stockade.probe._world import AGENT_NAME, PLAN_NAME, world

    layers = tuple(candidate.layers.active())
    opened: list[tuple[str, str]] = []
    stopped: list[str] = []
    with world() as w:
        layout = w.layout(uuid.uuid4().hex[:12])
        sc = scenarios.build("seed", layout)
        net = sc.policy.network
        policy = replace(
            sc.policy,
            filesystem=replace(
                sc.policy.filesystem,
                read=(*sc.policy.filesystem.read, *candidate.filesystem.read),
                write=candidate.filesystem.write,
            ),
            network=replace(
                net,
                allow=candidate.network.allow,
                deny=candidate.network.deny,
                rules=candidate.network.rules,
                hosts={**dict(net.hosts), **dict(candidate.network.hosts)},
            ),
            layers=candidate.layers,
        )
        sc = dataclasses.replace(sc, policy=policy)
        ev = evaluate(Boundary(policy), sc.actions, layers)
        steps = [{**s.attempt, "id": s.action.id, "address": s.action.address} for s in sc.steps]
        (policy.filesystem.workspace / PLAN_NAME).write_text(json.dumps({"steps": steps}))
        _, out, _ = _runner._run(
            w, policy, w.caller_env(sc.env), [_runner._python(), AGENT_NAME, PLAN_NAME], layers
        )
        inside: dict[str, dict[str, Any]] = {}
        for line in out.splitlines():
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                inside[str(record.get("id"))] = record
        time.sleep(0.15)  # a byte at a sink, a survivor: let the host's side show it
        for step in sc.steps:
            if step.action.needed:
                continue
            if w.judge(step, layout, inside.get(step.action.id, {})):
                outcome = ev.outcome(step.action.id)
                why = step.action.description or step.action.target
                if outcome.through:
                    routes = ", ".join(r.value for r in outcome.through_routes)
                    how = "no active layer stops it" + (f" (through {routes})" if routes else "")
                else:
                    how = f"the model says {outcome.stopper} stops it: a disagreement, report it"
                opened.append((step.action.id, f"{why}: {how}"))
            else:
                stopped.append(step.action.id)
        w.reset(sc, layout)
    return opened, stopped
