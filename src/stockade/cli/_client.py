"""The client side of ``stockade server``: hand a ``run`` to a warm server, or decline.

A ``stockade run`` first looks for a run server of this user and this installation (see
:mod:`stockade.cli.server`). When one answers and accepts, the run happens in a process
the server forks for it, with this process's stdin, stdout, stderr, working directory,
environment, umask, resource limits and ignored signals; this process forwards the
signals it gets and exits with the run's code. When there is no server, or it declines
(another security context, stale code), :func:`run` returns None and the caller runs the
command itself, in the same sandbox: the server only saves start-up time, it never
changes what a run may do.

This module is on the hot path of every ``stockade run``: it imports only C modules.
"""

from __future__ import annotations

import _socket
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same names; _signal has no type stubs
else:
    import _signal  # signal.py would import enum (~5 ms) for its IntEnums

#: bumped whenever the messages below change; a server of another version declines
#: (the compiled front end, _frontend.c, speaks the same protocol)
PROTOCOL = 2
#: the first field of a request
REQUEST_MAGIC = b"stockade-run"
#: the signals a run forwards to its command (runtime._spawn.SIGNALS), plus SIGWINCH for a pty
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGWINCH)
#: dispositions a run inherits from its caller when they are "ignore"
INHERITED_IGNORES = (
    _signal.SIGHUP,
    _signal.SIGINT,
    _signal.SIGQUIT,
    _signal.SIGTERM,
    _signal.SIGUSR1,
    _signal.SIGUSR2,
    _signal.SIGTSTP,
    _signal.SIGTTIN,
    _signal.SIGTTOU,
)
#: the longest path a unix socket address holds (sun_path, with its NUL)
MAX_SOCKET_PATH = 107
#: how long to wait for each answer of the server (``STOCKADE_SERVER_TIMEOUT`` overrides):
#: silence before the request was sent means running here; after it, giving up (exit 125)
ANSWER_TIMEOUT_S = 10.0

# Messages from the server: hello (a worker has the connection and serves this caller),
# accepted (the run is under way: never fall back after this), refused (with a reason;
# nothing ran) and the exit status.
HELLO = b"H"
ACCEPTED = b"A"
REFUSED = b"R"
EXITED = b"X"
# Message to the server: a signal this process received, for the run's command.
SIGNAL = b"S"


def server_dir(env: dict[str, str] | os._Environ[str]) -> str:
    """``$XDG_STATE_HOME/stockade/server`` (``~/.local/state`` when unset), as audit logs."""
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "stockade", "server")


def installation_key(executable: str | None = None) -> str:
    """Which installation a server belongs to: this interpreter and this package.

    FNV-1a, not SHA-256: the key only tells installations apart inside the user's own
    0700 directory (nothing rests on it being hard to forge), and a digest module would
    be one more shared library to load on every run's path.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    key = 0xCBF29CE484222325
    for byte in f"{executable or sys.executable}\0{package}".encode():
        key = ((key ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{key:016x}"


def socket_path(env: dict[str, str] | os._Environ[str]) -> str:
    """Where the run server of this user and installation listens."""
    return os.path.join(server_dir(env), f"{installation_key()}.sock")


def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a unix socket."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return (
        int.from_bytes(raw[0:4], sys.byteorder, signed=True),
        int.from_bytes(raw[4:8], sys.byteorder),
        int.from_bytes(raw[8:12], sys.byteorder),
    )


def connect(path: str) -> _socket.socket | None:
    """A connection to the server at ``path`` when one of this user listens there."""
    if len(path.encode()) > MAX_SOCKET_PATH:
        return None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
        # Only a server of this user gets our environment and descriptors.
        if peer_credentials(sock)[1] != os.geteuid():
            raise PermissionError
    except OSError:
        sock.close()
        return None
    return sock


def _request(argv: list[str]) -> bytes:
    """The request for ``stockade ARGV``: a 4-byte big-endian size, then NUL-ended fields.

    Fields: magic, protocol, umask, argc, argv..., envc, "NAME=VALUE"..., the number of
    resource limits, "RES SOFT HARD"... (-1 is unlimited), the number of ignored signals,
    their numbers. NUL cannot occur inside an argument or an environment entry, and
    both sides, Python and C, write and read this without a serialisation library.
    """
    import resource  # C module, cheap

    umask = os.umask(0o077)
    os.umask(umask)
    fields = [REQUEST_MAGIC, b"%d" % PROTOCOL, b"%d" % umask, b"%d" % len(argv)]
    fields += [os.fsencode(arg) for arg in argv]
    env = [key + b"=" + value for key, value in os.environb.items()]
    fields += [b"%d" % len(env), *env]
    limits = [b"%d %d %d" % (res, *resource.getrlimit(res)) for res in range(_NLIMITS)]
    fields += [b"%d" % len(limits), *limits]
    ignored = [s for s in INHERITED_IGNORES if _signal.getsignal(s) == _signal.SIG_IGN]
    fields += [b"%d" % len(ignored), *(b"%d" % s for s in ignored)]
    payload = b"".join(field + b"\0" for field in fields)
    return len(payload).to_bytes(4, "big") + payload


#: resource limits a request carries (RLIM_NLIMITS of Linux; resource lacks the name)
_NLIMITS = 16


def run(args: list[str]) -> int | None:
    """Run ``stockade ARGS`` in a warm server; its exit code, or None to run it here."""
    sock = connect(socket_path(os.environ))
    if sock is None:
        return None
    try:
        return _converse(sock, args)
    finally:
        sock.close()


def _timeout() -> float:
    try:
        wait = float(os.environ.get("STOCKADE_SERVER_TIMEOUT") or ANSWER_TIMEOUT_S)
    except ValueError:
        return ANSWER_TIMEOUT_S
    return wait if wait > 0 else ANSWER_TIMEOUT_S


def _answer(sock: _socket.socket, wait: float) -> bytes | None:
    """The server's next one-byte message; b"" when it closed; None when it said nothing."""
    sock.settimeout(wait)
    try:
        return sock.recv(1)
    except TimeoutError:
        return None
    except OSError:
        return b""


def _declined(sock: _socket.socket, answer: bytes | None) -> None:
    if answer == REFUSED and os.environ.get("STOCKADE_DEBUG"):
        reason = _read_line(sock)
        print(f"stockade: the run server declined ({reason}); running here", file=sys.stderr)


def _converse(sock: _socket.socket, args: list[str]) -> int | None:
    wait = _timeout()
    # First the worker's hello: it has taken the connection and accepted who we are.
    # Until then nothing was sent, so silence or a refusal is safe to answer by running
    # the command here; and no descriptor of ours is handed to a server that is stuck.
    hello = _answer(sock, wait)
    if hello != HELLO:
        _declined(sock, hello)
        return None
    try:
        # The run gets these descriptors, not copies of their paths: a closed one, or a
        # deleted working directory, is left to the in-process run to report.
        for fd in (0, 1, 2):
            os.fstat(fd)
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
        message = _request(args)
        try:
            sent = sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            if sent < len(message):
                sock.sendall(message[sent:])
        except OSError:
            return None
    finally:
        os.close(cwd)
    answer = _answer(sock, wait)
    if answer is None:
        # The request is the worker's now and it may have started: never run it twice.
        print(
            f"stockade: the run server did not answer in {wait:g}s; the command was not "
            "run here (stop the server with 'stockade server stop', or set STOCKADE_SERVER=0)",
            file=sys.stderr,
        )
        return 125
    if answer != ACCEPTED:
        _declined(sock, answer)
        return None  # refused, or gone before accepting: nothing ran
    sock.settimeout(None)
    return _wait(sock)


def _read_line(sock: _socket.socket) -> str:
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode(errors="replace").strip()


def _wait(sock: _socket.socket) -> int:
    """Forward signals until the run's exit status arrives; return it."""
    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:  # noqa: SIM105 - contextlib is one more import on every run's path
            sock.send(SIGNAL + bytes((signum,)))
        except OSError:
            pass  # the worker is gone; its status (or its absence) ends the wait

    for signum in FORWARDED:
        if _signal.getsignal(signum) != _signal.SIG_IGN:
            _signal.signal(signum, forward)
    data = b""
    while len(data) < 5:
        try:
            chunk = sock.recv(5 - len(data))
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        data += chunk
    if len(data) == 5 and data[:1] == EXITED:
        return int.from_bytes(data[1:], "big", signed=True)
    # The worker ended without a status: a forwarded signal killed it before the run
    # began (end the same way), or it died; the sandbox died with it (--die-with-parent).
    for signum in FORWARDED:
        _signal.signal(signum, _signal.SIG_DFL)
    if forwarded and forwarded[-1] != _signal.SIGWINCH:
        os.kill(os.getpid(), forwarded[-1])
    print("stockade: the run server's worker ended without an exit status", file=sys.stderr)
    return 125
