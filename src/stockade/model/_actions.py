"""Actions: what a command inside the sandbox may try to do, as plain values."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    """The kinds of action the layers are judged on."""

    FILE_READ = "file_read"
    FILE_WRITE = "file_write"
    #: a process started inside is still running on the host after the sandbox ends
    PROCESS_SURVIVE = "process_survive"
    #: deliver a signal to a process of the host
    PROCESS_SIGNAL = "process_signal"
    #: open a TCP connection to ``host:port`` (raw bytes, or a tunnel through the proxy)
    NET_CONNECT = "net_connect"
    #: one HTTP request: ``method`` ``host`` ``path``
    NET_REQUEST = "net_request"
    ENV_READ = "env_read"
    #: a DNS query whose name carries data (``host`` is the name asked for)
    DNS_LOOKUP = "dns_lookup"
    #: connect to a unix socket: a path, or ``@name`` for the abstract namespace
    UNIX_CONNECT = "unix_connect"
    #: a kernel facility named by ``target`` (``userns``, ``mount``, ``bpf``, ...)
    SYSCALL = "syscall"
    #: consume a resource named by ``target`` (``file_size``, ``pids``, ...) up to ``amount``
    RESOURCE = "resource"
    #: a system call that every layer on the host kernel lets on, whose arguments the
    #: kernel answering it has to parse (``target`` names it, e.g.
    #: ``sendmsg:SCM_RIGHTS``: a control message passing a descriptor over a unix
    #: socket). On the host kernel a bug in that parser is an escape; only a kernel of
    #: the sandbox's own (gVisor's Sentry, ``[container] backend = "gvisor"``) keeps the
    #: call from reaching the host's. It "gets through" when the host kernel answered it.
    HOST_KERNEL = "host_kernel"
    #: read a file of another host process under ``/proc/PID/`` (``target`` names it:
    #: ``cmdline``, ``environ``, ``mem``, ...). A PID namespace hides the process; on the
    #: host kernel Landlock's ptrace restriction refuses the files that need ptrace
    #: access (:data:`~stockade.model.PTRACE_READ_FILES`) to a process outside the domain.
    PROCESS_READ = "process_read"
    #: use an IPC object of the host's IPC namespace (``target``: ``sysv_shm``,
    #: ``sysv_msg``, ``sysv_sem``): only an IPC namespace of the sandbox's own keeps them
    HOST_IPC = "host_ipc"


class Route(enum.StrEnum):
    """A way a network action can leave the sandbox.

    An attempt may try several; it gets through when any of them does.
    """

    #: a socket that ignores the proxy variables (only the network namespace stops it)
    DIRECT = "direct"
    #: through the stockade proxy named by ``HTTP_PROXY`` and friends
    PROXY = "proxy"


#: The kinds that leave the sandbox over the network, and so take :class:`Route` values.
NETWORK_KINDS: frozenset[Kind] = frozenset({Kind.NET_CONNECT, Kind.NET_REQUEST, Kind.DNS_LOOKUP})


class Credential(enum.StrEnum):
    """Which credential an HTTP request carries."""

    NONE = "none"
    #: the credential the policy binds to the host (the sandbox holds a placeholder)
    BOUND = "bound"
    #: any other credential, e.g. an attacker's own API key
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a command tries, and whether the task needs it.

    ``target`` is what the action is aimed at: a path, an environment variable name, a
    ``host:port``, a socket path. File actions judge ``resolved`` when it is set (the
    real file a link in ``target`` points at), because Landlock and the mount table act
    on the real file, never on a spelling. Network actions use ``host``, ``port``,
    ``method`` and ``path`` (already normalised, as the proxy matches rules on it);
    ``address`` is the IP the host is known to resolve to (empty when unknown, taken as
    public). A request's scheme is the one of its ``target`` URL. ``routes`` are the ways
    a network action is tried (the strongest attacker tries both); ``labelled`` says the
    request carries data the policy labels.

    ``approved`` says that the person reviewing an overlay run's changes applies this
    write (``stockade apply``); an unapproved write stays in the run's layer. ``link_to``
    marks a write that makes a symlink at ``target`` pointing at ``link_to``.
    """

    id: str
    kind: Kind
    target: str
    needed: bool
    description: str = ""
    host: str = ""
    port: int = 0
    method: str = ""
    path: str = ""
    address: str = ""
    resolved: str = ""
    credential: Credential = Credential.NONE
    amount: int = 0
    routes: tuple[Route, ...] = (Route.DIRECT, Route.PROXY)
    labelled: bool = False
    approved: bool = False
    link_to: str = ""

    @property
    def paths_out(self) -> tuple[Route | None, ...]:
        """The routes this action is judged on: its ``routes`` for a network action,
        ``(None,)`` for every other kind (no route applies)."""
        return self.routes if self.kind in NETWORK_KINDS else (None,)

    @property
    def plain_http(self) -> bool:
        """True for an HTTP request whose target is an ``http://`` URL (no TLS)."""
        return self.kind is Kind.NET_REQUEST and self.target.lower().startswith("http://")

    @property
    def file_path(self) -> str:
        """The path a file or socket action is judged on."""
        return self.resolved or self.target
