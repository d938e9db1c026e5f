"""Policy → proxy: the one assembly ``stockade run``, ``stockade proxy`` and the gateway use.

:func:`build_proxy` wires what the policy asks for (inspection with its rules, secrets
and labels, the operator's upstream proxy, approval, transparent capture, a gateway's
cluster ranges) and refuses, before anything listens, what its caller cannot serve: a
policy that inspects requests given no interception CA. A policy is never served with
part of it silently ignored (DESIGN §7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade._exceptions import PolicyError
from stockade.audit._sink import AuditCallback, AuditSink, FailClosed
from stockade.egress._addr import ClusterRanges
from stockade.egress._proxy import EgressProxy, Resolver
from stockade.egress._rules import EgressRules
from stockade.egress.upstream import Transport, resolve_upstream
from stockade.policy import Policy
from stockade.policy._inspect import wants_inspection

__all__ = ["build_proxy", "inspect_keys"]


def inspect_keys(policy: Policy) -> list[str]:
    """The policy keys that need the inspect layer (for an error that names them)."""
    keys = []
    if policy.network.rules:
        keys.append("network.rules")
    keys += [f"secrets.{s.name}" for s in policy.secrets]
    if policy.labels.configured:
        keys.append("labels")
    return keys


def build_proxy(
    policy: Policy,
    sink: AuditSink | AuditCallback,
    *,
    caller: str,
    ca_fix: str,
    rules: EgressRules | None = None,
    extra_allow: Sequence[str] = (),
    ca: Any = None,
    secrets: Any = None,
    environ: Mapping[str, str] | None = None,
    caller_trust: Sequence[Path] = (),
    transport: Transport | None = None,
    inspect_sink: AuditSink | AuditCallback | None = None,
    cluster: ClusterRanges | None = None,
    resolver: Resolver | None = None,
    handshake_timeout: float = 10.0,
    pool: Any = None,
    gate: Any = None,
) -> EgressProxy:
    """The egress proxy for ``policy``, writing its events to ``sink``.

    Args:
        sink: where events go: an :class:`~stockade.audit._sink.AuditSink` (an
            :class:`~stockade.audit.AuditLog`) or a ``(decision, fields)`` callback; a
            write that fails closes the proxy (:class:`~stockade.audit._sink.FailClosed`).
        caller: who serves the proxy, as the error names it (``stockade proxy``).
        ca_fix: how that caller is given an interception CA (``pass --ca DIR``).
        rules: the allow-list (built from ``policy.network`` plus ``extra_allow`` and
            ``cluster`` when omitted).
        ca: the interception CA; required when the policy inspects requests.
        secrets: the resolved :class:`~stockade.egress.inspect.SecretStore` whose
            placeholders the clients were given (resolved from ``environ`` if omitted).
        transport: how vetted destinations are opened; by default through the policy's
            ``[network.upstream]`` (a bad setting raises :class:`PolicyError` here).
        inspect_sink: where the inspect layer writes (``sink`` when omitted).

    Raises:
        PolicyError: the policy inspects requests and ``ca`` is None (exit 125, naming
            the keys and ``ca_fix``), or its upstream setting is invalid.
    """
    if rules is None:
        rules = EgressRules.from_policy(policy.network, extra_allow, cluster=cluster)
    if transport is None:
        transport = Transport(resolve_upstream(policy.network.upstream))
    inspect = None
    if wants_inspection(policy):
        if ca is None:
            raise PolicyError(
                f"{caller}: {', '.join(inspect_keys(policy))} need the inspect layer, which "
                f"needs an interception CA; {ca_fix}, or remove them (or set "
                "layers.inspect = false to relay those hosts unexamined)"
            )
        from stockade.egress.inspect import InspectLayer

        inspect = InspectLayer.from_policy(
            policy,
            ca,
            sink if inspect_sink is None else inspect_sink,
            secrets=secrets,
            environ=environ,
            caller_trust=caller_trust,
            transport=transport,
        )
    proxy = EgressProxy(
        rules,
        sink,
        resolver=resolver,
        handshake_timeout=handshake_timeout,
        inspect=inspect,
        pool=pool,
        gate=gate,
        transport=transport,
    )
    if inspect is not None and inspect.audit is not None:
        # One rule for both writers: an inspect event that cannot be written closes the
        # proxy, as the proxy's own do.
        inspect.audit = FailClosed(inspect.audit, proxy.close, "inspect")
    return proxy
