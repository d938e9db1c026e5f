"""The values of asking: what is asked (:class:`AccessRequest`), what comes back
(:class:`Answer`, :class:`Scope`) and what an allow leaves behind (:class:`Grant`).

Pure values, no I/O: the approvers that talk to a person live in :mod:`stockade.approvers`
(terminal) and the CLI; the control channel in :mod:`._control`.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from stockade._record import record

__all__ = ["AccessRequest", "Answer", "AnswerLike", "Approver", "Grant", "Scope", "Unanswerable"]


class Scope(enum.StrEnum):
    """How long an answer holds.

    ``RUN``: this command (the run that asked); ``SESSION``: every run of this
    :class:`~stockade.Sandbox` (or this ``stockade run``) from now on; ``ALWAYS``: also
    written to ``approved.toml`` beside the user policy and loaded by later sessions.
    """

    RUN = "run"
    SESSION = "session"
    ALWAYS = "always"


@record
class AccessRequest:
    """One question: may run ``run_id`` (``argv``) connect to ``host:port``?

    ``host`` is the normalised name (punycode for international names), never a URL:
    paths and queries are not shown (they may carry tokens). ``waiting`` counts the
    connections held for this answer; ``timeout`` is how long the answer may take (then
    the request is denied). ``suggestions`` are patterns an answer may use, narrowest
    first.
    """

    id: str
    run_id: str
    host: str
    port: int
    scheme: str
    argv: tuple[str, ...]
    waiting: int
    timeout: float
    suggestions: tuple[str, ...] = ()
    #: where an "always" answer would be written; None when "always" is not offered
    always_to: str | None = None

    @property
    def target(self) -> str:
        """``host:port``, with brackets around an IPv6 literal."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@record
class Answer:
    """An approver's decision; make one with :meth:`allow` or :meth:`deny`.

    ``pattern`` widens or narrows what an allow covers (default: exactly ``host:port`` of
    the request); it must still match the request, or the answer denies. A deny with
    ``Scope.SESSION`` stops asking about the host for the session; with ``Scope.ALWAYS``
    it is also written to ``approved.toml`` as a deny entry.
    """

    allowed: bool
    scope: Scope = Scope.RUN
    pattern: str | None = None
    reason: str = ""
    #: with a deny: ask nothing more for the rest of this run
    stop: bool = False

    @classmethod
    def allow(cls, scope: Scope | str = Scope.RUN, pattern: str | None = None) -> Answer:
        """Allow the request (and what ``pattern`` names) for ``scope``."""
        return cls(True, Scope(scope), pattern, "")

    @classmethod
    def deny(
        cls,
        reason: str = "",
        scope: Scope | str = Scope.RUN,
        pattern: str | None = None,
        *,
        stop: bool = False,
    ) -> Answer:
        """Deny the request; ``reason`` is recorded. ``stop`` also ends asking for the run."""
        return cls(False, Scope(scope), pattern, reason, stop)


@record
class Grant:
    """An entry added on top of the loaded policy while a sandbox lives.

    ``action`` is ``allow`` or ``deny``; ``source`` says who made it (``answer:<ask id>``,
    ``api``, ``control``); ``at`` is a Unix time.
    """

    pattern: str
    scope: Scope
    action: str = "allow"
    source: str = "api"
    ask_id: str | None = None
    at: float = 0.0
    #: for a remembered deny answer: the reason it was denied with
    reason: str = ""


class Unanswerable(Exception):
    """Raised by an asker when nobody can answer (a closed channel, no terminal)."""


#: What an approver may return: ``True`` allows for the run, ``False``/``None`` deny;
#: anything else (or an exception) denies as an error.
AnswerLike = Answer | bool | None
#: A callable that decides an :class:`AccessRequest`; sync (run in a worker thread) or
#: async (run on the loop that called :meth:`Sandbox.arun`).
Approver = Callable[[AccessRequest], AnswerLike | Awaitable[AnswerLike]]
