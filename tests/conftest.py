"""Shared fixtures: a throw-away world (HOME with canaries, a workspace) and helpers.

Kernel-dependent tests call :func:`require`: without the feature they skip with a
reason, but under ``STOCKADE_MUST_WORK=1`` (set by ``.ci/run``) a missing feature fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MUST_WORK = os.environ.get("STOCKADE_MUST_WORK") == "1"


def wait_for_file(path: Path, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    """Wait until ``path`` exists (a sandboxed command touched it), while ``proc`` (the
    stockade run) is still running; fail with its output when it ends first, or after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout:g}s"
        time.sleep(0.02)


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
        [
            bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--disable-userns",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--",
            "/bin/true",
        ],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


@pytest.fixture
def ok_server() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering every GET with "ok"; yields its port."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


#: The user's cache as it was when the tests were collected: a session fixture elsewhere
#: points XDG_CACHE_HOME at a private cache for the run (tests/enforce/conftest.py).
_CACHE_ENV = {k: v for k, v in os.environ.items() if k in ("HOME", "XDG_CACHE_HOME")}


@pytest.fixture(scope="session")
def runsc() -> str:
    """The path of a usable runsc (gVisor), for the tests that run the gvisor backend.

    Opt-in locally (a plain scripts/test downloads no runsc); CI sets STOCKADE_GVISOR=1,
    and under STOCKADE_MUST_WORK=1 a run without it, or without a usable runsc, fails
    rather than skips. Name it to stockade as STOCKADE_RUNSC: a test world's HOME is fake.
    """
    require(
        os.environ.get("STOCKADE_GVISOR") == "1",
        "gVisor end-to-end tests are opt-in: set STOCKADE_GVISOR=1 (docs/gvisor.md)",
    )
    from stockade import Unavailable
    from stockade.enforce import gvisor

    try:
        env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
        found = gvisor.require_runsc({**env, **_CACHE_ENV})
    except Unavailable as exc:
        require(False, f"runsc: {exc}")
        raise
    return str(found.path)


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
    #: how the stockade command is started (the compiled front end, in some tests)
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "stockade"])

    def stockade(
        self,
        *args: str,
        timeout: float = 60,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the stockade CLI in this world (cwd = workspace)."""
        return subprocess.run(
            [*self.command, *args],
            cwd=cwd or self.workspace,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
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
def world() -> Iterator[World]:
    """F-CANARY of attacks.md: canary secrets in a fake HOME and in the environment.

    It lives in its own directory under /tmp (pytest's tmp_path is 0700 root's), so that
    the same world also serves the tests that run stockade as uid 65534.
    """
    root = Path(tempfile.mkdtemp(prefix="stockade-world-"))
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
    try:
        yield World(root, home, workspace, canary, env)
    finally:
        shutil.rmtree(root, ignore_errors=True)


NOBODY = 65534


def _nobody_python(*, from_any_process: bool = False) -> str | None:
    """A Python >= 3.11 that uid 65534 can execute (the venv's may live under /root).

    setpriv still holds root's capabilities while it execs, so a path under /root passes
    through it; ``from_any_process`` asks for one that a process of uid 65534 can exec
    itself (as the compiled front end does).
    """
    for cand in (
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        shutil.which("python3") or "",
    ):
        if not cand:
            continue
        proc = subprocess.run(
            [
                "setpriv",
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                *(["sh", "-c", 'exec "$0" "$@"'] if from_any_process else []),
                cand,
                "-c",
                "import sys; sys.exit(sys.version_info < (3, 11))",
            ],
            capture_output=True,
            check=False,
        )
        if proc.returncode == 0:
            return cand
    return None


def nobody_gvisor(world: World, runsc: str) -> list[str]:
    """Prepare ``world`` for a gVisor run as uid 65534; return the command for
    :func:`as_nobody`.

    A user without root has a runsc of their own (here a copy in the world, which
    as_nobody hands to uid 65534), named by STOCKADE_RUNSC; and a Python that uid 65534
    can execute from any process, not only through setpriv (the gVisor entry was once
    that interpreter started again; it is a C program now, built into that user's
    cache, and the stricter choice is kept).
    """
    own = world.root / "bin" / "runsc"
    own.parent.mkdir(exist_ok=True)
    shutil.copy(runsc, own)
    world.env["STOCKADE_RUNSC"] = str(own)
    python = _nobody_python(from_any_process=True) if os.getuid() == 0 else sys.executable
    require(python is not None, "no Python >= 3.11 that uid 65534 can execute")
    assert python is not None
    return [python, "-m", "stockade"]


def nobody_command(
    world: World, command: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv prefix and environment that run the stockade CLI as uid 65534 in
    ``world`` (chowned to it first; root only); ``command`` replaces ``python -m
    stockade``."""
    python = _nobody_python()
    require(
        python is not None and shutil.which("setpriv") is not None,
        "no Python >= 3.11 executable by uid 65534, or no setpriv",
    )
    assert python is not None
    import sysconfig

    src = Path(__file__).resolve().parent.parent / "src"
    site = sysconfig.get_paths()["purelib"]
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(world.root)], check=True)
    env = dict(world.env, PYTHONPATH=f"{src}:{site}", XDG_CACHE_HOME=str(world.root / "cache"))
    argv = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        *(command or [python, "-m", "stockade"]),
    ]
    return argv, env


def as_nobody(
    world: World, *args: str, timeout: float = 60, command: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the stockade CLI as uid 65534 in ``world`` (which is chowned to it first);
    ``command`` replaces ``python -m stockade``."""
    if os.getuid() != 0:
        if command is None:
            return world.stockade(*args, timeout=timeout)
        return subprocess.run(
            [*command, *args],
            cwd=world.workspace,
            env=world.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    argv, env = nobody_command(world, command)
    return subprocess.run(
        [*argv, *args],
        cwd=world.workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
