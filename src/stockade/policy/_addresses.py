"""Address classes (pure): is this a public address, or something a sandbox must not reach?

The proxy resolves an allowed name, classifies every address, and dials only an address
that is public or that the policy names explicitly. The model (``stockade explain``, the
probe) classifies with this very table, so a metadata endpoint the proxy refuses is never
predicted to get through. IPv6 forms that carry an IPv4 address
(mapped, compatible, NAT64, 6to4, Teredo) are judged by the IPv4 address they carry, so
``[::ffff:169.254.169.254]`` is metadata, not "some IPv6 address".
"""

from __future__ import annotations

import enum
import ipaddress

__all__ = [
    "LINK_LOCAL_RANGES",
    "METADATA_ADDRESSES",
    "NON_PUBLIC_RANGES",
    "AddressClass",
    "ClusterRanges",
    "IPAddress",
    "classify",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressClass(enum.StrEnum):
    """What kind of address a connection would go to; only PUBLIC is reachable by default."""

    PUBLIC = "public"
    LOOPBACK = "loopback"
    UNSPECIFIED = "unspecified"
    LINK_LOCAL = "link-local"
    PRIVATE = "private"
    CGNAT = "cgnat"
    MULTICAST = "multicast"
    BROADCAST = "broadcast"
    RESERVED = "reserved"
    METADATA = "metadata"
    DOCUMENTATION = "documentation"
    SELF = "self"
    #: the gateway's own cluster: API server, pod and service ranges, nodes, link-local
    CLUSTER = "cluster"


#: Cloud instance-metadata and similar endpoints; refused even inside an allowed range.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, Hetzner, IBM
        "169.254.169.253",  # AWS VPC DNS resolver
        "169.254.169.123",  # AWS time sync
        "169.254.170.2",  # AWS ECS task credentials
        "169.254.170.23",  # AWS EKS pod identity agent
        "169.254.0.23",  # Tencent Cloud
        "169.254.42.42",  # Scaleway
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
        "192.0.0.192",  # Oracle Cloud (legacy)
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS EKS pod identity over IPv6
        "fd20:ce::254",  # GCP metadata over IPv6
    )
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_N = ipaddress.ip_network
_CGNAT = _N("100.64.0.0/10")
_PRIVATE = (_N("10.0.0.0/8"), _N("172.16.0.0/12"), _N("192.168.0.0/16"), _N("fc00::/7"))
_DOCUMENTATION = (
    _N("192.0.2.0/24"),
    _N("198.51.100.0/24"),
    _N("203.0.113.0/24"),
    _N("2001:db8::/32"),
    _N("3fff::/20"),
)
_NAT64 = (_N("64:ff9b::/96"), _N("64:ff9b:1::/48"))
_LINK_LOCAL = (_N("169.254.0.0/16"), _N("fe80::/10"))
_THIS_NETWORK = _N("0.0.0.0/8")

#: the ranges never needed for the public internet: private (RFC 1918, IPv6 ULA), CGNAT
#: and link-local (the metadata endpoints' range); export writes them as NetworkPolicy
#: exceptions and the gateway refuses link-local whatever its flags say
NON_PUBLIC_RANGES: tuple[IPNetwork, ...] = tuple(
    sorted((*_PRIVATE, _CGNAT, *_LINK_LOCAL), key=lambda n: (n.version, n.network_address))
)
LINK_LOCAL_RANGES: tuple[IPNetwork, ...] = _LINK_LOCAL


class ClusterRanges:
    """The addresses of the cluster a gateway runs in: refused like metadata endpoints.

    A gateway shares its network with what it protects, so a NetworkPolicy cannot tell
    its own API traffic from a sandbox's: the API server, the pod and service ranges,
    the nodes and link-local are refused unless an allow entry names them by address.
    ``networks`` are fixed (``--cluster-cidrs``); :meth:`add` records addresses learnt
    while running (node addresses seen in pods' ``status.hostIP``).
    """

    def __init__(
        self, networks: tuple[IPNetwork, ...] = (), addresses: frozenset[IPAddress] = frozenset()
    ) -> None:
        self.networks = tuple(networks)
        self._addresses: set[IPAddress] = set(addresses)

    def add(self, address: IPAddress) -> bool:
        """Refuse ``address`` from now on; True when it is new."""
        if address in self._addresses:
            return False
        self._addresses.add(address)
        return True

    def __contains__(self, address: object) -> bool:
        if address in self._addresses:
            return True
        return any(
            address in n
            for n in self.networks
            if isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address)
            and n.version == address.version
        )

    def __repr__(self) -> str:
        return f"ClusterRanges({[str(n) for n in self.networks]}, {len(self._addresses)} addresses)"


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    packed = int(address)
    if packed >> 32 == 0 and packed > 1:
        # IPv4-compatible ::a.b.c.d (deprecated, still routed by some stacks).
        return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    for network in _NAT64:
        if address in network:
            return ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def classify(
    address: IPAddress,
    local: frozenset[IPAddress] = frozenset(),
    cluster: ClusterRanges | None = None,
) -> AddressClass:
    """Classify one address. ``local`` is this host's own addresses (``self``; the egress
    layer reads them from /proc, see :func:`stockade.egress._addr.local_addresses`);
    ``cluster`` (a gateway's) is checked before everything but metadata, loopback
    included."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            address = ipaddress.IPv6Address(address.compressed.split("%")[0])
        if address.is_unspecified:
            return AddressClass.UNSPECIFIED
        if address.is_loopback:
            return AddressClass.LOOPBACK
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return classify(embedded, local, cluster)
    if address in METADATA_ADDRESSES:
        return AddressClass.METADATA
    if cluster is not None and address in cluster:
        return AddressClass.CLUSTER
    if isinstance(address, ipaddress.IPv4Address):
        if address == ipaddress.IPv4Address(0):
            return AddressClass.UNSPECIFIED
        if address.is_loopback:
            return AddressClass.LOOPBACK
    if address in local:
        return AddressClass.SELF
    if any(address in n for n in _LINK_LOCAL if n.version == address.version):
        return AddressClass.LINK_LOCAL
    if address.is_multicast:
        return AddressClass.MULTICAST
    if isinstance(address, ipaddress.IPv4Address):
        if address == ipaddress.IPv4Address("255.255.255.255"):
            return AddressClass.BROADCAST
        if address in _THIS_NETWORK:
            return AddressClass.RESERVED
        if address in _CGNAT:
            return AddressClass.CGNAT
    if any(address in n for n in _PRIVATE if n.version == address.version):
        return AddressClass.PRIVATE
    if any(address in n for n in _DOCUMENTATION if n.version == address.version):
        return AddressClass.DOCUMENTATION
    if not address.is_global:
        # Benchmarking, IETF protocol assignments, 240/4, discard-only, ORCHID, site-local.
        return AddressClass.RESERVED
    return AddressClass.PUBLIC
