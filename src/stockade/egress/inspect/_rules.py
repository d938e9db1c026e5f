"""Request rules for inspected hosts (pure).

Matching order: **first match in file order wins**, as in a firewall. A rule matches when
its host pattern names the host, its method list is empty or names the method, and one
of its path globs matches the normalised path. Then its action decides:

* ``allow`` — the request goes on (to the credential and label checks);
* ``deny`` — refused with ``rule-denied``;
* ``report`` — the request goes on, and its event has verdict ``report`` with
  ``rule-denied``: what this rule would refuse once switched to ``deny``.

A host that at least one rule names is *ruled*: a request to it that matches no rule is
refused (``no-rule-matched``), so listing what is allowed is enough to deny the rest.
First-match lets an operator put a narrow ``deny`` (``POST /v1/files``) before a broad
``allow`` (``/**``) and read the file top to bottom; "most specific first" would need a
specificity order between globs that nobody can predict.

Path globs: ``*`` matches within one segment (no ``/``), ``**`` any number of segments
(``/v1/**`` matches ``/v1``, ``/v1/`` and ``/v1/a/b``); everything else is literal and
compared with the normalised path (see :mod:`._http`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.policy import Decision, Reason, RequestRule, Verdict

LAYER = "inspect"


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: RequestRule
    host: HostMatch
    methods: frozenset[str]
    paths: tuple[re.Pattern[str], ...]

    def matches(self, method: str, path: str) -> bool:
        if self.methods and method not in self.methods:
            return False
        return any(p.fullmatch(path) for p in self.paths)


class RuleSet:
    """The ``network.rules`` of a policy, compiled once."""

    def __init__(self, rules: Sequence[RequestRule]) -> None:
        self._rules = tuple(
            _Compiled(
                r,
                HostMatch.parse(r.host),
                frozenset(m.upper() for m in r.methods),
                tuple(compile_glob(g) for g in r.paths),
            )
            for r in rules
        )

    def __bool__(self) -> bool:
        return bool(self._rules)

    def ruled(self, host: str, port: int) -> bool:
        """True when some rule names ``host`` (then unmatched requests are refused)."""
        return any(c.host.matches(host, port) for c in self._rules)

    def decide(self, host: str, port: int, method: str, path: str) -> Decision:
        """The rules' decision for one request (``path`` already normalised)."""
        ruled = False
        for c in self._rules:
            if not c.host.matches(host, port):
                continue
            ruled = True
            if not c.matches(method, path):
                continue
            name = c.rule.name
            if c.rule.action == "deny":
                return Decision.deny(LAYER, Reason.RULE_DENIED, name, f"{method} {path}")
            if c.rule.action == "report":
                return Decision(Verdict.REPORT, LAYER, Reason.RULE_DENIED, name, "report only")
            return Decision.allow(LAYER, name)
        if ruled:
            return Decision.deny(LAYER, Reason.NO_RULE_MATCHED, "", f"{method} {path}")
        return Decision.allow(LAYER)
