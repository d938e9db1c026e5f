"""``stockade server``: a warm run server that takes ``stockade run``'s start-up cost once.

Most of a cold ``stockade run`` is Python starting and importing (on a 2-core machine
about 100 ms of 150), not sandboxing. The server imports everything a run needs once,
then forks one worker per ``stockade run``: the worker takes the caller's stdin, stdout,
stderr and working directory (passed as descriptors), its environment, umask, resource
limits and ignored signals, and runs exactly the code an in-process run would. The
caller forwards its signals and exits with the run's code; if the caller dies, the
worker kills itself and with it the sandbox (bwrap's ``--die-with-parent``).

What a run may do does not depend on the server. It only serves callers whose security
context equals its own: user and groups, capabilities, ``no_new_privs``, seccomp mode,
every namespace, root directory, cgroups and LSM label. Anything else (a process inside
a stockade sandbox, a confined or differently-privileged process, another user) is
declined, and the caller runs the command in-process under the same policy. The server
also declines, and exits, once its own code changed on disk.

Actions: ``start`` (in the background), ``stop``, ``status``, ``run`` (in the foreground,
for a service manager).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from stockade._exceptions import EXIT_STOCKADE_ERROR
from stockade._libc import libc
from stockade._record import record
from stockade.cli import _client, _prefault

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

    from stockade.audit._log import AuditLog

#: exit after this long without a request (seconds); 0 keeps the server until stopped
DEFAULT_IDLE_S = 900.0
#: how long ``start`` waits for the server to listen
START_TIMEOUT_S = 15.0
#: the largest request a worker reads (argv and environment)
MAX_REQUEST = 8 << 20
#: /proc/PID/status fields that must match between the server and a caller
CONTEXT_FIELDS = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``server``."""
    parser.add_argument(
        "action",
        choices=("start", "stop", "status", "run", "install-frontend"),
        help="start in the background, stop, report, run in the foreground, or install "
        "the compiled front end of the stockade command (hands runs over without "
        "starting Python)",
    )
    parser.add_argument(
        "--bin-dir",
        type=Path,
        metavar="DIR",
        help="install-frontend: where the stockade command is "
        "(default: this installation's scripts directory)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_S,
        metavar="S",
        help=f"exit after S seconds without a request; 0: never (default {DEFAULT_IDLE_S:g})",
    )


def execute(args: argparse.Namespace) -> int:
    """Carry out one action; 0 on success, 1 when it could not be done."""
    if args.action == "install-frontend":
        return _install_frontend(args.bin_dir)
    path = _client.socket_path(os.environ)
    if args.action == "status":
        return _status(path)
    if args.action == "stop":
        return _stop(path)
    if args.idle_timeout < 0:
        print("stockade server: --idle-timeout must be 0 or more seconds", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    if len(path.encode()) > _client.MAX_SOCKET_PATH:
        print(
            f"stockade server: the socket path {path} is longer than a unix socket allows "
            f"({_client.MAX_SOCKET_PATH} bytes); set XDG_STATE_HOME to a shorter directory",
            file=sys.stderr,
        )
        return EXIT_STOCKADE_ERROR
    if args.action == "start":
        return _start(path, args.idle_timeout)
    return serve(path, args.idle_timeout)


def _install_frontend(bin_dir: Path | None) -> int:
    import sysconfig

    from stockade.cli import _frontend

    where = bin_dir or Path(sysconfig.get_path("scripts"))
    try:
        print(f"stockade server: {_frontend.install(where)}")
    except (OSError, ValueError) as exc:
        print(f"stockade server: cannot install the front end in {where}: {exc}", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    return 0


def _running_pid(path: str) -> int | None:
    sock = _client.connect(path)
    if sock is None:
        return None
    with contextlib.closing(sock):
        return _client.peer_credentials(sock)[0]


def _status(path: str) -> int:
    pid = _running_pid(path)
    if pid is None:
        print(f"stockade server: not running (socket {path})")
        return 1
    print(f"stockade server: running, pid {pid}, socket {path}")
    return 0


def _stop(path: str) -> int:
    pid = _running_pid(path)
    if pid is None:
        print(f"stockade server: not running (socket {path})")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and os.path.exists(path):
        time.sleep(0.02)
    print(f"stockade server: stopped pid {pid}")
    return 0


def _start(path: str, idle: float) -> int:
    pid = _running_pid(path)
    if pid is not None:
        print(f"stockade server: already running, pid {pid}, socket {path}")
        return 0
    log = Path(path).with_suffix(".log")
    _private_dir(Path(path).parent)
    sys.stdout.flush()
    sys.stderr.flush()
    # A daemon by double fork, not a new interpreter: this process already is the right
    # Python with the right modules (sys.executable may not even be executable, in a
    # virtual environment whose interpreter lives in another user's home).
    first = os.fork()
    if first == 0:
        try:
            os.setsid()
            if os.fork():
                os._exit(0)
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.closerange(3, 256)  # nothing of the caller's stays open in the server
            code = serve(path, idle)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.waitpid(first, 0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        pid = _running_pid(path)
        if pid is not None:
            print(f"stockade server: started, pid {pid}, socket {path}")
            return 0
        time.sleep(0.02)
    print(f"stockade server: did not start within {START_TIMEOUT_S:g}s; see {log}", file=sys.stderr)
    return EXIT_STOCKADE_ERROR


def _private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and check that only this user can use it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must belong to this user with mode 0700")


# --- the server ---------------------------------------------------------------------


def _warm(workspace: Path) -> dict[str, int]:
    """Import and compute what every run needs; return the source files to watch.
    ``workspace``: a directory of the server's own to plan a run in (see _dry_plan)."""
    import tomllib  # noqa: F401

    import stockade.cli.run
    import stockade.egress._assemble
    import stockade.egress._proxy
    import stockade.egress.dns._server
    import stockade.egress.inspect
    import stockade.egress.upstream._transport
    import stockade.policy._hosts
    import stockade.runtime._egress
    from stockade.enforce import launcher, limits, seccomp  # noqa: F401
    from stockade.runtime import _host, _plan, _run

    _plan.seccomp_filter()
    _host.landlock_abi()
    _host.seccomp_available()
    _host.find_bwrap()
    # Callers usually share the server's PATH and HOME: scan their toolchains once (the
    # cache is keyed on PATH, HOME and the PATH directories' times, so it stays right).
    from stockade.enforce import paths

    paths.toolchain_paths(os.environ.get("PATH", ""), paths.caller_home(os.environ))
    _dry_plan(workspace)
    import fcntl  # noqa: F401
    import pty  # noqa: F401
    import resource  # noqa: F401
    import termios  # noqa: F401
    import threading  # noqa: F401
    import tty  # noqa: F401

    import stockade._denials
    import stockade.api
    import stockade.enforce.gitlinks  # noqa: F401

    libc()

    watched = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        file = getattr(module, "__file__", None)
        if (name == "stockade" or name.startswith("stockade.")) and file:
            watched[file] = os.stat(file).st_mtime_ns
    for source in ("enforce/_launcher.c", "egress/_netns_helper.c"):
        path = Path(_run.__file__).parent.parent / source
        watched[str(path)] = path.stat().st_mtime_ns
    return watched


def _dry_plan(workspace: Path) -> None:
    """Plan one run of the user's policy in ``workspace``, and throw the plan away.

    Every worker is a fresh fork of the server: whatever a first run computes lazily
    (compiled patterns, the launcher's source digest and binary, the cgroup controllers,
    the mount API probe) would be paid again by each of them, about a quarter of a
    served run. Planning starts and writes nothing (runtime/_plan.py), and nothing of
    this plan is used by a run: each run loads its policy and plans anew. What can change
    while the server lives is not kept: the host's own addresses (which the proxy
    refuses) are read again by each run.
    """
    from stockade.egress import _addr, _netns
    from stockade.enforce import launcher
    from stockade.policy import load_policy
    from stockade.runtime import RunRequest
    from stockade.runtime._plan import plan

    # From inside the workspace, as a caller plans: a daemon's "/" holds every path, and
    # a bwrap under the working directory is refused (runtime/_host.find_bwrap).
    home = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(workspace)
        policy = load_policy(None, workspace=workspace)
        plan(RunRequest(argv=["true"], policy=policy, audit_to_file=False))
        launcher.build_launcher()
        _netns.build_helper()
    except Exception as exc:  # a warm-up: the first run reports a failure properly
        print(f"stockade server: warm-up plan failed: {exc}", file=sys.stderr)
    finally:
        os.fchdir(home)
        os.close(home)
        with _addr._local_lock:
            _addr._local_cache = None


def _stale(watched: dict[str, int]) -> str | None:
    for file, mtime in watched.items():
        try:
            if os.stat(file).st_mtime_ns != mtime:
                return f"{file} changed"
        except OSError:
            return f"{file} is gone"
    return None


def serve(path: str, idle: float) -> int:
    """Serve ``stockade run`` requests on ``path`` until stopped, idle or stale.

    Pre-forked spare workers (:data:`SPARES`) wait in ``accept``; one that takes a
    connection tells the server, which forks its replacement once a run ends, so no
    caller waits for a fork.
    """
    from stockade.audit._log import AuditLog

    sock_path = Path(path)
    _private_dir(sock_path.parent)
    # One server per installation and user: the lock is held for the server's life (a
    # second server, two front ends starting one at once, exits here), so that no
    # server can take over another's socket and leave it listening where nobody calls.
    lock = _take_lock(sock_path.with_suffix(".lock"))
    if lock is None:
        print(f"stockade server: already running (or starting) on {path}", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    # Started by the compiled front end on first use (docs/server.md), not by hand.
    auto = os.environ.pop("STOCKADE_SERVER_AUTOSTART", None) == "1"
    watched = _warm(sock_path.parent)
    # Workers are forks: keep the collector from walking (and so copying) every page
    # of the warm heap in each of them.
    import gc

    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    with contextlib.suppress(FileNotFoundError):
        if _running_pid(path) is not None:
            print(f"stockade server: already running on {path}", file=sys.stderr)
            return EXIT_STOCKADE_ERROR
        sock_path.unlink()  # a socket left by a server that died
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    ours = os.stat(path).st_ino
    audit = AuditLog(f"server-{_client.installation_key()}", sock_path.with_suffix(".jsonl"))
    audit.emit("server_start", pid=os.getpid(), socket=path, auto=auto)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    news_r, news_w = os.pipe2(os.O_CLOEXEC)
    spares: set[int] = set()
    workers: set[int] = set()
    wanted = True  # a spare is wanted now
    news = b""  # what the workers said, up to a whole message
    forked = 0
    #: where workers record the pages a run writes, for the next spares (_prefault)
    pages = (str(sock_path.with_suffix(".pages")), _prefault.token())
    last = time.monotonic()
    why = "stopped"
    try:
        while not stopping:
            # The next spare is forked when a run ends or another caller waits, not
            # while a run is starting: on a small machine the fork would compete with
            # it for the CPU. Two wait, so that a caller who comes soon after the last
            # finds one that is ready (it has copied its pages, see _prefault) while
            # the newest gets ready: the one that waited longest takes the caller.
            while len(spares) < SPARES and (wanted or not workers):
                forked += 1
                # The pages a run writes are learnt when there is no record, and now
                # and then again (a worker's learning costs it about 1 ms after its run).
                learn = forked % 50 == 0
                spares.add(
                    _fork_spare(listener, news_r, news_w, watched, audit, lock, (*pages, learn))
                )
            wanted = False
            watch = [news_r] if spares else [news_r, listener.fileno()]
            try:
                ready, _, _ = select.select(watch, [], [], 1.0)
            except InterruptedError:
                continue
            if listener.fileno() in ready:
                wanted = True  # a caller waits and no spare takes it
            if news_r in ready:
                news += os.read(news_r, 4096)
            while len(news) >= _NEWS_SIZE:
                kind, worker = news[:1], int.from_bytes(news[1:_NEWS_SIZE], "big")
                news = news[_NEWS_SIZE:]
                if kind == TAKEN and worker in spares:
                    spares.discard(worker)
                    workers.add(worker)
                    last = time.monotonic()
                elif kind == DONE:
                    wanted, last = True, time.monotonic()
                elif kind == STALE:
                    stopping, why = True, "its code changed on disk"
            while True:  # reap finished workers (and a spare that died)
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                spares.discard(pid)
                workers.discard(pid)
            if idle and not workers and time.monotonic() - last > idle:
                why = f"idle for {idle:g}s"
                break
            if not _still_ours(path, ours):
                # Nobody can reach a server whose socket was removed (its directory
                # deleted, another server's left by a crash): it would only hold memory.
                why = "its socket was removed"
                break
    finally:
        for spare in spares:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare, signal.SIGKILL)
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ours:
                os.unlink(path)
        listener.close()
        audit.emit("server_stop", pid=os.getpid(), reason=why, end=True)
        audit.close()
        os.close(lock)
    return 0


def _take_lock(path: Path) -> int | None:
    """The server's lock file, locked (its descriptor); None when another holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _still_ours(path: str, ours: int) -> bool:
    """Whether ``path`` is still the socket this server bound (by inode)."""
    try:
        return os.stat(path).st_ino == ours
    except OSError:
        return False


#: worker -> server: "I took a connection", "my run is over", "the code on disk changed"
TAKEN = b"T"
DONE = b"D"
STALE = b"S"
#: a message on the workers' pipe: its kind and the worker's pid (one write: atomic)
_NEWS_SIZE = 5
#: spares that wait for callers
SPARES = 2


def _tell(news: int, kind: bytes) -> None:
    """Tell the server ``kind`` about this worker."""
    os.write(news, kind + os.getpid().to_bytes(4, "big"))


def _fork_spare(
    listener: socket.socket,
    news_r: int,
    news_w: int,
    watched: dict[str, int],
    audit: AuditLog,
    lock: int,
    pages: tuple[str, bytes, bool],
) -> int:
    """Fork a worker that waits for the next connection; return its pid. ``pages``: the
    record of the pages a run writes (copied before a caller comes, see _prefault), the
    server's token in it, and whether this worker records them anew after its run."""
    pid = os.fork()
    if pid:
        return pid
    try:
        # The lock is the server's: a worker still running a long command must not keep
        # the next server from starting.
        os.close(lock)
        # A spare must not outlive the server (it would serve with nobody to replace
        # it); once it has a caller, it serves that caller whatever the server does.
        _set_parent_death_signal(signal.SIGKILL)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        os.close(news_r)
        if os.getppid() == 1:
            os._exit(0)
        # What the worker's runs will be confined by, read before a caller waits: a
        # spare is forked anew after every run, so this is as fresh as the server's own.
        mine = _context("self")
        # The run's background thread (stockade._background), started while no caller
        # waits: a thread's start waits until it has run.
        from stockade import _background

        _background.submit(lambda: None)
        # Last, as it stops when a caller comes: the pages a run writes, copied now.
        record, server, learn = pages
        mapped: _prefault.Regions = []
        with contextlib.suppress(OSError):
            mapped = _prefault.regions()
            ranges = _prefault.load(record, server)
            # No usable record (this server's first run, or one damaged): this worker
            # writes it.
            learn = learn or not ranges
            _prefault.populate(ranges, mapped, _caller_waits(listener))
        conn, _ = listener.accept()
        _prime_cgroup()
        listener.close()
        stale = _stale(watched)
        if stale is not None:
            # New code must not be served by old code: decline, and make way.
            _tell(news_w, STALE)
            _refuse(conn, f"the server's code changed ({stale})")
            os._exit(0)
        _tell(news_w, TAKEN)
        _set_parent_death_signal(0)
    except BaseException:
        os._exit(1)
    _worker(conn, mine, audit, news_w, (record, server, mapped) if learn and mapped else None)


def _caller_waits(listener: socket.socket) -> Callable[[], bool]:
    """Whether a caller waits that no other spare took: one seen at two looks in a row
    (a spare already in ``accept`` takes a caller within microseconds; a spare still
    copying its pages sees the connection for that moment only)."""
    seen = False

    def waiting() -> bool:
        nonlocal seen
        ready = bool(select.select([listener], [], [], 0)[0])
        waits, seen = ready and seen, ready
        return waits

    return waiting


def _prime_cgroup() -> None:
    """Start the kernel's first-move wait for the run's cgroup as soon as a caller
    arrives (:func:`stockade.enforce.limits.prime_attach`): after an idle spell that wait
    is an RCU grace period (6 to 25 ms here), and a run's own prime, started once its
    plan is made, left the cgroup's creation waiting for the rest of it. Moving this
    process into the cgroup it is in changes nothing; without a cgroup to make, or with
    the limits layer off for this caller, the move was only a wasted system call."""
    from stockade.enforce import limits

    support = limits.detect()
    if support is not None:
        limits.prime_attach(support)


def _set_parent_death_signal(signum: int) -> None:
    """PR_SET_PDEATHSIG; OSError when the kernel refuses (the caller then exits)."""
    import ctypes

    pr_set_pdeathsig = 1
    if libc().prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _refuse(conn: socket.socket, reason: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(_client.REFUSED + reason.encode() + b"\n")
    conn.close()


# --- a worker: one run ----------------------------------------------------------------


def _context(pid: int | str) -> dict[str, object]:
    """What a process may do, as far as /proc shows it: the fields that must match."""
    proc = f"/proc/{pid}"
    ctx: dict[str, object] = {}
    with open(f"{proc}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in CONTEXT_FIELDS:
                ctx[name] = value.strip()
    for ns in sorted(os.listdir(f"{proc}/ns")):
        if not ns.endswith("_for_children"):
            ctx[f"ns/{ns}"] = os.readlink(f"{proc}/ns/{ns}")
    root = os.stat(f"{proc}/root")
    ctx["root"] = (root.st_dev, root.st_ino)
    with open(f"{proc}/cgroup") as f:
        ctx["cgroup"] = f.read()
    try:
        with open(f"{proc}/attr/current") as f:
            ctx["lsm"] = f.read().strip("\0\n")
    except OSError:
        ctx["lsm"] = None
    return ctx


def context_difference(pid: int, mine: dict[str, object] | None = None) -> str | None:
    """Why the process ``pid`` may not be served by this one; None when it may.

    A process confined in any way this one is not (a stockade sandbox, another sandbox,
    fewer capabilities, another namespace or cgroup) would escape that confinement if
    its run were made here, so it is declined and runs the command itself.
    """
    if mine is None:
        mine = _context("self")
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return "the caller is gone"
    try:
        theirs = _context(pid)
        # The pidfd pins the process: had it exited (and its pid been reused) while
        # /proc was read, the pidfd would now be readable.
        if select.select([pidfd], [], [], 0)[0]:
            return "the caller is gone"
    except OSError as exc:
        return f"cannot read the caller's context: {exc.strerror}"
    finally:
        os.close(pidfd)
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    return f"its {', '.join(differ)} differ from the server's" if differ else None


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    """Read one request: its fields and the descriptors that came with it."""
    fds: list[int] = []
    data = b""
    msg, ancdata, flags, _ = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(raw) - len(raw) % 4
            fds += [int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(0, usable, 4)]
    if flags & socket.MSG_CTRUNC:
        raise ValueError("too many descriptors")
    data = msg
    if not data:
        raise EOFError  # a connection that only asked who listens (status, stop)
    if len(data) < 4:
        raise ValueError("short request")
    size = int.from_bytes(data[:4], "big")
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    while len(data) < 4 + size:
        chunk = conn.recv(min(1 << 20, 4 + size - len(data)))
        if not chunk:
            raise ValueError("truncated request")
        data += chunk
    request = parse_request(data[4 : 4 + size])
    if not request.argv or request.argv[0] != "run":
        raise ValueError("the server serves 'stockade run' only")
    if len(fds) != 4:
        raise ValueError("expected four descriptors")
    return request, fds


@record
class Request:
    """What a caller hands over with a run (see ``_client._request`` for the format)."""

    argv: list[str]
    env: dict[bytes, bytes]
    umask: int
    limits: list[tuple[int, int, int]]
    ignored: list[int]


def parse_request(payload: bytes) -> Request:
    """Read a request's fields; ValueError for anything not exactly as written."""
    fields = payload.split(b"\0")
    if fields.pop() != b"":
        raise ValueError("a request ends with NUL")
    items = iter(fields)

    def take() -> bytes:
        try:
            return next(items)
        except StopIteration:
            raise ValueError("truncated request") from None

    def count(limit: int) -> int:
        text = take()
        if not text.isdigit() or int(text) > limit:
            raise ValueError(f"bad count {text[:20]!r}")
        return int(text)

    if take() != _client.REQUEST_MAGIC or take() != b"%d" % _client.PROTOCOL:
        raise ValueError("unknown protocol")
    umask = count(0o777)
    argv = [os.fsdecode(take()) for _ in range(count(len(fields)))]
    env: dict[bytes, bytes] = {}
    for _ in range(count(len(fields))):
        key, eq, value = take().partition(b"=")
        if eq and key:
            env[key] = value
    limits = []
    for _ in range(count(64)):
        res, soft, hard = (int(part) for part in take().split(b" "))
        limits.append((res, soft, hard))
    ignored = [count(64) for _ in range(count(64))]
    if next(items, None) is not None:
        raise ValueError("trailing fields in the request")
    return Request(argv=argv, env=env, umask=umask, limits=limits, ignored=ignored)


def _worker(
    conn: socket.socket,
    mine: dict[str, object],
    audit: AuditLog,
    news: int,
    learn: tuple[str, bytes, _prefault.Regions] | None = None,
) -> NoReturn:
    """Serve one request in this forked process, then exit; never returns. ``learn``:
    where to record the pages this run wrote of the mappings it was forked with."""
    code = 125
    request: tuple[Request, list[int]] | None = None
    try:
        # The parent's handlers (stop the server) must not run here.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()  # out of the server's session: the caller's signals come by message
        pid = _client.peer_credentials(conn)[0]
        why = context_difference(pid, mine)
        if why is None:
            try:
                conn.sendall(_client.HELLO)  # only now does the caller send its request
                request = _receive(conn)
            except (EOFError, BrokenPipeError, ConnectionResetError):
                _done(news)  # it only asked who listens (status, stop), or left
            except (OSError, ValueError, TypeError) as exc:
                why = f"bad request: {exc}"
            if request is not None:
                why = _take_limits(request[0].limits)
                if why is not None:
                    request = None
        if request is None:
            audit.emit(
                "server_declined",
                layer="container",
                verdict="deny",
                reason="process-contained",
                pid=pid,
                detail=why,
                end=True,
            )
            _refuse(conn, why or "no request")
            _done(news)
        # A worker's event is a chain of its own (run id "<server's>.<pid>", bound to
        # the server's chain by fork_of): the server's own chain goes on without it.
        audit.emit("server_run", pid=pid, argv=request[0].argv, end=True)
        code = _run_request(conn, *request)
    except SystemExit as exc:
        # What the CLI ends with in process (argparse's usage error, sys.exit): the same
        # status and words here, never a traceback of the worker's.
        code = _exit_status(exc)
    except BaseException:  # a worker never unwinds into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        # The run is over: the caller leaving now (it does, once it has the status) is
        # no reason to kill this worker (see relay). It tells the server first, so that
        # the next spare is forked at once: told after, it lost the race with that kill
        # now and then, and the next caller waited for a fork.
        _over.set()
        with contextlib.suppress(OSError):
            _tell(news, DONE)
        with contextlib.suppress(OSError):
            conn.sendall(_client.EXITED + code.to_bytes(4, "big", signed=True))
        if learn is not None and request is not None:
            # After the caller has its status: off its path.
            with contextlib.suppress(Exception):
                _prefault.save(learn[0], learn[1], _prefault.touched(learn[2]))
        os._exit(0)


#: set in a worker once its run is over (its exit status is about to be sent)
_over = threading.Event()


def _exit_status(exc: SystemExit) -> int:
    """The status a process ending with ``exc`` gets, as the interpreter gives it: an
    int as is (masked to a byte, as the kernel does), None 0, anything else printed to
    stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def _done(news: int) -> NoReturn:
    """Tell the server this worker is finished (it forks a spare in its place), and exit."""
    with contextlib.suppress(OSError):
        _tell(news, DONE)
    os._exit(0)


def _take_limits(limits: list[tuple[int, int, int]]) -> str | None:
    """Give this worker the caller's resource limits; why not, when one cannot be had.

    Lowering a limit always works; raising one above the server's needs privilege. A
    server started with lower limits (it was started from a shell with a ``ulimit``, or
    on first use by such a caller) declines a caller with higher ones, which then runs
    the command itself with its own: a served run never gets other limits than its
    caller's.
    """
    import resource

    for res, soft, hard in limits:
        try:
            resource.getrlimit(res)
        except ValueError:
            continue  # a limit this Python does not know: the server's, as before
        with contextlib.suppress(ValueError, OSError):  # EPERM is a ValueError here
            resource.setrlimit(res, (soft, hard))
        if resource.getrlimit(res) != (soft, hard):
            return f"its resource limit {res} ({soft} {hard}) exceeds the server's"
    return None


def _run_request(conn: socket.socket, request: Request, fds: list[int]) -> int:
    """Take on the caller's process state, then run as ``stockade ARGS`` would."""
    import io
    import threading

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    os.fchdir(fds[3])
    for fd in fds:
        os.close(fd)
    os.umask(request.umask)
    for signum in request.ignored:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)
    os.environ.clear()
    for key, value in request.env.items():
        os.environb[key] = value
    # Python set its standard streams up for the server's descriptors; make them anew
    # for the caller's (line-buffered on a terminal, as at any start).
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), errors="surrogateescape", line_buffering=os.isatty(1)
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True
    )
    sys.argv = ["stockade", *request.argv]
    main_thread = threading.main_thread().ident
    assert main_thread is not None

    def relay() -> None:
        # The caller's signals, delivered to this worker's main thread, where the run's
        # handlers forward them to the command; the caller gone means SIGKILL, as for a
        # stockade process killed outright.
        pending = b""
        while True:
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            if not data:
                if _over.is_set():
                    return  # the caller left once it had the exit status: nothing runs
                os.kill(os.getpid(), signal.SIGKILL)
            pending += data
            while len(pending) >= 2:
                kind, signum, pending = pending[:1], pending[1], pending[2:]
                if kind == _client.SIGNAL and signum in _client.FORWARDED:
                    signal.pthread_kill(main_thread, signum)

    conn.sendall(_client.ACCEPTED)
    threading.Thread(target=relay, daemon=True).start()
    from stockade.cli import dispatch

    return dispatch(request.argv)
