"""The egress allow-list as decisions (pure): name first (before any DNS), then each address.

Pure and in L0 so that the proxy, the resolver, the gateway and the model
(``stockade explain``, the probe) take every egress decision with this one object.
``local`` (this host's own addresses) is a fact of the host: the egress layer's
subclass (:class:`stockade.egress.EgressRules`) reads it from /proc; here it is what
the caller passes (nothing by default).

Order, on the one normalised spelling of the host:

1. a ``deny`` entry matching the name  → deny (``host-denied``); deny always wins;
2. no ``allow`` entry matching         → deny (``host-not-allowed``), with no DNS lookup;
3. addresses: the ``hosts`` pin, the IP literal itself, or one ``getaddrinfo``;
4. each address: a ``deny`` IP/CIDR entry → deny; public → allow; otherwise allowed only
   when an ``allow`` IP/CIDR entry or the name's ``hosts`` pin names that very address.

The gateway's cluster addresses (:class:`~stockade.policy._addresses.ClusterRanges`: API
server, pod and service ranges, nodes, link-local) follow the same strict rule: only an
allow entry naming the address or a range within those opens one, never a ``hosts`` pin.

Metadata endpoints (see :data:`METADATA_ADDRESSES`) are stricter: only an allow entry naming
that single address (``169.254.169.254``, or a ``/32``) opens one. A wider range such as
``169.254.0.0/16`` and a ``hosts`` pin never do, so no wildcard, range or name can reach
instance credentials by accident; writing the address itself is taken as meaning it.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stockade._exceptions import PolicyError
from stockade.policy._addresses import (
    AddressClass,
    ClusterRanges,
    IPAddress,
    classify,
)
from stockade.policy._decision import Decision, Reason, Verdict
from stockade.policy._hosts import HostPattern, ip_literal, normalize_host, parse_pattern
from stockade.policy._text import shown

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Self

__all__ = ["LAYER", "AddressVerdict", "EgressRules", "grace_in_force", "parse_address"]

#: The layer name on every egress decision.
LAYER = "egress"

_CLASS_REASON = {
    AddressClass.METADATA: Reason.ADDRESS_METADATA,
    AddressClass.SELF: Reason.ADDRESS_SELF,
    AddressClass.CLUSTER: Reason.ADDRESS_CLUSTER,
}


@dataclass(frozen=True, slots=True)
class AddressVerdict:
    """The decision on one resolved address, with its class."""

    decision: Decision
    address: IPAddress
    address_class: AddressClass


def _patterns(field_name: str, entries: Iterable[str]) -> tuple[HostPattern, ...]:
    out = []
    for index, entry in enumerate(entries):
        try:
            out.append(parse_pattern(entry))
        except ValueError as exc:
            raise PolicyError(f"{field_name}[{index}]: {exc}") from None
    return tuple(out)


@dataclass(frozen=True)
class EgressRules:
    """The network section of a policy, parsed once; decides names and addresses.

    ``allow``/``deny`` are pattern strings (see :func:`~stockade.policy._hosts.parse_pattern`),
    ``hosts`` maps a name to the IP literal it must resolve to (no DNS for it), and
    ``tls_ports`` lists the ports where a tunnel must carry TLS with a matching SNI.
    ``extra_allow`` adds entries (the CLI's ``--allow-host``). Invalid entries raise
    :class:`~stockade._exceptions.PolicyError` naming the entry and the fix.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    hosts: Mapping[str, str] = field(default_factory=dict)
    tls_ports: tuple[int, ...] = (443,)
    extra_allow: tuple[str, ...] = ()
    local: frozenset[IPAddress] | None = None
    #: the gateway's cluster addresses (None outside a gateway)
    cluster: ClusterRanges | None = None
    #: a learning run: a name no ``deny`` entry matches is allowed (rule ``learning``)
    #: and resolves; each of its addresses is still decided by :meth:`check_address`, so
    #: metadata, private and this host's addresses stay refused as without learning
    learning: bool = False
    #: a grace period in force (its last day, ISO; "" when none or over): a name no
    #: allow entry admits gets ``report`` (reason ``host-not-allowed``, rule ``grace``)
    #: instead of ``deny``; deny entries and every address check stay as they are
    grace: str = ""
    _allow: tuple[HostPattern, ...] = field(init=False, repr=False)
    _deny: tuple[HostPattern, ...] = field(init=False, repr=False)
    _pins: dict[str, IPAddress] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "allow", tuple(self.allow))
        set_(self, "deny", tuple(self.deny))
        set_(self, "tls_ports", tuple(self.tls_ports))
        set_(self, "extra_allow", tuple(self.extra_allow))
        allow = _patterns("network.allow", self.allow) + _patterns("--allow-host", self.extra_allow)
        set_(self, "_allow", allow)
        set_(self, "_deny", _patterns("network.deny", self.deny))
        pins: dict[str, IPAddress] = {}
        for name, value in dict(self.hosts).items():
            try:
                key = normalize_host(name)
            except ValueError as exc:
                raise PolicyError(f"network.hosts: {shown(name)}: {exc}") from None
            address = ip_literal(_strip_brackets(value))
            if address is None:
                raise PolicyError(
                    f"network.hosts.{name}: {shown(value)}: not an IP address; "
                    "pin a name to an address such as 192.0.2.10"
                )
            pins[key] = address
        set_(self, "_pins", pins)
        for port in self.tls_ports:
            if not isinstance(port, int) or not 1 <= port <= 65535:
                raise PolicyError(f"network.tls_ports: {shown(port)}: not a port from 1 to 65535")

    @classmethod
    def from_policy(
        cls,
        network: object,
        extra_allow: Iterable[str] = (),
        *,
        local: frozenset[IPAddress] | None = None,
        cluster: ClusterRanges | None = None,
        today: datetime.date | None = None,
        grace: bool = True,
    ) -> Self:
        """Build from any object with ``allow``, ``deny``, ``hosts`` and ``tls_ports``.

        Its ``grace_until`` is in force when ``grace`` and ``today`` (default: today,
        UTC) is not past it (:func:`grace_in_force`); ``grace=False`` decides as the
        policy will once the period is over (``policy diff``, ``policy verify``)."""
        return cls(
            allow=tuple(getattr(network, "allow", ())),
            deny=tuple(getattr(network, "deny", ())),
            hosts=dict(getattr(network, "hosts", {})),
            tls_ports=tuple(getattr(network, "tls_ports", (443,))),
            extra_allow=tuple(extra_allow),
            local=local,
            cluster=cluster,
            learning=bool(getattr(network, "learning", False)),
            grace=grace_in_force(network, today) if grace else "",
        )

    def pin(self, host: str) -> IPAddress | None:
        """The pinned address of a normalised name, if any."""
        return self._pins.get(host)

    def is_tls_port(self, port: int) -> bool:
        """True when a tunnel to ``port`` must carry TLS with a matching SNI."""
        return port in self.tls_ports

    def check_name(self, host: str, port: int) -> Decision:
        """Decide a normalised host and port before anything is resolved."""
        for pattern in self._deny:
            if pattern.matches(host, port):
                return Decision.deny(LAYER, Reason.HOST_DENIED, rule=pattern.text)
        for pattern in self._allow:
            if pattern.matches(host, port):
                return Decision.allow(LAYER, rule=pattern.text)
        if self.learning:
            return Decision.allow(LAYER, rule="learning")
        if self.grace:
            return self._grace_report()
        return Decision.deny(LAYER, Reason.HOST_NOT_ALLOWED)

    def check_lookup(self, host: str) -> Decision:
        """Whether stockade's resolver answers normalised ``host`` with an address.

        A ``deny`` entry for the name on every port denies it; an ``allow`` entry that
        names it on some port, or a ``hosts`` pin, lets it resolve. Each connection is
        still decided on its own by :meth:`check_name` (a port-bound deny included).
        """
        for pattern in self._deny:
            if pattern.port is None and pattern.matches(host, 0):
                return Decision.deny(LAYER, Reason.HOST_DENIED, rule=pattern.text)
        for pattern in self._allow:
            if pattern.matches(host, pattern.port or 0):
                return Decision.allow(LAYER, rule=pattern.text)
        if host in self._pins:
            return Decision.allow(LAYER, rule=f"hosts.{host}")
        if self.learning:
            return Decision.allow(LAYER, rule="learning")
        if self.grace:
            return self._grace_report()
        return Decision.deny(LAYER, Reason.HOST_NOT_ALLOWED)

    def _grace_report(self) -> Decision:
        return Decision(
            Verdict.REPORT,
            LAYER,
            Reason.HOST_NOT_ALLOWED,
            rule="grace",
            detail=f"let through in the grace period (until {self.grace}): not in network.allow",
        )

    def capture_ports(self) -> tuple[int, ...]:
        """The ports transparent capture listens on: 80, 443, the TLS ports and every port
        an ``allow`` entry names, in ascending order."""
        ports = {80, 443, *self.tls_ports}
        ports.update(p.port for p in self._allow if p.port is not None)
        return tuple(sorted(ports))

    def check_address(self, host: str, port: int, address: IPAddress) -> AddressVerdict:
        """Decide one address that ``host`` resolved to (or is)."""
        address_class = classify(address, self.local or frozenset(), self.cluster)
        for pattern in self._deny:
            if pattern.covers_address(address, port):
                decision = Decision.deny(LAYER, Reason.HOST_DENIED, rule=pattern.text)
                return AddressVerdict(decision, address, address_class)
        if address_class is AddressClass.PUBLIC:
            return AddressVerdict(Decision.allow(LAYER), address, address_class)
        if address_class is AddressClass.CLUSTER:
            # Only an allow entry written as an address or range opens one: a name
            # pinned there (or resolving there) never does.
            for pattern in self._allow:
                if pattern.covers_address(address, port):
                    return AddressVerdict(
                        Decision.allow(LAYER, rule=pattern.text), address, address_class
                    )
        elif address_class is AddressClass.METADATA:
            for pattern in self._allow:
                if pattern.single_address and pattern.covers_address(address, port):
                    return AddressVerdict(
                        Decision.allow(LAYER, rule=pattern.text), address, address_class
                    )
        else:
            if self._pins.get(host) == address:
                return AddressVerdict(
                    Decision.allow(LAYER, rule=f"hosts.{host}"), address, address_class
                )
            for pattern in self._allow:
                if pattern.covers_address(address, port):
                    return AddressVerdict(
                        Decision.allow(LAYER, rule=pattern.text), address, address_class
                    )
        reason = _CLASS_REASON.get(address_class, Reason.ADDRESS_NOT_PUBLIC)
        decision = Decision.deny(LAYER, reason, detail=f"{address} is {address_class}")
        return AddressVerdict(decision, address, address_class)


def grace_in_force(network: object, today: datetime.date | None = None) -> str:
    """The last day (ISO) of ``network``'s grace period when ``today`` (default: today,
    UTC) is not past it, else "" (no period, or it is over: the policy is enforced)."""
    until = getattr(network, "grace_until", None)
    if until is None:
        return ""
    day = today if today is not None else datetime.datetime.now(datetime.UTC).date()
    return until.isoformat() if day <= until else ""


def _strip_brackets(value: str) -> str:
    if value.startswith("[") and value.endswith("]"):
        return value[1:-1]
    return value


def parse_address(value: str) -> IPAddress:
    """Parse an IP literal from a resolver answer (zone ids dropped)."""
    return ipaddress.ip_address(value.split("%", 1)[0])
