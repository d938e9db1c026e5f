"""The ``inspect`` layer's request rules, as the model reads them from the policy.

The model does not read the rules itself: it asks the enforcement's own
:class:`~stockade.policy._rulematch.RuleSet` (pure, in L0), so the order (first match in
file order wins; a host some rule names refuses a request no rule matches) and the host
patterns (:func:`~stockade.policy._hosts.parse_pattern`, IDNA 2008 as the allow-list)
cannot drift. tests/model checks the two agree on a table of cases.
"""

from __future__ import annotations

from collections.abc import Sequence

from stockade.policy import Reason, RequestRule
from stockade.policy._hosts import HostPattern
from stockade.policy._rulematch import RuleSet
from stockade.policy._rulematch import compile_glob as compile_glob

#: A rule's or bound secret's host pattern: the very class the enforcement uses.
RuleHost = HostPattern


class Rules:
    """The ``network.rules`` of a policy, compiled once, judged as the proxy judges them."""

    def __init__(self, rules: Sequence[RequestRule]) -> None:
        self._set = RuleSet(rules)

    def ruled(self, host: str, port: int) -> bool:
        """True when some rule names ``host:port`` (then an unmatched request is refused)."""
        return self._set.ruled(host, port)

    def decide(self, host: str, port: int, method: str, path: str) -> Reason | None:
        """Why the rules refuse ``method path`` on ``host:port``, or None when they let it on.

        ``report`` lets the request on (it only logs what a ``deny`` would refuse).
        """
        decision = self._set.decide(host, port, method, path)
        return None if decision.allowed else decision.reason
