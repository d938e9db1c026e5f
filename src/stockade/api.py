"""The public Python API: :func:`run`, mirroring :func:`subprocess.run`.

::

    import stockade

    result = stockade.run(["pytest", "-q"], workspace="~/project", capture_output=True)
    print(result.returncode, result.stdout, result.denials)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
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
    from stockade.runtime._popen import AsyncSandboxProcess, SandboxProcess


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
        loaded = load_policy(
            path, workspace=ws, extra_allow=tuple(allow_hosts), workspace_name="workspace"
        )
    unknown = [name for name in disable if name not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer {unknown[0]!r}; layers are {', '.join(LAYERS)}")
    if disable:
        loaded = replace(loaded, layers=loaded.layers.without(*disable))
    if loaded.filesystem.overlay and not loaded.layers.overlay:
        # The overlay layer switched off: the workspace is read-write, as the policy's
        # [layers] overlay = false makes it (policy/_load.py).
        loaded = replace(loaded, filesystem=replace(loaded.filesystem, overlay=False))
    return loaded


def with_env(policy: Policy, set_env: Mapping[str, str] | None) -> Policy:
    """``policy`` with ``set_env`` layered over its ``env.set`` (later wins).

    Raises:
        PolicyError: a name that is not a variable name, or a credential-like one the
            policy does not consent to (an ``env.pass`` entry with ``allow_secret``),
            while the secrets layer is on.
    """
    if not set_env:
        return policy
    import re

    from stockade._exceptions import PolicyError
    from stockade.policy._credentials import looks_like_credential

    consented = {e.name for e in policy.env.pass_ if e.allow_secret}
    for name, value in set_env.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise PolicyError(f"set_env: {name!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise PolicyError(f"set_env.{name}: expected a string, got {type(value).__name__}")
        if policy.layers.secrets and looks_like_credential(name) and name not in consented:
            raise PolicyError(
                f"set_env.{name}: looks like a credential and would be readable by everything "
                f'in the sandbox; the policy must consent with [env] pass = [{{ name = "{name}", '
                "allow_secret = true }] (or bind it to its host with [secrets])"
            )
    merged = {**policy.env.set, **set_env}
    return replace(policy, env=replace(policy.env, set=merged))


def _with_overlay(policy: Policy, overlay: bool) -> Policy:
    if not overlay or not policy.layers.overlay:
        # overlay=True with the overlay layer disabled: the layer's switch wins, as for
        # a policy's mode = "overlay".
        return policy
    return replace(policy, filesystem=replace(policy.filesystem, overlay=True))


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
    set_env: Mapping[str, str] | None = None,
    overlay: bool = False,
) -> CompletedRun:
    """Run ``argv`` inside a sandbox and wait for it.

    Args:
        argv: the command and its arguments.
        policy: a :class:`Policy`, a policy file, or None for the default search order.
        workspace: the read-write root (overrides the policy's).
        cwd: working directory (default: the current directory if it is inside the
            workspace, else the workspace); any directory the command may read
            (``filesystem.read``, a system path, ``/``), else :class:`SandboxError`.
        timeout: wall-time limit in seconds; on expiry the whole tree is killed and the
            result has ``returncode`` 124 (or :class:`SandboxTimeout` with ``check``).
        capture_output, text, input: as for :func:`subprocess.run`.
        check: raise :class:`SandboxError` when the command exits non-zero.
        allow_hosts: hosts added to ``network.allow``.
        disable: layers switched off for this run.
        audit: append audit events to this file (default: events kept in memory only).
        env: the caller environment the secrets layer filters (default: ``os.environ``).
        set_env: variables set for the command, on top of the policy's ``env.set``
            (they reach the command as ``env.set`` values do). A credential-like name
            (``*_TOKEN``, ``*_KEY``, ...) needs the policy's consent: an ``env.pass``
            entry ``{ name = "X", allow_secret = true }``; else :class:`PolicyError`.
        ask: an approver (see :mod:`stockade.approvers`) asked about hosts that are not on
            the allow-list, before any DNS lookup; sync only here (an async one needs
            :meth:`Sandbox.arun`). None: such hosts are denied, as without asking.
        ask_timeout: seconds an answer may take; then the request is denied. The
            command's ``timeout`` stands still while an ask waits.
        overlay: keep the run's writes in a layer, the real workspace untouched; the
            result's ``changes`` lists them (apply with :func:`stockade.workspace.apply`
            or ``stockade apply RUN``).

    Raises:
        PolicyError: the policy is invalid.
        Unavailable: a layer the policy asks for cannot be applied here.
        SandboxError: the sandbox failed, or ``check`` and a non-zero exit.
        TypeError: ``ask`` is an async approver.
    """
    loaded = _with_overlay(
        with_env(_policy(policy, workspace, allow_hosts, disable), set_env), overlay
    )
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


async def arun(
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
    set_env: Mapping[str, str] | None = None,
) -> CompletedRun:
    """The asyncio twin of :func:`run` (arguments the same; ``ask`` may be async).

    Cancelling the awaiting task kills the command's whole tree, waits for it to be
    gone and re-raises :class:`asyncio.CancelledError`.
    """
    with Sandbox(
        policy,
        workspace=workspace,
        allow_hosts=allow_hosts,
        disable=disable,
        audit=audit,
        env=env,
        ask=ask,
        ask_timeout=ask_timeout,
        set_env=set_env,
    ) as sb:
        return await sb.arun(
            argv,
            cwd=cwd,
            timeout=timeout,
            capture_output=capture_output,
            text=text,
            input=input,
            check=check,
        )


def _warn(line: str) -> None:
    """A run's warning for the person, on stderr, as the CLI prints it (the runtime
    prints nothing itself; ``CompletedRun`` callers find it in the audit events too)."""
    import sys

    print(line, file=sys.stderr)


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
    handle: Any = None,
    tmp: Path | None = None,
    overlay_layer: Any = None,
) -> CompletedRun:
    from stockade._exceptions import EXIT_NOT_FOUND, SandboxTimeout

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
            handle=handle,
            tmp=tmp,
            overlay_layer=overlay_layer,
            report=_warn,
        )
    )
    if capture_output and result.stdout is None and result.returncode == EXIT_NOT_FOUND:
        # The command never started: captured output is empty, not missing, and the
        # reason is where the caller reads the command's errors.
        result.stdout = b""
        result.stderr = f"stockade: {argv[0]}: command not found\n".encode()
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
    :meth:`popen` starts a long-lived command (a persistent shell, a REPL);
    :meth:`read_file` and :meth:`write_file` do host-side file I/O that keeps to what the
    sandbox lets its command read and write (agent frameworks' editor tools).

    ``set_env`` sets variables for every command (on top of the policy's ``env.set``;
    see :func:`stockade.run`); ``tmp="session"`` keeps one private ``/tmp`` across the
    runs of this Sandbox instead of a fresh one per run.

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
        set_env: Mapping[str, str] | None = None,
        tmp: str | None = None,
        overlay: bool = False,
    ) -> None:
        if tmp not in (None, "run", "session"):
            raise ValueError(f'tmp={tmp!r}: "run" (a fresh /tmp per run) or "session"')
        self.policy = _with_overlay(
            with_env(_policy(policy, workspace, allow_hosts, disable), set_env), overlay
        )
        #: "session": one private /tmp kept across this Sandbox's runs (made when first
        #: needed, removed by :meth:`close`); "run" (None): a fresh one per run
        self.tmp = tmp or "run"
        self._tmp_dir: Path | None = None
        # An overlay Sandbox: every run mounts the same layer (made by the first run), so
        # a run sees what the ones before it wrote; overlayfs does not share an upper
        # layer between mounts at once, so those runs take turns.
        self._layer: Any = None
        self._overlay_lock = threading.Lock()
        self._restock: threading.Thread | None = None
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
        set_env: Mapping[str, str] | None = None,
    ) -> CompletedRun:
        """Run ``argv`` in this sandbox; arguments as for :func:`stockade.run`."""
        if self._async_ask:
            raise TypeError("this Sandbox's approver is async: use arun()")
        return self._run(argv, cwd, timeout, capture_output, text, input, check, set_env)

    def _run(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None,
        timeout: float | None,
        capture_output: bool,
        text: bool,
        input: str | bytes | None,  # noqa: A002 - the name subprocess.run uses
        check: bool,
        set_env: Mapping[str, str] | None = None,
        handle: Any = None,
    ) -> CompletedRun:
        if self._closed:
            raise SandboxError("this Sandbox is closed; make a new one")
        if self.policy.filesystem.overlay:
            with self._overlay_lock:
                self._settle()
                result = self._run_once(
                    argv, cwd, timeout, capture_output, text, input, False, set_env, handle
                )
                if self._layer is None and result._result.layer is not None:
                    from stockade.workspace import Layer

                    self._layer = Layer(result._result.layer)
            if check:
                _check(argv, result, timeout)
            return result
        return self._run_once(
            argv, cwd, timeout, capture_output, text, input, check, set_env, handle
        )

    def _run_once(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None,
        timeout: float | None,
        capture_output: bool,
        text: bool,
        input: str | bytes | None,  # noqa: A002 - the name subprocess.run uses
        check: bool,
        set_env: Mapping[str, str] | None = None,
        handle: Any = None,
    ) -> CompletedRun:
        return _run_request(
            argv,
            with_env(self.policy, set_env),
            handle=handle,
            tmp=self._session_tmp(),
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
            overlay_layer=self._layer,
        )

    # -- the overlay layer (Sandbox(overlay=True)) -------------------------------------------

    def _overlay(self) -> Any:
        if not self.policy.filesystem.overlay:
            raise SandboxError("this Sandbox has no overlay workspace; make it with overlay=True")
        return self._layer

    @property
    def layer(self) -> Path | None:
        """The directory of this overlay Sandbox's layer (None before its first run)."""
        layer = self._overlay()
        return None if layer is None else Path(layer.root)

    def changes(self, paths: Sequence[str] = ()) -> list[Any]:
        """What this overlay Sandbox's runs changed and is not applied yet
        (:class:`stockade.workspace.Change`), at or below ``paths`` (all when empty)."""
        from stockade import workspace

        layer = self._overlay()
        return [] if layer is None else workspace.changes(layer, tuple(paths))

    def diff(self, paths: Sequence[str] = ()) -> str:
        """The unified diff of :meth:`changes` (binary files named, not dumped)."""
        from stockade import workspace

        layer = self._overlay()
        if layer is None:
            return ""
        return workspace.diff(layer, workspace.changes(layer, tuple(paths)))

    def apply(self, paths: Sequence[str] = (), *, dry_run: bool = False) -> list[Any]:
        """Write the changes into the real workspace (each file atomically, after a
        three-way check; protected paths and symlinks out refused); one
        :class:`stockade.workspace.Outcome` per change."""
        from stockade import workspace

        layer = self._overlay()
        if layer is None:
            return []
        with self._overlay_lock:
            return workspace.apply(
                layer, tuple(paths), protect=self.policy.filesystem.protect, dry_run=dry_run
            )

    def checkpoint(self, name: str) -> None:
        """Record this overlay Sandbox's layer as it is now under ``name`` (a copy, by
        reflink where the file system has it); :meth:`rollback` returns to it."""
        from stockade import workspace

        layer = self._overlay()
        with self._overlay_lock:
            self._settle()
            if layer is None:
                # Before the first run: an empty layer, so that rolling back to this
                # checkpoint means "the workspace as it is".
                layer = self._layer = workspace.Layer.create(
                    os.urandom(6).hex(), self.policy.filesystem.workspace
                )
                layer.update(state="finished")
            workspace.checkpoint(layer, name)

    def rollback(self, name: str) -> None:
        """Make the layer what it was at checkpoint ``name``: the next run sees the
        workspace view of that moment (two renames, whatever the size of the tree)."""
        from stockade import workspace

        layer = self._overlay()
        if layer is None:
            raise SandboxError(f"no checkpoint {name!r}: this Sandbox has made none")
        with self._overlay_lock:
            self._settle()
            self._restock = workspace.rollback(layer, name)

    def checkpoints(self) -> list[dict[str, Any]]:
        """The checkpoints of this overlay Sandbox's layer, oldest first."""
        from stockade import workspace

        layer = self._overlay()
        return [] if layer is None else workspace.checkpoints(layer)

    def _settle(self) -> None:
        # A rollback restocks its checkpoint in a thread: let it finish first.
        restock = self._restock
        if restock is not None:
            restock.join()
            self._restock = None

    def discard(self) -> None:
        """Throw the layer away; the next run starts from the real workspace again."""
        layer = self._overlay()
        if layer is not None:
            with self._overlay_lock:
                from stockade import workspace

                workspace.discard(layer)
                self._layer = None

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
        set_env: Mapping[str, str] | None = None,
    ) -> CompletedRun:
        """The asyncio twin of :meth:`run` (the wait happens in a worker thread).

        Cancelling the awaiting task kills the command's whole tree (also while one of
        its connections waits for an approver's answer), waits until the run has ended
        and re-raises :class:`asyncio.CancelledError`.
        """
        import asyncio

        from stockade.runtime._cancel import RunHandle
        from stockade.runtime._popen import _finish

        asker = self._approvals.asker
        if asker is not None and hasattr(asker, "caller_loop"):
            # An async approver runs here, on the caller's loop, not the proxy's.
            asker.caller_loop = asyncio.get_running_loop()
        handle = RunHandle()
        task = asyncio.ensure_future(
            asyncio.to_thread(
                self._run, argv, cwd, timeout, capture_output, text, input, check, set_env, handle
            )
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # The worker thread cannot be cancelled: end what it waits for, then wait
            # for it, so that nothing of the run outlives the cancellation.
            handle.kill()
            await _finish(task)
            raise

    def _session_tmp(self) -> Path | None:
        """The host directory bound at /tmp for ``tmp="session"`` (made once)."""
        if self.tmp != "session":
            return None
        with self._prepare_lock:
            if self._tmp_dir is None:
                import tempfile

                self._tmp_dir = Path(tempfile.mkdtemp(prefix="stockade-session-tmp-"))
            return self._tmp_dir

    # -- long-lived processes and host-side files (agent frameworks) -----------------------

    def popen(
        self,
        argv: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        text: bool = False,
        set_env: Mapping[str, str] | None = None,
    ) -> SandboxProcess:
        """Start ``argv`` in this sandbox and return at once, like :class:`subprocess.Popen`.

        ``stdin``, ``stdout``, ``stderr``: :data:`subprocess.PIPE`, ``DEVNULL``, None
        (inherited) or, for ``stderr``, ``STDOUT``. The command shares this Sandbox's
        proxy, grants and approver, and is one run in the audit log; :meth:`~stockade.
        runtime._popen.SandboxProcess.kill` ends its whole tree. For persistent shells
        and REPLs. Raises as :meth:`run` does when the sandbox cannot start.
        """
        from stockade.runtime._popen import SandboxProcess

        if self._async_ask:
            raise TypeError("this Sandbox's approver is async: use apopen()")
        return SandboxProcess(
            argv,
            self._starter(argv, cwd, timeout, set_env),
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=text,
        )

    async def apopen(
        self,
        argv: Sequence[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        set_env: Mapping[str, str] | None = None,
    ) -> AsyncSandboxProcess:
        """The asyncio twin of :meth:`popen`: streams are asyncio readers and a writer,
        as for :func:`asyncio.create_subprocess_exec` (bytes)."""
        import asyncio

        from stockade.runtime._popen import AsyncSandboxProcess, SandboxProcess

        asker = self._approvals.asker
        if asker is not None and hasattr(asker, "caller_loop"):
            asker.caller_loop = asyncio.get_running_loop()
        starter = self._starter(argv, cwd, timeout, set_env)
        return await AsyncSandboxProcess.start(
            lambda: SandboxProcess(argv, starter, stdin=stdin, stdout=stdout, stderr=stderr)
        )

    def _starter(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None,
        timeout: float | None,
        set_env: Mapping[str, str] | None,
    ) -> Any:
        if self._closed:
            raise SandboxError("this Sandbox is closed; make a new one")
        policy = with_env(self.policy, set_env)  # refused here, in the caller's thread

        def start(handle: Any, stdin: int | None, stdout: int | None, stderr: int | None) -> Any:
            return execute(
                RunRequest(
                    argv=list(argv),
                    policy=policy,
                    cwd=Path(os.fspath(cwd)) if cwd is not None else None,
                    audit_path=self._audit,
                    audit_to_file=self._audit is not None,
                    timeout=timeout,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    allow_pty=False,
                    caller_env=self._env,
                    egress=self._prepare(),
                    approval=self._approvals,
                    handle=handle,
                    tmp=self._session_tmp(),
                    report=_warn,
                )
            )

        return start

    def check_read(self, path: str | os.PathLike[str]) -> Path:
        """The resolved ``path`` (relative: to the workspace) when the command in this
        sandbox may read it: the workspace, ``filesystem.read``/``write``, system paths,
        less ``filesystem.deny`` and the credential locations.

        Raises:
            Denied: layer ``files``, reason ``path-denied`` or ``path-not-granted``.
        """
        from stockade.enforce import access, paths

        return access.check_read(self.policy, path, home=paths.caller_home(self._env))

    def check_write(self, path: str | os.PathLike[str], *, recursive: bool = False) -> Path:
        """The resolved ``path`` when the command in this sandbox may write it: the
        workspace and ``filesystem.write``, less ``filesystem.deny`` and the protected
        paths (``.git/hooks``, ``.git/config``, ``.claude/``, ``.vscode/``, ...), with
        the same tables the sandbox uses. ``recursive``: for removing or moving a whole
        tree, which must hold no protected or denied path either.

        Raises:
            Denied: layer ``files``, reason ``path-protected``, ``path-denied`` or
                ``path-not-granted``.
        """
        from stockade.enforce import access

        return access.check_write(self.policy, path, recursive=recursive)

    def read_file(self, path: str | os.PathLike[str]) -> bytes:
        """Read a file from the host process, as the command could (:meth:`check_read`).

        A relative path is relative to the workspace.
        """
        from stockade.enforce import access, paths

        return access.read_file(self.policy, path, home=paths.caller_home(self._env))

    def write_file(
        self, path: str | os.PathLike[str], data: str | bytes, *, parents: bool = True
    ) -> Path:
        """Write a file from the host process, only where the command could
        (:meth:`check_write`); ``parents``: make missing directories (each checked).
        Returns the path written. The final component is never followed if it is a
        link, and the file actually opened is checked again before anything is written.

        Raises:
            Denied: the sandbox keeps ``path`` read-only (or hides it).
        """
        from stockade.enforce import access

        blob = data.encode() if isinstance(data, str) else data
        return access.write_file(self.policy, path, blob, parents=parents)

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
        """Stop the shared proxy loop and remove the shared scratch files (and the
        session's /tmp)."""
        self._closed = True
        if self.policy.filesystem.overlay:
            self._settle()
        if self._tmp_dir is not None:
            import shutil

            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None
        if self._egress is not None:
            self._egress.close()
            self._egress = None
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _check(argv: Sequence[str], result: CompletedRun, timeout: float | None) -> None:
    from stockade._exceptions import SandboxTimeout

    if result.timed_out:
        raise SandboxTimeout(f"{argv[0]} timed out after {timeout:g}s and was killed")
    if result.returncode != 0:
        raise SandboxError(f"{argv[0]} exited with {result.returncode}")


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

    @property
    def layer(self) -> Path | None:
        """An overlay run's layer directory (None for a read-write workspace)."""
        return self._result.layer

    @property
    def changes(self) -> list[Any]:
        """An overlay run's changes (:class:`stockade.workspace.Change`), not yet
        applied; [] for a read-write workspace."""
        return self._result.changes

    def __repr__(self) -> str:
        return f"CompletedRun(args={self.args!r}, returncode={self.returncode})"
