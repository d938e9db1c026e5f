"""The ``inspect`` layer's request rules, as the model reads them from the policy.

Host patterns and path globs come from :mod:`stockade.policy._rulematch`, the module the
enforcement (:mod:`stockade.egress.inspect._rules`) uses too; the order is the same
(first match in file order wins; a host some rule names refuses a request no rule
matches). tests/model checks the two agree on a table of cases.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.policy import Reason, RequestRule
from stockade.policy._rulematch import HostMatch
from stockade.policy._rulematch import compile_glob as compile_glob

#: A rule's or bound secret's host pattern: the very class the enforcement uses.
RuleHost = HostMatch


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
