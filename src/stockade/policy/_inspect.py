"""What the inspect layer looks at (pure): which policies inspect, which hosts, which methods.

One answer for the proxy (:class:`~stockade.egress.inspect.Inspector`), the proxy
assembly (``build_proxy``), the gateway, the model and ``stockade explain``.
"""

from __future__ import annotations

from collections.abc import Iterable

from stockade.policy._hosts import HostPattern, parse_pattern
from stockade.policy._model import Policy

__all__ = [
    "ECHO_METHODS",
    "REFUSED_METHODS",
    "InspectScope",
    "echo_refusal",
    "inspected",
    "wants_inspection",
]

#: refused on every path that carries HTTP (inspected TLS, plain forward, captured port
#: 80, the gateway): TRACE/TRACK make the next hop echo the request back, with any
#: header added on the way (an injected credential, the upstream proxy's
#: Proxy-Authorization)
ECHO_METHODS: frozenset[str] = frozenset({"TRACE", "TRACK"})

#: refused inside an inspected tunnel: the echo methods, and CONNECT, which would open
#: a tunnel in the tunnel that nothing examines
REFUSED_METHODS: frozenset[str] = ECHO_METHODS | {"CONNECT"}


def echo_refusal(method: str, header_names: Iterable[bytes]) -> str | None:
    """Why a request must not be forwarded on any path because the next hop could answer
    it with the request itself, or None.

    TRACE/TRACK (in any letter case: the hop decides how it reads them) echo the request
    back with whatever was added on the way; ``Max-Forwards`` asks a proxy on the way
    (an operator's upstream, which sees stockade's Proxy-Authorization) to answer in
    place of the origin (RFC 9110 §7.6.2).
    """
    if method.upper() in ECHO_METHODS:
        return f"{method[:16]} is never forwarded: the next hop would echo the request back"
    if any(n.lower() == b"max-forwards" for n in header_names):
        return "Max-Forwards is never forwarded: a proxy on the way would answer the request"
    return None


def wants_inspection(policy: Policy) -> bool:
    """True when the inspect layer has anything to do for ``policy`` (rules, bound
    secrets or labels, with the layer on)."""
    return policy.layers.inspect and bool(
        policy.network.rules or policy.secrets or policy.labels.configured
    )


class InspectScope:
    """Which ``host:port`` the proxy intercepts rather than relays, compiled once.

    A host is inspected when a request rule names it, a secret is bound to it, or
    labels are configured (then every host is: labelled data may go anywhere). Hosts
    are normalised (:func:`~stockade.policy._hosts.normalize_host`).
    """

    def __init__(
        self,
        rule_hosts: tuple[HostPattern, ...] = (),
        secret_hosts: tuple[HostPattern, ...] = (),
        labels: bool = False,
    ) -> None:
        self.rule_hosts = rule_hosts
        self.secret_hosts = secret_hosts
        self.labels = labels

    @classmethod
    def from_policy(cls, policy: Policy) -> InspectScope:
        """The scope of ``policy``'s rules, secrets and labels (whether its inspect layer
        is on is the caller's question: :func:`inspected` asks it)."""
        return cls(
            tuple(parse_pattern(r.host) for r in policy.network.rules),
            tuple(parse_pattern(h) for s in policy.secrets for h in s.hosts),
            policy.labels.configured,
        )

    def ruled(self, host: str, port: int) -> bool:
        """True when a request rule names ``host:port``."""
        return any(p.matches(host, port) for p in self.rule_hosts)

    def bound(self, host: str, port: int) -> bool:
        """True when a secret is bound to ``host:port``."""
        return any(p.matches(host, port) for p in self.secret_hosts)

    def inspected(self, host: str, port: int) -> bool:
        """True when a TLS tunnel to ``host:port`` is intercepted."""
        return self.labels or self.ruled(host, port) or self.bound(host, port)


def inspected(policy: Policy, host: str, port: int) -> bool:
    """True when the proxy intercepts TLS to normalised ``host:port`` under ``policy``."""
    return policy.layers.inspect and InspectScope.from_policy(policy).inspected(host, port)
