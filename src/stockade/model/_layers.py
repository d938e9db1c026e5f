"""One predicate per layer: "does this layer, under this policy, stop this action?".

Each predicate reads only the policy (and the few facts of the build the enforcement
also hard-codes, listed below); none depends on which other layers are on. That
independence is what makes the boundary monotonic: a route of an action gets through a
set of layers only when no layer of the set stops it, so adding a layer can only stop
more; and an action gets through when any of its routes does, which an added layer can
only make rarer.

A network action is judged per :class:`~stockade.model.Route`. The ``direct`` route (a
socket that ignores the proxy variables) is stopped by ``egress``'s empty network
namespace and by nothing else that concerns the network. The ``proxy`` route is stopped
by ``egress``'s host decision and by ``inspect``.

The container's runtime (``[container] backend``, :attr:`Boundary.backend`) changes what
some predicates say, because it changes the mechanism under the layer's name:

=========  ==================================  ==========================================
layer      ``bubblewrap`` (host kernel)        ``gvisor`` (runsc: the Sentry's kernel)
=========  ==================================  ==========================================
files      Landlock on the real files          nothing: no Landlock (ENOSYS); the launcher
                                               runs with it off and the mount plan (the
                                               container's) is the files policy
container  namespaces, binds; userns refused   the same mount plan, in the Sentry;
           (``--disable-userns``)              abstract sockets and host kernel calls
                                               stay in the Sentry; a user namespace and
                                               a mount in it are allowed there (the
                                               Sentry's own)
syscalls   seccomp                             the same filter (a KILL stops one thread
                                               only; nothing judged here depends on it)
egress     the netns and the proxy             the same (runsc's host networking inside
                                               stockade's netns; with egress off, in the
                                               caller's); abstract sockets are not its
                                               concern (the Sentry keeps them)
=========  ==================================  ==========================================

The runtime refuses gVisor without the container layer (there would be no kernel of its
own), so under ``gvisor`` the container predicate is the one that matters most.

``landlock`` (no namespaces at all, for hosts that refuse user namespaces) moves what it
can onto the process itself, and the layers' names then mean:

=========  ====================================================================
layer      ``landlock`` (the host kernel, no namespaces)
=========  ====================================================================
files      Landlock on the real files, as under bubblewrap, and it alone keeps the
           protected paths read-only (the write grant is split around them) and
           /etc's secret files unreadable (the read grant is split around them);
           its ptrace restriction refuses other processes' environ and memory; it
           grants the host's /dev/shm (:data:`HOST_SHARED_DIRS`)
container  only the reaper: the launcher, a child subreaper, kills what the command
           leaves behind. No mount view (host files, /etc's secret files, named host
           unix sockets are as the files layer leaves them), no PID namespace, no
           ``--disable-userns`` (seccomp alone refuses a user namespace), no IPC
           namespace (the host's System V IPC objects are the run's too)
syscalls   the same seccomp filter
egress     Landlock's TCP connect rule (the proxy's port only; below ABI 4 the
           connect guard, seccomp user notification, which checks the proxy's
           address too and refuses io_uring) and seccomp (inet sockets are TCP
           alone): a direct connection or a UDP DNS query is refused;
           abstract unix sockets are the host's (only Landlock's scope, files, stops
           them); its Landlock domain brings the ptrace restriction too
limits     rlimits without ``RLIMIT_NPROC`` (it would count the user's every process):
           the pids cap holds only in a cgroup (``cgroup``: one can be made here)
=========  ====================================================================

The ``overlay`` layer acts only on a workspace in ``mode = "overlay"`` and only under
``bubblewrap`` and ``gvisor`` (the runtime refuses an overlay under ``landlock``, and
under bubblewrap without the container or files layer: such a run never starts; under
gVisor the overlay is mounted host-side, around runsc, and needs neither). A write to the
workspace then lands in the run's layer: it reaches the real workspace only when the
person reviewing applies it (:attr:`~stockade.model.Action.approved`), and apply
refuses a protected path and a symlink leading out of the workspace even then.

``auto`` is judged as what it may become at worst: ``landlock`` when the policy allows
degrading (``allow_degraded``), ``bubblewrap`` otherwise.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from stockade.model._actions import Action, Credential, Kind, Route
from stockade.model._rules import Rules
from stockade.policy import LAYERS, Policy, Reason
from stockade.policy._credentials import looks_like_credential
from stockade.policy._hosts import ip_literal, normalize_host
from stockade.policy._inspect import REFUSED_METHODS, InspectScope
from stockade.policy._model import BACKENDS
from stockade.policy._network import EgressRules, parse_address
from stockade.policy._tables import (
    BASE_ENV_NAMES,
    DEFAULT_PROTECTED,
    LINK_TARGETS_OUTSIDE,
    SYSTEM_PATHS,
    SYSTEM_SECRETS,
)

_LC = re.compile(r"^LC_[A-Z]+$")

#: Kernel facilities the seccomp filter refuses (DESIGN §2, ``syscalls``).
BLOCKED_SYSCALLS: frozenset[str] = frozenset(
    {
        "userns",
        "mount",
        "keyctl",
        "bpf",
        "perf",
        "userfaultfd",
        "io_uring",
        "ptrace",
    }
)

#: What bubblewrap's container refuses even without seccomp: ``--disable-userns`` and no
#: capabilities in the sandbox's user namespace. gVisor's Sentry lets a process make a
#: user namespace and mount in it (its own, measured with runsc release-20240729.0): only
#: seccomp refuses them there.
CONTAINER_SYSCALLS: frozenset[str] = frozenset({"userns", "mount"})

#: The files of ``/proc/PID/`` that the kernel opens only with ptrace read access to the
#: process (``PTRACE_MODE_READ``): Landlock's ptrace restriction refuses them for a
#: process outside the sandbox's domain, whatever the ABI. ``cmdline``, ``stat``,
#: ``status`` and ``comm`` need no such access: without a PID namespace they are open.
PTRACE_READ_FILES: frozenset[str] = frozenset(
    {"environ", "mem", "maps", "smaps", "auxv", "stack", "syscall", "pagemap", "cwd", "root"}
)

#: Host directories the landlock backend grants for writing besides the policy's, with
#: no mount namespace to give the run a copy of its own: POSIX shared memory (the
#: multiprocessing module's semaphores need it). Kept equal to the directories of
#: ``runtime/_landlock.DEVICES`` (tests/model checks it).
HOST_SHARED_DIRS: tuple[str, ...] = ("/dev/shm",)

#: what the proxy refuses on an inspected host (the enforcement's own table)
INSPECT_REFUSED_METHODS: frozenset[str] = REFUSED_METHODS

#: A layer's predicate: the reason it stops the action on the route (None: not stopped).
#: The route is None for actions that do not leave over the network.
Predicate = Callable[[Action, Route | None], Reason | None]


def _within(path: str, root: str) -> bool:
    p, r = PurePosixPath(path), PurePosixPath(root)
    return p == r or r in p.parents


def _within_any(path: str, roots: Iterable[str]) -> bool:
    return any(_within(path, r) for r in roots)


def _normal(host: str) -> str:
    """The one spelling the enforcement decides on; a host it would refuse to parse keeps
    a lower-cased spelling (it then matches no pattern, as in the proxy)."""
    try:
        return normalize_host(host)
    except ValueError:
        return host.lower().rstrip(".")


@dataclass(frozen=True)
class Boundary:
    """The layers of one policy as predicates.

    ``landlock_scopes`` says whether the kernel offers Landlock's ABI 6 scopes (signals and
    abstract unix sockets limited to the sandbox), which the files layer then applies.
    The container's runtime is the policy's ``[container] backend`` (see the module's
    table for what ``gvisor`` changes), unless ``runtime`` names another one (as
    ``stockade run --backend`` would give it; :meth:`with_backend`).
    """

    policy: Policy
    landlock_scopes: bool = True
    runtime: str = ""
    #: whether a cgroup can be made for a run on this host (``limits.detect()``): only
    #: the landlock backend depends on it, for the pids cap
    cgroup: bool = False
    _rules: Rules = field(init=False, repr=False, compare=False)
    _scope: InspectScope = field(init=False, repr=False, compare=False)
    _egress_rules: EgressRules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"unknown backend {self.backend!r}; backends are {', '.join(BACKENDS)}"
            )
        # Compiled once (the rules are judged for every action of every subset); the
        # dataclass is frozen, so the derived fields are set the way its __init__ does.
        object.__setattr__(self, "_rules", Rules(self.policy.network.rules))
        # The enforcement's own decision objects (L0): no table of the model's own.
        # Whether the inspect layer is on is the layer subset's business, not the scope's.
        object.__setattr__(self, "_scope", InspectScope.from_policy(self.policy))
        # The host's own addresses are not the model's to know: none are "self".
        egress = EgressRules.from_policy(self.policy.network, local=frozenset())
        object.__setattr__(self, "_egress_rules", egress)

    @property
    def backend(self) -> str:
        """The container's runtime: ``bubblewrap``, ``gvisor`` or ``landlock``."""
        chosen = self.runtime or self.policy.container.backend
        if chosen == "auto":
            return "landlock" if self.policy.container.allow_degraded else "bubblewrap"
        return chosen

    @property
    def no_namespaces(self) -> bool:
        """True under the landlock backend: the command runs in the host's namespaces."""
        return self.backend == "landlock"

    @property
    def own_kernel(self) -> bool:
        """True when the container is a kernel of its own (gVisor), not the host's."""
        return self.backend == "gvisor"

    def with_backend(self, backend: str) -> Boundary:
        """The same policy and host facts under another container runtime."""
        return Boundary(
            self.policy, landlock_scopes=self.landlock_scopes, runtime=backend, cgroup=self.cgroup
        )

    def predicate(self, layer: str) -> Predicate:
        """The predicate of ``layer``."""
        if layer not in LAYERS:
            raise ValueError(f"unknown layer {layer!r}; layers are {', '.join(LAYERS)}")
        fn: Predicate = getattr(self, f"_{layer}")
        return fn

    def stops(self, layer: str, action: Action, route: Route | None = None) -> Reason | None:
        """The reason ``layer`` stops ``action`` on ``route``, or None when it lets it through.

        Without ``route``, a network action counts as stopped by the layer alone only when
        the layer stops every one of its routes (the reason is the first route's).
        """
        fn = self.predicate(layer)
        if route is not None:
            return fn(action, route)
        reasons = [fn(action, r) for r in action.paths_out]
        if any(reason is None for reason in reasons):
            return None
        return reasons[0]

    # -- files: Landlock on the real files ---------------------------------------------

    def _readable(self) -> tuple[str, ...]:
        fs = self.policy.filesystem
        return (
            *SYSTEM_PATHS,
            str(fs.workspace),
            *(str(p) for p in fs.read),
            *(str(p) for p in fs.write),
        )

    def _writable(self) -> tuple[str, ...]:
        fs = self.policy.filesystem
        return (str(fs.workspace), *(str(p) for p in fs.write))

    def _files(self, action: Action, route: Route | None = None) -> Reason | None:
        if self.own_kernel:
            # The Sentry has no Landlock: the runtime turns it off and builds the same
            # mount plan whether this layer is on or not (the plan is the container's),
            # so switching files under gVisor changes nothing that can be measured.
            return None
        # The sandbox's own scratch directories (TMPDIR, a throw-away HOME) are granted too;
        # an action aimed at the host is never aimed at them, so they do not appear here.
        shared = HOST_SHARED_DIRS if self.no_namespaces else ()
        if action.kind is Kind.FILE_READ:
            if not _within_any(action.file_path, (*self._readable(), *shared)):
                return Reason.PATH_NOT_GRANTED
            if self.no_namespaces and _within_any(action.file_path, SYSTEM_SECRETS):
                # No mask without a mount namespace: the read grant is split around them.
                return Reason.PATH_DENIED
        elif action.kind is Kind.FILE_WRITE:
            if not _within_any(action.file_path, (*self._writable(), *shared)):
                return Reason.PATH_NOT_GRANTED
            if self.no_namespaces and self._protected(action.file_path):
                # No read-only bind: the split Landlock grant keeps it (runtime/_landlock).
                return Reason.PATH_PROTECTED
        elif action.kind is Kind.PROCESS_SIGNAL:
            if self.landlock_scopes:
                return Reason.PROCESS_CONTAINED
        elif action.kind is Kind.PROCESS_READ:
            # Landlock's ptrace restriction (every ABI): no ptrace access out of the domain.
            if action.target in PTRACE_READ_FILES:
                return Reason.PROCESS_CONTAINED
        elif (
            action.kind is Kind.UNIX_CONNECT
            and action.target.startswith("@")
            and self.landlock_scopes
        ):
            return Reason.PROCESS_CONTAINED
        return None

    # -- container: bubblewrap namespaces and binds ------------------------------------

    def _visible(self, path: str) -> Reason | None:
        fs = self.policy.filesystem
        granted = (str(fs.workspace), *(str(p) for p in fs.read), *(str(p) for p in fs.write))
        if _within_any(path, SYSTEM_SECRETS):
            return Reason.PATH_DENIED
        if self._denied(path):
            return Reason.PATH_DENIED
        if _within_any(path, granted):
            return None
        if _within_any(path, SYSTEM_PATHS):
            return None
        # Everything else (HOME is a fresh tmpfs, /tmp too, no other host directory is
        # bound) does not exist inside.
        return Reason.PATH_NOT_GRANTED

    def _denied(self, path: str) -> bool:
        ws = str(self.policy.filesystem.workspace)
        for pattern in self.policy.filesystem.deny:
            full = pattern if pattern.startswith("/") else f"{ws}/{pattern}"
            if fnmatch.fnmatchcase(path, full) or any(
                fnmatch.fnmatchcase(str(parent), full) for parent in PurePosixPath(path).parents
            ):
                return True
        return False

    def _protected(self, path: str) -> bool:
        ws = PurePosixPath(self.policy.filesystem.workspace)
        p = PurePosixPath(path)
        if not (p == ws or ws in p.parents):
            return False
        rel = p.relative_to(ws)
        candidates = [rel, *list(rel.parents)[:-1]]
        for pattern in (*DEFAULT_PROTECTED, *self.policy.filesystem.protect):
            if any(fnmatch.fnmatchcase(str(c), pattern) for c in candidates):
                return True
        return False

    def _container(self, action: Action, route: Route | None = None) -> Reason | None:
        kind = action.kind
        if self.no_namespaces:
            # The reaper is all there is of a container: no mount view, no namespaces
            # (host processes and the host's IPC objects are in plain sight).
            return Reason.PROCESS_CONTAINED if kind is Kind.PROCESS_SURVIVE else None
        if kind is Kind.FILE_READ:
            return self._visible(action.file_path)
        if kind is Kind.FILE_WRITE:
            path = action.file_path
            if self._denied(path):
                return Reason.PATH_DENIED
            if not _within_any(path, self._writable()):
                return Reason.PATH_NOT_GRANTED
            if self._protected(path):
                return Reason.PATH_PROTECTED
            return None
        if kind in (Kind.PROCESS_SURVIVE, Kind.PROCESS_SIGNAL, Kind.PROCESS_READ, Kind.HOST_IPC):
            # PID and IPC namespaces: host processes and IPC objects do not exist inside
            # (in the Sentry too).
            return Reason.PROCESS_CONTAINED
        if kind is Kind.UNIX_CONNECT:
            if action.target.startswith("@"):
                # bubblewrap: abstract sockets belong to the network namespace, which the
                # container shares with the host unless egress gives it one of its own.
                # gVisor: every unix socket lives in the Sentry, never the host's.
                return Reason.PROCESS_CONTAINED if self.own_kernel else None
            return None if self._visible(action.target) is None else Reason.PATH_NOT_GRANTED
        if kind is Kind.HOST_KERNEL:
            # The call is parsed and answered by the Sentry; the host kernel sees only
            # the Sentry's own, filtered, system calls.
            return Reason.PROCESS_CONTAINED if self.own_kernel else None
        if kind is Kind.SYSCALL and action.target in CONTAINER_SYSCALLS and not self.own_kernel:
            return Reason.SYSCALL_BLOCKED
        return None

    # -- syscalls: seccomp --------------------------------------------------------------

    def _syscalls(self, action: Action, route: Route | None = None) -> Reason | None:
        if action.kind is Kind.SYSCALL and action.target in BLOCKED_SYSCALLS:
            return Reason.SYSCALL_BLOCKED
        return None

    # -- secrets: the environment allow-list -------------------------------------------

    def _secrets(self, action: Action, route: Route | None = None) -> Reason | None:
        if action.kind is not Kind.ENV_READ:
            return None
        name = action.target
        env = self.policy.env
        if (
            name in BASE_ENV_NAMES
            or _LC.match(name)
            or name in {"HOME", "TMPDIR"}
            or name in env.set
            or any(e.name == name for e in env.pass_)
        ):
            return None
        return Reason.CREDENTIAL_ENV if looks_like_credential(name) else Reason.ENV_NOT_PASSED

    # -- egress: empty network namespace, the proxy and its allow-list -----------------

    def host_decision(self, host: str, port: int, address: str = "") -> Reason | None:
        """The egress verdict on ``host:port`` known to resolve to ``address``.

        Decided by the proxy's own :class:`~stockade.policy._network.EgressRules`: the
        name first, then the address (the ``hosts`` pin, the IP literal, or
        ``address``); with no address known, the name's verdict.
        """
        rules = self._egress_rules
        host = _normal(host)
        named = rules.check_name(host, port)
        if not named.allowed:
            return named.reason
        ip = rules.pin(host) or ip_literal(host)
        if ip is None and address:
            try:
                ip = parse_address(address.strip("[]"))
            except ValueError:
                ip = None
        if ip is None:
            return None
        verdict = rules.check_address(host, port, ip)
        return None if verdict.decision.allowed else verdict.decision.reason

    def _egress(self, action: Action, route: Route | None = None) -> Reason | None:
        kind = action.kind
        if kind in (Kind.NET_CONNECT, Kind.NET_REQUEST, Kind.DNS_LOOKUP) and (
            route is not Route.PROXY
        ):
            # The empty network namespace has no interface but loopback: a socket that
            # ignores the proxy reaches nothing. Its only way out is the proxy's protocol.
            # Under landlock: connect() reaches the proxy's port alone (Landlock) and an
            # inet socket is TCP alone (seccomp). That rule names a port, not an address:
            # a server elsewhere on the proxy's port (random per run) is reachable; no
            # action here aims at one (docs/security-model.md says so).
            return Reason.UNSUPPORTED_PROTOCOL
        if kind in (Kind.NET_CONNECT, Kind.NET_REQUEST):
            return self.host_decision(action.host, action.port, action.address)
        if kind is Kind.PROCESS_READ and self.no_namespaces and action.target in PTRACE_READ_FILES:
            # Under landlock the network rule is a Landlock domain of its own (the files
            # layer off, / granted whole), and every domain brings the ptrace restriction.
            return Reason.PROCESS_CONTAINED
        if kind is Kind.DNS_LOOKUP:
            # The sandbox has no resolver; the proxy resolves only names it may connect to.
            allowed = self.host_decision(action.host, action.port or 443) is None
            return None if allowed else Reason.HOST_NOT_ALLOWED
        if (
            kind is Kind.UNIX_CONNECT
            and action.target.startswith("@")
            and not self.own_kernel
            and not self.no_namespaces
        ):
            # On the host kernel the abstract namespace is the network namespace's; the
            # Sentry keeps its unix sockets to itself whatever the network namespace.
            return Reason.UNSUPPORTED_PROTOCOL
        return None

    # -- inspect: request rules, credential binding, labelled data ---------------------

    def bound(self, host: str, port: int = 0) -> bool:
        """True when the policy binds a credential (``[secrets.NAME]``) to ``host:port``."""
        return self._scope.bound(_normal(host), port)

    def inspected(self, host: str, port: int) -> bool:
        """True when the proxy intercepts traffic to ``host:port`` rather than relaying it.

        As the enforcement decides: a rule names the host, a secret is bound to it, or
        labels are configured (then every host is, labelled data may go anywhere).
        """
        return self._scope.inspected(_normal(host), port)

    def rule_decision(self, host: str, port: int, method: str, path: str) -> Reason | None:
        """Why ``network.rules`` refuse ``method path`` on ``host:port`` (None: let on)."""
        return self._rules.decide(_normal(host), port, method, path)

    def _inspect(self, action: Action, route: Route | None = None) -> Reason | None:
        # Inspection happens in the proxy: a route that bypasses it is not its concern.
        if route is not Route.PROXY or action.kind not in (Kind.NET_CONNECT, Kind.NET_REQUEST):
            return None
        host, port = _normal(action.host), action.port
        if not self.inspected(host, port):
            # An opaque tunnel: whatever it carries is out of sight (DESIGN §2).
            return None
        if action.plain_http or port not in self.policy.network.tls_ports:
            # Plain HTTP, or a tunnel on a port that need not carry TLS, would pass an
            # inspected host unexamined: only TLS on a TLS port is intercepted.
            return Reason.UNSUPPORTED_PROTOCOL
        if action.kind is Kind.NET_CONNECT:
            # A TLS tunnel is intercepted; what it carries is judged as requests.
            return None
        if action.method in INSPECT_REFUSED_METHODS:
            return Reason.BAD_REQUEST
        # The order of the proxy's checks: rules, then secrets headed to the wrong host and
        # labelled data, then the credential binding.
        ruled = self.rule_decision(host, port, action.method, action.path)
        if ruled is not None:
            return ruled
        bound = self.bound(host, port)
        if action.credential is Credential.BOUND and not bound:
            return Reason.SECRET_WRONG_HOST
        if action.labelled and self.policy.labels.configured:
            return Reason.LABELLED_DATA
        if action.credential is Credential.FOREIGN and bound:
            return Reason.FOREIGN_CREDENTIAL
        return None

    # -- limits: rlimits and cgroup ----------------------------------------------------

    def _limits(self, action: Action, route: Route | None = None) -> Reason | None:
        if action.kind is not Kind.RESOURCE:
            return None
        lim = self.policy.limits
        caps: dict[str, tuple[float, Reason]] = {
            "file_size": (lim.file_size, Reason.LIMIT_FILE_SIZE),
            "pids": (lim.pids, Reason.LIMIT_PIDS),
            "memory": (lim.memory, Reason.LIMIT_MEMORY),
            "cpu_seconds": (lim.cpu_seconds, Reason.LIMIT_CPU),
            "wall_seconds": (lim.wall_seconds, Reason.LIMIT_WALL_TIME),
        }
        cap = caps.get(action.target)
        if action.target == "pids" and self.no_namespaces and not self.cgroup:
            # No user namespace to count in (RLIMIT_NPROC would count the user's every
            # process on the host): only a delegated cgroup caps the pids.
            return None
        if cap is None or not cap[0]:
            return None
        return cap[1] if action.amount > cap[0] else None

    # -- overlay: the run's writes kept in a layer, applied after review ---------------

    def _overlay(self, action: Action, route: Route | None = None) -> Reason | None:
        fs = self.policy.filesystem
        if action.kind is not Kind.FILE_WRITE or not fs.overlay or self.backend == "landlock":
            # Under landlock the runtime refuses an overlay workspace (exit 125): no run
            # has one there, so the layer stops nothing a run can do. Under gvisor the
            # same overlayfs layer is mounted around runsc (runtime/_overlay.py).
            return None
        ws = str(fs.workspace)
        path = action.file_path
        if not _within(path, ws):
            # Only the workspace is overlaid; a write elsewhere is the other layers'.
            return None
        if not action.approved:
            # The write lands in the run's layer; the real workspace sees it only once a
            # person applies it (stockade apply), and the review leaves it out.
            return Reason.NOT_APPLIED
        if self._protected(path):
            # Listed as refused by apply, whatever the reviewer chose (workspace/_apply).
            return Reason.PATH_PROTECTED
        if action.link_to:
            # as apply judges a link: its target resolved lexically from its directory
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), action.link_to))
            if not _within_any(resolved, (ws, *LINK_TARGETS_OUTSIDE)):
                # apply refuses a symlink that leads out of the workspace
                return Reason.PATH_NOT_GRANTED
        return None
