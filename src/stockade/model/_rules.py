"""The ``inspect`` layer's request rules, as the model reads them from the policy.

The enforcement's matcher lives in :mod:`stockade.egress.inspect._rules`, which the model
may not import (``model`` imports only ``stockade.policy``). This module mirrors it: the
same host patterns, the same globs, the same order (first match in file order wins; a
host some rule names refuses a request no rule matches). tests/model checks the two agree
on a table of cases, so they cannot drift apart unnoticed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.policy import Reason, RequestRule


@dataclass(frozen=True, slots=True)
class RuleHost:
    """A rule's or bound secret's host pattern: ``name``, ``*.suffix``, IP, with ``:port``."""

    host: str
    suffix: bool
    port: int | None

    @classmethod
    def parse(cls, text: str) -> RuleHost:
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
    """A path glob as a regular expression on the whole path.

    ``*`` stays within one segment, ``**`` spans segments, ``/**`` also matches nothing.
    """
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


@dataclass(frozen=True, slots=True)
class _Rule:
    action: str
    host: RuleHost
    methods: frozenset[str]
    paths: tuple[re.Pattern[str], ...]


class Rules:
    """The ``network.rules`` of a policy, compiled once, judged as the proxy judges them."""

    def __init__(self, rules: Sequence[RequestRule]) -> None:
        self._rules = tuple(
            _Rule(
                r.action,
                RuleHost.parse(r.host),
                frozenset(m.upper() for m in r.methods),
                tuple(compile_glob(g) for g in r.paths),
            )
            for r in rules
        )

    def ruled(self, host: str, port: int) -> bool:
        """True when some rule names ``host:port`` (then an unmatched request is refused)."""
        return any(r.host.matches(host, port) for r in self._rules)

    def decide(self, host: str, port: int, method: str, path: str) -> Reason | None:
        """Why the rules refuse ``method path`` on ``host:port``, or None when they let it on.

        ``report`` lets the request on (it only logs what a ``deny`` would refuse).
        """
        ruled = False
        for r in self._rules:
            if not r.host.matches(host, port):
                continue
            ruled = True
            if r.methods and method not in r.methods:
                continue
            if not any(p.fullmatch(path) for p in r.paths):
                continue
            return Reason.RULE_DENIED if r.action == "deny" else None
        return Reason.NO_RULE_MATCHED if ruled else None
