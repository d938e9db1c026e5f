"""LangChain v1's shell middleware on stockade: an execution policy for
``ShellToolMiddleware``, whose persistent shell then runs inside a sandbox.

::

    from langchain.agents import create_agent
    from langchain.agents.middleware import ShellToolMiddleware
    from stockade.integrations.langchain import StockadeExecutionPolicy

    shell = ShellToolMiddleware("~/project", execution_policy=StockadeExecutionPolicy("agent.toml"))
    agent = create_agent(model, middleware=[shell])

The shell is one :meth:`stockade.Sandbox.popen` (one run in the audit log, for the
session's lifetime); the middleware's ``env`` becomes per-run ``set_env`` values (a
credential-like name needs the policy's consent), the caller environment the secrets
layer filters is ``caller_env`` (default ``os.environ``). Needs
``pip install 'stockade[langchain]'``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain.agents.middleware._execution import BaseExecutionPolicy

import stockade

__all__ = ["StockadeExecutionPolicy"]


class _ClosedAtEnd(io.TextIOWrapper):
    """A text stream that closes itself once a read reaches its end (nothing more can
    come from a pipe whose writer is gone)."""

    @classmethod
    def around(cls, stream: Any) -> Any:
        if stream is None:
            return None
        return cls(stream.detach(), encoding="utf-8", errors="replace", write_through=True)

    # typeshed's TextIOWrapper inherits a bytes readline from _IOBase beside its own
    def readline(self, size: int | None = -1, /) -> str:  # type: ignore[override]
        line = super().readline(-1 if size is None else size)
        if not line and size != 0:
            self.close()
        return line

    def read(self, size: int | None = -1, /) -> str:
        data = super().read(size)
        if not data and size != 0:
            self.close()
        return data


@dataclass
class StockadeExecutionPolicy(BaseExecutionPolicy):
    """Spawn the middleware's shell in a :class:`stockade.Sandbox` of its workspace."""

    policy: stockade.Policy | str | os.PathLike[str] | None = None
    allow_hosts: Sequence[str] = ()
    ask: Any = None
    caller_env: Mapping[str, str] | None = None
    audit: str | None = None
    _open: list[stockade.Sandbox] = field(default_factory=list, init=False, repr=False)

    def spawn(
        self, *, workspace: Path, env: Mapping[str, str], command: Sequence[str]
    ) -> subprocess.Popen[str]:
        sandbox = stockade.Sandbox(
            self.policy,
            workspace=workspace,
            allow_hosts=tuple(self.allow_hosts),
            ask=self.ask,
            env=dict(self.caller_env) if self.caller_env is not None else None,
            set_env={k: str(v) for k, v in env.items()} or None,
            audit=self.audit,
            tmp="session",
        )
        proc = sandbox.popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        # The middleware reads the shell's output line by line to its end and never closes
        # it (so it would reach the garbage collector open): read to the end, it closes.
        proc.stdout = _ClosedAtEnd.around(proc.stdout)
        proc.stderr = _ClosedAtEnd.around(proc.stderr)

        def close_when_done() -> None:
            # The run's own error (if any) is the shell's end; the middleware sees it die.
            with contextlib.suppress(BaseException):
                proc.wait()
            sandbox.close()

        threading.Thread(target=close_when_done, name="stockade-shell", daemon=True).start()
        # Popen-like: stdin/stdout/stderr (text), pid, poll, wait(timeout), kill; the
        # middleware's killpg of its pid's group ends bubblewrap, and with it the sandbox.
        return proc  # type: ignore[return-value]
