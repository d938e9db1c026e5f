"""deepagents on stockade: a ``BaseSandbox`` backend for ``create_deep_agent``.

::

    from deepagents import create_deep_agent
    from stockade.integrations.deepagents import StockadeBackend

    agent = create_deep_agent(model=model, backend=StockadeBackend("~/project", policy="agent.toml"))

``execute`` runs each command with ``sh -c`` in one :class:`stockade.Sandbox` (with a
session /tmp, so files left there are found by the next command); deepagents derives
ls/read/grep/glob/write/edit through ``execute``, inside the sandbox.
``upload_files``/``download_files`` are host-side and keep to what the sandbox lets its
command write and read. Needs ``pip install 'stockade[deepagents]'``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

import stockade
from stockade.integrations._common import denial_text

__all__ = ["StockadeBackend"]


class StockadeBackend(BaseSandbox):
    """A deepagents sandbox backend confined by stockade; :meth:`close` ends it."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        *,
        policy: stockade.Policy | str | os.PathLike[str] | None = None,
        allow_hosts: Sequence[str] = (),
        timeout: int = 120,
        env: dict[str, str] | None = None,
        **sandbox: Any,
    ) -> None:
        self._sandbox = stockade.Sandbox(
            policy,
            workspace=workspace,
            allow_hosts=tuple(allow_hosts),
            env=env,
            tmp="session",
            **sandbox,
        )
        self._timeout = timeout
        self._id = f"stockade-{os.urandom(6).hex()}"

    @property
    def id(self) -> str:
        return self._id

    @property
    def sandbox(self) -> stockade.Sandbox:
        """The :class:`stockade.Sandbox` the commands run in."""
        return self._sandbox

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        r = self._sandbox.run(
            ["sh", "-c", command],
            cwd=self._sandbox.policy.filesystem.workspace,
            timeout=timeout or self._timeout,
            capture_output=True,
            text=True,
            input="",
        )
        output = (r.stdout or "") + (r.stderr or "") + denial_text(r)
        return ExecuteResponse(output=output, exit_code=r.returncode, truncated=False)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for path, data in files:
            try:
                self._sandbox.write_file(path, data)
                out.append(FileUploadResponse(path=path, error=None))
            except stockade.Denied:
                out.append(FileUploadResponse(path=path, error="permission_denied"))
            except IsADirectoryError:
                out.append(FileUploadResponse(path=path, error="is_directory"))
            except OSError:
                out.append(FileUploadResponse(path=path, error="invalid_path"))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for path in paths:
            try:
                data = self._sandbox.read_file(path)
                out.append(FileDownloadResponse(path=path, content=data, error=None))
            except stockade.Denied:
                out.append(FileDownloadResponse(path=path, content=None, error="permission_denied"))
            except FileNotFoundError:
                out.append(FileDownloadResponse(path=path, content=None, error="file_not_found"))
            except IsADirectoryError:
                out.append(FileDownloadResponse(path=path, content=None, error="is_directory"))
            except OSError:
                out.append(FileDownloadResponse(path=path, content=None, error="invalid_path"))
        return out

    def close(self) -> None:
        """Close the sandbox (its proxy and session /tmp)."""
        self._sandbox.close()

    def __enter__(self) -> StockadeBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
