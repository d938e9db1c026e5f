"""The approval broker: grants on top of the loaded policy, asks, answers, generations.

One broker per :class:`~stockade.Sandbox` (or per ``stockade run``); one :class:`RunGate`
per run, which is what that run's proxy consults.

* The loaded policy (``base``) is never changed. Live entries (grants, live denies) sit on
  top of it; every change builds a new immutable :class:`RuleSet` with a new generation
  number, and a proxy that sees a new generation drops every cached decision before it
  decides anything again (no stale allow after a revoke, claude-code#81572).
* A change can add allow entries (names, or a public address), add deny entries and
  remove what earlier changes added. It can never remove a ``network.deny`` entry of the
  loaded policy (deny is checked first, on the base rules), never open an address class
  (addresses are decided by the base rules only) and never touch another layer.
* Asking happens only for an allow-list miss (``host-not-allowed``) and before any DNS
  lookup; a deny-list hit, a bad name and a refused address literal are never askable.
  One ask per ``host:port`` and run: later connections wait for the same answer.
  Unanswered, timed out, errored: denied for the run, never remembered beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from stockade._exceptions import PolicyError
from stockade.egress._addr import AddressClass, classify
from stockade.egress._rules import LAYER, EgressRules
from stockade.egress.approval._types import (
    AccessRequest,
    Answer,
    AnswerLike,
    Grant,
    Scope,
    Unanswerable,
)
from stockade.policy._decision import Decision, Reason, Verdict
from stockade.policy._hosts import HostPattern, PatternKind, ip_literal, parse_pattern
from stockade.policy._text import toml_string

__all__ = ["ApprovalBroker", "Asker", "RuleSet", "RunGate"]

logger = logging.getLogger("stockade.egress")

#: Asks pending at once in one run; more get ``approval-limit`` (prompt floods).
MAX_PENDING = 8
#: How long the command's wall clock may stand still for asks, in ask timeouts.
PAUSE_CAP_ASKS = 8

Emit = Callable[..., Any]


class Asker(Protocol):
    """Where questions go: a callback, the terminal, the control channel, MCP."""

    #: ``callback``, ``tty``, ``control``, ``mcp-elicit``, ...
    channel: str

    def available(self) -> bool:
        """False once nobody can answer any more (EOF, no terminal)."""
        ...

    def answered_by(self) -> str:
        """Who answers, for the audit log (``tty:/dev/pts/3``, ``control:fd3``)."""
        ...

    async def ask(self, request: AccessRequest) -> AnswerLike:
        """The answer to ``request``; awaited on the proxy's loop, under a timeout."""
        ...

    # Optional: ``bind_run(gate)``, called in the thread that starts a run, as its gate
    # is made. The MCP asker uses it to tie the run to the tool call that started it
    # (asks arrive on the proxy's loop, which knows nothing of tool calls).


class _CallbackAsker:
    """A user's approver: sync in a worker thread, async on the caller's loop."""

    def __init__(self, approver: Callable[[AccessRequest], Any]) -> None:
        self.approver = approver
        self.channel = str(getattr(approver, "channel", "callback"))
        self._who = getattr(approver, "answered_by", None)
        self.is_async = _is_async(approver)
        #: the loop an async approver runs on (Sandbox.arun's), set per run
        self.caller_loop: asyncio.AbstractEventLoop | None = None

    def available(self) -> bool:
        check = getattr(self.approver, "available", None)
        return bool(check()) if callable(check) else True

    def answered_by(self) -> str:
        if self._who is not None:
            return str(self._who() if callable(self._who) else self._who)
        name = getattr(self.approver, "__qualname__", type(self.approver).__qualname__)
        return f"callback:{name}"

    async def ask(self, request: AccessRequest) -> AnswerLike:
        loop = asyncio.get_running_loop()
        if self.is_async:
            if self.caller_loop is None or self.caller_loop.is_closed():
                raise TypeError("an async approver needs Sandbox.arun (no caller loop)")
            coro = self.approver(request)
            future = asyncio.run_coroutine_threadsafe(coro, self.caller_loop)
            try:
                return await asyncio.wrap_future(future)
            finally:
                future.cancel()
        # Never on the proxy's loop: a slow approver must not hold other connections.
        result = await loop.run_in_executor(None, self.approver, request)
        if inspect.isawaitable(result):
            with contextlib.suppress(Exception):
                result.close()  # type: ignore[attr-defined]
            raise TypeError("the approver returned an awaitable; make it async def")
        return result  # type: ignore[no-any-return]


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class RuleSet:
    """One immutable view of the rules: the loaded policy plus the live entries.

    ``rules`` is an :class:`EgressRules` with the grants appended to its allow list and
    the live denies to its deny list; ``labels`` maps a grant's pattern text to the rule
    name its decisions carry (``grant:<ask id>``, ``grant:api``).
    """

    __slots__ = ("askable", "generation", "labels", "refused", "rules")

    def __init__(
        self,
        rules: EgressRules,
        generation: int,
        labels: dict[str, str],
        askable: bool,
        refused: dict[tuple[str, int | None], Decision],
    ) -> None:
        self.rules = rules
        self.generation = generation
        self.labels = labels
        self.askable = askable
        self.refused = refused

    def check_name(self, host: str, port: int) -> Decision:
        """As :meth:`EgressRules.check_name`, with grants named by their source."""
        decision = self.rules.check_name(host, port)
        if decision.allowed and decision.rule in self.labels:
            return Decision(Verdict.ALLOW, LAYER, Reason.ALLOWED, self.labels[decision.rule])
        return decision

    def refusal(self, host: str, port: int | None = None) -> Decision | None:
        """The remembered deny answer for ``host`` (on ``port``), if one was given."""
        found = self.refused.get((host, None))
        if found is None and port is not None:
            found = self.refused.get((host, port))
        return found

    def may_ask(self, host: str, port: int | None = None) -> bool:
        """Whether a miss on ``host`` (``port``) would be asked about."""
        return self.askable and self.refusal(host, port) is None


class _Waiting:
    """One pending ask: the future its connections share, and how many wait."""

    __slots__ = ("future", "id", "waiting")

    def __init__(self, future: asyncio.Future[Decision], ask_id: str) -> None:
        self.future = future
        self.id = ask_id
        self.waiting = 1


def _validate_live_allow(pattern: HostPattern, text: str) -> None:
    if pattern.kind is PatternKind.NETWORK:
        raise PolicyError(
            f"{toml_string(text)}: a live allow names hosts or one public address, not a range"
        )
    if pattern.kind is PatternKind.ADDRESS:
        address = ip_literal(pattern.host)
        if address is None or classify(address) is not AddressClass.PUBLIC:
            raise PolicyError(
                f"{toml_string(text)}: a live change cannot open a non-public address; "
                "name it in the policy file instead"
            )
    if pattern.kind is PatternKind.SUFFIX and pattern.host.count(".") < 1:
        raise PolicyError(
            f"{toml_string(text)}: a wildcard over a whole top-level domain is too wide; name the host"
        )


class ApprovalBroker:
    """Grants, live denies, asks and generations for one sandbox (thread-safe).

    ``asker`` answers questions (None: never ask); ``strict`` (``network.strict``) turns
    asking off whatever ``asker`` is. ``store`` persists "always" answers
    (:class:`~stockade.egress.approval.ApprovedStore`); ``store_refusal`` says why there
    is none, and "always" then holds for the session only.
    """

    def __init__(
        self,
        base: EgressRules,
        *,
        asker: Asker | Callable[[AccessRequest], Any] | None = None,
        timeout: float = 120.0,
        strict: bool = False,
        store: Any = None,
        store_refusal: str | None = None,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if asker is not None and not hasattr(asker, "ask"):
            asker = _CallbackAsker(asker)
        self.asker: Asker | None = asker  # type: ignore[assignment]
        self.base = base
        self.timeout = timeout
        self.strict = strict
        self.store = store
        self.store_refusal = store_refusal
        self.max_pending = max_pending
        self._lock = threading.RLock()
        self._generation = 1
        self._grants: list[Grant] = []
        self._gates: list[RunGate] = []
        self._ids = itertools.count(1)
        self._closed = False

    # -- state ---------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The current generation; every change adds one."""
        return self._generation

    @property
    def asking(self) -> bool:
        """True while off-list hosts are asked about."""
        return self.asker is not None and not self.strict and self.asker.available()

    @property
    def active(self) -> bool:
        """Whether runs need a proxy even with an empty allow-list (asks or grants)."""
        return (self.asker is not None and not self.strict) or bool(self._grants)

    @property
    def grants(self) -> tuple[Grant, ...]:
        """The live entries (session and always), oldest first; run grants are per run."""
        with self._lock:
            return tuple(self._grants)

    def gate(self, run_id: str, argv: Iterable[str], emit: Emit) -> RunGate:
        """The gate of one run; ``emit`` writes to that run's audit log."""
        gate = RunGate(self, run_id, tuple(argv), emit)
        with self._lock:
            self._gates.append(gate)
        bind = getattr(self.asker, "bind_run", None)
        if callable(bind):
            bind(gate)
        return gate

    def _forget(self, gate: RunGate) -> None:
        with self._lock:
            with contextlib.suppress(ValueError):
                self._gates.remove(gate)
            self._generation += 1  # its run grants are gone

    def next_id(self) -> str:
        """A new ask id (``a1``, ``a2``, ...)."""
        return f"a{next(self._ids)}"

    def build(self, extra: Iterable[Grant] = ()) -> RuleSet:
        """The rule set of the current generation, with ``extra`` (run) grants."""
        with self._lock:
            generation = self._generation
            entries = [*self._grants, *extra]
        allow: list[str] = []
        deny: list[str] = []
        labels: dict[str, str] = {}
        refused: dict[tuple[str, int | None], Decision] = {}
        for grant in entries:
            if grant.action == "allow":
                allow.append(grant.pattern)
                labels.setdefault(grant.pattern, f"grant:{grant.ask_id or grant.source}")
            elif grant.action == "deny":
                deny.append(grant.pattern)
            else:  # "refuse": denied by an answer, not asked again
                pattern = parse_pattern(grant.pattern)
                reason = Reason(grant.reason) if grant.reason else Reason.USER_DENIED
                refused[(pattern.host, pattern.port)] = Decision.deny(
                    LAYER, reason, rule=f"ask:{grant.ask_id}", detail="answered earlier"
                )
        base = self.base
        rules = EgressRules(
            allow=base.allow,
            deny=(*base.deny, *deny),
            hosts=base.hosts,
            tls_ports=base.tls_ports,
            extra_allow=(*base.extra_allow, *(a for a in allow if a not in base.allow)),
            local=base.local,
            # the base's modes stand under every generation of grants
            learning=base.learning,
            grace=base.grace,
        )
        # A base allow entry stays the base's: its decisions keep their own rule name.
        for text in base.allow + base.extra_allow:
            labels.pop(text, None)
        return RuleSet(rules, generation, labels, self.asking, refused)

    # -- live changes -------------------------------------------------------------------

    def check_allow(self, text: str) -> HostPattern:
        """``text`` parsed as a live allow entry, or :class:`PolicyError` saying why it
        cannot be one (invalid, too wide, a non-public address, or denied by a
        ``network.deny`` entry of the loaded policy). Nothing is applied."""
        pattern = _parse(text)
        _validate_live_allow(pattern, text)
        if pattern.kind is not PatternKind.SUFFIX:
            decision = self.base.check_name(pattern.host, pattern.port or 443)
            if decision.reason is Reason.HOST_DENIED:
                raise PolicyError(
                    f"{toml_string(text)} is denied by network.deny entry "
                    f"{toml_string(decision.rule)}; "
                    "a live change cannot lift a deny of the loaded policy"
                )
            # Deny wins over allow, live entries too (DESIGN §4, docs/api.md): an allow
            # that a live deny covers would change nothing, so it is refused rather than
            # counted as a new generation; revoke() lifts the deny first.
            with self._lock:
                live = [g.pattern for g in self._grants if g.action == "deny"]
            for entry in live:
                if _parse(entry).matches(pattern.host, pattern.port or 443):
                    raise PolicyError(
                        f"{toml_string(text)} is denied by the live deny "
                        f"{toml_string(entry)}; deny wins over allow: revoke "
                        f"{toml_string(entry)} first (Sandbox.revoke, stockade approvals "
                        "revoke)"
                    )
        return pattern

    def update(
        self,
        *,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        revoke: Iterable[str] = (),
        scope: Scope = Scope.SESSION,
        source: str = "api",
        close: bool = True,
        ask_id: str | None = None,
        run: RunGate | None = None,
    ) -> int:
        """Apply one change atomically; return the new generation.

        Raises :class:`PolicyError` for an entry that is invalid, that a ``network.deny``
        entry of the loaded policy denies, or that would open an address class; nothing
        is applied then.
        """
        allow, deny, revoke = list(allow), list(deny), list(revoke)
        now = time.time()
        new: list[Grant] = []
        for text in allow:
            pattern = self.check_allow(text)
            new.append(Grant(pattern.text, scope, "allow", source, ask_id, now))
        for text in deny:
            pattern = _parse(text)
            new.append(Grant(pattern.text, scope, "deny", source, ask_id, now))
        revoked_hosts = [_parse(text) for text in revoke]
        persisted = None
        before = after = None
        if scope is Scope.ALWAYS and self.store is not None:
            before, after = self.store.add([(g.action, g.pattern) for g in new], answered_by=source)
            persisted = str(self.store.path)
        if revoke and self.store is not None and source in ("api", "control", "cli"):
            # Revoking a persisted grant removes it from the file too (only its own).
            with contextlib.suppress(OSError, PolicyError):
                self.store.remove([p.text for p in revoked_hosts])
        removed: list[str] = []
        with self._lock:
            if run is not None and scope is Scope.RUN:
                run.run_grants.extend(new)
            else:
                self._grants.extend(new)
            for pattern in revoked_hosts:
                for holder in [self._grants, *(g.run_grants for g in self._gates)]:
                    keep = [g for g in holder if not _covers(pattern, g)]
                    removed += [g.pattern for g in holder if _covers(pattern, g)]
                    holder[:] = keep
            self._generation += 1
            generation = self._generation
            gates = list(self._gates)
        fields = {
            "generation": generation,
            "add": [f"{g.action} {g.pattern}" for g in new],
            "remove": removed,
            "scope": str(scope),
            "source": source,
            "persisted": persisted,
            "sha256_before": before,
            "sha256_after": after,
        }
        verdict = "deny" if (deny or revoke) and not allow else "allow"
        targets = [run] if run is not None and scope is Scope.RUN else gates
        for gate in targets:
            gate.emit("policy_change", layer=LAYER, verdict=verdict, reason="allowed", **fields)
        if close and (deny or revoke):
            for gate in gates:
                gate.close_failing()
        if allow:
            for gate in targets:
                gate.granted()
        return generation

    def refuse(
        self,
        pattern: str,
        scope: Scope,
        run: RunGate | None,
        ask_id: str,
        reason: Reason = Reason.USER_DENIED,
    ) -> None:
        """Remember a deny answer: not asked again for the run (or the session)."""
        grant = Grant(
            pattern, scope, "refuse", f"answer:{ask_id}", ask_id, time.time(), str(reason)
        )
        with self._lock:
            if run is not None and scope is Scope.RUN:
                run.run_grants.append(grant)
            else:
                self._grants.append(grant)
            self._generation += 1

    def close(self) -> None:
        """Stop asking; pending asks are denied by their runs' ends."""
        self._closed = True


def _parse(text: str) -> HostPattern:
    try:
        return parse_pattern(text)
    except ValueError as exc:
        # parse_pattern's message starts with the entry, quoted once
        raise PolicyError(str(exc)) from None


def _covers(revoked: HostPattern, grant: Grant) -> bool:
    """Whether revoking ``revoked`` removes ``grant`` (same host; any port if none named)."""
    if grant.action not in ("allow", "refuse", "deny"):
        return False
    try:
        pattern = parse_pattern(grant.pattern)
    except ValueError:
        return False
    if pattern.host != revoked.host or pattern.kind is not revoked.kind:
        return False
    return revoked.port is None or pattern.port == revoked.port


class RunGate:
    """What one run's proxy consults: the current rule set and the asks of this run."""

    def __init__(
        self, broker: ApprovalBroker, run_id: str, argv: tuple[str, ...], emit: Emit
    ) -> None:
        self.broker = broker
        self.run_id = run_id
        self.argv = argv
        self.emit = emit
        self.run_grants: list[Grant] = []
        self._set: RuleSet | None = None
        self._pending: dict[tuple[str, int], _Waiting] = {}
        self._stopped = False
        # Wall-clock pause: seconds already paused, and since when asks are pending.
        self._paused = 0.0
        self._since: float | None = None
        self._pause_lock = threading.Lock()
        #: set by the proxy: called on the proxy's loop to close what no longer passes
        self.on_change: Callable[[], None] | None = None
        #: set by the run: called (in the thread that allowed) after an allow, so that
        #: what the new rules open is reachable (a capture listener for a new port)
        self.on_grant: Callable[[], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- rules ---------------------------------------------------------------------------

    def current(self) -> RuleSet:
        """The rule set for the next decision (rebuilt when the generation moved)."""
        current = self._set
        if current is None or current.generation != self.broker.generation:
            current = self._set = self.broker.build(self.run_grants)
            if self._stopped:
                current.askable = False
        return current

    def close_failing(self) -> None:
        """Ask the proxy (on its loop) to close connections the new rules refuse."""
        if self.on_change is not None and self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.on_change)

    def granted(self) -> None:
        """Tell the run that an allow took effect (its listeners may need to grow)."""
        if self.on_grant is not None:
            self.on_grant()

    def close(self) -> None:
        """The run ended: its run grants go, and its pending asks are denied."""
        for waiting in list(self._pending.values()):
            if not waiting.future.done():
                waiting.future.set_result(
                    Decision.deny(LAYER, Reason.APPROVAL_UNAVAILABLE, detail="the run ended")
                )
        self.broker._forget(self)

    # -- wall clock ----------------------------------------------------------------------

    def paused_seconds(self) -> float:
        """How long asks of this run have been pending in all (the command's clock stops)."""
        with self._pause_lock:
            total = self._paused
            if self._since is not None:
                total += time.monotonic() - self._since
        return min(total, self.broker.timeout * PAUSE_CAP_ASKS)

    def _pause(self, on: bool) -> None:
        with self._pause_lock:
            if on and self._since is None:
                self._since = time.monotonic()
            elif not on and self._since is not None and not self._pending:
                self._paused += time.monotonic() - self._since
                self._since = None

    # -- asking --------------------------------------------------------------------------

    async def decide(self, host: str, port: int, scheme: str, rules: RuleSet) -> Decision:
        """Ask about ``host:port`` (a ``host-not-allowed`` miss); the decision to apply.

        Called on the proxy's loop. A literal address is checked against the address
        rules first: a refused class is never askable.
        """
        literal = ip_literal(host)
        if literal is not None:
            verdict = rules.rules.check_address(host, port, literal)
            if not verdict.decision.allowed:
                return verdict.decision
        broker = self.broker
        asker = broker.asker
        if asker is None or broker.strict:
            return Decision.deny(LAYER, Reason.HOST_NOT_ALLOWED)
        refused = rules.refusal(host, port)
        if refused is not None:
            return refused
        key = (host, port)
        waiting = self._pending.get(key)
        if waiting is not None:
            # One ask per host:port: this connection waits for the same answer.
            waiting.waiting += 1
            return await asyncio.shield(waiting.future)
        if not asker.available() or self._stopped:
            return self._unanswered(
                Reason.APPROVAL_UNAVAILABLE, "nobody can answer (no terminal or channel)"
            )
        if len(self._pending) >= broker.max_pending:
            return Decision.deny(
                LAYER, Reason.APPROVAL_LIMIT, detail=f"{broker.max_pending} asks already pending"
            )
        loop = asyncio.get_running_loop()
        ask_id = broker.next_id()
        waiting = _Waiting(loop.create_future(), ask_id)
        self._pending[key] = waiting
        self._pause(True)
        try:
            decision = await self._ask(asker, ask_id, host, port, scheme, waiting)
        except BaseException:
            decision = Decision.deny(LAYER, Reason.APPROVAL_ERROR, detail="the ask was cancelled")
            raise
        finally:
            del self._pending[key]
            self._pause(False)
            if not waiting.future.done():
                waiting.future.set_result(decision)
        return decision

    def _unanswered(self, reason: Reason, detail: str) -> Decision:
        return Decision.deny(LAYER, reason, detail=detail)

    async def _ask(
        self, asker: Asker, ask_id: str, host: str, port: int, scheme: str, waiting: _Waiting
    ) -> Decision:
        broker = self.broker
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        store = broker.store if broker.store_refusal is None else None
        request = AccessRequest(
            id=ask_id,
            run_id=self.run_id,
            host=host,
            port=port,
            scheme=scheme,
            argv=self.argv,
            waiting=waiting.waiting,
            timeout=broker.timeout,
            suggestions=(target, host),
            always_to=str(store.path) if store is not None else None,
        )
        self.emit(
            "ask",
            layer=LAYER,
            verdict="pending",
            reason=str(Reason.HOST_NOT_ALLOWED),
            ask_id=ask_id,
            host=host,
            port=port,
            scheme=scheme,
            argv=list(self.argv),
            channel=asker.channel,
            waiting=waiting.waiting,
            timeout_s=broker.timeout,
        )
        started = time.monotonic()
        who = asker.answered_by()
        answer: Answer | None = None
        reason: Reason | None = None
        detail = ""
        try:
            async with asyncio.timeout(broker.timeout):
                raw = await asker.ask(request)
        except TimeoutError:
            reason, detail = Reason.APPROVAL_TIMEOUT, f"no answer in {broker.timeout:g}s"
        except Unanswerable as exc:
            reason, detail = Reason.APPROVAL_UNAVAILABLE, str(exc) or "nobody can answer"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason, detail = Reason.APPROVAL_ERROR, f"{type(exc).__name__}: {exc}"
        else:
            answer, reason, detail = _interpret(raw, host, port)
        latency = round((time.monotonic() - started) * 1000, 3)

        def answered(
            verdict: str, why: Reason, scope: Scope, pattern: str, by: str, note: str | None
        ) -> None:
            self.emit(
                "answer",
                layer=LAYER,
                verdict=verdict,
                reason=str(why),
                ask_id=ask_id,
                host=host,
                port=port,
                scope=str(scope),
                pattern=pattern,
                answered_by=by,
                latency_ms=latency,
                **({"detail": note} if note is not None else {}),
            )

        if answer is None or not answer.allowed:
            assert reason is not None or answer is not None
            reason = reason or Reason.USER_DENIED
            if answer is not None and answer.reason:
                detail = answer.reason
            scope = answer.scope if answer is not None else Scope.RUN
            decision = Decision.deny(LAYER, reason, rule=f"ask:{ask_id}", detail=detail)
            user = reason is Reason.USER_DENIED
            answered(
                "deny", reason, scope if user else Scope.RUN, target, who if user else "", detail
            )
            if reason is Reason.USER_DENIED and answer is not None:
                if scope is Scope.ALWAYS:
                    # Denies persist as a deny entry; a failure only narrows to session.
                    try:
                        broker.update(
                            deny=[answer.pattern or target],
                            scope=Scope.ALWAYS if broker.store_refusal is None else Scope.SESSION,
                            source=f"answer:{ask_id}",
                            ask_id=ask_id,
                            close=False,
                        )
                    except (PolicyError, OSError) as exc:
                        logger.warning("egress: cannot persist a deny: %s", exc)
                        broker.refuse(target, Scope.SESSION, None, ask_id)
                else:
                    broker.refuse(target, scope, self, ask_id)
                if answer.stop:
                    self._stopped = True
            else:
                # Timeout, error, no channel: denied for this run, never beyond it.
                broker.refuse(target, Scope.RUN, self, ask_id, reason)
            return decision
        pattern = answer.pattern or target
        scope = answer.scope
        note = ""
        if scope is Scope.ALWAYS and broker.store_refusal is not None:
            note = f"always narrowed to session: {broker.store_refusal}"
            scope = Scope.SESSION
        try:
            broker.update(
                allow=[pattern], scope=scope, source=f"answer:{ask_id}", ask_id=ask_id, run=self
            )
        except (PolicyError, OSError) as exc:
            decision = Decision.deny(
                LAYER, Reason.APPROVAL_ERROR, rule=f"ask:{ask_id}", detail=str(exc)
            )
            answered("deny", Reason.APPROVAL_ERROR, Scope.RUN, pattern, who, str(exc))
            broker.refuse(target, Scope.RUN, self, ask_id, Reason.APPROVAL_ERROR)
            return decision
        answered("allow", Reason.ALLOWED, scope, pattern, who, note or None)
        return Decision(Verdict.ALLOW, LAYER, Reason.ALLOWED, f"grant:{ask_id}")


def _interpret(raw: object, host: str, port: int) -> tuple[Answer | None, Reason | None, str]:
    """An approver's return value as an answer, or why it denies."""
    if raw is True:
        return Answer.allow(), None, ""
    if raw is False:
        return Answer.deny(), None, ""
    if raw is None:
        return Answer.deny(), None, ""
    if not isinstance(raw, Answer):
        return None, Reason.APPROVAL_ERROR, f"the approver returned {type(raw).__name__}"
    if raw.allowed and raw.pattern is not None:
        try:
            pattern = parse_pattern(raw.pattern)
            _validate_live_allow(pattern, raw.pattern)
        except (ValueError, PolicyError) as exc:
            return None, Reason.APPROVAL_ERROR, f"pattern {raw.pattern!r}: {exc}"
        if not pattern.matches(host, port):
            return (
                None,
                Reason.APPROVAL_ERROR,
                f"pattern {raw.pattern!r} does not match {host}:{port}",
            )
    return raw, None, ""
