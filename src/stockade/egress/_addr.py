"""This host's own addresses, and classification with them.

The classes and the metadata table are pure and live in L0
(:mod:`stockade.policy._addresses`, shared with the model); this module adds the one
fact that needs the host: its interfaces' addresses, read from /proc.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from pathlib import Path

from stockade.policy._addresses import METADATA_ADDRESSES as METADATA_ADDRESSES
from stockade.policy._addresses import AddressClass as AddressClass
from stockade.policy._addresses import ClusterRanges as ClusterRanges
from stockade.policy._addresses import IPAddress as IPAddress
from stockade.policy._addresses import classify as _classify

# The names of policy._addresses above are re-exported for the egress layer's users.
__all__ = ["classify", "local_addresses"]

_local_lock = threading.Lock()
_local_cache: frozenset[IPAddress] | None = None


def _parse_fib_trie(text: str) -> set[IPAddress]:
    # /proc/net/fib_trie prints each local address on a "|-- A.B.C.D" line followed by
    # "/32 host LOCAL": that lists secondary addresses too, which SIOCGIFADDR would miss.
    found: set[IPAddress] = set()
    previous = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("/32 host LOCAL") and previous.startswith("|-- "):
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv4Address(previous[4:].strip()))
        previous = stripped
    return found


def _parse_if_inet6(text: str) -> set[IPAddress]:
    found: set[IPAddress] = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv6Address(int(fields[0], 16)))
    return found


def local_addresses(refresh: bool = False) -> frozenset[IPAddress]:
    """The addresses of this host's interfaces, read once from /proc (no network traffic)."""
    global _local_cache
    with _local_lock:
        if _local_cache is None or refresh:
            found: set[IPAddress] = set()
            for path, parse in (
                ("/proc/net/fib_trie", _parse_fib_trie),
                ("/proc/net/if_inet6", _parse_if_inet6),
            ):
                try:
                    found |= parse(Path(path).read_text())
                except OSError:
                    # No IPv6 or a restricted /proc: the other classes still apply.
                    continue
            _local_cache = frozenset(found)
        return _local_cache


def classify(
    address: IPAddress,
    local: frozenset[IPAddress] | None = None,
    cluster: ClusterRanges | None = None,
) -> AddressClass:
    """Classify one address; ``local`` defaults to :func:`local_addresses`; ``cluster``
    (a gateway's) is checked before everything but metadata, loopback included."""
    return _classify(address, local_addresses() if local is None else local, cluster)
