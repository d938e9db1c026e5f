"""Asking the user through the MCP client (elicitation), for ``stockade mcp``.

A sandboxed command that connects to a host off the allow-list makes the proxy ask (see
:mod:`stockade.egress.approval`); here the question goes to the user through the MCP
client that called the tool, in the form of the client's protocol revision:

* **Handshake revisions** (2024-11-05 to 2025-11-25): a mid-call ``elicitation/create``
  related to the ``tools/call`` that started the command; the tool call stays open.
* **2026-07-28** (multi round-trip requests): a server may no longer send requests of
  its own (the SDK's ``ctx.elicit`` raises ``NoBackChannelError``). The tool call returns
  an ``InputRequiredResult`` naming the pending asks; the client asks the user and calls
  the tool again with ``inputResponses`` and the ``requestState`` it was given (sealed by
  the SDK: AES-GCM, a TTL, bound to the tool, its arguments and the caller). Meanwhile
  the command keeps running in its own thread, its connections held in the proxy.

Either way the answer comes from the MCP client, never from inside the sandbox: the
command's output is captured (it never reaches the JSON-RPC stream) and nothing it can
reach leads here. Unanswered, dismissed, malformed: denied (fail closed, audited by the
broker, remembered for that run only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from stockade._exceptions import PolicyError
from stockade.egress.approval import AccessRequest, Answer, AnswerLike, RunGate, Scope, Unanswerable

__all__ = [
    "ALLOW_ALWAYS",
    "ALLOW_NEXT",
    "ALLOW_RUN",
    "ALLOW_SESSION",
    "DENY",
    "Call",
    "McpAsker",
    "answer_of",
    "can_elicit",
    "choice_of",
    "client_name",
    "form",
    "is_modern",
    "response_fields",
    "safe",
]

logger = logging.getLogger("stockade.mcp")

# The choices offered in the form: plain strings, readable as they are, because a client
# may show the enum values themselves. "deny" is the default (Enter alone denies).
DENY = "deny"
ALLOW_RUN = "allow for this command"
ALLOW_NEXT = "allow for the next command"
ALLOW_SESSION = "allow for this session"
ALLOW_ALWAYS = "always allow"

#: How often progress is reported while an ask waits (clients that reset their request
#: timeout on progress then keep the tool call open: modelcontextprotocol#2006).
PROGRESS_EVERY = 10.0
#: Under 2026-07-28, how long to wait for more asks to join one InputRequiredResult.
BATCH_WINDOW = 0.25
#: How long the result of a finished run waits for a retry that never came (seconds).
CALL_TTL = 600.0

#: The tool call a run belongs to, set in the thread that starts the run: the broker's
#: ``bind_run`` reads it there (asks arrive later, on the proxy's loop).
_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "stockade_mcp_call", default=None
)


def safe(text: str, limit: int = 200) -> str:
    """``text`` as printable ASCII, clipped: hosts and argv are chosen inside the sandbox,
    client names by the client; no control or escape sequence reaches a prompt."""
    out = "".join(ch if 0x20 <= ord(ch) < 0x7F else f"\\x{ord(ch) & 0xFF:02x}" for ch in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def can_elicit(ctx: Context) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}`` is form)."""
    caps = ctx.client_capabilities
    if caps is None or caps.elicitation is None:
        return False
    return caps.elicitation.form is not None or caps.elicitation.url is None


def is_modern(ctx: Context) -> bool:
    """True on 2026-07-28 and later: asks go out as ``InputRequiredResult``."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def client_name(ctx: Context) -> str:
    """``mcp:<clientInfo.name> <version>``: who answers, for the audit log."""
    params = ctx.session.client_params
    if params is None:
        return "mcp:unnamed client"
    info = params.client_info
    return f"mcp:{safe(info.name, 80)} {safe(info.version or '', 40)}".strip()


def form(choices: tuple[str, ...]) -> dict[str, Any]:
    """The requested schema: one field, a string enum, valid on every revision."""
    return {
        "type": "object",
        "properties": {
            "decision": {
                "type": "string",
                "title": "Network access",
                "enum": list(choices),
                "default": DENY,
            }
        },
        "required": ["decision"],
    }


def ask_message(request: AccessRequest) -> str:
    """What the user reads: the command, the run and the host; never a URL path."""
    argv = safe(" ".join(request.argv), 120)
    return (
        f"The sandboxed command `{argv}` (run {request.run_id}) wants to connect to "
        f"{safe(request.target)} ({request.scheme}). It is not on your allow-list. "
        f"Unanswered in {request.timeout:g}s, it is denied."
    )


def choice_of(action: object, content: object, choices: tuple[str, ...]) -> tuple[str, str]:
    """An elicitation result as ``(choice, detail)``: ``decline`` and ``cancel`` are
    :data:`DENY`. Raises :class:`ValueError` for an accept whose choice was not offered."""
    if action == "decline":
        return DENY, "declined in the MCP client"
    if action != "accept":
        return DENY, "dismissed in the MCP client"
    decision = content.get("decision") if isinstance(content, Mapping) else None
    if not isinstance(decision, str) or decision not in choices:
        raise ValueError(f"the MCP client answered {safe(repr(decision), 60)}, not one offered")
    return decision, "denied in the MCP client" if decision == DENY else ""


def answer_of(action: object, content: object, choices: tuple[str, ...]) -> Answer:
    """An elicitation result as an :class:`Answer`.

    ``decline`` and ``cancel`` deny for the run (a cancel was a dismissal: nothing is
    remembered beyond the run, so a later command may ask again). Raises
    :class:`ValueError` for an accept whose choice was not offered (the broker then
    denies it as ``approval-error``).
    """
    choice, detail = choice_of(action, content, choices)
    if choice == ALLOW_RUN:
        return Answer.allow(Scope.RUN)
    if choice == ALLOW_SESSION:
        return Answer.allow(Scope.SESSION)
    if choice == ALLOW_ALWAYS:
        return Answer.allow(Scope.ALWAYS)
    return Answer.deny(detail or "denied in the MCP client")


def response_fields(response: object) -> tuple[object, object]:
    """``(action, content)`` of one entry of ``inputResponses`` (a model or a mapping)."""
    if isinstance(response, BaseModel):
        response = response.model_dump(by_alias=True)
    if not isinstance(response, Mapping):
        return None, None
    return response.get("action"), response.get("content")


class _Ask:
    """One pending ask of a call: the request and the future its answer arrives on."""

    __slots__ = ("choices", "future", "request", "sent")

    def __init__(self, request: AccessRequest, choices: tuple[str, ...]) -> None:
        self.request = request
        self.choices = choices
        self.future: concurrent.futures.Future[AnswerLike] = concurrent.futures.Future()
        #: named in an InputRequiredResult already (only such an ask takes an answer)
        self.sent = False

    def resolve(self, answer: Answer | None = None, error: BaseException | None = None) -> None:
        """Set the answer once; a late or second one is dropped."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(answer)


class Call:
    """One ``run_command`` call: its run in a thread, and the asks that run makes.

    ``flow`` is ``elicit`` (mid-call requests) or ``mrtr`` (InputRequiredResult rounds).
    ``changed`` (an event on the server's loop) is set when an ask comes or goes and
    when the run ends.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, ctx: Context, client: str, flow: str
    ) -> None:
        self.id = secrets.token_urlsafe(12)
        self.loop = loop
        self.ctx = ctx
        self.client = client
        self.flow = flow
        self.changed = asyncio.Event()
        self.result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.finished_at: float | None = None
        self.run_ids: set[str] = set()
        self._asks: dict[str, _Ask] = {}
        self._lock = threading.Lock()
        self._progress = 0

    def notify(self) -> None:
        """Wake the tool call waiting on ``changed`` (from any thread)."""
        with contextlib.suppress(RuntimeError):  # the server's loop is gone: nobody waits
            self.loop.call_soon_threadsafe(self.changed.set)

    def add(self, ask: _Ask) -> None:
        with self._lock:
            self._asks[ask.request.id] = ask
        self.notify()

    def remove(self, ask_id: str) -> None:
        with self._lock:
            self._asks.pop(ask_id, None)
        self.notify()

    def get(self, ask_id: str) -> _Ask | None:
        with self._lock:
            return self._asks.get(ask_id)

    def open_asks(self) -> list[_Ask]:
        """The asks still waiting for an answer, oldest first."""
        with self._lock:
            return [a for a in self._asks.values() if not a.future.done()]

    def start(self, work: Callable[[], Any], on_end: Callable[[Call], None]) -> None:
        """Run ``work`` in a thread of its own, bound to this call (see ``bind_run``)."""

        def body() -> None:
            _CALL.set(self)  # this thread's context: the run's gate is made here
            try:
                self.result.set_result(work())
            except BaseException as exc:  # handed to the tool call that collects it
                self.result.set_exception(exc)
            finally:
                self.finished_at = time.monotonic()
                on_end(self)
                self.notify()

        threading.Thread(target=body, name=f"stockade-mcp-{self.id[:6]}", daemon=True).start()

    async def report(self, asks: list[_Ask]) -> None:
        """A progress notification naming what waits (a no-op without a progress token)."""
        self._progress += 1
        targets = ", ".join(safe(a.request.target) for a in asks)
        with contextlib.suppress(Exception):  # progress is a courtesy; never fail the call
            await self.ctx.report_progress(
                self._progress, None, f"waiting for the user's answer about {targets}"
            )

    async def wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    # -- handshake revisions: the tool call stays open ------------------------------------

    async def finish(self) -> Any:
        """Wait for the run (elicit flow), reporting progress while an ask waits."""
        try:
            while not self.result.done():
                self.changed.clear()
                asks = self.open_asks()
                if asks:
                    await self.report(asks)
                if self.result.done():
                    break
                await self.wait_changed(PROGRESS_EVERY)
            return self.result.result()
        finally:
            for ask in self.open_asks():
                ask.resolve(Answer.deny("the tool call ended"))

    async def elicit(self, ask: _Ask) -> None:
        """Ask over ``elicitation/create`` (on the server's loop); resolve ``ask``."""
        try:
            result = await self.ctx.session.elicit_form(
                ask_message(ask.request), form(ask.choices), related_request_id=self.ctx.request_id
            )
            answer = answer_of(result.action, result.content, ask.choices)
        except asyncio.CancelledError:
            ask.resolve(error=Unanswerable("the ask was withdrawn"))
            raise
        except Exception as exc:  # the client failed or answered nonsense: approval-error
            ask.resolve(error=exc)
        else:
            ask.resolve(answer)

    # -- 2026-07-28: InputRequiredResult rounds -------------------------------------------

    def answer(self, responses: Mapping[str, object] | None) -> None:
        """Apply ``inputResponses``: each to an ask this call sent, at most once."""
        for key, response in (responses or {}).items():
            ask = self.get(key)
            if ask is None or not ask.sent or ask.future.done():
                continue  # unknown, never asked, expired or answered already: dropped
            action, content = response_fields(response)
            try:
                ask.resolve(answer_of(action, content, ask.choices))
            except ValueError as exc:
                ask.resolve(error=exc)

    async def round(self, ctx: Context) -> Any:
        """One round: the run's result, or an ``InputRequiredResult`` for its asks."""
        self.ctx = ctx  # progress goes to the request of this round
        self.answer(ctx.input_responses)
        while True:
            self.changed.clear()
            if self.result.done():
                return self.result.result()
            asks = self.open_asks()
            if asks:
                await self.report(asks)
                await asyncio.sleep(BATCH_WINDOW)  # asks of the same moment share a round
                asks = self.open_asks()
                if asks:
                    return self._input_required(asks)
                continue
            await self.wait_changed(PROGRESS_EVERY)

    def _input_required(self, asks: list[_Ask]) -> InputRequiredResult:
        requests: dict[str, Any] = {}
        for ask in asks:
            ask.sent = True
            requests[ask.request.id] = ElicitRequest(
                params=ElicitRequestFormParams(
                    message=ask_message(ask.request), requested_schema=form(ask.choices)
                )
            )
        # Only the call's id rides the state: the asks and the run stay here, and the
        # SDK seals the state (integrity, TTL, bound to this tool call and its caller).
        return InputRequiredResult(
            input_requests=requests, request_state=json.dumps({"call": self.id})
        )


class McpAsker:
    """The :class:`~stockade.egress.approval.Asker` of ``stockade mcp``.

    One per server; each run is tied (``bind_run``) to the tool call that started it,
    and its asks go to that call's client. ``allow_always`` is ``[mcp] allow_always``
    of the user policy: without it "always allow" is never offered.
    """

    def __init__(self, allow_always: bool) -> None:
        self.allow_always = allow_always
        #: ``mcp-elicit`` or ``mcp-mrtr``: the flow of the newest call (one client per
        #: stdio server, so one revision)
        self.channel = "mcp-elicit"
        self.client = "mcp:unnamed client"
        self._runs: dict[str, Call] = {}
        self._lock = threading.Lock()
        #: hosts ``request_network_access`` opened for the next command, and the answer
        self._next: list[str] = []
        self._next_source = ""

    def available(self) -> bool:
        """Always: a run without a call that can ask never gets this asker's sandbox."""
        return True

    def answered_by(self) -> str:
        """``mcp:<client name> <version>``."""
        return self.client

    def allow_next(self, hosts: list[str], source: str) -> None:
        """Open ``hosts`` for the next command only (``request_network_access``)."""
        with self._lock:
            self._next = list(hosts)
            self._next_source = source

    def bind_run(self, gate: RunGate) -> None:
        """Tie a run to the call starting it (in that call's thread)."""
        call = _CALL.get()
        if call is None:
            return
        with self._lock:
            self._runs[gate.run_id] = call
            hosts, source = self._next, self._next_source
            self._next = []
        call.run_ids.add(gate.run_id)
        self.channel = f"mcp-{call.flow}"
        self.client = call.client
        if hosts:
            try:
                gate.broker.update(
                    allow=hosts, scope=Scope.RUN, source=source, run=gate, close=False
                )
            except PolicyError as exc:  # validated when granted; a change since refuses it
                logger.warning("mcp: hosts for the next command not applied: %s", exc)

    def unbind(self, call: Call) -> None:
        """The call's run ended: its asks can no longer reach it."""
        with self._lock:
            for run_id in call.run_ids:
                self._runs.pop(run_id, None)

    def choices(self, request: AccessRequest) -> tuple[str, ...]:
        """What the form offers: "always" only with ``[mcp] allow_always`` and a store."""
        offered: tuple[str, ...] = (DENY, ALLOW_RUN, ALLOW_SESSION)
        if self.allow_always and request.always_to is not None:
            offered += (ALLOW_ALWAYS,)
        return offered

    async def ask(self, request: AccessRequest) -> AnswerLike:
        """Send the ask to the run's client; wait (the broker's timeout cancels the wait)."""
        with self._lock:
            call = self._runs.get(request.run_id)
        if call is None:
            raise Unanswerable("no MCP tool call owns this run")
        ask = _Ask(request, self.choices(request))
        call.add(ask)
        elicit: concurrent.futures.Future[None] | None = None
        try:
            if call.flow == "elicit":
                elicit = asyncio.run_coroutine_threadsafe(call.elicit(ask), call.loop)
            return await asyncio.wrap_future(ask.future)
        finally:
            if elicit is not None:
                elicit.cancel()  # timed out: withdraw the elicitation
            call.remove(request.id)
