"""Fixtures for the enforcement tests: a real launcher, a fake home and a workspace.

Everything runs against the real kernel.  When the tests run as root, the sandboxed
command runs as uid 65534 (``setpriv``), so that file permissions alone would allow
every access the tests expect Landlock to refuse: the canary is world-readable, the
"outside" directory world-writable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stockade._record import replace
from stockade.enforce import landlock, seccomp
from stockade.enforce.launcher import LauncherSpec, build_launcher, prepare

MUST_WORK = os.environ.get("STOCKADE_MUST_WORK") == "1"
NOBODY = 65534
PROBE = Path(__file__).with_name("_probe.py")
SYSTEM_PYTHON = "/usr/bin/python3"
# pytest for the in-sandbox pytest run: the venv's pure-Python packages, used by the
# system interpreter (the venv's own interpreter may live under an unreadable /root).
SITE_PACKAGES = next(Path(sys.prefix).glob("lib/python3*/site-packages"), None)

BWRAP = [
    "bwrap",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-all",
    "--die-with-parent",
    "--unshare-user",
    "--disable-userns",
]

READ_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/etc",
    "/proc",
    "/sys",
    "/dev/urandom",
    "/dev/random",
    str(PROBE.parent),
    *([str(SITE_PACKAGES)] if SITE_PACKAGES else []),
)
DEVICE_WRITE_PATHS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/pts", "/dev/ptmx")


def require(feature_ok: bool, reason: str) -> None:
    """Skip the test with ``reason`` when a kernel feature is missing.

    Under ``STOCKADE_MUST_WORK=1`` (CI) a missing feature fails the test instead: a
    skipped security test must never count as a pass there.
    """
    if feature_ok:
        return
    if MUST_WORK:
        pytest.fail(f"required feature missing (STOCKADE_MUST_WORK=1): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def abi() -> int:
    """The running kernel's Landlock ABI."""
    return landlock.abi_version()


@pytest.fixture(scope="session")
def shared_dir() -> Iterator[Path]:
    """A world-traversable directory for the launcher copy and the per-test boxes."""
    d = Path(tempfile.mkdtemp(prefix="stockade-enforce-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def launcher_bin(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Build the launcher in a private cache and copy it where uid 65534 can run it.

    The private cache stays in ``XDG_CACHE_HOME`` for the session, so that ``prepare``
    never builds into the real user's cache.
    """
    cache = tmp_path_factory.mktemp("xdg-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    try:
        built = build_launcher()
        target = shared_dir / "stockade-launcher"
        shutil.copy(built, target)
        target.chmod(0o755)
        yield target
    finally:
        if old is None:
            del os.environ["XDG_CACHE_HOME"]
        else:
            os.environ["XDG_CACHE_HOME"] = old


@dataclass
class Box:
    """One sandbox layout: a fake HOME with a canary, a workspace, an outside dir."""

    root: Path
    launcher: Path
    abi: int
    home: Path = field(init=False)
    canary: Path = field(init=False)
    ws: Path = field(init=False)
    outside: Path = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.ws = self.root / "ws"
        self.outside = self.root / "outside"
        for d in (self.home, self.ws, self.outside, self.ws / "tmp"):
            d.mkdir()
        self.canary = self.home / "canary"
        self.canary.write_text("CANARY-SECRET\n")
        self.canary.chmod(0o644)
        self.outside.chmod(0o777)
        if os.geteuid() == 0:
            # Owned by the sandbox user, so that only Landlock (not DAC or
            # fs.protected_hardlinks) can be what refuses reading or linking it.
            for p in (self.ws, self.ws / "tmp", self.canary):
                os.chown(p, NOBODY, NOBODY)

    def spec(self, **changes: object) -> LauncherSpec:
        """Both layers on, the workspace writable, the canary as must-deny probe."""
        base = LauncherSpec(
            read_paths=READ_PATHS,
            write_paths=(str(self.ws), *DEVICE_WRITE_PATHS, "/dev/shm"),
            landlock=True,
            scope=self.abi >= 6,
            seccomp_bpf=seccomp.build_filter(),
            seccomp_expected=True,
            deny_probe=str(self.canary),
        )
        return replace(base, **changes)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.ws),
            "TMPDIR": str(self.ws / "tmp"),
            "LANG": "C.UTF-8",
        }
        env.update(extra or {})
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        spec: LauncherSpec | None = None,
        bwrap: bool = False,
        root_in_bwrap: bool = False,
        bwrap_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` under the launcher, as uid 65534 when the tests run as root.

        ``bwrap`` puts bubblewrap in front (run by uid 65534), with ``bwrap_args`` added;
        ``root_in_bwrap`` runs bwrap as root with ``--cap-drop ALL`` instead.
        """
        prefix, fd = prepare(spec if spec is not None else self.spec())
        prefix[0] = str(self.launcher)
        outer: list[str] = []
        binds = ["--bind", str(self.ws), str(self.ws), "--chdir", str(self.ws)]
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        if root_in_bwrap:
            outer = [*BWRAP, *binds, "--cap-drop", "ALL", "--"]
        else:
            if os.geteuid() == 0:
                outer = drop
            if bwrap:
                outer = [*outer, *BWRAP, *binds, *bwrap_args, "--"]
        try:
            return subprocess.run(
                [*outer, *prefix, *argv],
                pass_fds=(fd,),
                capture_output=True,
                text=True,
                cwd=self.ws,
                env=self.env(env),
                timeout=timeout,
                check=False,
            )
        finally:
            os.close(fd)

    def probe(self, name: str, *args: str, **kw: object) -> str:
        """Run one probe of ``_probe.py`` inside and return its token (``ok``/errno)."""
        r = self.run([SYSTEM_PYTHON, str(PROBE), name, *args], **kw)  # type: ignore[arg-type]
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        return r.stdout.strip()

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside."""
        return self.run(["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]


@pytest.fixture
def box(shared_dir: Path, launcher_bin: Path, abi: int) -> Iterator[Box]:
    """A fresh layout per test; Landlock is required (fail under STOCKADE_MUST_WORK)."""
    require(abi >= 1, "kernel without Landlock")
    require(shutil.which("setpriv") is not None or os.geteuid() != 0, "setpriv missing")
    root = Path(tempfile.mkdtemp(prefix="box-", dir=shared_dir))
    root.chmod(0o755)
    yield Box(root=root, launcher=launcher_bin, abi=abi)
    shutil.rmtree(root, ignore_errors=True)


def bwrap_works() -> bool:
    """True when bubblewrap can build the namespaces the tests use."""
    if shutil.which("bwrap") is None:
        return False
    r = subprocess.run([*BWRAP, "--", "/bin/true"], capture_output=True, check=False)
    return r.returncode == 0
