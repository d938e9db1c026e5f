"""Asking and live changes through the public API, with real bubblewrap and curl.

Names under .test are pinned to 127.0.0.1 (network.hosts) and left off the allow-list,
so each request reaches the proxy as an allow-list miss.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import stockade
from stockade import AccessRequest, Answer, Scope, approvers
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

HOSTS = '{ "a.test" = "127.0.0.1", "b.test" = "127.0.0.1", "base.test" = "127.0.0.1" }'


def policy(world: World, extra: str = "") -> Path:
    path = world.root / "p.toml"
    path.write_text(f'[network]\nallow = ["base.test"]\nhosts = {HOSTS}\n{extra}')
    return path


def curl(port: int, host: str = "a.test") -> list[str]:
    return ["curl", "-fsS", "-m", "20", f"http://{host}:{port}/"]


def run_curl(
    world: World, port: int, *, policy_path: Path | None = None, **options: Any
) -> stockade.CompletedRun:
    """curl a.test:``port`` in a sandbox of ``world`` (``options``: ask, ask_timeout)."""
    return stockade.run(
        curl(port),
        policy=policy_path or policy(world),
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        **options,
    )


def events(result: stockade.CompletedRun, name: str) -> list[dict[str, object]]:
    return [e for e in result.events if e["event"] == name]


def test_run_asks_and_allows_for_the_run(world: World, ok_server: int) -> None:
    ask = approvers.scripted({"a.test": Answer.allow()})
    r = run_curl(world, ok_server, ask=ask)
    assert r.stdout == "ok", r.stderr
    (asked,) = ask.asked
    assert (asked.host, asked.port, asked.argv[0]) == ("a.test", ok_server, "curl")
    assert asked.run_id == r.run_id
    (answer,) = events(r, "answer")
    assert answer["verdict"] == "allow"
    assert answer["answered_by"] == "callback:approvers.scripted"
    # A second run asks again: a run grant ends with its run.
    r2 = run_curl(world, ok_server, ask=ask)
    assert r2.stdout == "ok"
    assert len(ask.asked) == 2


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Answer.deny("no"), "user-denied"),
        (RuntimeError("boom"), "approval-error"),
        (Answer.allow(pattern="b.test"), "approval-error"),
        ("slow", "approval-timeout"),
    ],
)
def test_denials_are_audited(world: World, ok_server: int, answer: object, reason: str) -> None:
    def approver(request: AccessRequest) -> Any:
        if answer == "slow":
            time.sleep(2)
            return True
        if isinstance(answer, BaseException):
            raise answer
        return answer

    r = run_curl(world, ok_server, ask=approver, ask_timeout=0.5)
    assert r.returncode != 0
    assert reason in {str(d.get("reason")) for d in r.denials}
    assert [e["reason"] for e in events(r, "answer")] == [reason]


def test_without_an_approver_nothing_is_asked(world: World, ok_server: int) -> None:
    r = run_curl(world, ok_server)
    assert r.returncode != 0
    assert events(r, "ask") == []
    assert "host-not-allowed" in {d.get("reason") for d in r.denials}


def test_strict_policy_turns_asking_off(world: World, ok_server: int) -> None:
    ask = approvers.scripted({"a.test": True})
    r = run_curl(world, ok_server, policy_path=policy(world, "strict = true\n"), ask=ask)
    assert r.returncode != 0
    assert ask.asked == []


def test_session_answers_are_remembered_by_the_sandbox(world: World, ok_server: int) -> None:
    ask = approvers.scripted({"a.test": Answer.allow(Scope.SESSION)})
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env, ask=ask) as sb:
        for _ in range(2):
            r = sb.run(curl(ok_server), capture_output=True, text=True)
            assert r.stdout == "ok", r.stderr
        assert len(ask.asked) == 1
        assert [(g.pattern, g.scope) for g in sb.grants] == [(f"a.test:{ok_server}", Scope.SESSION)]


def test_async_approver_runs_on_the_callers_loop(world: World, ok_server: int) -> None:
    seen: list[object] = []

    async def approver(request: AccessRequest) -> Answer:
        seen.append(asyncio.get_running_loop())
        return Answer.allow()

    async def main() -> stockade.CompletedRun:
        with stockade.Sandbox(
            policy(world), workspace=world.workspace, env=world.env, ask=approver
        ) as sb:
            with pytest.raises(TypeError):
                sb.run(["true"])
            seen.append(asyncio.get_running_loop())
            return await sb.arun(curl(ok_server), capture_output=True, text=True)

    r = asyncio.run(main())
    assert r.stdout == "ok"
    assert seen[0] is seen[1]
    with pytest.raises(TypeError):
        stockade.run(["true"], ask=approver, workspace=world.workspace, env=world.env)


#: a command that fetches b.test ten times a second, each result as a line on stdout and in
#: progress.log (the test paces itself on that file), until a file named stop appears
LOOP = """
import os, sys, time, urllib.request
log = open("progress.log", "a", buffering=1)
for i in range(1200):
    try:
        body = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
        line = f"{i} ok"
    except Exception as exc:
        line = f"{i} err {type(exc).__name__} {getattr(exc, 'code', '')}"
    print(line, flush=True)
    log.write(line + "\\n")
    if os.path.exists("stop"):
        break
    time.sleep(0.1)
"""


def wait_for_states(progress: Path, want: list[str], timeout: float = 60) -> None:
    """Wait until the states a loop wrote to ``progress`` contain ``want`` in order (a
    subsequence): the test moves on when the command has really reached a phase, not
    after a sleep that a loaded machine outruns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = progress.read_text() if progress.exists() else ""
        states = [ln.split()[1] for ln in text.splitlines() if len(ln.split()) > 1]
        it = iter(states)
        if all(w in it for w in want):
            return
        time.sleep(0.05)
    raise AssertionError(f"the command never reached {want}: {progress.read_text()!r}")


def test_live_allow_and_revoke(world: World, ok_server: int) -> None:
    """A running command gets 403, then 200 after sb.allow, then 403 after sb.revoke."""
    script = world.workspace / "loop.py"
    script.write_text(LOOP)
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        out: list[str] = []

        def run() -> None:
            r = sb.run(
                ["python3", "loop.py", f"http://b.test:{ok_server}/"],
                cwd=world.workspace,
                capture_output=True,
                text=True,
                timeout=60,
            )
            out.append(r.stdout)

        progress = world.workspace / "progress.log"
        t = threading.Thread(target=run)
        t.start()
        wait_for_states(progress, ["err"])
        sb.allow("b.test")
        wait_for_states(progress, ["err", "ok"])
        sb.revoke("b.test")
        wait_for_states(progress, ["err", "ok", "err"])
        (world.workspace / "stop").touch()
        t.join(90)
    lines = out[0].splitlines()
    states = [line.split()[1] for line in lines]
    first_ok = states.index("ok")
    assert "err" in states[:first_ok]
    assert "err" in states[first_ok:]
    assert states[-1] == "err"


#: a client that ignores the proxy variables: it resolves the name itself (stockade's
#: resolver) and connects straight to the address it got (transparent capture)
DIRECT_LOOP = """
import os, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
log = open("progress.log", "a", buffering=1)
for i in range(600):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(f"GET / HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode())
            head = s.recv(64)
        line = f"{i} {'ok' if head.split(b' ')[1:2] == [b'200'] else 'err'} {head[:20]!r}"
    except OSError as exc:
        line = f"{i} err {type(exc).__name__}"
    print(line, flush=True)
    log.write(line + "\\n")
    # Done once the grant has been seen working (the test asserts the last line is ok).
    if line.split()[1] == "ok":
        break
    time.sleep(0.1)
"""


def test_a_port_allowed_live_is_captured_for_a_client_that_ignores_the_proxy(
    world: World, ok_server: int
) -> None:
    """Capture listens on the ports known at start (80, 443, the policy's); a port a live
    grant names gets its listener when the grant is made, so a direct client reaches it."""
    (world.workspace / "direct.py").write_text(DIRECT_LOOP)
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        out: list[stockade.CompletedRun] = []

        def run() -> None:
            out.append(
                sb.run(
                    ["python3", "direct.py", "b.test", str(ok_server)],
                    cwd=world.workspace,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            )

        t = threading.Thread(target=run)
        t.start()
        wait_for_states(world.workspace / "progress.log", ["err"])
        sb.allow(f"b.test:{ok_server}")
        t.join(90)
    (r,) = out
    states = [line.split()[1] for line in r.stdout.splitlines()]
    # Refused before the grant (the resolver knew no b.test), reached after it.
    assert "err" in states, r.stdout
    assert "ok" in states, (r.stdout, r.stderr)
    assert states[-1] == "ok"
    assert states.index("ok") > states.index("err")
    (added,) = events(r, "capture_added")
    assert added["ports"] == [ok_server]
    # Decided and audited by the proxy like any captured connection.
    allowed = [e for e in events(r, "net_connect") if e.get("verdict") == "allow"]
    assert any(e.get("host") == "b.test" for e in allowed), events(r, "net_connect")


def test_revoke_closes_an_open_tunnel(world: World, tls_echo: int) -> None:
    """A CONNECT tunnel to b.test stays open until sb.revoke("b.test", close=True)."""
    code = (
        "import socket, sys, time\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT b.test:{tls_echo} HTTP/1.1\\r\\nHost: b.test\\r\\n\\r\\n')\n"
        "print(s.recv(100).split(b'\\r\\n')[0].decode(), flush=True)\n"
        "open('tunnel-open', 'w').close()\n"
        "s.settimeout(30)\n"
        "print('closed' if s.recv(100) == b'' else 'data', flush=True)\n"
    )
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        sb.allow(f"b.test:{tls_echo}")
        out: list[stockade.CompletedRun] = []
        t = threading.Thread(
            target=lambda: out.append(
                sb.run(
                    ["python3", "-c", code],
                    cwd=world.workspace,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            )
        )
        t.start()
        # Revoke once the tunnel is open (the command says so in the workspace).
        deadline = time.monotonic() + 60
        while not (world.workspace / "tunnel-open").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        sb.revoke("b.test", close=True)
        t.join(60)
    r = out[0]
    assert r.stdout.splitlines() == ["HTTP/1.1 200 Connection established", "closed"], r.stderr
    revoked = [e for e in r.events if e.get("reason") == "host-revoked"]
    assert revoked, json.dumps(r.events, default=str)[-2000:]


@pytest.fixture
def tls_echo() -> object:
    """A TCP server on 127.0.0.1 that holds connections open (a non-TLS port here)."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in conns:
        c.close()


def test_the_sandbox_holds_no_descriptor_of_the_approver(world: World, ok_server: int) -> None:
    """The rule that matters most: inside, /proc/self/fd shows 0-2 (and the listing's own),
    /dev/tty does not open, and the proxy has no magic host or path to answer with."""
    ask = approvers.scripted({}, default=False)
    probe = (
        "import os\n"
        "print(sorted(os.listdir('/proc/self/fd')))\n"
        "try:\n    open('/dev/tty', 'rb')\n    print('tty open')\n"
        "except OSError as e:\n    print('tty', e.errno)\n"
    )
    r = stockade.run(
        ["python3", "-c", probe],
        policy=policy(world),
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        ask=ask,
    )
    fds, tty = r.stdout.splitlines()
    assert set(json.loads(fds.replace("'", '"'))) <= {"0", "1", "2", "3"}
    assert tty == "tty 6"  # ENXIO: no controlling terminal inside
    # Requests shaped like approval endpoints are ordinary denied requests.
    attempts = [
        "http://stockade.approve/a1?decision=allow",
        "http://127.0.0.1:3128/approve",
        "http://localhost/stockade/answer",
    ]
    for url in attempts:
        stockade.run(
            ["curl", "-sS", "-m", "5", "-X", "POST", url],
            policy=policy(world),
            workspace=world.workspace,
            env=world.env,
            capture_output=True,
            ask=ask,
        )
    r = run_curl(world, ok_server, ask=ask)
    assert r.returncode != 0  # nothing above granted a.test
    assert all(not a.answers for a in [ask])
    # The twin: the allowed host still works with the same approver.
    ok = stockade.run(
        curl(ok_server, "base.test"),
        policy=policy(world),
        workspace=world.workspace,
        env=world.env,
        capture_output=True,
        text=True,
        ask=ask,
    )
    assert ok.stdout == "ok"
    assert subprocess.run(["true"]).returncode == 0


DIRECT = (
    "import socket, sys\n"
    "port = int(sys.argv[1])\n"
    "try:\n"
    "    with socket.create_connection(('b.test', port), timeout=10) as s:\n"
    "        s.sendall(b'GET / HTTP/1.0\\r\\nHost: b.test\\r\\n\\r\\n')\n"
    "        print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
    "except OSError as exc:\n"
    "    print(type(exc).__name__)\n"
)


def test_a_grant_made_before_the_run_is_captured(world: World, ok_server: int) -> None:
    """Issue 24 item 11: a port granted before the sandbox's network namespace existed
    gets its capture listener, so a client that ignores the proxy variables reaches it."""
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        before = sb.run(
            ["python3", "-c", DIRECT, str(ok_server)], capture_output=True, text=True, timeout=60
        )
        # The twin: not granted yet, the same direct connection finds nothing to accept it.
        assert before.stdout.strip() == "ConnectionRefusedError", before.stderr
        sb.allow(f"b.test:{ok_server}")
        after = sb.run(
            ["python3", "-c", DIRECT, str(ok_server)], capture_output=True, text=True, timeout=60
        )
        assert after.stdout.strip() == "HTTP/1.0 200 OK", after.stderr


def test_deny_after_allow_wins(world: World, ok_server: int) -> None:
    """sb.deny(h) after sb.allow(h): deny wins (DESIGN §4: a deny wins over every allow)."""
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        sb.allow("b.test")
        ok = sb.run(curl(ok_server, "b.test"), capture_output=True, text=True)
        assert ok.stdout == "ok", ok.stderr  # the twin: the allow took effect
        before = sb.generation
        assert sb.deny("b.test") == before + 1
        r = sb.run(curl(ok_server, "b.test"), capture_output=True, text=True)
    assert r.returncode != 0
    assert "host-denied" in {d.get("reason") for d in r.denials}, r.denials


def test_allow_after_deny_is_refused_until_revoked(world: World, ok_server: int) -> None:
    """sb.allow(h) after sb.deny(h) would change nothing (deny wins): it raises, naming
    the live deny and the fix, and counts no generation; after sb.revoke(h) it works."""
    with stockade.Sandbox(policy(world), workspace=world.workspace, env=world.env) as sb:
        sb.deny("b.test")
        before = sb.generation
        with pytest.raises(stockade.PolicyError) as info:
            sb.allow(f"b.test:{ok_server}")
        assert str(info.value) == (
            f'"b.test:{ok_server}" is denied by the live deny "b.test"; deny wins over '
            'allow: revoke "b.test" first (Sandbox.revoke, stockade approvals revoke)'
        )
        assert sb.generation == before
        denied = sb.run(curl(ok_server, "b.test"), capture_output=True, text=True)
        assert denied.returncode != 0
        assert "host-denied" in {d.get("reason") for d in denied.denials}
        sb.revoke("b.test")
        sb.allow(f"b.test:{ok_server}")
        ok = sb.run(curl(ok_server, "b.test"), capture_output=True, text=True)
    assert ok.stdout == "ok", ok.stderr
