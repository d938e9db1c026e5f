"""The egress allow-list as decisions, with this host's own addresses.

The decisions are pure and live in L0 (:mod:`stockade.policy._network`, where the order
is documented); this subclass adds the one fact of the host they need: its own
addresses (``self``), read from /proc when not given.
"""

from __future__ import annotations

from stockade.egress._addr import local_addresses
from stockade.policy._network import LAYER as LAYER
from stockade.policy._network import AddressVerdict as AddressVerdict
from stockade.policy._network import EgressRules as _PolicyRules
from stockade.policy._network import parse_address as parse_address

__all__ = ["LAYER", "AddressVerdict", "EgressRules", "parse_address"]


class EgressRules(_PolicyRules):
    """:class:`stockade.policy._network.EgressRules` whose ``local`` defaults to the
    addresses of this host's interfaces (:func:`~stockade.egress._addr.local_addresses`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local is None:
            object.__setattr__(self, "local", local_addresses())
