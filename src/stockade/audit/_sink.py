"""Where egress decisions are written: one protocol, and one place that fails closed.

Every writer of decisions (the proxy, the inspect layer, stockade's resolver, the gateway)
writes to an :class:`AuditSink`: ``sink(event, decision, fields)``. An
:class:`~stockade.audit.AuditLog` is one, and so is :class:`FailClosed`. The proxy and
the inspect layer also take the callback shape ``callback(decision, fields)``
(``fields["event"]`` naming the event), which :func:`as_sink` adapts: a plain function
given to them is read as such a callback.

:class:`FailClosed` is the one place the rule "never run unaudited" lives: a write that
fails closes what it audits (the proxy), rather than letting it go on unrecorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from stockade.audit._log import AuditLog
from stockade.policy._decision import Decision

__all__ = ["AuditCallback", "AuditSink", "FailClosed", "as_sink"]

logger = logging.getLogger("stockade.audit")

#: The callback shape: every decision with its fields, ``event`` among them.
AuditCallback = Callable[[Decision, dict[str, Any]], None]


class AuditSink(Protocol):
    """Writes one decision as the event ``event`` with ``fields``."""

    def __call__(self, event: str, decision: Decision, fields: dict[str, Any], /) -> None:
        """Write it (raise when it cannot be written)."""
        ...


def as_sink(target: AuditSink | AuditCallback | AuditLog | None) -> AuditSink | None:
    """``target`` as an :class:`AuditSink`: an AuditLog or FailClosed as it is, any other
    callable as a ``(decision, fields)`` callback (None stays None: nothing is written)."""
    if target is None or isinstance(target, AuditLog | FailClosed):
        return target
    callback: Any = target

    def sink(event: str, decision: Decision, fields: dict[str, Any]) -> None:
        callback(decision, {"event": event, **fields})

    return sink


class FailClosed:
    """``sink``, but a write that fails calls ``on_failure`` (closing what it audits)
    instead of raising into the connection that was being audited."""

    def __init__(self, sink: AuditSink, on_failure: Callable[[], object], what: str) -> None:
        self.sink = sink
        self.on_failure = on_failure
        self.what = what

    def __call__(self, event: str, decision: Decision, fields: dict[str, Any]) -> None:
        try:
            self.sink(event, decision, fields)
        except Exception as exc:
            # An event that cannot be written means the proxy would run unaudited: stop.
            logger.error("%s: cannot write audit event, closing: %s", self.what, exc)
            self.on_failure()
