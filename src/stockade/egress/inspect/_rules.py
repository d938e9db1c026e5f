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

import re
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.policy import Decision, Reason, RequestRule, Verdict
from stockade.policy._rulematch import HostMatch as HostMatch
from stockade.policy._rulematch import compile_glob as compile_glob

LAYER = "inspect"


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
