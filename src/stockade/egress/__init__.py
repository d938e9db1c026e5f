"""The egress layer: the proxy that is the sandbox's only way out.

* :class:`EgressRules` — the allow/deny lists, ``hosts`` pins and TLS ports, parsed once;
* :class:`EgressProxy` — HTTP forward proxy, CONNECT and SOCKS5 on one listener;
* :func:`classify` — what kind of address an IP is (public, loopback, metadata, …);
* :func:`listener_in_netns` — a listening socket created inside the sandbox's network
  namespace and handed back to the proxy;
* :func:`proxy_environment` — the variables that point clients at the proxy.
"""

from __future__ import annotations

from stockade.egress._addr import METADATA_ADDRESSES, AddressClass, classify, local_addresses
from stockade.egress._env import proxy_environment
from stockade.egress._netns import listener_in_netns
from stockade.egress._proxy import AuditCallback, EgressProxy, Resolver, bind_listener
from stockade.egress._rules import LAYER, AddressVerdict, EgressRules

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
