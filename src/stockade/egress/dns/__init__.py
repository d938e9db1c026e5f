"""stockade's resolver inside the sandbox: the wire codec, the synthetic-address pool and
the server that answers from the policy (see :mod:`stockade.egress.dns._server`)."""

from __future__ import annotations

from stockade.egress.dns._pool import POOL, AddressPool
from stockade.egress.dns._server import DnsServer

__all__ = ["POOL", "AddressPool", "DnsServer"]
