"""The egress layer: the proxy that is the sandbox's only way out.

* :class:`EgressRules` — the allow/deny lists, ``hosts`` pins and TLS ports, parsed once;
* :class:`EgressProxy` — HTTP forward proxy, CONNECT and SOCKS5 on one listener;
* :func:`classify` — what kind of address an IP is (public, loopback, metadata, …);
* :func:`listener_in_netns` — a listening socket created inside the sandbox's network
  namespace and handed back to the proxy;
* :func:`proxy_environment` — the variables that point clients at the proxy.

The names are loaded on first use: the proxy brings asyncio, ssl and h11 (~100 ms), which
a run whose command never opens a socket does not need (``stockade.runtime._egress``
imports the proxy only when a listener of the sandbox becomes readable).
"""

from __future__ import annotations

from stockade._lazy import load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.egress._addr import (
        METADATA_ADDRESSES as METADATA_ADDRESSES,
    )
    from stockade.egress._addr import (
        AddressClass as AddressClass,
    )
    from stockade.egress._addr import (
        classify as classify,
    )
    from stockade.egress._addr import (
        local_addresses as local_addresses,
    )
    from stockade.egress._env import proxy_environment as proxy_environment
    from stockade.egress._netns import listener_in_netns as listener_in_netns
    from stockade.egress._proxy import AuditCallback as AuditCallback
    from stockade.egress._proxy import EgressProxy as EgressProxy
    from stockade.egress._proxy import Resolver as Resolver
    from stockade.egress._proxy import bind_listener as bind_listener
    from stockade.egress._rules import LAYER as LAYER
    from stockade.egress._rules import AddressVerdict as AddressVerdict
    from stockade.egress._rules import EgressRules as EgressRules

__all__ = [
    "LAYER",
    "METADATA_ADDRESSES",
    "AddressClass",
    "AddressVerdict",
    "AuditCallback",
    "EgressProxy",
    "EgressRules",
    "Resolver",
    "bind_listener",
    "classify",
    "listener_in_netns",
    "local_addresses",
    "proxy_environment",
]

_LAZY = {
    "METADATA_ADDRESSES": "stockade.egress._addr",
    "AddressClass": "stockade.egress._addr",
    "classify": "stockade.egress._addr",
    "local_addresses": "stockade.egress._addr",
    "proxy_environment": "stockade.egress._env",
    "listener_in_netns": "stockade.egress._netns",
    "AuditCallback": "stockade.egress._proxy",
    "EgressProxy": "stockade.egress._proxy",
    "Resolver": "stockade.egress._proxy",
    "bind_listener": "stockade.egress._proxy",
    "LAYER": "stockade.egress._rules",
    "AddressVerdict": "stockade.egress._rules",
    "EgressRules": "stockade.egress._rules",
}


def __getattr__(name: str) -> Any:
    return load(__name__, _LAZY, name, globals())
