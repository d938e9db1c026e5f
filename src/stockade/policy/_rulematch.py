"""Matching of request rules (pure): host patterns and path globs.

Shared by the inspect layer, which enforces ``[[network.rules]]``, and the model, which
predicts what they stop, so that both read a rule the same way.

Path globs: ``*`` matches within one segment (no ``/``), ``**`` any number of segments
(``/v1/**`` matches ``/v1``, ``/v1/`` and ``/v1/a/b``); everything else is literal.
"""

from __future__ import annotations

import ipaddress
import re

from stockade._record import record


@record
class HostMatch:
    """A host pattern as in ``network.allow``: ``name``, ``*.suffix``, IP, with ``:port``."""

    host: str
    suffix: bool
    port: int | None

    @classmethod
    def parse(cls, text: str) -> HostMatch:
        """Parse a pattern (lower-cased, trailing dot dropped, IDNA names as A-labels)."""
        text = text.strip().lower()
        port: int | None = None
        if text.startswith("["):
            end = text.index("]")
            host, rest = text[1:end], text[end + 1 :]
            if rest.startswith(":"):
                port = int(rest[1:])
        elif text.count(":") == 1:
            host, _, digits = text.partition(":")
            port = int(digits)
        else:
            host = text
        host = host.removesuffix(".")
        suffix = host.startswith("*.")
        if suffix:
            host = host[2:]
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            host = host.encode("idna").decode("ascii") if not host.isascii() else host
        return cls(host, suffix, port)

    def matches(self, host: str, port: int) -> bool:
        """True when normalised ``host`` on ``port`` falls under this pattern."""
        if self.port is not None and port != self.port:
            return False
        if self.suffix:
            return host.endswith("." + self.host)
        return host == self.host


def compile_glob(glob: str) -> re.Pattern[str]:
    """A path glob as a regular expression matched against the whole path."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("/**", i) and (i + 3 == len(glob) or glob[i + 3] == "/"):
            out.append("(?:/.*)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))
