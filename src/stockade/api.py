"""The public Python API: :func:`run`, mirroring :func:`subprocess.run`.

::

    import stockade

    result = stockade.run(["pytest", "-q"], workspace="~/project", capture_output=True)
    print(result.returncode, result.stdout, result.denials)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stockade._exceptions import SandboxError
from stockade._record import replace
from stockade.policy import LAYERS, Policy, load_policy
from stockade.policy._load import add_allowed_hosts
from stockade.runtime import RunRequest, RunResult, execute

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stockade.egress.approval import ApprovalBroker, Approver, Grant, Scope


def _broker(policy: Policy, ask: Any, ask_timeout: float) -> ApprovalBroker:
    """The approval broker of a run or a Sandbox: ``ask`` answers (None: nobody asks);
    "always" is persisted beside the user policy unless the sandbox could write there
    or the policy was named explicitly (a reproducible run)."""
    from stockade.egress import EgressRules
    from stockade.egress.approval import ApprovalBroker
    from stockade.egress.approval._store import ApprovedStore, refusal
    from stockade.policy._load import user_policy_path

    if not ask_timeout > 0:
        raise ValueError(f"ask_timeout {ask_timeout!r}: must be a positive number of seconds")
    store = ApprovedStore()
    why = None
    if policy.sources and policy.sources[0] not in (str(user_policy_path()), "built-in"):
        why = f"the policy was given explicitly ({policy.sources[0]}); runs stay reproducible"
    else:
        fs = policy.filesystem
        why = refusal(store.path, (fs.workspace, *fs.write))
    return ApprovalBroker(
        EgressRules.from_policy(policy.network),
        asker=ask,
        timeout=ask_timeout,
        strict=policy.network.strict,
        store=store if why is None else None,
        store_refusal=why,
    )


def _is_async(ask: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(ask) or inspect.iscoroutinefunction(
        getattr(ask, "__call__", None)  # noqa: B004
    )


def _policy(
    policy: Policy | str | os.PathLike[str] | None,
    workspace: str | os.PathLike[str] | None,
    allow_hosts: Sequence[str],
    disable: Sequence[str],
) -> Policy:
    ws = Path(os.path.expanduser(os.fspath(workspace))) if workspace is not None else None
    if isinstance(policy, Policy):
        loaded = policy
        if ws is not None:
            loaded = replace(loaded, filesystem=replace(loaded.filesystem, workspace=ws.resolve()))
        loaded = add_allowed_hosts(loaded, tuple(allow_hosts))
    else:
        path = Path(os.fspath(policy)) if policy is not None else None
        loaded = load_policy(path, workspace=ws, extra_allow=tuple(allow_hosts))
    unknown = [name for name in disable if name not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer {unknown[0]!r}; layers are {', '.join(LAYERS)}")
    if disable:
        loaded = replace(loaded, layers=loaded.layers.without(*disable))
    return loaded


def run(
    argv: Sequence[str],
    *,
    policy: Policy | str | os.PathLike[str] | None = None,
    workspace: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    capture_output: bool = False,
    text: bool = False,
    input: str | bytes | None = None,  # noqa: A002 - the name subprocess.run uses
    check: bool = False,
    allow_hosts: Sequence[str] = (),
    disable: Sequence[str] = (),
    audit: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    ask: Approver | None = None,
    ask_timeout: float = 120.0,
) -> CompletedRun:
    """Run ``argv`` inside a sandbox and wait for it.

    Args:
        argv: the command and its arguments.
        policy: a :class:`Policy`, a policy file, or None for the default search order.
        workspace: the read-write root (overrides the policy's).
        cwd: working directory inside the workspace (default: the current directory if
            it is inside the workspace, else the workspace).
        timeout: wall-time limit in seconds; on expiry the whole tree is killed and the
            result has ``returncode`` 124 (or :class:`SandboxTimeout` with ``check``).
        capture_output, text, input: as for :func:`subprocess.run`.
        check: raise :class:`SandboxError` when the command exits non-zero.
        allow_hosts: hosts added to ``network.allow``.
        disable: layers switched off for this run.
        audit: append audit events to this file (default: events kept in memory only).
        env: the caller environment the secrets layer filters (default: ``os.environ``).
        ask: an approver (see :mod:`stockade.approvers`) asked about hosts that are not on
            the allow-list, before any DNS lookup; sync only here (an async one needs
            :meth:`Sandbox.arun`). None: such hosts are denied, as without asking.
        ask_timeout: seconds an answer may take; then the request is denied. The
            command's ``timeout`` stands still while an ask waits.

    Raises:
        PolicyError: the policy is invalid.
        Unavailable: a layer the policy asks for cannot be applied here.
        SandboxError: the sandbox failed, or ``check`` and a non-zero exit.
        TypeError: ``ask`` is an async approver.
    """
    loaded = _policy(policy, workspace, allow_hosts, disable)
    if ask is not None and _is_async(ask):
        raise TypeError("an async approver needs Sandbox.arun; give run() a sync one")
    approval = _broker(loaded, ask, ask_timeout) if ask is not None else None
    return _run_request(
        argv,
        loaded,
        cwd=cwd,
        timeout=timeout,
        capture_output=capture_output,
        text=text,
        input=input,
        check=check,
        audit=Path(os.fspath(audit)) if audit is not None else None,
        env=env,
        egress=None,
        approval=approval,
    )


def _run_request(
    argv: Sequence[str],
    policy: Policy,
    *,
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
    capture_output: bool,
    text: bool,
    input: str | bytes | None,  # noqa: A002 - the name subprocess.run uses
    check: bool,
    audit: Path | None,
    env: dict[str, str] | None,
    egress: Any,
    approval: Any = None,
) -> CompletedRun:
    from stockade._exceptions import SandboxTimeout

    data = input.encode() if isinstance(input, str) else input
    result = execute(
        RunRequest(
            argv=list(argv),
            policy=policy,
            cwd=Path(os.fspath(cwd)) if cwd is not None else None,
            audit_path=audit,
            audit_to_file=audit is not None,
            timeout=timeout,
            capture_output=capture_output,
            input=data,
            allow_pty=False,
            caller_env=env,
            egress=egress,
            approval=approval,
        )
    )
    completed = CompletedRun(result, text=text)
    if check and result.timed_out:
        raise SandboxTimeout(f"{argv[0]} timed out after {timeout:g}s and was killed")
    if check and result.returncode != 0:
        raise SandboxError(f"{argv[0]} exited with {result.returncode}")
    return completed


class Sandbox:
    """A sandbox kept warm across many commands.

    ::

        with stockade.Sandbox(workspace="~/project", allow_hosts=["pypi.org"]) as sb:
            sb.run(["pip", "install", "-e", "."], check=True)
            result = sb.run(["pytest", "-q"], capture_output=True, text=True)

    The policy is loaded and validated once; the egress proxy's event loop, the CA and
    trust bundle of the inspect layer, and the placeholders of bound secrets are made
    once and shared by every run. Each run still gets a fresh container, network
    namespace, proxy listener and audit ``run_id``: nothing a command leaves behind
    reaches the next one except through the workspace.

    :meth:`run` mirrors :func:`subprocess.run`; :meth:`arun` is its asyncio twin.

    ``ask`` is an approver asked about hosts not on the allow-list (an async one runs on
    the loop that called :meth:`arun`). The network policy can also change while
    commands run: :meth:`allow`, :meth:`deny` and :meth:`revoke` take effect on the next
    connection of every running command, atomically; :attr:`grants` lists the changes.
    They never lift a ``network.deny`` entry of the policy, never open a private or
    loopback address, and never change the filesystem layers.
    """

    def __init__(
        self,
        policy: Policy | str | os.PathLike[str] | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        allow_hosts: Sequence[str] = (),
        disable: Sequence[str] = (),
        audit: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        ask: Approver | None = None,
        ask_timeout: float = 120.0,
    ) -> None:
        self.policy = _policy(policy, workspace, allow_hosts, disable)
        self._approvals = _broker(self.policy, ask, ask_timeout)
        self._async_ask = ask is not None and _is_async(ask)
        self._audit = Path(os.fspath(audit)) if audit is not None else None
        self._env = dict(os.environ if env is None else env)
        self._scratch: Path | None = None
        self._egress: Any = None
        self._closed = False
        # Runs may start from several threads at once (the MCP server's tool calls):
        # one shared proxy loop, made once.
        self._prepare_lock = threading.Lock()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self) -> Any:
        with self._prepare_lock:
            return self._prepare_locked()

    def _prepare_locked(self) -> Any:
        layers = self.policy.layers
        net = self.policy.network
        wanted = net.allow or net.hosts or self._approvals.active
        if self._egress is None and layers.egress and wanted:
            import tempfile

            from stockade.enforce.bubblewrap import STOCKADE_DIR
            from stockade.runtime._egress import EgressPlan

            self._scratch = Path(tempfile.mkdtemp(prefix="stockade-sandbox-"))
            self._egress = EgressPlan(
                self.policy,
                self._env,
                self._scratch,
                STOCKADE_DIR if layers.container else None,
                approvals=self._approvals,
            )
        return self._egress

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        capture_output: bool = False,
        text: bool = False,
        input: str | bytes | None = None,  # noqa: A002 - the name subprocess.run uses
        check: bool = False,
    ) -> CompletedRun:
        """Run ``argv`` in this sandbox; arguments as for :func:`stockade.run`."""
        if self._async_ask:
            raise TypeError("this Sandbox's approver is async: use arun()")
        return self._run(argv, cwd, timeout, capture_output, text, input, check)

    def _run(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None,
        timeout: float | None,
        capture_output: bool,
        text: bool,
        input: str | bytes | None,  # noqa: A002 - the name subprocess.run uses
        check: bool,
    ) -> CompletedRun:
        if self._closed:
            raise SandboxError("this Sandbox is closed; make a new one")
        return _run_request(
            argv,
            self.policy,
            cwd=cwd,
            timeout=timeout,
            capture_output=capture_output,
            text=text,
            input=input,
            check=check,
            audit=self._audit,
            env=self._env,
            egress=self._prepare(),
            approval=self._approvals,
        )

    async def arun(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        capture_output: bool = False,
        text: bool = False,
        input: str | bytes | None = None,  # noqa: A002 - the name subprocess.run uses
        check: bool = False,
    ) -> CompletedRun:
        """The asyncio twin of :meth:`run` (the wait happens in a worker thread)."""
        import asyncio

        asker = self._approvals.asker
        if asker is not None and hasattr(asker, "caller_loop"):
            # An async approver runs here, on the caller's loop, not the proxy's.
            asker.caller_loop = asyncio.get_running_loop()
        return await asyncio.to_thread(
            self._run, argv, cwd, timeout, capture_output, text, input, check
        )

    # -- live changes ----------------------------------------------------------------------

    def allow(self, pattern: str, *, scope: Scope | str = "session") -> int:
        """Allow ``pattern`` (``host``, ``host:port``, ``*.suffix``, one public IP) from the
        next connection on, for running commands and later ones; return the generation.

        ``scope="always"`` also writes it to ``approved.toml`` beside the user policy.
        Raises :class:`PolicyError` when a ``network.deny`` entry denies it or it names a
        range or a non-public address.
        """
        from stockade.egress.approval import Scope as Scope_

        return self._approvals.update(allow=[pattern], scope=Scope_(scope), source="api")

    def deny(self, pattern: str) -> int:
        """Deny ``pattern`` from the next connection on (deny wins over every allow);
        open connections it matches are closed. Returns the generation."""
        return self._approvals.update(deny=[pattern], source="api")

    def revoke(self, host: str, *, close: bool = True) -> int:
        """Remove the grants (and live denies) for ``host`` (any port, or the one named),
        including persisted "always" ones; with ``close``, open tunnels and keep-alive
        connections that no longer pass are closed. The policy's own allow entries stay:
        narrow those with :meth:`deny`. Returns the generation."""
        return self._approvals.update(revoke=[host], close=close, source="api")

    @property
    def grants(self) -> tuple[Grant, ...]:
        """The live entries on top of the loaded policy (session and always), oldest first."""
        return tuple(g for g in self._approvals.grants if g.action in ("allow", "deny"))

    @property
    def generation(self) -> int:
        """The network policy's generation: 1 at start, one more per change."""
        return self._approvals.generation

    def close(self) -> None:
        """Stop the shared proxy loop and remove the shared scratch files."""
        self._closed = True
        if self._egress is not None:
            self._egress.close()
            self._egress = None
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


class CompletedRun:
    """The result of :func:`run`: like :class:`subprocess.CompletedProcess`, plus events."""

    __slots__ = ("_result", "args", "returncode", "stderr", "stdout")

    def __init__(self, result: RunResult, *, text: bool = False) -> None:
        self._result = result
        self.args = result.argv
        self.returncode = result.returncode
        self.stdout: Any = (
            result.stdout.decode(errors="replace")
            if text and result.stdout is not None
            else result.stdout
        )
        self.stderr: Any = (
            result.stderr.decode(errors="replace")
            if text and result.stderr is not None
            else result.stderr
        )

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every audit event of the run, in order."""
        return self._result.events

    @property
    def denials(self) -> list[dict[str, Any]]:
        """The audit events whose verdict is ``deny``."""
        return self._result.denials

    @property
    def run_id(self) -> str:
        """The run's id, as in the audit log."""
        return self._result.run_id

    @property
    def timed_out(self) -> bool:
        """True when the wall-time limit killed the command."""
        return self._result.timed_out

    def __repr__(self) -> str:
        return f"CompletedRun(args={self.args!r}, returncode={self.returncode})"
