"""pydantic-ai on stockade: a workspace capability whose commands run in a sandbox.

::

    from pydantic_ai import Agent
    from stockade.integrations.pydantic_ai import StockadeWorkspace

    agent = Agent(model, capabilities=[StockadeWorkspace("~/project", policy="agent.toml")])

Tools read ``ctx.workspace`` (pydantic-ai's workspace protocol, ``pydantic_ai.workspaces``).
The backend implements commands only (``SupportsCommands``): ``Workspace`` then derives
every file operation through the sandbox's shell, so a write the sandbox keeps read-only
(``.git/hooks``, ``.claude/``) fails inside it, as the command's would.

Needs ``pip install 'stockade[pydantic-ai]'``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai._run_context import AgentDepsT, RunContext
from pydantic_ai.capabilities.abstract import AbstractCapability
from pydantic_ai.workspaces import (
    CommandResult,
    WorkspaceBackend,
    WorkspaceCommand,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

import stockade
from stockade.integrations._common import denial_text

__all__ = ["StockadeWorkspace", "StockadeWorkspaceBackend"]

PROVIDER = "stockade"


class StockadeWorkspaceBackend:
    """A pydantic-ai ``WorkspaceBackend`` + ``SupportsCommands`` over a :class:`stockade.Sandbox`.

    Commands start in the workspace with stdin at EOF; a shell string runs as
    ``sh -c``. What the sandbox refused is appended to stderr as the MCP server's hints.
    """

    def __init__(
        self,
        sandbox: stockade.Sandbox | Callable[[], stockade.Sandbox],
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        # A factory: built without I/O, the sandbox (and its policy) is made on first use.
        self._get = sandbox if callable(sandbox) else (lambda: sandbox)
        self._env = dict(env or {})
        self._ref: WorkspaceRef | None = (
            None
            if callable(sandbox)
            else WorkspaceRef(provider=PROVIDER, id=str(sandbox.policy.filesystem.workspace))
        )

    @property
    def _sandbox(self) -> stockade.Sandbox:
        sandbox = self._get()
        if self._ref is None:
            self._ref = WorkspaceRef(provider=PROVIDER, id=str(sandbox.policy.filesystem.workspace))
        return sandbox

    @property
    def ref(self) -> WorkspaceRef | None:
        """``stockade:<workspace>``, set on first use and never changed."""
        return self._ref

    async def working_dir(self) -> str:
        """The workspace, resolved."""
        return str(self._sandbox.policy.filesystem.workspace)

    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``command`` in the sandbox and wait for it (see the protocol's contract)."""
        if shell and not isinstance(command, str):
            raise TypeError("shell=True takes a command string")
        if not shell and isinstance(command, str):
            raise TypeError("a command string needs shell=True; pass an argv list otherwise")
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be a positive number of seconds")
        argv = ["sh", "-c", command] if isinstance(command, str) else [str(c) for c in command]
        if not argv:
            raise ValueError("empty command")
        try:
            r = await self._sandbox.arun(
                argv,
                cwd=await self.working_dir(),
                timeout=timeout,
                capture_output=True,
                text=True,
                input="",
                set_env={**self._env, **(env or {})} or None,
            )
        except stockade.Unavailable as exc:
            raise WorkspaceUnavailableError(str(exc)) from exc
        except stockade.SandboxError as exc:
            if "closed" in str(exc):
                raise WorkspaceUnavailableError(str(exc)) from exc
            raise
        if r.timed_out:
            raise WorkspaceTimeoutError(
                f"command timed out after {timeout:g}s", stdout=r.stdout, stderr=r.stderr
            )
        return CommandResult(
            exit_code=r.returncode, stdout=r.stdout, stderr=r.stderr + denial_text(r)
        )


@dataclass
class StockadeWorkspace(AbstractCapability[AgentDepsT]):
    """Gives runs a workspace whose commands run in a stockade sandbox of ``working_dir``.

    One :class:`stockade.Sandbox` serves every run of the agent (made on first use, with
    ``tmp="session"`` so that /tmp lasts across commands); :meth:`close` ends it. A ref
    naming another directory is declined, so message history cannot point it elsewhere.
    """

    working_dir: str | Path
    _: KW_ONLY
    policy: stockade.Policy | str | os.PathLike[str] | None = None
    allow_hosts: Sequence[str] = ()
    ask: Any = None
    #: variables for every command (``set_env``: credential-like names need the policy)
    env: Mapping[str, str] | None = None
    #: the caller environment the secrets layer filters (default ``os.environ``)
    caller_env: Mapping[str, str] | None = None
    id: str | None = "stockade_workspace"
    _sandbox: stockade.Sandbox | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.working_dir = str(Path(os.path.expanduser(os.fspath(self.working_dir))).resolve())

    def sandbox(self) -> stockade.Sandbox:
        """The sandbox every run's commands go to (made on first use)."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = stockade.Sandbox(
                    self.policy,
                    workspace=self.working_dir,
                    allow_hosts=tuple(self.allow_hosts),
                    ask=self.ask,
                    env=dict(self.caller_env) if self.caller_env is not None else None,
                    tmp="session",
                )
            return self._sandbox

    def get_workspace(
        self, ctx: RunContext[AgentDepsT], *, ref: WorkspaceRef | None
    ) -> WorkspaceBackend | None:
        if ref is not None and ref != WorkspaceRef(provider=PROVIDER, id=str(self.working_dir)):
            return None
        return StockadeWorkspaceBackend(self.sandbox, env=self.env)

    def close(self) -> None:
        """Close the sandbox (its proxy and session /tmp)."""
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None
