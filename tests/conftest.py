"""Shared fixtures: a throw-away world (HOME with canaries, a workspace) and helpers.

Kernel-dependent tests call :func:`require`: without the feature they skip with a
reason, but under ``STOCKADE_MUST_WORK=1`` (set by ``.ci/run``) a missing feature fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MUST_WORK = os.environ.get("STOCKADE_MUST_WORK") == "1"


def require(ok: bool, reason: str) -> None:
    """Skip (or, under STOCKADE_MUST_WORK=1, fail) when a needed feature is missing."""
    if ok:
        return
    if MUST_WORK:
        pytest.fail(f"required feature missing under STOCKADE_MUST_WORK=1: {reason}")
    pytest.skip(reason)


def bwrap_works() -> bool:
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return False
    proc = subprocess.run(
        [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--disable-userns",
         "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/true"],
        capture_output=True, check=False,
    )
    return proc.returncode == 0


@pytest.fixture(scope="session")
def kernel() -> None:
    """Require bubblewrap with user namespaces."""
    require(bwrap_works(), "bubblewrap with unprivileged user namespaces is not available")


@dataclass
class World:
    """A temporary HOME with canary secrets, a workspace and the environment to use."""

    root: Path
    home: Path
    workspace: Path
    canary: str
    env: dict[str, str]

    def stockade(self, *args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run the stockade CLI in this world (cwd = workspace)."""
        return subprocess.run(
            [sys.executable, "-m", "stockade", *args],
            cwd=kw.pop("cwd", self.workspace),
            env=kw.pop("env", self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,  # type: ignore[arg-type]
        )


SECRET_FILES = (
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".npmrc",
    ".netrc",
    ".config/gh/hosts.yml",
    ".git-credentials",
    ".docker/config.json",
    ".kube/config",
)
SECRET_ENV = ("GH_TOKEN", "NPM_TOKEN", "AWS_SECRET_ACCESS_KEY", "ANTHROPIC_API_KEY", "DATABASE_URL")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """F-CANARY of attacks.md: canary secrets in a fake HOME and in the environment."""
    root = tmp_path
    os.chmod(root, 0o755)
    home = root / "home"
    canary = f"CANARY-{uuid.uuid4()}"
    for rel in SECRET_FILES:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"secret {canary}\n")
    (home / ".bashrc").write_text("# bashrc\n")
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "README").write_text("workspace file\n")
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env.update(
        HOME=str(home),
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
    )
    for name in SECRET_ENV:
        env[name] = canary
    yield World(root, home, workspace, canary, env)
