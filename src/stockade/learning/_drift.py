"""Drift: what later runs needed that a policy in use does not admit (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade.learning._suggest import suggest
from stockade.policy import Policy
from stockade.policy._network import EgressRules
from stockade.policy._rulematch import RuleSet

__all__ = ["not_admitted"]


def _covered(path: str, roots: Iterable[Path]) -> bool:
    return any(path == str(r) or path.startswith(str(r).rstrip("/") + "/") for r in roots)


def not_admitted(
    policy: Policy,
    observations: Sequence[Mapping[str, Any]],
    summaries: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """One line per needed observation ``policy`` refuses (the host, the request, the
    file), naming the run it came from; [] when the policy admits all of them."""
    # as the policy will be enforced: a grace period in force would admit every name
    rules = EgressRules.from_policy(policy.network, grace=False)
    requests = RuleSet(policy.network.rules)
    out: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for obs in observations:
        if obs.get("kind") not in ("connect", "request") or obs.get("verdict") != "allow":
            continue
        host, port = str(obs.get("host")), int(obs.get("port", 0))
        key: tuple[Any, ...] = (host, port)
        if key not in seen:
            seen.add(key)
            decision = rules.check_name(host, port)
            if not decision.allowed:
                out.append(f"run {obs.get('run')}: host {host}:{port} is not allowed")
                continue
        if obs.get("kind") == "request":
            method, path = str(obs.get("method")), str(obs.get("path"))
            key = (host, port, method, path)
            if key not in seen:
                seen.add(key)
                if not requests.decide(host, port, method, path).allowed:
                    out.append(
                        f"run {obs.get('run')}: request {method} {path} to {host}:{port} "
                        "matches no allow rule"
                    )
    fs = policy.filesystem
    suggestion = suggest(observations, summaries)
    for section, roots in (("read", (*fs.read, *fs.write)), ("write", fs.write)):
        for line in suggestion.section(section):
            if not _covered(line.value, roots):
                out.append(f"{section} {line.value} is not granted ({line.needs[0]})")
    return out
