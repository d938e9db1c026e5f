"""``stockade run --ask``: the terminal prompt under a real pty, the control channel driven
by a harness process, and no terminal at all.

The rule that matters most is checked on each channel: type-ahead and bytes the command
writes do not answer the prompt; the sandbox holds no descriptor of the control channel.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

HOSTS = '{ "a.test" = "127.0.0.1", "b.test" = "127.0.0.1" }'
PROMPT = b"choice, then Enter: "


def setup(world: World) -> Path:
    path = world.root / "p.toml"
    path.write_text(f"[network]\nhosts = {HOSTS}\n")
    return path


class Pty:
    """``stockade run`` on a pty of its own (pty.fork): the user's terminal."""

    def __init__(self, world: World, *args: str) -> None:
        env = dict(world.env, STOCKADE_SERVER="0", TERM="xterm")
        pid, fd = pty.fork()
        if pid == 0:  # pragma: no cover - the child
            os.chdir(world.workspace)
            os.execvpe(sys.executable, [sys.executable, "-m", "stockade", "run", *args], env)
        self.pid, self.fd = pid, fd
        self.out = b""

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while marker not in self.out and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:
                    return marker in self.out
        return marker in self.out

    def idle(self, seconds: float) -> None:
        self.read_until(b"\x00never\x00", seconds)

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.idle(0.2)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.idle(0.2)
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"stockade did not end: {self.out[-2000:]!r}")


def audit_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_prompt_allows_after_a_key_and_enter(world: World, ok_server: int) -> None:
    audit = world.root / "audit.jsonl"
    # The command sleeps first: keys typed meanwhile are its type-ahead, never an answer.
    p = Pty(
        world,
        "--policy",
        str(setup(world)),
        "--audit",
        str(audit),
        "--",
        "sh",
        "-c",
        f"sleep 1; curl -sS -m 60 http://a.test:{ok_server}/; echo; echo END",
    )
    p.type(b"r\r")  # type-ahead
    assert p.read_until(PROMPT), p.out[-2000:]
    assert b"a.test:" in p.out
    p.idle(1.0)
    assert b"allowed" not in p.out  # the type-ahead did not answer
    p.type(b"r")
    p.idle(0.7)
    assert b"allowed" not in p.out  # a key alone is not an answer: Enter is needed
    p.type(b"\r")
    assert p.read_until(b"END"), p.out[-2000:]
    assert p.wait() == 0
    assert b"ok" in p.out.split(b"allowed", 1)[1]
    events = audit_events(audit)
    (answer,) = [e for e in events if e["event"] == "answer"]
    assert answer["verdict"] == "allow"
    assert str(answer["answered_by"]).startswith("tty:")


def test_prompt_deny_and_the_commands_own_bytes(world: World, ok_server: int) -> None:
    audit = world.root / "audit.jsonl"
    # The command writes "r\r" and a cursor-position request to its terminal while it asks:
    # none of it reaches the prompt (the relay is paused, the input flushed).
    script = (
        # -f: the proxy's 403 fails curl, so REFUSED is the command's own word (the
        # prompt shows the command cut short, so it cannot supply it).
        f"(curl -fsS -m 60 http://a.test:{ok_server}/ || echo REFUSED) & "
        "for i in 1 2 3 4 5 6; do printf 'r\\r\\033[6n'; printf 'r\\r' > /dev/tty; sleep 0.2; done; "
        "wait; echo END"
    )
    p = Pty(world, "--policy", str(setup(world)), "--audit", str(audit), "--", "sh", "-c", script)
    assert p.read_until(PROMPT), p.out[-2000:]
    p.idle(2.0)
    assert b"allowed" not in p.out
    p.type(b"d\r")
    assert p.read_until(b"END"), p.out[-2000:]
    assert p.wait() == 0
    assert b"REFUSED" in p.out, p.out.decode(errors="replace")
    reasons = [e.get("reason") for e in audit_events(audit) if e["event"] == "answer"]
    assert reasons == ["user-denied"]


def test_no_terminal_means_approval_unavailable(world: World, ok_server: int) -> None:
    audit = world.root / "audit.jsonl"

    def run_without_terminal(mode: str) -> list[dict[str, object]]:
        """``stockade run --ask MODE -- curl`` with no controlling terminal; its events."""
        with contextlib.suppress(FileNotFoundError):
            audit.unlink()
        r = subprocess.run(
            [
                *(sys.executable, "-m", "stockade", "run", "--ask", mode),
                *("--policy", str(setup(world)), "--audit", str(audit), "--"),
                *("curl", "-fsS", "-m", "10", f"http://a.test:{ok_server}/"),
            ],
            cwd=world.workspace,
            env=dict(world.env, STOCKADE_SERVER="0"),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            timeout=60,
            check=False,
        )
        assert r.returncode != 0
        return audit_events(audit)

    reasons = {e.get("reason") for e in run_without_terminal("tty") if e.get("verdict") == "deny"}
    assert "approval-unavailable" in reasons
    # The twins: auto without a terminal, and never, keep today's denial.
    for mode in ("auto", "never"):
        events = run_without_terminal(mode)
        reasons = {e.get("reason") for e in events if e.get("verdict") == "deny"}
        assert reasons == {"host-not-allowed"}
        assert not [e for e in events if e["event"] == "ask"]


HARNESS = textwrap.dedent(
    """
    import json, os, socket, subprocess, sys
    mine, theirs = socket.socketpair()
    port, policy = sys.argv[1], sys.argv[2]
    script = (
        "ls /proc/self/fd | tr '\\\\n' ' '; echo; "
        f"curl -sS -m 30 http://a.test:{port}/ ; echo; "
        f"curl -fsS -m 30 http://b.test:{port}/ 2>/dev/null || echo B-REFUSED; "
        "sleep 2; "
        f"curl -sS -m 30 http://b.test:{port}/ ; echo"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stockade", "run", "--policy", policy,
         "--control-fd", str(theirs.fileno()), "--", "sh", "-c", script],
        pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    theirs.close()
    f = mine.makefile("rwb", buffering=0)
    def send(m): f.write(json.dumps(m).encode() + b"\\n")
    seen = [json.loads(f.readline())]
    send({"type": "hello", "protocol": "stockade-control/1"})
    send({"type": "update", "id": "u0", "allow": ["*"]})
    while True:
        line = f.readline()
        if not line:
            break
        m = json.loads(line)
        seen.append(m)
        if m["type"] == "ask" and m["host"] == "a.test":
            send({"type": "answer", "id": m["id"], "decision": "allow", "scope": "run"})
        elif m["type"] == "ask" and m["host"] == "b.test":
            send({"type": "answer", "id": m["id"], "decision": "deny", "reason": "no"})
            send({"type": "update", "id": "u1", "allow": ["b.test"]})
    out, err = proc.communicate(timeout=60)
    print(json.dumps({"seen": seen, "out": out.decode(), "err": err.decode(), "code": proc.returncode}))
    """
)


def test_control_channel_driven_by_a_harness(world: World, ok_server: int) -> None:
    harness = world.root / "harness.py"
    harness.write_text(HARNESS)
    r = subprocess.run(
        [sys.executable, str(harness), str(ok_server), str(setup(world))],
        cwd=world.workspace,
        env=dict(world.env, STOCKADE_SERVER="0"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    result = json.loads(r.stdout)
    seen = result["seen"]
    assert seen[0]["type"] == "hello"
    assert seen[0]["protocol"] == "stockade-control/1"
    acks = {m["id"]: m for m in seen if m["type"] == "ack"}
    assert acks["u0"]["ok"] is False  # "*" is refused: a delta can never open everything
    assert acks["u1"]["ok"] is True
    assert acks["u1"]["policy_generation"] > 1
    asks = [m["host"] for m in seen if m["type"] == "ask"]
    assert asks == ["a.test", "b.test"]  # after u1, b.test passes without asking
    fds, a, b1, b2 = result["out"].splitlines()[:4]
    assert set(fds.split()) <= {"0", "1", "2", "3"}  # no descriptor of the channel inside
    assert a == "ok"
    assert b1 == "B-REFUSED"
    assert b2 == "ok"


def test_eof_on_the_control_channel_denies(world: World, ok_server: int) -> None:
    import socket

    mine, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stockade",
            "run",
            "--policy",
            str(setup(world)),
            "--control-fd",
            str(theirs.fileno()),
            "--",
            "sh",
            "-c",
            f"sleep 1; curl -fsS -m 20 http://a.test:{ok_server}/ || echo REFUSED",
        ],
        pass_fds=[theirs.fileno()],
        cwd=world.workspace,
        env=dict(world.env, STOCKADE_SERVER="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    theirs.close()
    f = mine.makefile("rwb", buffering=0)
    assert json.loads(f.readline())["type"] == "hello"
    f.write(b'{"type":"hello","protocol":"stockade-control/1"}\n')
    mine.close()
    f.close()
    out, _ = proc.communicate(timeout=60)
    assert b"REFUSED" in out


def test_prompt_offers_only_what_it_accepts_and_says_the_scope(
    world: World, ok_server: int
) -> None:
    # Issue 24 item 9: with --policy "always" cannot be stored, so it is neither offered
    # nor named in the retry line; the long command is cut with an ellipsis; the answer
    # says which scope was granted.
    long_arg = "x" * 80
    p = Pty(
        world,
        "--policy",
        str(setup(world)),
        "--",
        "sh",
        "-c",
        f"curl -sS -m 60 http://a.test:{ok_server}/; echo; echo END",
        long_arg,
    )
    assert p.read_until(PROMPT), p.out[-2000:]
    prompt = p.out.decode(errors="replace")
    assert "[a]" not in prompt
    assert "...)" in prompt
    assert long_arg not in prompt
    p.idle(1.0)  # past the prompt's settle time: earlier keys are flushed as type-ahead
    p.type(b"a\r")
    assert p.read_until(b"type r, s, d or D, then Enter: ", 10), p.out[-2000:]
    p.type(b"s\r")
    assert p.read_until(b"END"), p.out[-2000:]
    assert p.wait() == 0
    assert b"stockade: allowed for this session" in p.out


def test_one_refusal_on_the_terminal_is_counted_once(world: World, ok_server: int) -> None:
    p = Pty(
        world,
        "--policy",
        str(setup(world)),
        "--",
        "sh",
        "-c",
        f"curl -sS -m 60 http://a.test:{ok_server}/ || echo REFUSED; echo END",
    )
    assert p.read_until(PROMPT), p.out[-2000:]
    p.idle(1.0)
    p.type(b"d\r")
    assert p.read_until(b"END"), p.out[-2000:]
    assert p.wait() == 0
    assert b"stockade: denied\r\n" in p.out
    # The answer and the connection it refused are one denial, not two.
    assert b"stockade: denied 1: 1 egress user-denied (GET a.test:" in p.out, p.out[-2000:]
