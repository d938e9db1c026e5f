"""Synthetic addresses: one loopback address per allowed name, stable for a run.

The sandbox never learns a real address. stockade's resolver answers an allowed name with
an address from a loopback pool, and a connection to that address is captured inside the
sandbox's network namespace and mapped back to the name here. Addresses are never
recycled during a run: a reused address would change a name's meaning mid-run.
"""

from __future__ import annotations

import ipaddress

__all__ = ["POOL", "AddressPool"]

#: The default pool. Inside the sandbox's own network namespace every 127.0.0.0/8
#: address is local to loopback already, so nothing needs routing; the /16 gives 65534
#: names, far more than a run asks for.
POOL = ipaddress.IPv4Network("127.64.0.0/16")


class AddressPool:
    """Names to synthetic addresses and back, for one run.

    Not thread-safe: the resolver and the capture listeners run on one event loop.
    """

    __slots__ = ("_by_address", "_by_name", "_network", "_next")

    def __init__(self, network: ipaddress.IPv4Network = POOL) -> None:
        if network.num_addresses < 4:
            raise ValueError(f"{network}: a pool needs at least a /30")
        self._network = network
        self._by_name: dict[str, ipaddress.IPv4Address] = {}
        self._by_address: dict[ipaddress.IPv4Address, str] = {}
        # The network's first address is skipped: some clients treat x.x.0.0 as unusable.
        self._next = int(network.network_address) + 1

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The range addresses come from."""
        return self._network

    def __len__(self) -> int:
        return len(self._by_name)

    def issue(self, name: str) -> ipaddress.IPv4Address | None:
        """The address for normalised ``name``: the same one every time; None when full."""
        address = self._by_name.get(name)
        if address is not None:
            return address
        if self._next >= int(self._network.broadcast_address):
            return None
        address = ipaddress.IPv4Address(self._next)
        self._next += 1
        self._by_name[name] = address
        self._by_address[address] = name
        return address

    def name_of(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        """The name ``address`` was issued for (IPv4-mapped IPv6 spellings included)."""
        if isinstance(address, ipaddress.IPv6Address):
            mapped = address.ipv4_mapped
            if mapped is None:
                return None
            address = mapped
        return self._by_address.get(address)

    def covers(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        """True when ``address`` lies in the pool's range (issued or not)."""
        if isinstance(address, ipaddress.IPv6Address):
            mapped = address.ipv4_mapped
            if mapped is None:
                return False
            address = mapped
        return address in self._network
