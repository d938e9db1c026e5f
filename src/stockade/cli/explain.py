"""``stockade explain``: what a policy still lets through, read from the policy alone.

Static: nothing is run. For each allowed destination it lists the effects that remain
(download; upload, i.e. which methods an inspected host still accepts; a bound
credential), flags destinations that accept writes as exfiltration channels, lists the
policy's deliberate exceptions with a risk note each, and gives the residual the model
predicts for the extended scenario's attacks (and the overlay scenario's writes into the
workspace) under this policy. The container's runtime
is the policy's ``[container] backend`` (or ``--backend``); for each attack where the
runtime makes a difference (a system call the host kernel would parse, Landlock's part,
a user namespace) it says which layers stop it under each runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``stockade explain``."""
    parser.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: the search order)"
    )
    parser.add_argument(
        "--workspace", type=Path, default=None, help="workspace (default: the policy's)"
    )
    parser.add_argument(
        "--backend",
        choices=("bubblewrap", "gvisor", "landlock"),
        default=None,
        help="judge under this container runtime instead of the policy's [container] backend",
    )
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON")


def _broad_note(entry: str) -> str | None:
    # The policy loader's own tables (policy._tables): one list of risky hosts.
    from stockade.policy._tables import BROAD_HOSTS, risky_host

    host = entry.lower().split(":")[0]
    for pattern, note in BROAD_HOSTS:
        bare = pattern.removeprefix("*.")
        if host in (pattern, bare) or host.endswith("." + bare):
            return f"broad destination: {note}"
    what = risky_host(entry)
    if what is not None and "DNS-over-HTTPS" in what:
        return "DNS-over-HTTPS endpoint: any name can be resolved (and data leaked in names)"
    if what is not None:
        return f"paste, webhook or tunnel service ({what}): made for receiving data from anywhere"
    if host.startswith("*."):
        return "wildcard: every subdomain, including ones created later by someone else"
    return None


def analyse(policy: Any, backend: str | None = None) -> dict[str, Any]:
    """The analysis of a loaded :class:`~stockade.policy.Policy` as plain data, under the
    container runtime ``backend`` (default: the policy's)."""
    from stockade.model import Action, Boundary, Kind, evaluate
    from stockade.policy import LAYERS, Policy
    from stockade.policy._hosts import normalize_host, parse_pattern
    from stockade.policy._model import BACKENDS
    from stockade.probe import scenarios

    assert isinstance(policy, Policy)
    boundary = Boundary(policy, runtime=backend or "")
    layers = policy.layers
    writing = {"PUT", "POST", "PATCH", "DELETE"}
    destinations = []
    for entry in policy.network.allow:
        host = entry.split(":")[0].removeprefix("*.")
        with contextlib.suppress(ValueError):
            host = normalize_host(host)  # the spelling the proxy decides on
        rules = [r for r in policy.network.rules if parse_pattern(r.host).matches(host, 443)]
        letting = [r for r in rules if r.action != "deny"]
        methods = sorted({m for r in letting for m in r.methods}) if rules else ["any"]
        if any(not r.methods for r in letting):
            methods = ["any"]
        # A deny rule never lets a write on; allow and report rules do.
        writes = not rules or any(
            not r.methods or writing & {m.upper() for m in r.methods} for r in letting
        )
        inspected = layers.inspect and boundary.inspected(host, 443)
        effects = ["download"] + (["upload"] if writes else [])
        destinations.append(
            {
                "entry": entry,
                "effects": effects,
                "methods": methods,
                "inspected": inspected,
                "bound_credential": boundary.bound(host, 443),
                "exfiltration_channel": writes,
                "note": (
                    "accepts writes: anything the sandbox reads can leave through it"
                    if writes
                    else "read-only by request rules"
                ),
                "risk": _broad_note(entry),
            }
        )
    exceptions = []
    fs = policy.filesystem
    for path in fs.write:
        exceptions.append(
            {
                "kind": "writable path",
                "value": str(path),
                "risk": "written outside the workspace; anything there may run later on the host",
            }
        )
    for path in fs.read:
        exceptions.append(
            {
                "kind": "readable path",
                "value": str(path),
                "risk": "readable inside, so its contents can leave through any open channel",
            }
        )
    for path in (*fs.read, *fs.write):
        if path.suffix == ".sock" or "sock" in path.name:
            exceptions.append(
                {
                    "kind": "unix socket",
                    "value": str(path),
                    "risk": "a host service reachable from inside (docker.sock means root on the host)",
                }
            )
    for name, address in policy.network.hosts.items():
        exceptions.append(
            {
                "kind": "pinned host",
                "value": f"{name} = {address}",
                "risk": "explicitly allows that address, even loopback or private",
            }
        )
    from stockade.policy._network import grace_in_force

    grace = grace_in_force(policy.network)
    if grace:
        exceptions.append(
            {
                "kind": "grace period",
                "value": f"until {grace}",
                "risk": "a host or request this policy does not admit is let through and "
                "reported, not refused: anything the sandbox reads can leave to any public "
                "host the allow-list lacks until then (deny entries and address checks hold)",
            }
        )
    for entry in policy.network.allow:
        risk = _broad_note(entry)
        if risk:
            exceptions.append({"kind": "broad destination", "value": entry, "risk": risk})
    for layer in LAYERS:
        if not getattr(layers, layer):
            exceptions.append(
                {
                    "kind": "disabled layer",
                    "value": layer,
                    "risk": f"everything the {layer} layer stops is open",
                }
            )
    for e in policy.env.pass_:
        if e.allow_secret:
            exceptions.append(
                {
                    "kind": "secret passed",
                    "value": e.name,
                    "risk": "the real value is inside the sandbox and can be sent anywhere open",
                }
            )
    # The residual: the extended scenario's attacks, and the overlay scenario's writes
    # into the workspace (what a person commits later), re-aimed at this policy's workspace.
    layout = scenarios.Layout(Path("/nonexistent-probe-world"))
    sc = scenarios.build("extended", layout)
    seen = {a.id for a in sc.actions}
    ws_writes = [a for a in scenarios.build("overlay", layout).actions if a.id not in seen]
    residual_actions = [
        replace(
            a,
            target=a.target.replace(str(layout.workspace), str(fs.workspace)),
            resolved=a.resolved.replace(str(layout.workspace), str(fs.workspace)),
            # A resource attack is always just past this policy's own cap.
            amount=policy.limits.file_size + 1 if a.kind is Kind.RESOURCE else a.amount,
        )
        for a in (*sc.actions, *ws_writes)
    ]
    for entry in policy.network.allow:
        host = entry.split(":")[0].replace("*", "any")
        residual_actions.append(
            Action(
                f"upload-to:{entry}",
                Kind.NET_REQUEST,
                host,
                False,
                f"upload (POST) to the allowed {entry}",
                host=host,
                port=443,
                method="POST",
                path="/",
            )
        )
    if boundary.own_kernel and not layers.container:
        exceptions.append(
            {
                "kind": "gvisor without the container layer",
                "value": "container",
                "risk": "refused: stockade will not run gvisor without its container "
                "(nor fall back to the host kernel)",
            }
        )
    if fs.overlay and boundary.backend == "landlock":
        exceptions.append(
            {
                "kind": f"overlay workspace under {boundary.backend}",
                "value": "overlay",
                "risk": "refused: stockade runs an overlay workspace on bubblewrap and gvisor "
                "only (exit 125, never a read-write workspace instead)",
            }
        )
    ev = evaluate(boundary, residual_actions, layers.active())
    residual = [
        {"action": o.action.id, "description": o.action.description}
        for o in ev.outcomes
        if o.through and not o.action.needed
    ]
    # The same attacks under each runtime: the layers of this policy that each stop it on
    # every route. Where they differ, the runtime is part of what stops it (or of what
    # no longer does: Landlock's part under gvisor).
    by_backend = []
    for action in residual_actions:
        stoppers = {
            b: [
                layer
                for layer in layers.active()
                if boundary.with_backend(b).stops(layer, action) is not None
            ]
            for b in BACKENDS
        }
        if len({tuple(v) for v in stoppers.values()}) > 1:
            by_backend.append({"action": action.id, "description": action.description, **stoppers})
    return {
        "policy": list(policy.sources),
        "backend": boundary.backend,
        "layers": list(layers.active()),
        # overlay: the run's writes are reviewed before they reach the real workspace
        "workspace_mode": "overlay" if fs.overlay else "read-write",
        "destinations": destinations,
        "exceptions": exceptions,
        "residual": residual,
        "by_backend": by_backend,
    }


def execute(args: argparse.Namespace) -> int:
    """Print the analysis."""
    from stockade.policy import load_policy

    policy = load_policy(args.policy, workspace=args.workspace)
    data = analyse(policy, args.backend)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(
        f"policy: {', '.join(data['policy'])}; layers on: {', '.join(data['layers'])}; "
        f"container runtime: {data['backend']}; workspace: {data['workspace_mode']}"
    )
    print("\ndestinations:")
    if not data["destinations"]:
        print("  none: the sandbox has no network")
    for d in data["destinations"]:
        flag = "  EXFILTRATION CHANNEL" if d["exfiltration_channel"] else ""
        cred = ", bound credential" if d["bound_credential"] else ""
        print(
            f"  {d['entry']}: {' + '.join(d['effects'])} (methods: {', '.join(d['methods'])}{cred}){flag}"
        )
        print(f"      {d['note']}")
        if d["risk"]:
            print(f"      risk: {d['risk']}")
    print("\ndeliberate exceptions:")
    if not data["exceptions"]:
        print("  none")
    for e in data["exceptions"]:
        print(f"  {e['kind']}: {e['value']}\n      risk: {e['risk']}")
    print("\nresidual (the model, on the extended and overlay scenarios' attacks):")
    if not data["residual"]:
        print("  nothing gets through")
    for r in data["residual"]:
        print(f"  open: {r['action']}: {r['description']}")
    print("\nwhere the container runtime matters (the layers that each stop the attack):")
    if not data["by_backend"]:
        print("  nowhere, with these layers")
    for d in data["by_backend"]:
        print(f"  {d['action']}: {d['description']}")
        for b in ("bubblewrap", "gvisor", "landlock"):
            mark = "  <- this run" if b == data["backend"] else ""
            print(f"      {b:<10} {', '.join(d[b]) or 'nothing stops it'}{mark}")
    return 0
