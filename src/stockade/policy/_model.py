"""The policy as frozen values.

A :class:`Policy` is what the loader produces after validation and composition; every
path in it is absolute and resolved (symlinks, ``..`` and ``~``), so enforcement never
re-interprets a spelling.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from pathlib import Path

from stockade._hash import sha256_hex
from stockade._record import asdict, field, fields, record

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The switchable layers, in the order they are described and reported.
LAYERS: tuple[str, ...] = (
    "files",
    "container",
    "syscalls",
    "secrets",
    "egress",
    "inspect",
    "limits",
    "overlay",
)

#: the policy reader behind :meth:`Policy.load` (:func:`stockade.policy._load.load_policy`):
#: ``_load`` builds on this module and registers it here when imported, which the package
#: does before anything can hold a Policy; this module never imports ``_load`` back
_loader: Callable[..., Policy] | None = None


@record
class EnvPass:
    """One entry of ``env.pass``: a variable passed through from the caller."""

    name: str
    allow_secret: bool = False


@record
class FilesystemPolicy:
    """``[filesystem]``: what the sandbox may read and write."""

    workspace: Path
    read: tuple[Path, ...] = ()
    write: tuple[Path, ...] = ()
    #: glob patterns (absolute after ``~`` expansion, or relative to the workspace)
    deny: tuple[str, ...] = ()
    #: paths inside writable areas that stay read-only (relative to the workspace)
    protect: tuple[str, ...] = ()
    #: ``mode = "overlay"``: the run's writes land in a layer kept in stockade's state,
    #: reviewed and applied or discarded afterwards; the real workspace is untouched
    overlay: bool = False
    #: a learning run only (never read from a file): directories outside the workspace
    #: that the sandbox sees through a throwaway copy-on-write view, so that the task's
    #: writes there succeed and are recorded while the host's files stay as they were
    #: (stockade.learning._observe.learning_policy; docs/learn.md)
    scratch: tuple[Path, ...] = ()


@record
class EnvPolicy:
    """``[env]``: how the child's environment is built."""

    pass_: tuple[EnvPass, ...] = ()
    set: Mapping[str, str] = field(default_factory=dict)


# --- inspect: request rules, bound secrets, labels ------------------------------------


@record
class RequestRule:
    """One ``[[network.rules]]`` entry: what an inspected request to ``host`` may do.

    ``methods`` empty means any method; ``paths`` are globs on the normalised path
    (``*`` = within one segment, ``**`` = any number of segments).
    """

    host: str
    methods: tuple[str, ...] = ()
    paths: tuple[str, ...] = ("/**",)
    #: "allow", "deny" or "report" (let through, logged as what would have been denied)
    action: str = "allow"
    #: position in ``network.rules``; names the rule in audit events
    index: int = 0

    @property
    def name(self) -> str:
        """The rule's name in audit events: ``network.rules[N]``."""
        return f"network.rules[{self.index}]"


@record
class BoundSecret:
    """``[secrets.NAME]``: a credential the sandbox sees only as a placeholder.

    The value is read by the proxy (outside the sandbox) from ``source`` and sent only
    to ``hosts``, in ``header``, over verified TLS. The policy never holds the value.
    """

    name: str
    #: "env:VARIABLE" or "file:/absolute/path"
    source: str
    hosts: tuple[str, ...]
    #: the header that carries it; "authorization" means ``Bearer <value>``
    header: str = "authorization"


@record
class Labels:
    """``[labels]``: data that must never leave through an inspected request."""

    #: globs: absolute, ``~``-relative, or relative to the workspace
    secret_files: tuple[str, ...] = ()
    #: names of the caller's environment variables whose values are labelled
    secret_env: tuple[str, ...] = ()
    #: literal canary tokens
    canaries: tuple[str, ...] = ()

    @property
    def configured(self) -> bool:
        """True when any label is set (then every TLS host is inspected)."""
        return bool(self.secret_files or self.secret_env or self.canaries)


#: the credential detectors (``egress/inspect/_detectors.py`` defines them; the loader
#: checks ``[inspect.detectors]`` against these names, and a test keeps the two equal)
DETECTOR_NAMES = (
    "private_key",
    "aws_access_key",
    "aws_secret_key",
    "github_token",
    "gitlab_token",
    "slack_token",
    "stripe_key",
    "anthropic_key",
    "openai_key",
    "google_api_key",
    "npm_token",
    "pypi_token",
    "jwt",
    "authorization",
    "basic_auth",
)
#: what a detector may be set to, weakest last
DETECTOR_ACTIONS = ("deny", "report", "off")


@record
class InspectPolicy:
    """``[inspect]``: credential detectors and decoding on inspected hosts."""

    #: ``(detector, action)`` set by the policy; every other detector is ``deny``
    detectors: tuple[tuple[str, str], ...] = ()
    #: search decoded views (base64, hex, nested percent, escapes, gzip...) too
    decode: bool = True
    #: request-body bytes decoded per request
    decode_limit: int = 16 * 1024 * 1024
    #: past ``decode_limit``: "scan-raw" (search raw bytes only) or "refuse" (413)
    past_limit: str = "scan-raw"
    #: ``(suffix, max_label, max_labels)`` for names under ``*.suffix`` (0: no limit)
    names: tuple[tuple[str, int, int], ...] = ()
    #: offer HTTP/2 (ALPN h2) to clients of inspected hosts whose server speaks it
    http2: bool = True

    def actions(self) -> dict[str, str]:
        """Every detector's action."""
        given = dict(self.detectors)
        return {name: given.get(name, "deny") for name in DETECTOR_NAMES}

    @property
    def default(self) -> bool:
        """True when nothing differs from the defaults (then it is left out of digests)."""
        return self == InspectPolicy()


# --- end inspect ----------------------------------------------------------------------


@record
class UpstreamPolicy:
    """``[network.upstream]``: the operator's proxy that every allowed connection is
    chained through (set only by the user policy, ``--policy`` or ``--upstream-proxy``).
    """

    #: ``http://host:port``, or ``env`` (HTTPS_PROXY/HTTP_PROXY/ALL_PROXY/NO_PROXY of
    #: stockade's own environment, read once at start)
    proxy: str
    #: destinations sent direct: hosts, ``*.suffix``, IPs, CIDRs, each with ``:port``
    no_proxy: tuple[str, ...] = ()
    #: a file holding ``user:password`` (readable by its owner only); never in the URL
    auth_file: Path | None = None
    #: ``address``: ``CONNECT <vetted IP>:port``; ``name``: ``CONNECT <host>:port``
    connect_by: str = "address"

    def to_dict(self) -> dict[str, Any]:
        """The table as plain data (a path, never a credential)."""
        out: dict[str, Any] = {
            "proxy": self.proxy,
            "no_proxy": list(self.no_proxy),
            "connect_by": self.connect_by,
        }
        if self.auth_file is not None:
            out["auth_file"] = str(self.auth_file)
        return out


@record
class NetworkPolicy:
    """``[network]``: where the sandbox may connect, through the stockade proxy."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    #: name -> IP literal; a pinned name is explicitly allowed to reach that address
    hosts: Mapping[str, str] = field(default_factory=dict)
    #: ports on which a CONNECT tunnel must carry TLS with a matching SNI
    tls_ports: tuple[int, ...] = (443,)
    #: request rules for inspected hosts, in file order (first match wins)
    rules: tuple[RequestRule, ...] = ()
    #: CA file that upstream TLS is verified against instead of the system roots
    upstream_ca: Path | None = None
    #: stockade's resolver and transparent capture inside the sandbox, for clients
    #: that ignore proxy variables (the proxy variables stay set as a fast path)
    transparent: bool = True
    #: the operator's upstream proxy (None: allowed destinations are dialled directly)
    upstream: UpstreamPolicy | None = None
    #: never ask about a host that is not allowed (a workspace file may set it, not unset)
    strict: bool = False
    #: a learning run (``stockade learn``): every name is allowed and recorded, its
    #: addresses still decided as always (metadata and private addresses stay refused
    #: unless pinned or named); never read from a file, only set by the learn mode
    learning: bool = False
    #: the last day (UTC) of a learnt policy's grace period: until then a host or a
    #: request this policy does not admit is let through and reported (verdict
    #: ``report``, rule ``grace``), never refused silently nor allowed silently; after it
    #: the policy is enforced as written. Only a user policy (or ``--policy``) may set it,
    #: never a workspace file (docs/learn.md, "Drift during a grace period")
    grace_until: datetime.date | None = None


@record
class KubernetesPolicy:
    """``[kubernetes]``: which pods ``stockade gateway serve`` may apply this policy to.

    A pod names its policy in an annotation that whoever creates claims can write: the
    policy itself says where it may be used, so a claim cannot pick a wider one. Empty
    ``namespaces`` means no pod at all (``["*"]`` is every namespace, written out).
    """

    #: namespaces whose pods may use this policy; ``"*"`` for all
    namespaces: tuple[str, ...] = ()
    #: service accounts (``name`` or ``namespace/name``) whose pods may; empty: any
    service_accounts: tuple[str, ...] = ()

    @property
    def configured(self) -> bool:
        """True when the table says anything (it then enters the policy's digest)."""
        return bool(self.namespaces or self.service_accounts)

    def permits(self, namespace: str, service_account: str) -> bool:
        """Whether a pod in ``namespace`` running as ``service_account`` may use it."""
        if "*" not in self.namespaces and namespace not in self.namespaces:
            return False
        if not self.service_accounts:
            return True
        return (
            service_account in self.service_accounts
            or f"{namespace}/{service_account}" in self.service_accounts
        )


#: the container backends, from the host kernel's own namespaces to a kernel of its own,
#: and the namespace-less one for hosts that refuse user namespaces (docs/security-model.md)
BACKENDS: tuple[str, ...] = ("bubblewrap", "gvisor", "landlock")

#: what ``[container] backend`` and ``--backend`` take: a backend, or "auto" (bubblewrap
#: where user namespaces work, else landlock only with ``allow_degraded``)
BACKEND_CHOICES: tuple[str, ...] = (*BACKENDS, "auto")


@record
class ContainerPolicy:
    """``[container]``: which runtime builds the container from the mount plan."""

    #: "bubblewrap" (the default), "gvisor" (runsc; a workspace file may only pick it),
    #: "landlock" (no namespaces) or "auto"
    backend: str = "bubblewrap"
    #: let "auto" fall back to the landlock backend where user namespaces are refused
    #: (user policy or --policy only)
    allow_degraded: bool = False


@record
class McpPolicy:
    """``[mcp]``: how ``stockade mcp`` may ask the user through the MCP client."""

    #: offer "always allow" over MCP elicitation (user policy only; default off, since
    #: an MCP client may answer with a hook or a model rather than a person)
    allow_always: bool = False


@record
class LimitsPolicy:
    """``[limits]``: resource caps. 0 means unlimited for the time limits."""

    pids: int = 512
    memory: int = 4 * 1024**3
    file_size: int = 4 * 1024**3
    cpu_seconds: int = 0
    wall_seconds: float = 0


@record
class LayersPolicy:
    """``[layers]``: each layer is on unless turned off explicitly."""

    files: bool = True
    container: bool = True
    syscalls: bool = True
    secrets: bool = True
    egress: bool = True
    inspect: bool = True
    limits: bool = True
    #: acts only on a workspace in ``mode = "overlay"``; off, that workspace is read-write
    overlay: bool = True

    def active(self) -> tuple[str, ...]:
        """Names of the layers that are on, in canonical order."""
        return tuple(name for name in LAYERS if getattr(self, name))

    def without(self, *names: str) -> LayersPolicy:
        """A copy with the named layers turned off."""
        values = {name: getattr(self, name) for name in fields(self)}
        for name in names:
            values[name] = False
        return LayersPolicy(**values)


@record
class Policy:
    """A validated, composed policy. Build one with :func:`stockade.policy.load_policy`."""

    filesystem: FilesystemPolicy
    env: EnvPolicy = field(default_factory=EnvPolicy)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    limits: LimitsPolicy = field(default_factory=LimitsPolicy)
    layers: LayersPolicy = field(default_factory=LayersPolicy)
    #: credentials bound to their hosts (``[secrets.NAME]``)
    secrets: tuple[BoundSecret, ...] = ()
    #: labelled data (``[labels]``)
    labels: Labels = field(default_factory=Labels)
    #: credential detectors and decoding (``[inspect]``)
    inspect: InspectPolicy = field(default_factory=InspectPolicy)
    #: where the gateway may apply it (``[kubernetes]``)
    kubernetes: KubernetesPolicy = field(default_factory=KubernetesPolicy)
    #: ``[mcp]``: the MCP server's asking
    mcp: McpPolicy = field(default_factory=McpPolicy)
    #: ``[container]``: the runtime boundary
    container: ContainerPolicy = field(default_factory=ContainerPolicy)
    #: where each part came from, most general first ("built-in", a user file, ...)
    sources: tuple[str, ...] = ("built-in",)
    #: notes found while loading (paths whose real location differs from their spelling)
    notes: tuple[str, ...] = ()
    #: what the policy allows that is an open channel (DoH resolvers, tunnels, pastes)
    warnings: tuple[str, ...] = ()
    #: advice about the files themselves (a missing ``version`` key), shown once on stderr
    #: by ``stockade check`` and ``stockade run``; no part of the effective policy (not in
    #: :meth:`to_dict`, so not in the digest)
    hints: tuple[str, ...] = ()

    version: int = 1

    @classmethod
    def load(cls, path: str | Path | None = None, *, workspace: str | Path | None = None) -> Policy:
        """Load and validate a policy file (or the default search order when ``path`` is None)."""
        if _loader is None:  # pragma: no cover - the package imports _load first
            raise RuntimeError("stockade.policy._load was not imported")
        return _loader(
            Path(path) if path is not None else None,
            workspace=Path(workspace) if workspace is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The effective policy as plain data, in the v1 key names."""
        data: dict[str, Any] = {
            "version": self.version,
            "filesystem": {
                "workspace": str(self.filesystem.workspace),
                "read": [str(p) for p in self.filesystem.read],
                "write": [str(p) for p in self.filesystem.write],
                "deny": list(self.filesystem.deny),
                "protect": list(self.filesystem.protect),
            },
            "env": {
                "pass": [
                    {"name": e.name, "allow_secret": True} if e.allow_secret else e.name
                    for e in self.env.pass_
                ],
                "set": dict(self.env.set),
            },
            "network": {
                "allow": list(self.network.allow),
                "deny": list(self.network.deny),
                "hosts": dict(self.network.hosts),
                "tls_ports": list(self.network.tls_ports),
                "transparent": self.network.transparent,
                "strict": self.network.strict,
            },
            "limits": asdict(self.limits),
            "layers": asdict(self.layers),
        }
        # inspect: rules, upstream CA, bound secrets (never their values), labels
        if self.network.rules:
            data["network"]["rules"] = [
                {
                    "host": r.host,
                    "methods": list(r.methods),
                    "paths": list(r.paths),
                    "action": r.action,
                }
                for r in self.network.rules
            ]
        if self.network.upstream_ca is not None:
            data["network"]["tls"] = {"upstream_ca": str(self.network.upstream_ca)}
        if self.network.upstream is not None:
            data["network"]["upstream"] = self.network.upstream.to_dict()
        if self.network.grace_until is not None:
            # Only when set, so that the digest of every other policy stays as it was.
            data["network"]["grace_until"] = self.network.grace_until.isoformat()
        if self.secrets:
            data["secrets"] = {
                s.name: {"from": s.source, "hosts": list(s.hosts), "header": s.header}
                for s in self.secrets
            }
        if self.labels.configured:
            data["labels"] = {
                "secret_files": list(self.labels.secret_files),
                "secret_env": list(self.labels.secret_env),
                "canaries": list(self.labels.canaries),
            }
        if not self.inspect.default:
            # Only when set, so that the digest of every other policy stays as it was.
            data["inspect"] = {
                "detectors": dict(self.inspect.detectors),
                "decode": self.inspect.decode,
                "decode_limit": self.inspect.decode_limit,
                "past_limit": self.inspect.past_limit,
                "names": [
                    {"host": f"*.{n}", "max_label": a, "max_labels": b}
                    for n, a, b in self.inspect.names
                ],
                "http2": self.inspect.http2,
            }
        if self.kubernetes.configured:
            data["kubernetes"] = {
                "namespaces": list(self.kubernetes.namespaces),
                "service_accounts": list(self.kubernetes.service_accounts),
            }
        if self.mcp.allow_always:
            # Only when set, so that the digest of every other policy stays as it was.
            data["mcp"] = {"allow_always": True}
        if self.container.backend != "bubblewrap" or self.container.allow_degraded:
            # Only when not the default, as for [mcp]: other digests stay as they were.
            data["container"] = {"backend": self.container.backend}
            if self.container.allow_degraded:
                data["container"]["allow_degraded"] = True
        return data

    def digest(self) -> str:
        """A stable hash of the effective policy, recorded in every ``run_start`` event."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + sha256_hex(blob)
