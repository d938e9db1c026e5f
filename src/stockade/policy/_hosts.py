"""Host names and host patterns: one canonical spelling, decided once.

Every egress decision is taken on the string that :func:`normalize_host` returns, so two
spellings of one destination (``127.1`` and ``2130706433``, ``Example.TEST.`` and
``example.test``, a full-width ``１２７.０.０.１``) can never be judged differently.

Pure: standard library and ``idna`` only, no I/O, no asyncio (the policy loader imports it).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Sequence

from stockade._record import record
from stockade.policy._decision import Reason
from stockade.policy._text import printable, toml_string

__all__ = ["HostPattern", "PatternKind", "ip_literal", "normalize_host", "parse_pattern"]

_MAX_NAME = 253
_MAX_LABEL = 63
# Letters, digits, hyphen and underscore: hyphen not first or last. Underscores occur in
# real service names (``_acme-challenge``, some CDN hosts) and are harmless to a resolver.
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_DECIMAL = re.compile(r"[0-9]+\Z")
_OCTAL = re.compile(r"0[0-7]*\Z")
_HEX = re.compile(r"0x[0-9a-f]*\Z")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)\Z")


def _refuse_characters(raw: str) -> None:
    for ch in raw:
        code = ord(ch)
        if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
            raise ValueError(f"control character U+{code:04X} in host name")
        if ch.isspace():
            raise ValueError("white space in host name")
    if "%" in raw:
        # Zone ids (fe80::1%eth0) name an interface of this machine, and percent-escapes
        # are a second spelling of the name; neither has a place in an egress target.
        raise ValueError("'%' (zone id or percent-escape) in host name")


def _parse_ipv4_part(part: str) -> int:
    # WHATWG URL rules, which curl, browsers and inet_aton follow: 0x.. hex, 0.. octal.
    if _HEX.match(part):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        if not _OCTAL.match(part):
            raise ValueError(f"{part!r} is not a valid octal IPv4 component")
        return int(part, 8)
    if _DECIMAL.match(part):
        return int(part, 10)
    raise ValueError(f"{part!r} is not a number")


def _parse_ipv4(name: str) -> ipaddress.IPv4Address:
    parts = name.split(".")
    if len(parts) > 4 or any(p == "" for p in parts):
        raise ValueError("not a valid IPv4 address")
    values = [_parse_ipv4_part(p) for p in parts]
    for value in values[:-1]:
        if value > 255:
            raise ValueError("IPv4 component out of range")
    last_bits = 8 * (5 - len(values))
    if values[-1] >= 1 << last_bits:
        raise ValueError("IPv4 address out of range")
    number = values[-1]
    for index, value in enumerate(values[:-1]):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _parse_ipv6(text: str) -> ipaddress.IPv6Address:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError(f"[{text}] is not a valid IPv6 address") from None
    if address.scope_id is not None:
        raise ValueError("zone ids are not allowed in addresses")
    return address


def _ascii_name(name: str) -> str:
    """Validate and canonicalise an ASCII, lower-case name with no trailing dot."""
    if not name:
        raise ValueError("empty host name")
    labels = name.split(".")
    if _NUMERIC_LABEL.match(labels[-1]):
        # A numeric last label makes the whole name an IPv4 address (WHATWG): it either
        # parses as one or is refused, never resolved as a name.
        return str(_parse_ipv4(name))
    if len(name) > _MAX_NAME:
        raise ValueError(f"host name longer than {_MAX_NAME} characters")
    out = []
    for label in labels:
        if not label:
            raise ValueError("empty label in host name")
        if len(label) > _MAX_LABEL:
            raise ValueError(f"label longer than {_MAX_LABEL} characters")
        if not _LABEL.match(label):
            raise ValueError(
                f"label {toml_string(label[:20])} has characters not allowed in a host name"
                if len(labels) > 1
                # one label: it is the whole name, which the caller shows already
                else "has characters not allowed in a host name"
            )
        if label.startswith("xn--"):
            # An A-label must be the canonical encoding of a valid U-label, else two
            # spellings could reach one name.
            import idna  # only for these labels and non-ASCII names: ~10 ms to import

            try:
                ulabel = idna.decode(label)
                canonical = idna.encode(ulabel).decode("ascii")
            except (idna.IDNAError, UnicodeError):
                raise ValueError(f"label {toml_string(label[:20])} is not valid punycode") from None
            if canonical != label:
                raise ValueError(
                    f"label {toml_string(label[:20])} is not in canonical punycode form"
                )
        out.append(label)
    return ".".join(out)


def _to_ascii(name: str) -> str:
    import idna  # only for non-ASCII names (and xn-- labels): ~10 ms to import

    try:
        mapped = idna.uts46_remap(name, std3_rules=True, transitional=False)
    except (idna.IDNAError, UnicodeError, IndexError):
        raise ValueError("host name is not valid under IDNA") from None
    if mapped.endswith("."):
        mapped = mapped[:-1]
    labels = mapped.split(".")
    out = []
    for label in labels:
        if not label:
            raise ValueError("empty label in host name")
        if label.isascii():
            out.append(label.lower())
            continue
        try:
            out.append(idna.alabel(label).decode("ascii"))
        except (idna.IDNAError, UnicodeError):
            raise ValueError("host name is not valid under IDNA") from None
    return ".".join(out)


def normalize_host(raw: str) -> str:
    """Return the one canonical spelling of a host name or IP address.

    Lower case, one trailing dot removed, IDNA (UTS 46) to A-labels, brackets removed from
    IPv6 addresses, every numeric IPv4 spelling (``2130706433``, ``0x7f.1``, ``0177.0.0.1``)
    as a dotted quad and IPv6 in compressed form. Raises :class:`ValueError` with a short
    reason for anything that is not a host name or an IP address.
    """
    if not isinstance(raw, str):
        raise ValueError("host name is not text")
    if not raw:
        raise ValueError("empty host name")
    if len(raw) > 4 * _MAX_NAME:
        raise ValueError(f"host name longer than {_MAX_NAME} characters")
    _refuse_characters(raw)
    if raw.startswith("["):
        if not raw.endswith("]"):
            raise ValueError("unbalanced '[' in host")
        return _parse_ipv6(raw[1:-1]).compressed
    if ":" in raw:
        return _parse_ipv6(raw).compressed
    name = raw if raw.isascii() else _to_ascii(raw)
    # UTS 46 maps full-width and other look-alike characters to ASCII: check again.
    _refuse_characters(name)
    if ":" in name or "[" in name:
        raise ValueError("host name maps to characters not allowed in a host name")
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    return _ascii_name(name)


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address when a normalised ``host`` is an IP literal, else None."""
    if not host or not (host[0].isdigit() or ":" in host):
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def sni_disagreement(names: Sequence[str], host: str) -> tuple[Reason, str] | None:
    """Why the server names of a TLS ClientHello do not hold the client to ``host``.

    ``host`` is the normalised name the tunnel was allowed for; ``names`` are the
    ClientHello's server names as sent. None when they agree. Both TLS paths ask this one
    function (the opaque tunnel on the ClientHello it peeked at, the inspect layer on the
    name its handshake saw), so one ClientHello gets one verdict and one reason, whichever
    path it takes.
    """
    if not names:
        if ip_literal(host) is not None:
            # Clients send no SNI to an IP literal (RFC 6066); the address itself was vetted.
            return None
        return Reason.SNI_MISSING, "ClientHello has no server name"
    if len(names) > 1:
        return Reason.SNI_MISMATCH, "ClientHello names two servers"
    try:
        sni = normalize_host(names[0])
    except ValueError as exc:
        return Reason.SNI_MISMATCH, f"unreadable server name: {exc}"
    if sni != host:
        return Reason.SNI_MISMATCH, f"SNI {printable(sni)} is not {host}"
    return None


class PatternKind(enum.Enum):
    """What a host pattern names."""

    EXACT = "exact"  #: one host name
    SUFFIX = "suffix"  #: every subdomain of a name (never the name itself)
    ADDRESS = "address"  #: one IP address
    NETWORK = "network"  #: an IP range (CIDR)


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@record
class HostPattern:
    """One parsed policy entry; ``text`` is the entry as written (used as the rule name)."""

    text: str
    kind: PatternKind
    host: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        """True when the normalised ``host`` on ``port`` falls under this pattern."""
        if self.port is not None and port != self.port:
            return False
        if self.kind is PatternKind.EXACT or self.kind is PatternKind.ADDRESS:
            return host == self.host
        if self.kind is PatternKind.SUFFIX:
            return host.endswith("." + self.host)
        address = ip_literal(host)
        return address is not None and self.covers_address(address, port)

    def covers_address(
        self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
    ) -> bool:
        """True when this is an IP or CIDR entry that names ``address`` (on ``port``)."""
        if self.port is not None and port != self.port:
            return False
        if self.kind is PatternKind.ADDRESS:
            return str(address) == self.host
        if self.kind is PatternKind.NETWORK and self.network is not None:
            return address.version == self.network.version and address in self.network
        return False

    @property
    def single_address(self) -> bool:
        """True when the entry names exactly one address (an IP, a /32 or a /128)."""
        if self.kind is PatternKind.ADDRESS:
            return True
        return (
            self.kind is PatternKind.NETWORK
            and self.network is not None
            and self.network.num_addresses == 1
        )


def _split_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unbalanced '['; write an IPv6 address as [2001:db8::1]:443")
        rest = text[end + 1 :]
        if not rest:
            return text[: end + 1], None
        if not rest.startswith(":"):
            raise ValueError("text after ']' must be ':PORT'")
        return text[: end + 1], _port(rest[1:])
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, _port(port)
    return text, None


def _port(text: str) -> int:
    if not _DECIMAL.match(text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {toml_string(text)} is not a number from 1 to 65535")
    return int(text)


def parse_pattern(text: str) -> HostPattern:
    """Parse one allow/deny entry: ``host``, ``*.suffix``, an IP, a CIDR, each with ``:port``.

    Raises :class:`ValueError` whose message starts with the entry, quoted once as TOML
    writes it (``"x.test:0": port "0" is not ...``), then says what is wrong and the fix;
    a caller shows the message as it is, without quoting the entry again.
    """
    if not isinstance(text, str):
        raise ValueError('expected a string such as "example.com"')
    try:
        return _parse_pattern(text)
    except ValueError as exc:
        raise ValueError(f"{toml_string(text)}: {exc}") from None


def _parse_pattern(text: str) -> HostPattern:
    if not text:
        raise ValueError("empty entry; write a host name such as example.com")
    if text != text.strip():
        raise ValueError("remove the surrounding white space")
    if text in ("*", "*:*") or text.startswith("*:"):
        raise ValueError("a bare wildcard allows every host; list the hosts")
    if "://" in text:
        raise ValueError("write a host name, not a URL (drop the scheme)")
    host_part, port = _split_port(text)
    if "/" in host_part:
        return _parse_network(text, host_part, port)
    if "*" in host_part:
        if not host_part.startswith("*.") or "*" in host_part[2:]:
            raise ValueError(
                "only a leading '*.' wildcard is supported; write '*.example.com' or list the hosts"
            )
        suffix = normalize_host(host_part[2:])
        if ip_literal(suffix) is not None:
            raise ValueError("a wildcard cannot extend an IP address; list it")
        if "." not in suffix:
            raise ValueError(
                "a wildcard over a top-level domain allows too much; "
                f"name the domain, e.g. '*.example.{suffix}'"
            )
        return HostPattern(text, PatternKind.SUFFIX, host=suffix, port=port)
    host = normalize_host(host_part)
    address = ip_literal(host)
    if address is not None:
        return HostPattern(text, PatternKind.ADDRESS, host=host, port=port)
    return HostPattern(text, PatternKind.EXACT, host=host, port=port)


def _parse_network(text: str, host_part: str, port: int | None) -> HostPattern:
    inner = host_part[1:-1] if host_part.startswith("[") else host_part
    try:
        network = ipaddress.ip_network(inner, strict=True)
    except ValueError as exc:
        if "has host bits set" in str(exc):
            fixed = ipaddress.ip_network(inner, strict=False)
            raise ValueError(f"host bits are set; write {fixed}") from None
        raise ValueError("not a CIDR range; write e.g. 10.0.0.0/8") from None
    if network.prefixlen == 0:
        raise ValueError("a range over every address allows every host; list them")
    return HostPattern(text, PatternKind.NETWORK, host=str(network), network=network, port=port)
