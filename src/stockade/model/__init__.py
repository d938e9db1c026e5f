"""The boundary model: actions, the layers as predicates, and evaluation over layer subsets.

Pure: no I/O, and nothing of stockade is imported but :mod:`stockade.policy`. For a given
:class:`~stockade.policy.Policy`, :class:`Boundary` has one predicate per layer, "does
this layer stop this action", derived from the same policy the enforcement reads. An
action gets through a set of layers only when no layer of the set stops it, so adding a
layer never opens anything (:func:`check_monotonic` checks it on every subset).

The layers (in sync with DESIGN §2; mechanism, then what it stops):

files      Landlock ruleset applied inside the sandbox just before exec.
           Stops reading home/secrets, writing outside the workspace, through any
           symlink or hard link; with ABI 6 scopes, signals and abstract sockets out.
container  bubblewrap: user, mount, PID, IPC, UTS (cgroup) namespaces; read-only
           system binds; tmpfs HOME and /tmp; --die-with-parent --disable-userns.
           Stops seeing, reading or signalling host processes, the host's IPC
           objects, surviving the sandbox, host sockets, the nested-userns remount trick, writes to protected paths.
syscalls   seccomp filter. Stops new namespaces, mount API, keyctl, bpf, perf,
           userfaultfd, io_uring, ptrace of others.
secrets    environment built from an allow-list. Stops tokens in env vars.
egress     empty network namespace; the only way out is the stockade proxy; DNS only
           by the proxy. Stops hosts not on the allow-list, raw IPs, DNS exfiltration,
           private/loopback/metadata addresses.
inspect    TLS interception; method/path rules; credential binding; data scanning.
           Stops uploads to an allow-listed host, an attacker's key on an allowed API,
           a secret sent to the wrong host, labelled data; read from the policy's
           network.rules, [secrets.NAME] and [labels].
limits     rlimits and, where available, a cgroup. Stops fork/memory/disk bombs, hangs.
overlay    a workspace in ``mode = "overlay"``: overlayfs (bubblewrap and gvisor), writes kept
           in a layer in stockade's state until applied. Stops an unreviewed write
           reaching the real workspace (an action the reviewer does not approve), and
           at apply a protected path or a symlink leading out of the workspace.

A network action is judged per route: ``direct`` (a socket that ignores the proxy
variables), stopped only by egress's empty network namespace, and ``proxy``, stopped by
egress's host decision and by inspect. It gets through when any of its routes does; each
route is monotone, so the action is too.

The container's runtime comes from the policy (``[container] backend``). Under
``gvisor`` the command runs on the Sentry, a kernel of its own: the files layer stops
nothing there (no Landlock; the mount plan is the container's), the container also keeps
the direct network route, abstract sockets and every system call away from the host
kernel (a :attr:`Kind.HOST_KERNEL` action: stopped by nothing on ``bubblewrap``, by the
container alone on ``gvisor``), and it no longer refuses a user namespace (seccomp
still does). :meth:`Boundary.with_backend` gives the same policy under the other one.

What each does NOT stop is what the probe's extended scenario shows: the container does
not stop reads of what is bound in, egress does not stop what an allowed connection
carries, inspect does not stop a host left as an opaque tunnel.
"""

from __future__ import annotations

from stockade.model._actions import NETWORK_KINDS as NETWORK_KINDS
from stockade.model._actions import Action as Action
from stockade.model._actions import Credential as Credential
from stockade.model._actions import Kind as Kind
from stockade.model._actions import Route as Route
from stockade.model._evaluate import Evaluation as Evaluation
from stockade.model._evaluate import Outcome as Outcome
from stockade.model._evaluate import RouteOutcome as RouteOutcome
from stockade.model._evaluate import Violation as Violation
from stockade.model._evaluate import canonical as canonical
from stockade.model._evaluate import check_monotonic as check_monotonic
from stockade.model._evaluate import evaluate as evaluate
from stockade.model._evaluate import exercised_layers as exercised_layers
from stockade.model._evaluate import kernel_only as kernel_only
from stockade.model._evaluate import lost_without_namespaces as lost_without_namespaces
from stockade.model._evaluate import subsets as subsets
from stockade.model._layers import BLOCKED_SYSCALLS as BLOCKED_SYSCALLS
from stockade.model._layers import HOST_SHARED_DIRS as HOST_SHARED_DIRS
from stockade.model._layers import PTRACE_READ_FILES as PTRACE_READ_FILES
from stockade.model._layers import Boundary as Boundary
from stockade.model._rules import RuleHost as RuleHost
from stockade.model._rules import Rules as Rules
from stockade.policy._tables import SYSTEM_PATHS as SYSTEM_PATHS

__all__ = [
    "BLOCKED_SYSCALLS",
    "HOST_SHARED_DIRS",
    "NETWORK_KINDS",
    "PTRACE_READ_FILES",
    "SYSTEM_PATHS",
    "Action",
    "Boundary",
    "Credential",
    "Evaluation",
    "Kind",
    "Outcome",
    "Route",
    "RouteOutcome",
    "RuleHost",
    "Rules",
    "Violation",
    "canonical",
    "check_monotonic",
    "evaluate",
    "exercised_layers",
    "kernel_only",
    "lost_without_namespaces",
    "subsets",
]
