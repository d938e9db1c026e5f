"""Proxy environment variables for every common client inside the sandbox.

These are the fast path, never the enforcement: the sandbox's empty network namespace
is. Clients that ignore them reach allowed hosts through stockade's resolver and
transparent capture (``network.transparent``), or, with that off, cannot connect at all.
Nothing set here may make a common client fail at start.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["proxy_environment"]


def proxy_environment(url: str) -> dict[str, str]:
    """The environment that points clients at the proxy listening at ``url``.

    ``url`` is ``http://HOST:PORT`` with a loopback IP host (the address the listener has
    inside the sandbox). ``ALL_PROXY`` is the HTTP proxy too: a ``socks5h://`` URL there
    makes clients without a SOCKS extra refuse to start (httpx raises "Using SOCKS proxy,
    but the 'socksio' package is not installed", and the OpenAI and Anthropic SDKs are
    built on it); SOCKS5 is still served on the same listener for clients told to use it.
    ``NO_PROXY`` is set empty so no host bypasses the proxy.
    Git gets ``http.proxy`` through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_0``/
    ``GIT_CONFIG_VALUE_0``; a caller adding its own git settings must renumber them.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r}: the proxy URL must be http://HOST:PORT")
    if parts.username or parts.password or parts.path not in ("", "/"):
        raise ValueError(f"{url!r}: the proxy URL takes no user, password or path")
    try:
        address = ipaddress.ip_address(parts.hostname)
    except ValueError:
        raise ValueError(f"{url!r}: the proxy host must be an IP address") from None
    host = f"[{address}]" if address.version == 6 else str(address)
    port = str(parts.port)
    http_url = f"http://{host}:{port}"
    java_host = str(address)
    java = " ".join(
        (
            f"-Dhttp.proxyHost={java_host}",
            f"-Dhttp.proxyPort={port}",
            f"-Dhttps.proxyHost={java_host}",
            f"-Dhttps.proxyPort={port}",
            f"-DsocksProxyHost={java_host}",
            f"-DsocksProxyPort={port}",
            # Java's default exempts localhost and 127.*; nothing may bypass the proxy.
            "-Dhttp.nonProxyHosts=",
            "-Djava.net.useSystemProxies=false",
        )
    )
    env = {
        "HTTP_PROXY": http_url,
        "HTTPS_PROXY": http_url,
        "ALL_PROXY": http_url,
        "http_proxy": http_url,
        "https_proxy": http_url,
        "all_proxy": http_url,
        "NO_PROXY": "",
        "no_proxy": "",
        # Node 24+ reads the variables above only with this set.
        "NODE_USE_ENV_PROXY": "1",
        "GLOBAL_AGENT_HTTP_PROXY": http_url,
        "GLOBAL_AGENT_HTTPS_PROXY": http_url,
        "GLOBAL_AGENT_NO_PROXY": "",
        "npm_config_proxy": http_url,
        "npm_config_https_proxy": http_url,
        "npm_config_noproxy": "",
        "YARN_HTTP_PROXY": http_url,
        "YARN_HTTPS_PROXY": http_url,
        "PIP_PROXY": http_url,
        "CARGO_HTTP_PROXY": http_url,
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.proxy",
        "GIT_CONFIG_VALUE_0": http_url,
        "JAVA_TOOL_OPTIONS": java,
        "GRADLE_OPTS": java,
    }
    return env
