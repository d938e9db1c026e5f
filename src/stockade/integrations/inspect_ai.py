"""Inspect AI on stockade: a sandbox environment provider named ``stockade``.

::

    from inspect_ai import Task, eval
    from inspect_ai.agent import react
    from inspect_ai.tool import bash, python

    task = Task(dataset=..., solver=react(tools=[bash(), python()]),
                sandbox=("stockade", "agent.toml"))

Installed with ``pip install 'stockade[inspect]'``, the provider is found through
Inspect's ``inspect_ai`` entry point, so ``sandbox="stockade"`` works in a task, on
``inspect eval --sandbox stockade`` and in ``.env`` files. The configuration is a policy
file (a path, relative to the task's directory) or a :class:`StockadeSandboxConfig`.

Each sample gets its own workspace (a fresh directory, removed when the sample ends) and
one :class:`stockade.Sandbox` on it with ``tmp="session"``: ``/tmp`` lasts across the
sample's commands, and nothing else does. ``exec`` runs one sandboxed command per call;
``read_file`` and ``write_file`` run inside the sandbox too, so they see and may change
exactly what the sample's commands could (``.git/hooks`` stays read-only, a credential
under ``HOME`` stays hidden), whichever user the host process runs as.

What it cannot do: ``exec(user=...)`` for another user (stockade runs the command as the
host program's user; another name raises Inspect's ``SandboxUserUnsupportedError``,
never runs as someone else); ``exec_remote`` and the tools built on Inspect's sandbox-tools server
(``bash_session``, ``text_editor``, ``web_browser``), which need a process that outlives
one command inside the sandbox; ``connection()`` gives the ``stockade run`` command for a
shell on the sample's workspace under the same policy.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import shlex
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, Field

import stockade
from stockade.integrations._common import denial_text, refusal_text

__all__ = ["StockadeSandboxConfig", "StockadeSandboxEnvironment"]

logger = logging.getLogger(__name__)

_TMP = Path("/tmp")

#: exit code of a command stockade refused to start (as ``sh`` reports "cannot execute")
REFUSED = 126

# read_file: a directory and a missing file are told apart before reading; the read takes
# at most LIMIT+1 bytes, so an oversized file never crosses into the host process whole.
_READ = r"""
f=$1
if [ -d "$f" ]; then echo "Is a directory" >&2; exit 21; fi
if [ ! -e "$f" ] && [ ! -L "$f" ]; then echo "No such file or directory" >&2; exit 22; fi
exec head -c "$2" -- "$f"
"""
# write_file: the parents are made inside the sandbox, where the files layer decides.
_WRITE = r"""
f=$1
if [ -d "$f" ]; then echo "Is a directory" >&2; exit 21; fi
mkdir -p -- "$(dirname -- "$f")" || exit 1
cat > "$f"
"""


class StockadeSandboxConfig(BaseModel, frozen=True):
    """The ``stockade`` provider's configuration (kept in the eval log: no secrets here).

    ``sandbox=("stockade", "agent.toml")`` is the same as
    ``sandbox=SandboxEnvironmentSpec("stockade", StockadeSandboxConfig(policy="agent.toml"))``.
    """

    #: the policy file (relative: to the task's directory); None: stockade's default
    #: search order (the user policy, docs/policy.md)
    policy: str | None = None
    #: hosts added to ``network.allow`` for every sample
    allow_hosts: tuple[str, ...] = ()
    #: variables set for every command (on top of the policy's ``env.set``)
    set_env: dict[str, str] = Field(default_factory=dict)
    #: append the audit events of every run to this file (default: in memory only)
    audit: str | None = None

    def __hash__(self) -> int:
        # Inspect hashes sandbox specs (config included); the dict field is not hashable.
        return hash(
            (self.policy, self.allow_hosts, tuple(sorted(self.set_env.items())), self.audit)
        )


def _config(config: SandboxEnvironmentConfigType | None) -> StockadeSandboxConfig:
    if config is None:
        return StockadeSandboxConfig()
    if isinstance(config, str):
        return StockadeSandboxConfig(policy=config)
    if isinstance(config, StockadeSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return StockadeSandboxConfig.model_validate(config.model_dump())
    raise TypeError(
        f"stockade sandbox config: a policy file or StockadeSandboxConfig, not {config!r}"
    )


def _absolute(path: str | None) -> str | None:
    # Inspect calls the provider with the task's directory as the current directory.
    return None if path is None else str(Path(os.path.expanduser(path)).resolve())


def _current_users() -> set[str]:
    uid = os.geteuid()
    names = {str(uid)}
    with contextlib.suppress(KeyError):
        names.add(pwd.getpwuid(uid).pw_name)
    return names


def _remove_workspace(path: Path) -> None:
    # A sample may leave directories without write or search permission (chmod -w):
    # give them back to the owner first, then remove the tree, links never followed.
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            full = os.path.join(root, name)
            with contextlib.suppress(OSError):
                if not os.path.islink(full):
                    os.chmod(full, stat.S_IRWXU)
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def _throttle(enabled: bool) -> AsyncIterator[None]:
    """Inspect's ``subprocesses`` limit (``--max-subprocesses``), as the local provider
    uses it: stockade's commands are host processes too."""
    if not enabled:
        yield
        return
    try:
        from inspect_ai.util import concurrency
        from inspect_ai.util._subprocess import max_subprocesses_context_var
    except ImportError:  # a later Inspect moved them: run unthrottled, as remote providers do
        yield
        return
    # The same semaphore (name and kind) as Inspect's own subprocess(): one limit for both.
    async with concurrency("subprocesses", max_subprocesses_context_var.get(), resizable=True):
        yield


@sandboxenv(name="stockade")
class StockadeSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: a workspace directory and a :class:`stockade.Sandbox` on it."""

    def __init__(self, sandbox: stockade.Sandbox, workspace: Path, policy: str | None) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.workspace = workspace
        self._policy_file = policy

    # -- life cycle ------------------------------------------------------------------------

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Load the policy once, so that a bad one (or a ``set_env`` it does not consent
        to) fails the task before any sample starts."""
        cfg = _config(config)
        with tempfile.TemporaryDirectory(prefix="stockade-inspect-check-") as scratch:
            stockade.Sandbox(
                _absolute(cfg.policy),
                workspace=scratch,
                allow_hosts=cfg.allow_hosts,
                set_env=cfg.set_env or None,
            ).close()

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        """A fresh workspace and a Sandbox on it, with the policy of ``config``."""
        cfg = _config(config)
        policy = _absolute(cfg.policy)
        workspace = Path(tempfile.mkdtemp(prefix="stockade-inspect-")).resolve()
        try:
            sandbox = stockade.Sandbox(
                policy,
                workspace=workspace,
                allow_hosts=cfg.allow_hosts,
                audit=_absolute(cfg.audit),
                set_env=cfg.set_env or None,
                tmp="session",
            )
        except BaseException:
            _remove_workspace(workspace)
            raise
        return {"default": cls(sandbox, workspace, policy)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Close each Sandbox (its proxy and /tmp) and remove its workspace."""
        for environment in environments.values():
            env = environment.as_type(StockadeSandboxEnvironment)
            try:
                env.sandbox.close()
            finally:
                _remove_workspace(env.workspace)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """The configuration back from an eval log."""
        return StockadeSandboxConfig(**config)

    # -- commands --------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,  # noqa: A002 - Inspect's name
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` in the sample's sandbox (cwd: the workspace; relative ``cwd`` is
        under it). ``timeout`` kills the whole tree and raises :class:`TimeoutError`
        (never retried: a command that timed out may have had effects). What the sandbox
        refused is appended to stderr as the MCP server's hints."""
        if user is not None and user not in _current_users():
            raise SandboxUserUnsupportedError(
                f"[stockade] refused: cannot run as user {user!r}: every command runs as the "
                "eval's own user, confined by the policy (user= has no meaning in stockade)"
            )
        if not cmd:
            raise ValueError("exec: empty command")
        run_cwd = self.workspace if cwd is None else self.workspace / cwd
        data = input.encode() if isinstance(input, str) else input
        async with _throttle(concurrency):
            result = await self._arun(
                cmd, cwd=run_cwd, input=b"" if data is None else data, timeout=timeout, env=env
            )
        if result.timed_out:
            raise TimeoutError(f"command timed out after {timeout}s and was killed: {cmd[0]}")
        if result.returncode == REFUSED and result.stderr.startswith(b"stockade: cannot run "):
            raise PermissionError(
                errno.EACCES, result.stderr.decode(errors="replace").strip(), cmd[0]
            )
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        for stream in (result.stdout, result.stderr):
            if len(stream) > limit:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                    stream[-limit:].decode(errors="replace"),
                )
        return ExecResult(
            success=result.returncode == 0,
            returncode=result.returncode,
            stdout=result.stdout.decode(errors="replace"),
            stderr=result.stderr.decode(errors="replace") + denial_text(result),
        )

    async def _arun(
        self,
        argv: list[str],
        *,
        cwd: Path,
        input: bytes,  # noqa: A002 - the name subprocess.run uses
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> stockade.CompletedRun:
        try:
            return await self.sandbox.arun(
                argv,
                cwd=cwd,
                input=input,
                timeout=timeout,
                capture_output=True,
                set_env=env or None,
            )
        except stockade.Unavailable as exc:
            raise SandboxUnavailableError(str(exc)) from exc
        except stockade.PolicyError as exc:
            # set_env with a credential-like name the policy did not consent to
            raise PermissionError(errno.EACCES, str(exc)) from exc
        except stockade.SandboxError as exc:
            if "closed" in str(exc):
                raise SandboxUnavailableError(str(exc)) from exc
            raise

    # -- files (inside the sandbox: the same view and the same rules as its commands) -------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write ``file`` (relative: in the workspace) as a command of this sample could,
        making missing parents; :class:`PermissionError` where the sandbox keeps it
        read-only or hidden, :class:`IsADirectoryError` on a directory."""
        self._preflight(file, write=True)
        data = contents.encode() if isinstance(contents, str) else contents
        result = await self._arun(
            ["sh", "-c", _WRITE, "stockade-write", file], cwd=self.workspace, input=data
        )
        if result.returncode != 0:
            raise self._file_error(file, result, write=True)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read ``file`` (relative: in the workspace) as a command of this sample could;
        :class:`OutputLimitExceededError` past Inspect's read limit. Text keeps its
        newlines as they are."""
        self._preflight(file, write=False)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        result = await self._arun(
            ["sh", "-c", _READ, "stockade-read", file, str(limit + 1)],
            cwd=self.workspace,
            input=b"",
        )
        if result.returncode != 0:
            raise self._file_error(file, result, write=False)
        if len(result.stdout) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        data: bytes = result.stdout
        return data.decode("utf-8") if text else data

    def _preflight(self, file: str, *, write: bool) -> None:
        """Refuse, with the sandbox's own reason (the hint the model is shown), a path its
        tables keep from the command: a protected or denied path, or one outside every
        grant (inside, such a write would land in a throwaway and be lost, such a read
        would find nothing). Only the sandbox's /tmp is left to the command inside: it is
        the sample's own (``tmp="session"``), never the host's, so a path there outside
        the workspace and the grants is not the tables' to refuse."""
        path = Path(file) if os.path.isabs(file) else self.workspace / file
        try:
            if write:
                self.sandbox.check_write(path)
            else:
                self.sandbox.check_read(path)
        except stockade.Denied as exc:
            private_tmp = (
                getattr(exc, "reason", "") == "path-not-granted"
                and _TMP in Path(os.path.normpath(path)).parents
            )
            if not private_tmp:
                raise PermissionError(errno.EACCES, refusal_text(exc), file) from exc

    def _file_error(self, file: str, result: stockade.CompletedRun, *, write: bool) -> OSError:
        said = result.stderr.decode(errors="replace").strip()
        code = result.returncode
        # The scripts' own codes (21, 22) first, then what the tools inside said (sh
        # exits 2 for any redirection it cannot make, so 2 alone tells nothing).
        if code == 21 or "Is a directory" in said:
            return IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if any(s in said for s in ("Permission denied", "Read-only file system", "not permitted")):
            return PermissionError(errno.EACCES, said, file)
        if code == 22 or "No such file" in said:
            return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
        if "Not a directory" in said:
            return NotADirectoryError(errno.ENOTDIR, "Not a directory", file)
        return OSError(errno.EIO, f"{said or 'failed'} (exit {code})", file)

    # -- what Inspect asks besides --------------------------------------------------------

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """A ``stockade run`` command for a shell on this sample's workspace (same policy,
        a fresh /tmp: the session's is private to this process)."""
        argv = ["stockade", "run", "--workspace", str(self.workspace)]
        if self._policy_file is not None:
            argv += ["--policy", self._policy_file]
        return SandboxConnection(
            type="stockade",
            command=f"cd {shlex.quote(str(self.workspace))} && "
            + shlex.join([*argv, "--", "bash", "-l"]),
        )

    async def exec_remote(self, cmd: list[str], options: Any = None, *, stream: bool = True) -> Any:
        """Not offered: it needs Inspect's sandbox-tools server alive inside the sandbox
        between commands, and a stockade command ends with its call. Refused with
        stockade's own "not available here" error, which names what to use instead."""
        from stockade._exceptions import Unavailable

        raise Unavailable(
            "exec_remote (and bash_session, text_editor, web_browser, built on it)",
            "the stockade sandbox runs one command per exec(); use bash() and python()",
        )

    def default_polling_interval(self) -> float:
        return 0.2
