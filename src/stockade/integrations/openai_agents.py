"""The OpenAI Agents SDK (``openai-agents``) on stockade.

Two ways in:

* :class:`StockadeSandboxClient`, a sandbox client for ``SandboxAgent`` runs
  (``RunConfig(sandbox=SandboxRunConfig(client=StockadeSandboxClient(policy)))``). It is
  the SDK's own Unix-local client, whose commands run on the host unconfined on Linux,
  with each ``exec`` run by a :class:`stockade.Sandbox` and every host-side file operation
  (read, write, mkdir, rm, mv) kept to what that sandbox lets its command do.
* :func:`shell_executor`, an executor for ``ShellTool`` / ``LocalShellTool``.

Needs ``pip install 'stockade[openai-agents]'``.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agents.sandbox.errors import ExecTimeoutError, WorkspaceArchiveWriteError
from agents.sandbox.manifest import Manifest
from agents.sandbox.sandboxes.unix_local import (
    UnixLocalSandboxClient,
    UnixLocalSandboxClientOptions,
    UnixLocalSandboxSession,
    UnixLocalSandboxSessionState,
)
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

import stockade
from stockade.integrations._common import denial_text, refusal_text

__all__ = [
    "StockadeSandboxClient",
    "StockadeSandboxSession",
    "StockadeSandboxSessionState",
    "shell_executor",
]

_DEFAULT_ROOT = str(Manifest.model_fields["root"].default)


class StockadeSandboxSessionState(UnixLocalSandboxSessionState):
    """The session state of a stockade session (its ``type`` names the backend)."""

    type: Literal["stockade"] = "stockade"  # type: ignore[assignment]


class StockadeSandboxSession(UnixLocalSandboxSession):
    """A Unix-local session whose commands run in a :class:`stockade.Sandbox`.

    No pty (``exec_command`` then runs each command once, to its end); ``user=`` has no
    meaning in stockade (the command runs as the caller, confined) and is refused.
    """

    def __init__(self, *, state: UnixLocalSandboxSessionState, sandbox: stockade.Sandbox) -> None:
        super().__init__(state=state)
        self.sandbox = sandbox

    def supports_pty(self) -> bool:
        return False

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        env = await self.state.manifest.environment.resolve()
        result = await self.sandbox.arun(
            [str(c) for c in command],
            cwd=self.state.manifest.root,
            timeout=timeout,
            capture_output=True,
            input="",
            set_env=dict(env) or None,
        )
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        stderr = (result.stderr or b"") + denial_text(result).encode()
        return ExecResult(stdout=result.stdout or b"", stderr=stderr, exit_code=result.returncode)

    def _refuse_user(self, user: str | User | None) -> None:
        if user is not None:
            raise PermissionError("stockade runs commands as the caller; user= is not supported")

    def _writable(self, path: Path | str, *, recursive: bool = False) -> Path:
        normalized = self.normalize_path(path, for_write=True)
        try:
            return self.sandbox.check_write(normalized, recursive=recursive)
        except stockade.Denied as exc:
            raise WorkspaceArchiveWriteError(
                path=normalized, cause=PermissionError(refusal_text(exc))
            ) from exc

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._refuse_user(user)
        normalized = self.normalize_path(path)
        try:
            self.sandbox.check_read(normalized)
        except stockade.Denied as exc:
            raise PermissionError(refusal_text(exc)) from exc
        return await super().read(path)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._refuse_user(user)
        target = self._writable(path)
        payload = data.read()
        blob = payload.encode() if isinstance(payload, str) else bytes(payload)
        try:
            self.sandbox.write_file(target, blob)
        except stockade.Denied as exc:  # a link swapped in after the check
            raise WorkspaceArchiveWriteError(
                path=target, cause=PermissionError(refusal_text(exc))
            ) from exc

    async def mkdir(
        self, path: Path | str, *, parents: bool = False, user: str | User | None = None
    ) -> None:
        self._refuse_user(user)
        self._writable(path)
        await super().mkdir(path, parents=parents)

    async def rm(
        self, path: Path | str, *, recursive: bool = False, user: str | User | None = None
    ) -> None:
        self._refuse_user(user)
        self._writable(path, recursive=recursive)
        await super().rm(path, recursive=recursive)

    async def mv(
        self, source: Path | str, destination: Path | str, *, user: str | User | None = None
    ) -> None:
        self._refuse_user(user)
        self._writable(source, recursive=True)
        self._writable(destination, recursive=True)
        await super().mv(source, destination)


class StockadeSandboxClient(UnixLocalSandboxClient):
    """Sandbox sessions confined by stockade: one :class:`stockade.Sandbox` per session.

    Args:
        policy: a :class:`stockade.Policy`, a policy file, or None (the default search).
        allow_hosts: hosts added to ``network.allow``.
        ask: an approver asked about hosts off the allow-list (sync or async).
        env: the caller environment the secrets layer filters (default ``os.environ``).
        tmp: "session" keeps one private /tmp across the session's commands.
        **sandbox: further :class:`stockade.Sandbox` arguments (``audit``, ``disable``).

    The workspace is the manifest's ``root`` when it names a host directory, else a new
    temporary directory removed by :meth:`delete`.
    """

    backend_id = "stockade"

    def __init__(
        self,
        policy: stockade.Policy | str | os.PathLike[str] | None = None,
        *,
        allow_hosts: Sequence[str] = (),
        ask: Any = None,
        env: Mapping[str, str] | None = None,
        tmp: str | None = "session",
        **sandbox: Any,
    ) -> None:
        super().__init__()
        self._policy = policy
        self._sandbox_args: dict[str, Any] = {
            "allow_hosts": tuple(allow_hosts),
            "ask": ask,
            "env": dict(env) if env is not None else None,
            "tmp": tmp,
            **sandbox,
        }

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: UnixLocalSandboxClientOptions | None = None,
    ) -> SandboxSession:
        import tempfile

        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        owned = manifest.root == _DEFAULT_ROOT
        if owned:
            root = tempfile.mkdtemp(prefix="stockade-agents-")
            manifest = manifest.model_copy(update={"root": root}, deep=True)
        session_id = uuid.uuid4()
        state = StockadeSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            workspace_root_owned=owned,
        )
        return self._wrap_session(self._session(state), instrumentation=self._instrumentation)

    def _session(self, state: UnixLocalSandboxSessionState) -> StockadeSandboxSession:
        sandbox = stockade.Sandbox(
            self._policy, workspace=state.manifest.root, **self._sandbox_args
        )
        return StockadeSandboxSession(state=state, sandbox=sandbox)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Close the session's sandbox; remove the workspace when this client made it."""
        inner = session._inner
        if isinstance(inner, StockadeSandboxSession):
            inner.sandbox.close()
        return await super().delete(session)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, UnixLocalSandboxSessionState):
            raise TypeError("StockadeSandboxClient.resume expects a StockadeSandboxSessionState")
        return self._wrap_session(self._session(state), instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, StockadeSandboxSessionState)


def shell_executor(sandbox: stockade.Sandbox, *, timeout: float | None = 120.0) -> Any:
    """An executor for ``ShellTool(executor=...)`` (and ``LocalShellTool``) that runs each
    command of the request in ``sandbox`` with ``sh -c``, in order, and returns a
    ``ShellResult`` whose output holds the denials' hints."""
    from agents.tool import (
        ShellCallOutcome,
        ShellCommandOutput,
        ShellCommandRequest,
        ShellResult,
    )

    async def execute(request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        limit = action.timeout_ms / 1000 if action.timeout_ms else timeout
        outputs = []
        for command in action.commands:
            r = await sandbox.arun(
                ["sh", "-c", command], timeout=limit, capture_output=True, text=True, input=""
            )
            outcome = ShellCallOutcome(
                type="timeout" if r.timed_out else "exit",
                exit_code=None if r.timed_out else r.returncode,
            )
            outputs.append(
                ShellCommandOutput(
                    command=command,
                    stdout=r.stdout,
                    stderr=r.stderr + denial_text(r),
                    outcome=outcome,
                )
            )
        return ShellResult(output=outputs, max_output_length=action.max_output_length)

    return execute
