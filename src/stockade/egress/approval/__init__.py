"""Asking about hosts not on the allow-list, and changing a running sandbox's network
policy live: grants, generations, asks and answers (DESIGN §3: no terminal I/O here).
"""

from stockade.egress.approval._broker import ApprovalBroker, Asker, RuleSet, RunGate
from stockade.egress.approval._types import (
    AccessRequest,
    Answer,
    AnswerLike,
    Approver,
    Grant,
    Scope,
    Unanswerable,
)

__all__ = [
    "AccessRequest",
    "Answer",
    "AnswerLike",
    "ApprovalBroker",
    "Approver",
    "Asker",
    "Grant",
    "RuleSet",
    "RunGate",
    "Scope",
    "Unanswerable",
]
