"""Request rules (pure): compiled once, judged the same by the proxy and the model.

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

Host patterns are :class:`~stockade.policy._hosts.HostPattern`, parsed by
:func:`~stockade.policy._hosts.parse_pattern`: the allow-list's own parser, so a rule on
``straße.test`` names the very host (``xn--strae-oqa.test``) the allow-list admits.

Path globs: ``*`` matches within one segment (no ``/``), ``**`` any number of segments
(``/v1/**`` matches ``/v1``, ``/v1/`` and ``/v1/a/b``); everything else is literal and
compared with the normalised path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stockade._record import record
from stockade.policy._decision import Decision, Reason, Verdict
from stockade.policy._hosts import HostPattern, parse_pattern
from stockade.policy._model import RequestRule

__all__ = ["LAYER", "RuleSet", "compile_glob"]

#: The layer name on every request-rule decision.
LAYER = "inspect"


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


@record
class _Compiled:
    rule: RequestRule
    host: HostPattern
    methods: frozenset[str]
    paths: tuple[re.Pattern[str], ...]

    def matches(self, method: str, path: str) -> bool:
        if self.methods and method not in self.methods:
            return False
        return any(p.fullmatch(path) for p in self.paths)


class RuleSet:
    """The ``network.rules`` of a policy, compiled once.

    Hosts given to :meth:`ruled` and :meth:`decide` are normalised
    (:func:`~stockade.policy._hosts.normalize_host`), as every egress decision's are.
    """

    def __init__(self, rules: Sequence[RequestRule], *, grace: str = "") -> None:
        #: a grace period in force (its last day, ISO): a request to a ruled host that
        #: matches no rule is reported, not refused; a deny rule still refuses
        self.grace = grace
        self._rules = tuple(
            _Compiled(
                r,
                parse_pattern(r.host),
                frozenset(m.upper() for m in r.methods),
                tuple(compile_glob(g) for g in r.paths),
            )
            for r in rules
        )

    def __bool__(self) -> bool:
        return bool(self._rules)

    @property
    def hosts(self) -> tuple[HostPattern, ...]:
        """The rules' host patterns, in file order."""
        return tuple(c.host for c in self._rules)

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
        if ruled and self.grace:
            return Decision(
                Verdict.REPORT,
                LAYER,
                Reason.NO_RULE_MATCHED,
                "grace",
                f"{method} {path}: let through in the grace period (until {self.grace})",
            )
        if ruled:
            return Decision.deny(LAYER, Reason.NO_RULE_MATCHED, "", f"{method} {path}")
        return Decision.allow(LAYER)
