"""The operator's upstream proxy, as text: its URL and its ``no_proxy`` entries.

Pure parsing shared by the policy loader (which validates ``[network.upstream]`` and
``--upstream-proxy``) and :mod:`stockade.egress.upstream` (which reads the same spellings
from ``HTTPS_PROXY``/``NO_PROXY`` at start). Every error message is safe to print: a URL
that carries credentials is never echoed with them.
"""

from __future__ import annotations

import ipaddress
import re

from stockade._record import record
from stockade.policy._hosts import ip_literal, normalize_host, parse_pattern
from stockade.policy._text import toml_string

__all__ = ["NoProxy", "parse_no_proxy", "parse_proxy_url", "redact_url"]

#: the values ``network.upstream.connect_by`` takes
CONNECT_BY = ("address", "name")
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)
_DECIMAL = re.compile(r"[0-9]+\Z")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def redact_url(text: str) -> str:
    """``text`` with any ``user:password@`` replaced by ``***@`` (for messages and logs)."""
    return _USERINFO.sub(r"\1***@", text)


def parse_proxy_url(text: str) -> tuple[str, int]:
    """The normalised host and the port of an ``http://host:port`` proxy URL.

    Raises :class:`ValueError` saying what is wrong and how to fix it; the message never
    repeats credentials found in the URL.
    """
    scheme, sep, rest = text.strip().partition("://")
    if not sep:
        raise ValueError('write the URL with its scheme and port, e.g. "http://proxy.corp:8080"')
    scheme = scheme.lower()
    if scheme == "https":
        raise ValueError(
            "stockade speaks plain http:// to the upstream proxy (TLS to the destination "
            'goes inside its CONNECT tunnels); write "http://host:port"'
        )
    if scheme != "http":
        raise ValueError(
            f"{scheme}:// proxies are not supported; give the HTTP proxy, "
            'e.g. "http://proxy.corp:8080"'
        )
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        raise ValueError(
            "credentials in the proxy URL are refused (they would show in process lists, "
            "logs and the audit); put user:password in a file named by "
            "network.upstream.auth_file"
        )
    if (slash and path) or "?" in authority or "#" in authority:
        raise ValueError('a proxy URL has no path or query; write "http://host:port"')
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError("unbalanced '['; write an IPv6 proxy as http://[2001:db8::1]:3128")
        host, after = authority[1:end], authority[end + 1 :]
        if not after.startswith(":"):
            raise ValueError("name the port: http://[ADDRESS]:PORT")
        port_text = after[1:]
    else:
        host, colon, port_text = authority.rpartition(":")
        if not colon:
            raise ValueError(f'name the port: "http://{authority}:PORT"')
    if not _DECIMAL.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {toml_string(port_text)} is not a number from 1 to 65535")
    if not host:
        raise ValueError('no host; write "http://host:port"')
    try:
        host = normalize_host(host)
    except ValueError as exc:
        raise ValueError(f"the proxy host: {exc}") from None
    return host, int(port_text)


@record
class NoProxy:
    """One ``no_proxy`` entry: destinations it sends direct instead of to the upstream.

    ``name`` matches that host; with ``subdomains`` also every name under it (and only
    those when ``exact`` is False); ``network`` matches vetted addresses inside it.
    """

    text: str
    name: str = ""
    exact: bool = True
    subdomains: bool = False
    network: IPNetwork | None = None
    port: int | None = None
    #: ``*`` in ``NO_PROXY``: everything goes direct
    everything: bool = False

    def matches(
        self, host: str, port: int, address: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> bool:
        """True when ``host:port``, vetted to ``address``, goes direct."""
        if self.port is not None and port != self.port:
            return False
        if self.everything:
            return True
        if self.network is not None:
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                address = address.ipv4_mapped
            return address.version == self.network.version and address in self.network
        if self.exact and host == self.name:
            return True
        return self.subdomains and host.endswith("." + self.name)


def parse_no_proxy(text: str, *, convention: bool = False) -> NoProxy:
    """Parse one entry of ``network.upstream.no_proxy`` (the ``network.allow`` syntax), or
    with ``convention`` one of ``NO_PROXY`` (``.corp.example``, ``corp.example`` for the
    domain and its subdomains, ``*``, CIDRs, each with an optional ``:port``).

    Raises :class:`ValueError` with the fix.
    """
    if not convention:
        pattern = parse_pattern(text)
        kind = pattern.kind.value
        if kind == "exact":
            return NoProxy(text, name=pattern.host, port=pattern.port)
        if kind == "suffix":
            return NoProxy(text, name=pattern.host, exact=False, subdomains=True, port=pattern.port)
        if kind == "address":
            literal = ip_literal(pattern.host)
            assert literal is not None
            network = ipaddress.ip_network(literal)
            return NoProxy(text, network=network, port=pattern.port)
        return NoProxy(text, network=pattern.network, port=pattern.port)
    entry = text.strip()
    if entry == "*":
        return NoProxy(text, everything=True)
    host_part, port = entry, None
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ValueError(f"{toml_string(text)}: unbalanced '['")
        host_part, rest = entry[1:end], entry[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{toml_string(text)}: text after ']' must be ':PORT'")
            port = _port(rest[1:], text)
    elif entry.count(":") == 1:
        host_part, port_text = entry.split(":")
        port = _port(port_text, text)
    if "/" in host_part:
        try:
            network = ipaddress.ip_network(host_part, strict=False)
        except ValueError:
            raise ValueError(
                f"{toml_string(text)}: not a CIDR range; write e.g. 10.0.0.0/8"
            ) from None
        return NoProxy(text, network=network, port=port)
    host_part = host_part.removeprefix("*").removeprefix(".")
    try:
        name = normalize_host(host_part)
    except ValueError as exc:
        raise ValueError(f"{toml_string(text)}: {exc}") from None
    literal = ip_literal(name)
    if literal is not None:
        return NoProxy(text, network=ipaddress.ip_network(literal), port=port)
    # curl, Go and Python's urllib all read "corp.example" and ".corp.example" as the
    # domain and every name under it.
    return NoProxy(text, name=name, subdomains=True, port=port)


def _port(text: str, entry: str) -> int:
    if not _DECIMAL.match(text) or not 1 <= int(text) <= 65535:
        raise ValueError(
            f"{toml_string(entry)}: port {toml_string(text)} is not a number from 1 to 65535"
        )
    return int(text)
