"""The attack suite under the landlock backend, each case's outcome taken from the model.

A host that refuses user namespaces is made real as in
``tests/runtime/test_landlock_backend.py``: stockade runs under a parent that loads
stockade's own seccomp filter (refusing ``CLONE_NEWUSER``), as root and as uid 65534.
Every case of :mod:`tests.attacks.landlock_cases` is attempted inside one ``stockade run
--backend landlock`` (the world of attacks.md A.0: canaries, sinks, a sibling process of
the same user, a host SysV segment), judged from what the host saw, and compared with
what the model says the landlock backend does to the case's action, every layer on:
where the model says stopped it must be stopped, where it says the action gets through
it must get through (a real observation: the sink logged the nonce, the host file holds
it, the sibling died), so the model stays honest about what this backend loses.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stockade.model import Boundary
from stockade.policy import load_policy
from stockade.runtime import _host
from tests.attacks.conftest import Arena
from tests.attacks.landlock_cases import (
    CASES,
    DOCS_LAYOUT,
    LIMITS,
    MAY_END_THE_RUN,
    Case,
    Layout,
    Seen,
    docs_boundary,
    probe,
    verdict,
)
from tests.conftest import NOBODY, nobody_command, require
from tests.runtime.test_landlock_backend import _RESTRICT, _RESTRICT_PTRACE, _python_for

_IPC_CREAT, _IPC_EXCL, _IPC_RMID = 0o1000, 0o2000, 0


class LandlockArena(Arena):
    """The A.0 world, every ``stockade`` started under the restricting parent as ``who``."""

    def __init__(self, who: str, abi: int | None = None) -> None:
        self.who = who
        #: the Landlock ABI stockade is told to use at most (the connect guard below 4)
        self.abi = abi
        self.nonce = f"N{uuid.uuid4().hex}"
        super().__init__("landlock")
        (self.workspace / "src").mkdir()
        (self.workspace / "src" / "input").write_text(f"input {self.nonce}\n")
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp_log: list[bytes] = []
        threading.Thread(target=self._udp_sink, daemon=True).start()
        self._closers.append(self.udp.close)
        libc = ctypes.CDLL(None, use_errno=True)
        self.shm_key = int.from_bytes(os.urandom(3), "big") + 1
        self.shm_id = libc.shmget(self.shm_key, 4096, _IPC_CREAT | _IPC_EXCL | 0o666)
        assert self.shm_id >= 0, ctypes.get_errno()
        self._closers.append(lambda: libc.shmctl(self.shm_id, _IPC_RMID, None))
        self.python = _python_for(who)
        # Below ABI 4 the connect guard takes the command's sockets with pidfd_getfd,
        # which stockade's own filter (_RESTRICT's) refuses: a profile that allows it.
        restrict = [self.python, "-c", _RESTRICT if abi is None else _RESTRICT_PTRACE]
        if abi is not None:
            restrict = ["/usr/bin/env", f"STOCKADE_LANDLOCK_ABI_MAX={abi}", *restrict]
        if who == "root":
            self.prefix = [*restrict, self.python]
            self.run_env = self.env
        else:
            # chowns the world to uid 65534: every file is the sandbox user's own, so a
            # refusal is the sandbox's, never the permission bits'
            argv, self.run_env = nobody_command(self.world, [*restrict, self.python])
            self.prefix = argv
        self.sibling = self._start_sibling()
        # a host process's POSIX shared memory object, the sandbox user's own
        self.host_shm = Path("/dev/shm") / f"stockade-ll-{self.nonce}-host"
        self.host_shm.write_text(f"shm {self.canary}\n")
        if who != "root":
            os.chown(self.host_shm, NOBODY, NOBODY)
        self.host_shm.chmod(0o600)

    def policy_text(self, extra_allow: tuple[str, ...] = ()) -> str:
        limits = "".join(f"{k} = {v}\n" for k, v in LIMITS.items())
        return super().policy_text(extra_allow) + f"[limits]\n{limits}"

    def _udp_sink(self) -> None:
        while True:
            try:
                data, _ = self.udp.recvfrom(4096)
            except OSError:
                return
            self.udp_log.append(data)

    def _start_sibling(self) -> subprocess.Popen[bytes]:
        """F-HOSTPROC as the sandbox's own user: the canary in its environment, the
        nonce in its argv."""
        user = (
            []
            if self.who == "root"
            else ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        )
        proc = subprocess.Popen(
            [*user, self.python, "-c", "import time; time.sleep(600)", self.nonce],
            env={"SECRET": self.canary, "PATH": "/usr/bin:/bin"},
        )
        self._closers.append(proc.kill)
        self._closers.append(proc.wait)
        return proc

    def stockade(
        self,
        *args: str,
        timeout: float = 90,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *self.argv(*args)[1:]],
            cwd=cwd or self.workspace,
            env=env or self.run_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def cgroup(self) -> bool:
        """Whether a run of ``who`` under the restriction can make a cgroup (the model's
        ``cgroup`` fact, asked the way the run asks it)."""
        proc = subprocess.run(
            [
                *self.prefix,
                "-c",
                "from stockade.enforce import limits; print(limits.detect() is not None)",
            ],
            env=self.run_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return proc.stdout.strip() == "True"

    def layout(self) -> Layout:
        return Layout(
            root=self.root,
            home=self.home,
            workspace=self.workspace,
            nonce=self.nonce,
            canary=self.canary,
            tcp_port=self.tcp_port,
            udp_port=int(self.udp.getsockname()[1]),
            allowed_http=self.allowed.http_port,
            evil_http=self.evil.http_port,
            evil_https=self.evil.https_port,
            abstract=self.abstract,
            unix={k: str(v) for k, v in self.unix.items()},
            sibling_pid=self.sibling.pid,
            shm_key=self.shm_key,
            kernel=os.uname().release,
        )

    def survivors(self) -> list[int]:
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                    if f"{self.nonce}-survive".encode() in cmdline:
                        out.append(int(entry))
        return out

    def close(self) -> None:
        for pid in self.survivors():
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        for leftover in (
            Path("/tmp") / f"stockade-ll-{self.nonce}",
            Path("/dev/shm") / f"stockade-ll-{self.nonce}",
            Path("/dev/shm") / f"stockade-ll-{self.nonce}-host",
        ):
            with contextlib.suppress(OSError):
                leftover.unlink()
        super().close()


@dataclass
class Ran:
    """One run of every case, and what the model says of each."""

    layout: Layout
    lines: dict[str, dict[str, Any]]
    seen: Seen
    boundary: Boundary
    stderr: str


def _settled(arena: LandlockArena) -> tuple[list[str], list[str], list[str], list[str]]:
    """What the sinks logged, once they have logged nothing new for half a second (a
    sink logs a connection when its peer has closed it, which may trail the run)."""
    recs = (arena.rec_unix, arena.rec_tcp, arena.evil.rec, arena.allowed.rec)
    logs: list[list[str]] = [[], [], [], []]
    deadline = time.monotonic() + 10
    datagrams = -1
    while True:
        new = [rec.take() for rec in recs]
        for log, more in zip(logs, new, strict=True):
            log.extend(more)
        if (not any(new) and len(arena.udp_log) == datagrams) or time.monotonic() > deadline:
            break
        datagrams = len(arena.udp_log)
        time.sleep(0.5)
    return logs[0], logs[1], logs[2], logs[3]


@pytest.fixture(scope="module", params=["root", "nobody", "root-abi3", "nobody-abi3"])
def ran(request: pytest.FixtureRequest) -> Iterator[Ran]:
    """``who[-abi3]``: as root or uid 65534; with ``-abi3`` told to use Landlock ABI 3 at
    most (no TCP rules: the connect guard; no scopes)."""
    who, _, capped = str(request.param).partition("-")
    abi = 3 if capped else None
    require(_host.landlock_abi() >= 4, "Landlock ABI 4 (network rules) is not available")
    require(os.getuid() == 0, "the restriction and uid 65534 need root")
    if who == "nobody":
        require(shutil.which("setpriv") is not None, "no setpriv")
    arena = LandlockArena(who, abi)
    try:
        layout = arena.layout()
        cfg = dict(layout.config(), order=[c.id for c in CASES])
        result = arena.run("python3", "-c", probe(), json.dumps(cfg), timeout=180)
        unix, tcp, evil, allowed = _settled(arena)
        seen = Seen(
            unix=unix,
            tcp=tcp,
            udp=list(arena.udp_log),
            evil=evil,
            allowed=allowed,
            survivors=arena.survivors(),
            sibling_alive=arena.sibling.poll() is None,
        )
        policy = load_policy(arena.policy, workspace=arena.workspace)
        boundary = Boundary(
            policy,
            landlock_scopes=min(_host.landlock_abi(), abi or 99) >= 6,
            runtime="landlock",
            cgroup=arena.cgroup(),
        )
        assert any("landlock backend" in json.dumps(e) for e in result.audit), result.audit[:3]
        guard = any("connect guard" in json.dumps(e) for e in result.audit)
        assert guard == (abi is not None), result.audit[:3]
        yield Ran(layout, result.lines, seen, boundary, result.proc.stderr)
    finally:
        arena.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_outcome_is_the_models(ran: Ran, case: Case) -> None:
    action = case.action(ran.layout)
    expected, says = verdict(ran.boundary, action)
    # the docs' table (computed for another layout, with scopes) says the same of it
    if ran.boundary.landlock_scopes:
        docs = docs_boundary("landlock", cgroup=ran.boundary.cgroup)
        assert verdict(docs, case.action(DOCS_LAYOUT)) == (expected, says)
    line = ran.lines.get(case.id)
    if line is None and case.id in MAY_END_THE_RUN:
        got = False  # the run was ended (its cgroup's OOM killer): stopped
    else:
        assert line is None or "error" not in line, line
        got = case.judge(ran.layout, line, ran.seen)
    assert got == expected, (
        f"{case.id} ({case.attack}): the model says {says}, but it "
        f"{'got through' if got else 'was stopped'}: {line!r}; stderr={ran.stderr[-1500:]!r}"
    )


def test_every_case_reported(ran: Ran) -> None:
    missing = [c.id for c in CASES if c.id not in ran.lines and c.id not in MAY_END_THE_RUN]
    assert missing == [], ran.stderr[-3000:]
    assert len({c.id for c in CASES}) == len(CASES)
