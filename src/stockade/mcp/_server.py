"""The stockade MCP server: ``run_command``, ``request_network_access`` and
``sandbox_policy`` over stdio.

The policy is loaded once, when the server starts, from the user's files or the
``--policy`` the MCP client configuration names: it is host-side and never a tool
argument, so the model cannot widen its own sandbox. It can only *ask*: when the client
declares elicitation, a host off the allow-list is asked about through the client (see
:mod:`._ask`), and ``request_network_access`` asks ahead of a command; only the user's
answer, through the client, opens anything. Every run is audited to one JSONL file per
server process under the state directory, where ``stockade log`` finds it.

stdout carries JSON-RPC and nothing else: the SDK logs to stderr, and a command never
inherits the server's stdin or stdout (its input is a pipe, its output is captured).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio.to_thread
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult

from stockade._denials import describe_policy, explain_denial
from stockade._exceptions import PolicyError, StockadeError
from stockade.mcp._ask import (
    ALLOW_ALWAYS,
    ALLOW_NEXT,
    ALLOW_SESSION,
    CALL_TTL,
    DENY,
    PROGRESS_EVERY,
    Call,
    McpAsker,
    can_elicit,
    choice_of,
    client_name,
    form,
    is_modern,
    response_fields,
    safe,
)
from stockade.policy import Policy

if TYPE_CHECKING:
    from stockade.api import CompletedRun, Sandbox
    from stockade.audit import AuditLog
    from stockade.egress.approval import ApprovalBroker

#: The most output returned per stream; the tail is kept, where errors usually are.
MAX_OUTPUT = 100_000
#: Timeout of a command when the model gives none, and the most it may ask for.
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 3600.0
#: The most hosts one request_network_access may name (one form, read by a person).
MAX_HOSTS = 8

#: request_network_access without elicitation: nothing is granted, and the model is told
#: the one way that works (the user edits the policy), never a way around the sandbox.
NO_ELICITATION = (
    "this MCP client cannot ask the user (it does not support MCP elicitation), so "
    "nothing was granted; ask the user to add {hosts} to network.allow in their stockade "
    "policy ({policy}) and restart the MCP server; do not try to reach it another way"
)


def policy_file(policy: Policy) -> str:
    """The file a user edits to widen ``policy``: the trusted file it was read from
    (``--policy``, or the user policy), else where the user policy would be (which
    honours ``XDG_CONFIG_HOME``). Never the workspace's file: it can only tighten."""
    from stockade.policy._load import user_policy_path

    workspace = policy.filesystem.workspace
    for source in policy.sources:
        path = Path(source)
        if path.is_absolute() and path.is_file() and not path.is_relative_to(workspace):
            return str(path)
    return str(user_policy_path())


INSTRUCTIONS = """\
Commands run inside a stockade sandbox: a private file system with the workspace
read-write, no credentials in the environment, and network access only to the hosts the
user allowed. When a result lists denials, each has a hint; follow it, and never try to
work around the sandbox. Call sandbox_policy to see what is allowed; call
request_network_access to ask the user for a host a task needs."""


def _tail(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_OUTPUT:
        return text, False
    return "[... output truncated ...]\n" + text[-MAX_OUTPUT:], True


def _resolve_cwd(workspace: Path, cwd: str) -> Path:
    """``cwd`` (relative to the workspace, or absolute) if it lies inside the workspace."""
    path = Path(cwd)
    resolved = (path if path.is_absolute() else workspace / path).resolve()
    if resolved != workspace and workspace not in resolved.parents:
        raise ToolError(
            f"cwd {cwd!r} is outside the workspace {workspace}; give a directory inside it"
        )
    if not resolved.is_dir():
        raise ToolError(f"cwd {cwd!r} is not a directory in the workspace {workspace}")
    return resolved


def _result(completed: CompletedRun) -> dict[str, Any]:
    """A finished run as the tool's structured result."""
    stdout, cut_out = _tail(completed.stdout or "")
    stderr, cut_err = _tail(completed.stderr or "")
    return {
        "exit_code": completed.returncode,
        "timed_out": completed.timed_out,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": cut_out or cut_err,
        # A withheld credential is no denial of the command's, but the agent needs
        # to hear of it: its hint says to ask the user, never to work around it. A
        # denying answer is left out: the connections it refused are listed themselves;
        # so is a revoke (a policy_change), which is the user's change, not a refusal.
        "denials": [
            explain_denial(e)
            for e in completed.events
            if (e.get("verdict") == "deny" and e.get("event") not in ("answer", "policy_change"))
            or e.get("event") == "env_dropped"
        ],
        "run_id": completed.run_id,
    }


class _Preflight:
    """A ``request_network_access`` waiting for its retry (2026-07-28)."""

    __slots__ = ("ask_id", "choices", "deadline", "hosts", "started")

    def __init__(
        self, ask_id: str, hosts: list[str], choices: tuple[str, ...], timeout: float
    ) -> None:
        self.ask_id = ask_id
        self.hosts = hosts
        self.choices = choices
        self.started = time.monotonic()
        self.deadline = self.started + timeout


class _Session:
    """What one server process keeps between tool calls.

    The asking sandbox is made on the first call that can ask, and kept: its broker
    holds the session's grants. A client without elicitation never uses it; its
    commands run exactly as before asking existed (``host-not-allowed``).
    """

    def __init__(self, policy: Policy, audit: Path | None) -> None:
        self.policy = policy
        self.audit = audit
        self.asker = McpAsker(policy.mcp.allow_always)
        self.calls: dict[str, Call] = {}
        self.preflights: dict[str, _Preflight] = {}
        self._sandbox: Sandbox | None = None
        self._overlay: Sandbox | None = None
        self._log: AuditLog | None = None
        self._lock = threading.Lock()

    def sandbox(self) -> Sandbox:
        """The warm sandbox whose runs ask through the client."""
        with self._lock:
            if self._sandbox is None:
                from stockade.api import Sandbox

                # The asker is an Asker object (it has ask()), used as is by the broker.
                self._sandbox = Sandbox(self.policy, audit=self.audit, ask=cast(Any, self.asker))
            return self._sandbox

    def overlay_sandbox(self) -> Sandbox:
        """The overlay session's sandbox for clients that cannot ask (one layer)."""
        with self._lock:
            if self._overlay is None:
                from stockade.api import Sandbox

                self._overlay = Sandbox(self.policy, audit=self.audit)
            return self._overlay

    def layer_sandbox(self) -> Sandbox:
        """The sandbox whose layer the workspace_* tools read: the one commands ran in."""
        with self._lock:
            asking = self._sandbox
        if asking is not None and asking._layer is not None:
            return asking
        return self.overlay_sandbox()

    @property
    def broker(self) -> ApprovalBroker:
        return self.sandbox()._approvals

    def log(self) -> AuditLog:
        """The server's own audit log (request_network_access), beside the runs' events."""
        with self._lock:
            if self._log is None:
                from stockade.audit import AuditLog

                self._log = AuditLog(f"mcp-{os.urandom(6).hex()}", self.audit)
            return self._log

    def close(self) -> None:
        """Stop the warm sandbox's proxy loop and remove its scratch files."""
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None
            if self._overlay is not None:
                self._overlay.close()
                self._overlay = None

    # -- run_command ---------------------------------------------------------------------

    def _expire(self) -> None:
        now = time.monotonic()
        for key, call in list(self.calls.items()):
            if call.finished_at is not None and now - call.finished_at > CALL_TTL:
                del self.calls[key]
        for key, pre in list(self.preflights.items()):
            if now > pre.deadline:
                del self.preflights[key]

    async def run_asking(
        self, ctx: Context, argv: list[str], where: Path, timeout: float, stdin: str
    ) -> dict[str, Any] | InputRequiredResult:
        """Run in the asking sandbox; asks go to this call's client."""
        self._expire()
        flow = "mrtr" if is_modern(ctx) else "elicit"
        call = Call(asyncio.get_running_loop(), ctx, client_name(ctx), flow)
        sandbox = self.sandbox()
        call.start(
            lambda: sandbox.run(
                argv, cwd=where, timeout=timeout, capture_output=True, text=True, input=stdin
            ),
            self.asker.unbind,
        )
        if flow == "elicit":
            return self._outcome(await call.finish())
        self.calls[call.id] = call
        return await self.resume_round(call, ctx)

    async def resume(self, ctx: Context) -> dict[str, Any] | InputRequiredResult:
        """A retry of run_command carrying answers (2026-07-28)."""
        self._expire()
        key = _state_key(ctx, "call")
        call = self.calls.get(key)
        if call is None:
            raise ToolError(
                "the command these answers belong to is unknown here or expired; run it again"
            )
        return await self.resume_round(call, ctx)

    async def resume_round(self, call: Call, ctx: Context) -> dict[str, Any] | InputRequiredResult:
        try:
            outcome = await call.round(ctx)
        except BaseException:
            if call.result.done():
                self.calls.pop(call.id, None)
            raise
        if isinstance(outcome, InputRequiredResult):
            return outcome
        self.calls.pop(call.id, None)  # the result is handed out once
        return self._outcome(outcome)

    def _outcome(self, completed: Any) -> dict[str, Any]:
        return _result(cast("CompletedRun", completed))

    # -- request_network_access ----------------------------------------------------------

    def _choices(self) -> tuple[str, ...]:
        broker = self.broker
        offered: tuple[str, ...] = (DENY, ALLOW_NEXT, ALLOW_SESSION)
        if self.asker.allow_always and broker.store is not None and broker.store_refusal is None:
            offered += (ALLOW_ALWAYS,)
        return offered

    def _check_hosts(self, hosts: list[str]) -> list[str]:
        if not hosts:
            raise ToolError("hosts is empty; name the host (or host:port) the task needs")
        if len(hosts) > MAX_HOSTS:
            raise ToolError(f"at most {MAX_HOSTS} hosts per request; ask for what the task needs")
        out: list[str] = []
        for host in hosts:
            try:
                text = self.broker.check_allow(host).text
            except PolicyError as exc:
                raise ToolError(f"cannot ask for {safe(host, 100)}: {exc}") from None
            if text not in out:
                out.append(text)
        return out

    def _access_message(self, hosts: list[str], reason: str) -> str:
        return (
            "The agent asks that commands in the stockade sandbox may connect to "
            f"{', '.join(safe(h, 100) for h in hosts)}. Reason given by the agent "
            f"(unverified): {safe(reason, 300) or '(none)'}"
        )

    async def request_access(
        self, ctx: Context, hosts: list[str], reason: str
    ) -> dict[str, Any] | InputRequiredResult:
        """Ask the user about ``hosts``; grant them only on an accepted allow."""
        self._expire()
        if ctx.request_state is not None:
            return self._access_retry(ctx)
        if not can_elicit(ctx):
            shown = ", ".join(safe(h, 100) for h in hosts) or "the host"
            raise ToolError(NO_ELICITATION.format(hosts=shown, policy=policy_file(self.policy)))
        patterns = self._check_hosts(hosts)
        broker = self.broker
        choices = self._choices()
        ask_id = broker.next_id()
        modern = is_modern(ctx)
        self.log().emit(
            "ask",
            layer="egress",
            verdict="pending",
            reason="host-not-allowed",
            ask_id=ask_id,
            host=patterns[0],
            hosts=patterns,
            channel="mcp-mrtr" if modern else "mcp-elicit",
            tool="request_network_access",
            detail=safe(reason, 300),
            timeout_s=broker.timeout,
        )
        message = self._access_message(patterns, reason)
        if modern:
            nonce = secrets.token_urlsafe(12)
            self.preflights[nonce] = _Preflight(ask_id, patterns, choices, broker.timeout)
            return InputRequiredResult(
                input_requests={
                    "access": ElicitRequest(
                        params=ElicitRequestFormParams(
                            message=message, requested_schema=form(choices)
                        )
                    )
                },
                request_state=json.dumps({"access": nonce}),
            )
        started = time.monotonic()
        client = client_name(ctx)
        try:
            async with asyncio.timeout(broker.timeout):
                result = await _with_progress(
                    ctx,
                    ctx.session.elicit_form(
                        message, form(choices), related_request_id=ctx.request_id
                    ),
                    ", ".join(patterns),
                )
        except TimeoutError:
            return self._settle(ask_id, patterns, client, started, error="approval-timeout")
        except Exception as exc:  # the client failed: denied, as an approval error
            return self._settle(ask_id, patterns, client, started, error=f"approval-error:{exc}")
        return self._settle(
            ask_id,
            patterns,
            client,
            started,
            action=result.action,
            content=result.content,
            choices=choices,
        )

    def _access_retry(self, ctx: Context) -> dict[str, Any]:
        nonce = _state_key(ctx, "access")
        pre = self.preflights.pop(nonce, None)  # each question is answered once
        if pre is None:
            raise ToolError(
                "this request was answered already or has expired; call "
                "request_network_access again"
            )
        client = client_name(ctx)
        if time.monotonic() > pre.deadline:
            return self._settle(
                pre.ask_id, pre.hosts, client, pre.started, error="approval-timeout"
            )
        response = (ctx.input_responses or {}).get("access")
        action, content = response_fields(response)
        return self._settle(
            pre.ask_id,
            pre.hosts,
            client,
            pre.started,
            action=action,
            content=content,
            choices=pre.choices,
        )

    def _settle(
        self,
        ask_id: str,
        hosts: list[str],
        client: str,
        started: float,
        *,
        action: object = None,
        content: object = None,
        choices: tuple[str, ...] = (),
        error: str = "",
    ) -> dict[str, Any]:
        """Apply the user's answer (or its absence): grant, or deny and say so."""
        latency = round((time.monotonic() - started) * 1000, 3)
        choice, detail, reason = DENY, "", "user-denied"
        if error:
            reason, _, detail = error.partition(":")
            detail = detail or "no answer in time"
        else:
            try:
                choice, detail = choice_of(action, content, choices)
            except ValueError as exc:
                reason, detail = "approval-error", str(exc)
        log = self.log()
        common: dict[str, Any] = {
            "ask_id": ask_id,
            "host": hosts[0],
            "hosts": hosts,
            "latency_ms": latency,
        }
        if choice == DENY:
            log.emit(
                "answer",
                layer="egress",
                verdict="deny",
                reason=reason,
                scope="run",
                pattern=", ".join(hosts),
                answered_by=client if reason == "user-denied" else "",
                detail=detail,
                **common,
            )
            hint = {
                "user-denied": "the user refused {h}; do not retry it or route around the "
                "sandbox; carry on without it or ask the user",
                "approval-timeout": "nobody answered the request for {h}; ask the user "
                "before asking again",
            }.get(
                reason,
                "asking about {h} failed; ask the user to add it to their stockade policy",
            )
            return {
                "granted": False,
                "hosts": hosts,
                "reason": reason,
                "hint": hint.format(h=", ".join(hosts)),
            }
        broker = self.broker
        scope = {ALLOW_NEXT: "next command", ALLOW_SESSION: "session", ALLOW_ALWAYS: "always"}[
            choice
        ]
        source = f"answer:{ask_id}"
        generation = broker.generation
        try:
            if choice == ALLOW_NEXT:
                self.asker.allow_next(hosts, source)
            else:
                from stockade.egress.approval import Scope

                generation = broker.update(
                    allow=hosts,
                    scope=Scope.ALWAYS if choice == ALLOW_ALWAYS else Scope.SESSION,
                    source=source,
                    ask_id=ask_id,
                )
        except (PolicyError, OSError) as exc:
            log.emit(
                "answer",
                layer="egress",
                verdict="deny",
                reason="approval-error",
                scope="run",
                pattern=", ".join(hosts),
                answered_by=client,
                detail=str(exc),
                **common,
            )
            return {
                "granted": False,
                "hosts": hosts,
                "reason": "approval-error",
                "hint": f"the grant failed ({exc}); ask the user to add it to their policy",
            }
        log.emit(
            "answer",
            layer="egress",
            verdict="allow",
            reason="allowed",
            scope=scope,
            pattern=", ".join(hosts),
            answered_by=client,
            **common,
        )
        if choice != ALLOW_NEXT:
            log.emit(
                "policy_change",
                layer="egress",
                verdict="allow",
                reason="allowed",
                generation=generation,
                add=[f"allow {h}" for h in hosts],
                remove=[],
                scope=scope,
                source=source,
            )
        return {
            "granted": True,
            "hosts": hosts,
            "scope": scope,
            "hint": f"the user allowed {', '.join(hosts)} ({scope}); run the command now",
        }


def _state_key(ctx: Context, name: str) -> str:
    """The key ``name`` of the request state this server sealed (verified by the SDK)."""
    try:
        value = json.loads(ctx.request_state or "")[name]
    except (ValueError, TypeError, KeyError):
        raise ToolError("the request state is not one this tool made; call it afresh") from None
    if not isinstance(value, str):
        raise ToolError("the request state is not one this tool made; call it afresh")
    return value


async def _with_progress(ctx: Context, awaitable: Any, what: str) -> Any:
    """Await ``awaitable``, reporting progress now and every few seconds meanwhile."""
    task = asyncio.ensure_future(awaitable)
    step = 0
    try:
        while True:
            step += 1
            with contextlib.suppress(Exception):  # a courtesy; never fails the call
                await ctx.report_progress(step, None, f"waiting for the user's answer about {what}")
            done, _ = await asyncio.wait({task}, timeout=PROGRESS_EVERY)
            if done:
                return task.result()
    finally:
        task.cancel()


def build_server(policy: Policy, *, audit: Path | None = None) -> MCPServer:
    """An :class:`MCPServer` whose tools run commands under ``policy``.

    Args:
        policy: the loaded, validated policy every command runs under.
        audit: the JSONL file events are appended to (None: in memory only); one the
            sandbox could write (inside the workspace or a ``filesystem.write`` path)
            is refused with :class:`~stockade.SandboxError`, as ``stockade run`` does.
    """
    return _build(policy, audit)[0]


def _build(
    policy: Policy, audit: Path | None, *, explicit: bool = True
) -> tuple[MCPServer, _Session]:
    from stockade.api import run

    if audit is not None:
        from stockade.runtime._audit_guard import refuse_reachable

        # Before the server's own log is opened there: the first run would refuse it.
        refuse_reachable(audit, policy, explicit=explicit)
    workspace = policy.filesystem.workspace
    from stockade._version import __version__

    server = MCPServer(
        "stockade", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    session = _Session(policy, audit)

    @server.tool(
        annotations=ToolAnnotations(
            title="Run a command in the sandbox",
            read_only_hint=False,
            destructive_hint=True,
            open_world_hint=True,
        )
    )
    async def run_command(
        command: list[str] | str,
        cwd: str = ".",
        timeout: float = DEFAULT_TIMEOUT,
        stdin: str = "",
        *,
        ctx: Context,
    ) -> dict[str, Any] | InputRequiredResult:
        """Run a command inside the stockade sandbox and return its output and denials.

        Args:
            command: an argv list such as ["pytest", "-q"], or a shell string run with sh -c.
            cwd: working directory, relative to the workspace (or absolute inside it).
            timeout: seconds before the command and everything it started are killed.
            stdin: text given to the command on standard input.

        Returns exit_code (124 on timeout, 127 when the command is not found), stdout,
        stderr, and denials: what the sandbox refused, each with a hint on what to do.
        A host off the allow-list may be asked about through your client (the user
        answers); the command waits meanwhile.
        """
        try:
            if ctx.request_state is not None:
                return await session.resume(ctx)
            argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
            if not argv or not argv[0]:
                raise ToolError("command is empty; give an argv list or a shell string")
            if not 0 < timeout <= MAX_TIMEOUT:
                raise ToolError(f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds")
            where = _resolve_cwd(workspace, cwd)
            if can_elicit(ctx):
                return await session.run_asking(ctx, argv, where, timeout, stdin)
            if policy.filesystem.overlay:
                # One layer for the session: a command sees what the ones before wrote.
                sb = session.overlay_sandbox()
                completed = await anyio.to_thread.run_sync(
                    lambda: sb.run(
                        argv,
                        cwd=where,
                        timeout=timeout,
                        capture_output=True,
                        text=True,
                        input=stdin,
                    )
                )
                return _result(completed)
            # No way to ask: today's behaviour, an off-list host is host-not-allowed.
            completed = await anyio.to_thread.run_sync(
                lambda: run(
                    argv,
                    policy=policy,
                    cwd=where,
                    timeout=timeout,
                    capture_output=True,
                    text=True,
                    # Always a pipe: the server's own stdin is the JSON-RPC stream.
                    input=stdin,
                    audit=audit,
                )
            )
            return _result(completed)
        except StockadeError as exc:
            raise ToolError(f"the sandbox could not run the command: {exc}") from exc

    @server.tool(
        annotations=ToolAnnotations(
            title="Ask the user for network access",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    async def request_network_access(
        hosts: list[str], reason: str, *, ctx: Context
    ) -> dict[str, Any] | InputRequiredResult:
        """Ask the user to let sandboxed commands connect to hosts not on the allow-list.

        The user answers through your client (deny, allow for the next command, allow for
        this session); nothing is granted unless they allow it. Ask only for hosts the
        task needs, and say why in reason. If they refuse, do not retry or work around it.

        Args:
            hosts: host names or host:port, such as ["pypi.org", "files.pythonhosted.org"].
            reason: one sentence, shown to the user, on why the task needs them.

        Returns granted (true or false), hosts, scope when granted, and a hint.
        """
        return await session.request_access(ctx, hosts, reason)

    @server.tool(
        annotations=ToolAnnotations(
            title="Explain the sandbox policy", read_only_hint=True, open_world_hint=False
        )
    )
    def sandbox_policy() -> dict[str, Any]:
        """What commands in the sandbox may read, write and reach, and which layers are on."""
        described = describe_policy(policy)
        grants = session._sandbox._approvals.grants if session._sandbox is not None else ()
        # Grants made by answers (this session), apart from the policy's own entries.
        described["network_granted"] = [
            {"pattern": g.pattern, "scope": str(g.scope), "source": g.source}
            for g in grants
            if g.action == "allow"
        ]
        return described

    if policy.filesystem.overlay:
        _overlay_tools(server, session)
    return server, session


def _overlay_tools(server: MCPServer, session: _Session) -> None:
    """The tools of an overlay session. There is no apply tool: the layer is what the
    user reviews, so the model that wrote it does not get to approve it; the result of
    workspace_changes names the command the user runs (``stockade apply RUN``)."""

    def layer_of() -> Any:
        sb = session.layer_sandbox()
        return sb, sb._layer

    @server.tool(
        annotations=ToolAnnotations(
            title="List the session's file changes", read_only_hint=True, open_world_hint=False
        )
    )
    def workspace_changes(paths: list[str] | None = None) -> dict[str, Any]:
        """What this session's commands changed in the workspace, not yet applied: each
        path with its kind (added, modified, deleted, renamed, mode, replaced) and sizes.
        The user reviews and applies them; you cannot.

        Args:
            paths: only changes at or below these workspace-relative paths.
        """
        sb, layer = layer_of()
        changes = sb.changes(paths or ())
        run = None if layer is None else layer.run_id
        return {
            "changes": [c.to_json() for c in changes],
            "layer": run,
            "hint": (
                f"the user applies them with 'stockade apply {run}' (or discards them)"
                if run
                else "no command has run yet"
            ),
        }

    @server.tool(
        annotations=ToolAnnotations(
            title="Show the session's changes as a diff", read_only_hint=True, open_world_hint=False
        )
    )
    def workspace_diff(paths: list[str] | None = None) -> dict[str, Any]:
        """A unified diff of the session's changes (binary files named, not shown).

        Args:
            paths: only changes at or below these workspace-relative paths.
        """
        sb, _ = layer_of()
        text, cut = _tail(sb.diff(paths or ()))
        return {"diff": text, "truncated": cut}

    @server.tool(
        annotations=ToolAnnotations(
            title="Checkpoint the session's changes", read_only_hint=False, open_world_hint=False
        )
    )
    def workspace_checkpoint(name: str) -> dict[str, Any]:
        """Remember the workspace view as it is now under ``name``; workspace_rollback
        returns to it.

        Args:
            name: 1-64 letters, digits, '.', '_' or '-'.
        """
        sb, _ = layer_of()
        try:
            sb.checkpoint(name)
        except StockadeError as exc:
            raise ToolError(str(exc)) from exc
        return {"checkpoint": name, "checkpoints": [c["name"] for c in sb.checkpoints()]}

    @server.tool(
        annotations=ToolAnnotations(
            title="Roll the session's changes back",
            read_only_hint=False,
            destructive_hint=True,
            open_world_hint=False,
        )
    )
    def workspace_rollback(name: str) -> dict[str, Any]:
        """Return the workspace view to checkpoint ``name``: what later commands changed
        is gone (the real workspace is untouched either way).

        Args:
            name: a checkpoint made with workspace_checkpoint.
        """
        sb, _ = layer_of()
        try:
            sb.rollback(name)
        except StockadeError as exc:
            raise ToolError(str(exc)) from exc
        return {"rolled_back_to": name, "changes": len(sb.changes())}

    @server.tool(
        annotations=ToolAnnotations(
            title="Discard the session's changes",
            read_only_hint=False,
            destructive_hint=True,
            open_world_hint=False,
        )
    )
    def workspace_discard() -> dict[str, Any]:
        """Throw away every change of this session: the next command sees the real
        workspace again."""
        sb, _ = layer_of()
        sb.discard()
        return {"discarded": True}


def serve(
    policy_path: Path | None = None, workspace: Path | None = None, *, overlay: bool = False
) -> None:
    """Load the policy and serve over stdio until the client disconnects.

    ``overlay``: the session's commands write into one overlay layer (as the policy's
    ``workspace = { mode = "overlay" }``), reviewed with the workspace_* tools.

    Raises:
        PolicyError: the policy is invalid (reported before any JSON-RPC is spoken).
    """
    from stockade._record import replace
    from stockade.policy import load_policy
    from stockade.runtime._state import default_audit_dir

    policy = load_policy(policy_path, workspace=workspace)
    if overlay:
        policy = replace(policy, filesystem=replace(policy.filesystem, overlay=True))
    audit = default_audit_dir() / f"{time.strftime('%Y%m%dT%H%M%S')}-mcp-{os.getpid()}.jsonl"
    server, session = _build(policy, audit, explicit=False)
    try:
        server.run("stdio")
    finally:
        session.close()
