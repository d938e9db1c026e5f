"""``stockade server``: runs served by a warm server behave as in-process runs.

The container tests of tests/runtime/test_container.py run again here with a server
listening for the world's user; the fixture checks that each of them really went
through it. The server's own guarantees follow: who it declines (and that a declined
caller still gets its sandboxed run), signals, a caller killed outright, stale code.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.cli import _client, server
from tests.conftest import World, _nobody_python, require

# The tests imported here (noqa: F401) are collected again in this module, where every
# world has a server (see the `world` fixture).
from tests.runtime.test_container import (
    cli_run_argv,
    kill_stockade_mid_run,
    run,
    test_allowed_env_passes,  # noqa: F401
    test_audit_log_records_start_end_and_denials,  # noqa: F401
    test_background_process_does_not_survive,  # noqa: F401
    test_canary_files_in_home_are_invisible,  # noqa: F401
    test_command_not_found_is_127,  # noqa: F401
    test_credential_env_is_absent,  # noqa: F401
    test_exit_codes_pass_through,  # noqa: F401
    test_host_pids_are_invisible,  # noqa: F401
    test_killed_by_signal_is_128_plus_n,  # noqa: F401
    test_malformed_policy_exits_125_naming_the_key,  # noqa: F401
    test_protected_paths_are_read_only,  # noqa: F401
    test_sigterm_reaches_the_command,  # noqa: F401
    test_timeout_kills_the_tree_and_exits_124,  # noqa: F401
    test_workspace_file_is_readable,  # noqa: F401
    test_write_inside_workspace_works,  # noqa: F401
    test_write_outside_workspace_fails,  # noqa: F401
)
from tests.runtime.test_layers import (
    test_interactive_bash_under_a_pty,  # noqa: F401
    test_tiocsti_cannot_reach_the_callers_terminal,  # noqa: F401
)

pytestmark = pytest.mark.usefixtures("kernel")


def server_events(world: World, kind: str | None = None) -> list[dict[str, object]]:
    log = Path(_client.socket_path(world.env)).with_suffix(".jsonl")
    if not log.exists():
        return []
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in events if kind is None or e["event"] == kind]


def start_server(world: World) -> None:
    proc = world.stockade("server", "start")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started" in proc.stdout


@pytest.fixture(scope="module")
def frontend() -> str:
    """The compiled front end of the stockade command (cli/_frontend.c), built for this
    installation."""
    from stockade.cli import _frontend

    return str(_frontend.build_frontend())


@pytest.fixture(params=["python", "compiled"])
def world(world: World, request: pytest.FixtureRequest) -> Iterator[World]:
    """The shared world, with a run server for its user; every test must be served.

    Each test runs twice: with the Python CLI as the client, and with the compiled front
    end, which speaks the same protocol without starting Python.
    """
    if request.param == "compiled":
        world.command = [request.getfixturevalue("frontend")]
    start_server(world)
    try:
        yield world
        assert server_events(world, "server_run"), "no run went through the server"
    finally:
        world.stockade("server", "stop")


def test_status_start_stop(world: World) -> None:
    status = world.stockade("server", "status")
    assert status.returncode == 0
    assert "running, pid" in status.stdout
    again = world.stockade("server", "start")
    assert "already running" in again.stdout
    assert run(world, "true").returncode == 0
    stop = world.stockade("server", "stop")
    assert "stopped" in stop.stdout
    assert world.stockade("server", "status").returncode == 1
    assert not Path(_client.socket_path(world.env)).exists()
    # With no server, the run happens in-process, just as well.
    before = len(server_events(world, "server_run"))
    assert run(world, "sh", "-c", "exit 3").returncode == 3
    assert len(server_events(world, "server_run")) == before


def test_caller_state_reaches_the_run(world: World) -> None:
    (world.workspace / "sub").mkdir()
    proc = subprocess.run(
        cli_run_argv(
            world, "sh", "-c", "read line; echo in=$line; pwd; umask; ulimit -n; echo err >&2"
        ),
        input="hello\n",
        cwd=world.workspace / "sub",
        env=world.env,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=_narrow_process_state,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["in=hello", str(world.workspace / "sub"), "0027", "200"]
    assert proc.stderr.startswith("err\n")
    argv = server_events(world, "server_run")[-1]["argv"]
    assert isinstance(argv, list)
    assert argv[-1].startswith("read line")


def test_a_usage_error_is_the_clis_own_not_a_traceback(world: World) -> None:
    """A served ``stockade run`` with an option it does not know ends as in process: the
    usage and 125, no traceback of the worker's; the twin runs."""
    proc = world.stockade("run", "--no-such-option", "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert "unrecognized arguments: --no-such-option" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert run(world, "true").returncode == 0


def _narrow_process_state() -> None:
    """The caller's umask and open-file limit, which the served run must inherit."""
    import resource

    os.umask(0o027)
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))


def test_a_killed_caller_takes_its_sandbox_along(world: World) -> None:
    kill_stockade_mid_run(world, f"{world.canary}-served-kill")
    # The next run (served too) tidies what the killed one left in the workspace.
    assert run(world, "true").returncode == 0
    assert sorted(os.listdir(world.workspace)) == ["README"]


def test_a_confined_caller_is_declined_and_runs_in_process(world: World) -> None:
    """no_new_privs stands for any confinement the server lacks: seccomp, a sandbox."""
    before = len(server_events(world, "server_run"))
    proc = subprocess.run(
        ["setpriv", "--no-new-privs", *world.command, "run", "--", "echo", "ok"],
        cwd=world.workspace,
        env=dict(world.env, STOCKADE_DEBUG="1"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"
    assert "the run server declined (its NoNewPrivs" in proc.stderr
    declined = server_events(world, "server_declined")
    assert declined
    assert "NoNewPrivs" in str(declined[-1]["detail"])
    assert len(server_events(world, "server_run")) == before
    # The twin: the same caller without the flag is served.
    assert run(world, "echo", "ok").stdout == "ok\n"
    assert len(server_events(world, "server_run")) == before + 1


@pytest.mark.parametrize(
    ("wrapper", "field"),
    [
        (["setpriv", "--no-new-privs"], "NoNewPrivs"),
        (["unshare", "--net"], "ns/net"),
        (["setpriv", "--bounding-set=-sys_admin"], "CapBnd"),
        (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], "Uid"),
    ],
)
def test_context_difference_names_what_differs(wrapper: list[str], field: str) -> None:
    if wrapper != ["setpriv", "--no-new-privs"]:
        require(os.geteuid() == 0, f"{' '.join(wrapper)} needs root (a new namespace, caps, uid)")
    p = subprocess.Popen([*wrapper, "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not os.readlink(f"/proc/{p.pid}/exe").endswith(
            "sleep"
        ):
            time.sleep(0.02)  # the wrapper has not changed itself and exec'd yet
        why = server.context_difference(p.pid)
        assert why is not None
        assert field in why
    finally:
        p.kill()
        p.wait()
    # The twin: a plain child of this process has the same context.
    same = subprocess.Popen(["sleep", "30"])
    try:
        assert server.context_difference(same.pid) is None
    finally:
        same.kill()
        same.wait()


def test_stale_code_is_declined_and_the_server_exits(world: World) -> None:
    assert run(world, "true").returncode == 0
    source = Path(server.__file__)
    st = source.stat()
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        proc = run(world, "echo", "fresh")
        assert proc.returncode == 0
        assert proc.stdout == "fresh\n"  # ran in-process, by the new code
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and world.stockade("server", "status").returncode == 0:
        time.sleep(0.05)
    assert world.stockade("server", "status").returncode == 1
    stops = server_events(world, "server_stop")
    assert "code changed" in str(stops[-1]["reason"])


def _record_of(record: Path, other_than: bytes = b"") -> bytes:
    """The token of the server whose page record is at ``record``, once the record is
    there and whole and not ``other_than``'s, within 5 s (a worker writes it after its
    caller has the exit status); b"" when that does not happen."""
    from stockade.cli import _prefault

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            data = record.read_bytes()
            token = data[: _prefault.TOKEN_SIZE]
            if token != other_than and _prefault.load(str(record), token):
                return token
        time.sleep(0.02)
    return b""


def test_a_damaged_page_record_costs_nothing_but_time(world: World) -> None:
    """The record of the pages a run writes (cli/_prefault.py) is only about time: the
    first worker writes it, one damaged on disk is ignored (the run is served as ever),
    and a worker whose spare found it damaged writes it whole again; so does the first
    worker of the next server, whose memory is laid out anew."""
    record = Path(_client.socket_path(world.env)).with_suffix(".pages")
    assert run(world, "true").returncode == 0
    first = _record_of(record)
    assert first
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    record.write_bytes(b"\xff" * 40)  # not whole ranges
    served = len(server_events(world, "server_run"))
    proc = run(world, "sh", "-c", "echo served; exit 7")
    assert (proc.returncode, proc.stdout) == (7, "served\n")
    assert len(server_events(world, "server_run")) == served + 1
    # That run's spare was forked before the damage; the next one finds it and learns.
    assert run(world, "true").returncode == 0
    assert _record_of(record) == first
    world.stockade("server", "stop")
    start_server(world)
    assert run(world, "true").returncode == 0
    assert _record_of(record, other_than=first)


def test_another_user_cannot_reach_the_socket(world: World) -> None:
    require(os.geteuid() == 0, "acting as another user (uid 65534) needs root")
    path = _client.socket_path(world.env)
    code = (
        "import _socket, sys\n"
        "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\n"
        "try:\n"
        f"    s.connect({path!r})\n"
        "except PermissionError:\n"
        "    sys.exit(3)\n"
    )
    python = _nobody_python()
    require(python is not None, "no Python that uid 65534 can run")
    assert python is not None
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code],
        check=False,
    )
    assert proc.returncode == 3
    assert oct(Path(path).parent.stat().st_mode & 0o777) == "0o700"
    # The twin: the owner connects, and is served.
    sock = _client.connect(path)
    assert sock is not None
    sock.close()
    assert run(world, "true").returncode == 0


def _raw_request(world: World, argv: list[str]) -> bytes:
    """Send a request by hand (as any process of the user could) and return the answer."""
    import _socket

    sock = _client.connect(_client.socket_path(world.env))
    assert sock is not None
    cwd = os.open(world.workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.settimeout(10)
        assert sock.recv(1) == _client.HELLO
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
        sock.sendmsg([_client._request(argv)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer
    finally:
        os.close(cwd)
        sock.close()


def test_only_run_is_served(world: World) -> None:
    answer = _raw_request(world, ["server", "stop"])
    assert answer.startswith(_client.REFUSED)
    assert b"'stockade run' only" in answer
    assert world.stockade("server", "status").returncode == 0  # still there
    # The twin: a run request is accepted and runs.
    assert _raw_request(world, ["run", "--", "true"]).startswith(_client.ACCEPTED)


@contextlib.contextmanager
def impostor(world: World, behaviour: Callable[[socket.socket], None]) -> Iterator[None]:
    """A listener of this user on the server's socket that misbehaves as told."""
    world.stockade("server", "stop")
    path = _client.socket_path(world.env)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    thread = threading.Thread(target=behaviour, args=(listener,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        listener.close()
        os.unlink(path)
        start_server(world)  # the fixture expects a served run
        assert run(world, "true").returncode == 0


def test_a_server_that_never_answers_costs_a_wait_then_runs_here(world: World) -> None:
    with impostor(world, lambda listener: None):  # never accepts, never says hello
        env = dict(world.env, STOCKADE_SERVER_TIMEOUT="0.5")
        proc = world.stockade("run", "--", "touch", "ran", env=env)
        assert proc.returncode == 0, proc.stderr
        assert (world.workspace / "ran").exists()


def test_a_server_silent_after_the_request_never_gets_it_run_twice(world: World) -> None:
    """A request handed over may have started: the caller gives up (125), it does not
    run the command again in-process."""
    taken: list[bytes] = []

    def hello_then_silence(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.sendall(_client.HELLO)
        message, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(16))
        for _, _, raw in ancillary:  # close what it was handed, as a real worker would
            for i in range(0, len(raw) - len(raw) % 4, 4):
                os.close(int.from_bytes(raw[i : i + 4], sys.byteorder))
        taken.append(message)
        time.sleep(3)
        conn.close()

    with impostor(world, hello_then_silence):
        env = dict(world.env, STOCKADE_SERVER_TIMEOUT="0.5")
        proc = world.stockade("run", "--", "touch", "ran", env=env)
        assert proc.returncode == 125
        assert "did not answer" in proc.stderr
        assert not (world.workspace / "ran").exists()
        assert taken
        assert b"touch" in taken[0]
        # The twin: told to ignore servers, the same command runs, in-process.
        env["STOCKADE_SERVER"] = "0"
        assert world.stockade("run", "--", "touch", "ran", env=env).returncode == 0
        assert (world.workspace / "ran").exists()


@given(
    # What sys.argv can hold: text, and bytes that are not UTF-8 (surrogate-escaped).
    argv=st.lists(
        st.one_of(
            st.text(st.characters(codec="utf-8", blacklist_characters="\0")),
            st.binary(max_size=20).filter(lambda b: b"\0" not in b).map(os.fsdecode),
        ),
        max_size=8,
    ),
    env=st.dictionaries(
        st.binary(min_size=1, max_size=10).filter(lambda k: b"=" not in k and b"\0" not in k),
        st.binary(max_size=20).filter(lambda v: b"\0" not in v),
        max_size=8,
    ),
)
@settings(max_examples=300, deadline=None)
def test_a_request_reads_back_as_written(argv: list[str], env: dict[bytes, bytes]) -> None:
    saved = dict(os.environb)
    os.environb.clear()
    try:
        os.environb.update(env)
        payload = _client._request(["run", *argv])
    finally:
        os.environb.clear()
        os.environb.update(saved)
    request = server.parse_request(payload[4:])
    assert int.from_bytes(payload[:4], "big") == len(payload) - 4
    assert request.argv == ["run", *argv]
    assert request.env == env
    assert len(request.limits) == 16


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p[:-1],  # not NUL-ended
        lambda p: p.replace(b"stockade-run\0", b"stockade-walk\0", 1),
        lambda p: p.replace(b"stockade-run\0%d\0" % _client.PROTOCOL, b"stockade-run\0999\0"),
        lambda p: p + b"extra\0",  # trailing field
        lambda p: p[: p.index(b"\0", 20) + 1],  # cut after a few fields
        lambda p: p.replace(
            b"stockade-run\0%d\0" % _client.PROTOCOL, b"stockade-run\0%d\0-1\0" % _client.PROTOCOL
        ),
    ],
)
def test_a_damaged_request_is_refused(damage: Callable[[bytes], bytes]) -> None:
    payload = _client._request(["run", "--", "true"])[4:]
    assert server.parse_request(payload).argv == ["run", "--", "true"]  # the twin
    with pytest.raises(ValueError):
        server.parse_request(damage(payload))


def test_a_spare_stops_copying_for_a_caller_no_other_spare_took(tmp_path: Path) -> None:
    """A spare copying its pages gives way to a caller seen at two looks in a row, not to
    one another spare (already in accept) took at once; the twin: nobody waiting, it
    goes on copying."""
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    try:
        waiting = server._caller_waits(listener)
        assert (waiting(), waiting()) == (False, False)  # nobody calls
        caller = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        caller.connect(path)
        assert waiting() is False  # seen once: another spare may be taking it
        taken, _ = listener.accept()  # ... and one did
        assert waiting() is False
        late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        late.connect(path)
        assert (waiting(), waiting()) == (False, True)  # nobody took this one
        for sock in (caller, taken, late):
            sock.close()
    finally:
        listener.close()
