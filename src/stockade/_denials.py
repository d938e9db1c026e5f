"""Denials and the policy, explained for a model.

No MCP import here: these are plain functions over audit events and a :class:`Policy`,
so that the CLI and the tests can use them without the ``mcp`` extra. Each denial
becomes ``{layer, reason, target, hint}``, where the hint is one line saying what the
model can do about it, which is usually to ask the user: a sandboxed agent must never be
able to widen its own policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stockade.policy import Policy

Event = dict[str, Any]

#: reason -> hint template; ``{target}`` is the request, path or name the denial is
#: about, ``{host}`` the bare host name of a network denial
_HINTS: dict[str, str] = {
    "host-not-allowed": "host {host} is not in network.allow; ask the user to add it",
    "host-denied": "host {host} is in network.deny; it cannot be reached from this sandbox",
    "port-not-allowed": "{target}: that port is not allowed; ask the user to allow {host}:PORT",
    "address-not-public": (
        "{host} resolves to a private or loopback address, which is refused; "
        "ask the user to pin it in network.hosts if that is intended"
    ),
    "address-metadata": "{host} is a cloud metadata address; it is never reachable",
    "address-self": "{host} is this host's own address; it is never reachable",
    "resolve-failed": "{host} did not resolve; check the spelling",
    "bad-hostname": "{host} is not a valid host name",
    "user-denied": (
        "the user refused {host}; do not retry it or route around the sandbox; ask the user"
    ),
    "approval-timeout": "nobody answered the request for {host}; ask the user before retrying",
    "approval-unavailable": (
        "{host} is not in network.allow and nobody could be asked; ask the user to add it "
        "(stockade approvals, or their policy)"
    ),
    "approval-error": "the approval of {host} failed; ask the user to add it to their policy",
    "approval-limit": "too many hosts are waiting for approval; ask the user, then retry",
    "host-revoked": "access to {host} was revoked while the connection was open; ask the user",
    "upstream-refused": (
        "the network's upstream proxy refused {target} (its status is in the event); "
        "this is the operator's proxy, not the policy: ask the user"
    ),
    "upstream-unreachable": (
        "the network's upstream proxy could not be reached for {target}; nothing was "
        "sent directly; ask the user to check the proxy (stockade doctor)"
    ),
    "unsupported-protocol": "only HTTP(S) through the proxy leaves the sandbox; use http(s)",
    "sni-mismatch": "the TLS name did not match the host connected to ({target})",
    "not-tls": "a tunnel to {target} on a TLS port must carry TLS",
    "rule-denied": "the request {target} is refused by a network rule; do not retry it",
    "no-rule-matched": (
        "the request {target} matches no network rule of its host; ask the user to add a rule"
    ),
    "foreign-credential": (
        "the request to {target} carried a credential the policy did not issue; use the "
        "placeholder the sandbox was given"
    ),
    "secret-wrong-host": "a secret was headed to {target}, which is not bound to it; refused",
    "labelled-data": "the request to {target} carried labelled data; uploads of it are refused",
    "credential-detected": (
        "the request to {target} carried a credential (its kind is in the event); "
        "credentials go only to the hosts they are bound to: ask the user"
    ),
    "credential-env": (
        "environment variable {target} looks like a credential and was withheld; if the "
        'command needs it, ask the user to add {{ name = "{target}", allow_secret = true }} '
        "to env.pass"
    ),
    "env-not-passed": (
        "environment variable {target} is not passed; ask the user to add it to env.pass"
    ),
    "path-not-granted": (
        "{target} is outside the workspace and filesystem.read/write; work inside the "
        "workspace or ask the user to grant the path"
    ),
    "path-denied": "{target} matches filesystem.deny; it is never readable",
    "path-protected": (
        "{target} is protected (hooks, agent and editor configuration stay read-only); "
        "do not modify it"
    ),
    "syscall-blocked": "a system call the sandbox forbids was refused ({target})",
    "limit-wall-time": "the command ran past its time limit ({target}) and was killed; "
    "split the work or ask for a larger timeout",
    "limit-memory": "the command hit the memory limit; use less memory",
    "limit-pids": "the command hit the process limit; start fewer processes",
    "limit-file-size": "a file hit the size limit; write smaller files",
    "limit-cpu": "the command hit the CPU time limit",
}


def denial_target(event: Event) -> str:
    """The host, request, path or name a denial is about, as one short string."""
    host = event.get("host")
    if host:
        port = event.get("port")
        where = f"{host}:{port}" if port else str(host)
        method, path = event.get("method"), event.get("path")
        return f"{method} {where}{path}" if method and path else where
    for key in ("path", "name", "syscall", "detail"):
        value = event.get(key)
        if value:
            return str(value)
    return ""


def grace_reports(events: Sequence[Event]) -> list[str]:
    """What a grace period let through in one run (the policy does not admit it): each
    host:port and request once, in order (the resolver's answers are left out: the
    connection to the name is listed)."""
    out: list[str] = []
    for event in events:
        if event.get("rule") != "grace" or event.get("verdict") != "report":
            continue
        if event.get("event") == "dns_query":
            continue
        target = denial_target(event)
        if target and target not in out:
            out.append(target)
    return out


def explain_denial(event: Event) -> dict[str, str]:
    """One denial as ``{layer, reason, target, hint}``."""
    layer = str(event.get("layer", ""))
    reason = str(event.get("reason", ""))
    target = denial_target(event)
    template = _HINTS.get(reason)
    if template is not None:
        host = str(event.get("host") or target or "the host")
        hint = template.format(target=target or "the target", host=host)
    else:
        hint = f"refused by the {layer} layer ({reason}); tell the user what was attempted"
    return {"layer": layer, "reason": reason, "target": target, "hint": hint}


def describe_policy(policy: Policy) -> dict[str, Any]:
    """What a sandboxed command may do under ``policy``, for a model to read."""
    fs, net, lim = policy.filesystem, policy.network, policy.limits
    active = list(policy.layers.active())
    off = [name for name in policy.to_dict()["layers"] if name not in active]
    hosts = ", ".join(net.allow) if net.allow else "none"
    return {
        "summary": (
            f"Commands run in a sandbox rooted at {fs.workspace} (read-write). "
            f"Network: {hosts}. Environment variables are filtered; credentials are withheld. "
            "The policy is set by the user; to widen it, ask the user."
        ),
        "workspace": str(fs.workspace),
        "readable": ["system directories (/usr, /etc, ...)", *(str(p) for p in fs.read)],
        "writable": [str(fs.workspace), *(str(p) for p in fs.write)],
        "never_readable": list(fs.deny),
        "read_only_in_workspace": [".git/hooks", ".git/config", *fs.protect],
        "network_allow": list(net.allow),
        "network_deny": list(net.deny),
        "env_passed": [e.name for e in policy.env.pass_],
        "limits": {
            "pids": lim.pids,
            "memory_bytes": lim.memory,
            "file_size_bytes": lim.file_size,
            "cpu_seconds": lim.cpu_seconds or None,
            "wall_seconds": lim.wall_seconds or None,
        },
        "layers_on": active,
        "layers_off": off,
        "sources": list(policy.sources),
    }
