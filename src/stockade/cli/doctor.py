"""``stockade doctor``: what this host can enforce, and how to fix what it cannot."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from stockade import _roots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stockade.model import Action


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``doctor``."""
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--policy", type=Path, metavar="FILE", help="the policy whose upstream proxy to check"
    )
    parser.add_argument(
        "--upstream-proxy", metavar="URL", help="check this upstream proxy instead (as run takes)"
    )
    parser.add_argument(
        "--connect-to",
        metavar="HOST[:PORT]",
        help="ask the upstream proxy for a tunnel to this host (port 443 unless named) "
        "instead of the policy's first allowed host; a refusal is a failure",
    )


def upstream_check(
    policy_path: Path | None = None, url: str | None = None, connect_to: str | None = None
) -> dict[str, object]:
    """The upstream proxy in force (``[network.upstream]``, ``--upstream-proxy``): which
    one, whether it answers a CONNECT (for ``connect_to``, else an allowed host), and the
    fix when it does not. With no host to ask for, the proxy is still connected to: "ok"
    always means a real connection worked."""
    import dataclasses
    import tempfile

    from stockade._exceptions import PolicyError
    from stockade.egress.upstream import PROXY_VARIABLES, probe, reach, resolve_upstream
    from stockade.policy import load_policy
    from stockade.policy._hosts import ip_literal, parse_pattern
    from stockade.policy._load import with_upstream_proxy

    check: dict[str, object] = {
        "name": "upstream proxy",
        "ok": True,
        "fix": "",
        "layers": ["egress"],
    }
    try:
        # A throw-away workspace: doctor runs from anywhere (a home directory is no
        # workspace), and a workspace file cannot set the upstream anyway.
        with tempfile.TemporaryDirectory(prefix="stockade-doctor-") as ws:
            policy = load_policy(policy_path, workspace=Path(ws))
        if url is not None:
            policy = with_upstream_proxy(policy, url)
        upstream = resolve_upstream(policy.network.upstream)
        if upstream is not None and url is not None:
            # Given on the command line: say so, not the policy key it stands in for.
            upstream = dataclasses.replace(upstream, source="--upstream-proxy")
        target = _connect_target(connect_to) if connect_to is not None else None
    except PolicyError as exc:
        check.update(
            ok=False,
            detail=str(exc),
            fix="correct the setting named above; every run is refused until then",
        )
        return check
    table = policy.network.upstream
    if upstream is None:
        if table is not None and table.proxy == "env":
            check["detail"] = (
                f'proxy = "env", and none of {", ".join(PROXY_VARIABLES[::2])} is set (or '
                "NO_PROXY is *): allowed connections are dialled directly"
            )
        else:
            check["detail"] = "none: allowed connections are dialled directly"
        return check
    auth = f", credentials from {upstream.auth_file}" if upstream.auth_file else ""
    shown = f"{upstream.url} (from {upstream.source}, connect by {upstream.connect_by}{auth})"
    if target is not None:
        host, port = target
        result = probe(upstream, host, port, None)
        ok = result.ok and 200 <= result.status < 300
        fix = result.fix or (
            ""
            if ok
            else f"the proxy refuses a tunnel to {host}:{port}: ask its operator to allow it, "
            "or list the host in network.upstream.no_proxy if it is reached directly"
        )
        check.update(ok=ok, detail=f"{shown}: {result.detail}", fix=fix)
        return check
    for entry in policy.network.allow:
        pattern = parse_pattern(entry)
        if pattern.kind.value != "exact":
            continue
        port = pattern.port or 443
        pin = policy.network.hosts.get(pattern.host)
        address = ip_literal(pin) if pin is not None else None
        if address is not None and upstream.direct(pattern.host, port, address):
            continue
        result = probe(upstream, pattern.host, port, address)
        check.update(ok=result.ok, detail=f"{shown}: {result.detail}", fix=result.fix)
        return check
    result = reach(upstream)
    check.update(
        ok=result.ok,
        detail=f"{shown}: {result.detail}; no allowed host name to test a CONNECT with "
        "(give --connect-to HOST)",
        fix=result.fix,
    )
    return check


def _connect_target(text: str) -> tuple[str, int]:
    """``--connect-to HOST[:PORT]`` as (normalised host, port); PolicyError when bad."""
    from stockade._exceptions import PolicyError
    from stockade.policy._hosts import parse_pattern

    try:
        pattern = parse_pattern(text)
    except ValueError as exc:
        raise PolicyError(f"--connect-to {exc}") from None
    if pattern.kind.value not in ("exact", "address"):
        raise PolicyError(f"--connect-to {text}: name one host, not a pattern")
    return pattern.host, pattern.port or 443


def checks(
    policy_path: Path | None = None, url: str | None = None, connect_to: str | None = None
) -> list[dict[str, object]]:
    """Run every host check; each is a dict with name, ok, detail, fix and layers."""
    from stockade.runtime import _host

    out: list[dict[str, object]] = []
    bwrap = _host.find_bwrap()
    if bwrap:
        version = subprocess.run(
            [bwrap, "--version"],
            capture_output=True,
            text=True,
            check=False,
            env=_roots.host_environment(),
        ).stdout.strip()
        out.append(
            {
                "name": "bubblewrap",
                "ok": True,
                "detail": f"{bwrap} ({version})",
                "fix": "",
                "layers": ["container", "egress"],
            }
        )
    else:
        out.append(
            {
                "name": "bubblewrap",
                "ok": False,
                "detail": "bwrap not found on PATH",
                "fix": "sudo apt-get install bubblewrap",
                "layers": ["container", "egress"],
            }
        )
    userns = _host.userns_check()
    out.append(
        {
            "name": userns.name,
            "ok": userns.ok,
            "detail": userns.detail,
            "fix": userns.fix,
            "layers": ["container", "egress"],
        }
    )
    out += landlock_checks(userns.ok)
    transparent = _host.transparent_check()
    out.append(
        {
            "name": transparent.name,
            "ok": transparent.ok,
            "detail": transparent.detail,
            "fix": transparent.fix,
            "layers": ["egress"],
        }
    )
    abi = _host.landlock_abi()
    out.append(
        {
            "name": "landlock",
            "ok": abi >= 1,
            "detail": f"ABI {abi}"
            + (" (abstract unix socket and signal scoping)" if abi >= 6 else "")
            if abi
            else "not available",
            "fix": ""
            if abi
            else "kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and landlock in the lsm= boot parameter",
            "layers": ["files"],
        }
    )
    seccomp = _host.seccomp_available()
    out.append(
        {
            "name": "seccomp",
            "ok": seccomp,
            "detail": "filters supported" if seccomp else "not available",
            "fix": "" if seccomp else "kernel with CONFIG_SECCOMP_FILTER=y",
            "layers": ["syscalls"],
        }
    )
    from stockade.enforce import observe

    notify, why = observe.available()
    out.append(
        {
            # stockade learn's file observer; Landlock's audit records and fanotify would
            # need root (CAP_AUDIT_READ, CAP_SYS_ADMIN), this one works for every user
            "name": "learn mode",
            "ok": notify,
            "detail": (
                f"files seen by {observe.MECHANISM}; writes outside the workspace kept in "
                + (
                    "throwaway copy-on-write views"
                    if _host.mount_api()
                    else "no view (no new mount API): refused and observed"
                )
                if notify
                else why
            ),
            "fix": "" if notify else "stockade learn needs a kernel >= 5.5 with seccomp filters",
            "layers": [],
        }
    )
    mount_api = _host.mount_api()
    out.append(
        {
            # Speed only: either way the same masks and binds are made.
            "name": "mount API",
            "ok": True,
            "detail": "open_tree/mount_setattr: with Landlock on, the launcher makes the "
            "masks and protected binds (faster)"
            if mount_api
            else "not available: bubblewrap makes the masks and protected binds (slower)",
            "fix": "" if mount_api else "a kernel >= 5.12 makes each run a few ms faster",
            "layers": ["container"],
        }
    )
    from stockade.enforce import limits

    cg = limits.detect()
    out.append(
        {
            "name": "limits",
            "ok": True,
            "detail": f"{cg.describe()} + rlimits"
            if cg
            else "rlimits only (per process; no cgroup this user may create)",
            "fix": ""
            if cg
            else "for per-sandbox pids and memory caps, run under a delegated cgroup: systemd-run --user --scope -p Delegate=yes stockade ...",
            "layers": ["limits"],
        }
    )
    out.append(upstream_check(policy_path, url, connect_to))
    out.append(gvisor_check())
    out.append(kubernetes_check(out, policy_path, url))
    return out


#: what the landlock backend cannot stop and no action of the model names
LANDLOCK_UNMODELLED: tuple[str, ...] = (
    "a server on another host listening on the proxy's port (random per run): "
    "Landlock's connect rule names a port, not an address",
    "named host unix sockets (docker.sock, D-Bus, nscd, systemd-resolved) are reachable: "
    "Landlock does not cover connect() on a unix socket",
    "nothing new can be made directly in the workspace's top directory or in .git "
    "(the write grant is split around the protected paths there)",
    "no transparent capture: a client that ignores the proxy variables gets EACCES",
    "the proxy listens on a loopback port any host process can reach",
    "no pids cap unless a cgroup can be made (see the limits check): RLIMIT_NPROC would "
    "count every process of the user",
)


def _host_actions() -> tuple[Action, ...]:
    """Model actions on the host's processes, IPC and /dev/shm (the attack suite's)."""
    from stockade.model import Action, Kind

    return (
        Action(
            "host-process",
            Kind.PROCESS_READ,
            "cmdline",
            False,
            "host processes are visible (ps, /proc/PID/cmdline); signalling them is refused "
            "(Landlock scopes, ABI 6), their environment and memory too (ptrace restriction)",
        ),
        Action(
            "host-ipc",
            Kind.HOST_IPC,
            "sysv_shm",
            False,
            "the host's System V IPC objects (shared memory, queues, semaphores) are reachable",
        ),
        Action(
            "host-dev-shm",
            Kind.FILE_WRITE,
            "/dev/shm/stockade-doctor",
            False,
            "the host's /dev/shm (POSIX shared memory of the user's other processes) is "
            "readable and writable",
        ),
    )


def landlock_losses() -> list[str]:
    """The scenario's attacks (the model's) that the bubblewrap backend stops and the
    landlock backend lets through, under the default policy: one line each."""
    from stockade.model import Boundary, evaluate
    from stockade.policy import Policy
    from stockade.probe import scenarios

    layout = scenarios.Layout(Path("/nonexistent-probe-world"))
    sc = scenarios.build("extended", layout)
    policy: Policy = sc.policy
    active = policy.layers.active()
    # the host's processes, IPC and shared memory: the scenario does not try them (the
    # attack suite does, tests/attacks/test_landlock_attacks.py)
    actions = (*sc.actions, *_host_actions())
    bubblewrap = evaluate(Boundary(policy, runtime="bubblewrap"), actions, active)
    landlock = evaluate(Boundary(policy, runtime="landlock"), actions, active)
    held = {o.action.id for o in bubblewrap.outcomes if not o.through}
    return [
        f"{o.action.id}: {o.action.description}"
        for o in landlock.outcomes
        if o.through and not o.action.needed and o.action.id in held
    ]


def landlock_checks(userns_ok: bool) -> list[dict[str, object]]:
    """Which configuration refuses user namespaces (and its fix), and the landlock
    backend: whether this kernel can run it and what it loses beside bubblewrap."""
    from stockade.runtime import _landlock

    out: list[dict[str, object]] = []
    found = [] if userns_ok else _landlock.userns_restrictions()
    out.append(
        {
            "name": "userns restrictions",
            "ok": not found,
            "detail": "; ".join(what for what, _ in found)
            or ("none" if userns_ok else "none of the known ones; see the user namespaces check"),
            "fix": "; ".join(fix for _, fix in found),
            "layers": ["container", "egress"],
        }
    )
    abi = _landlock.usable_abi()
    lost = [*landlock_losses(), *LANDLOCK_UNMODELLED]
    if abi >= _landlock.MIN_NET_ABI:
        usable, detail = True, f"usable (Landlock ABI {abi}, network rules)"
    elif abi < 1:
        usable, detail = False, "not usable: no Landlock"
    else:
        from stockade.enforce import netguard

        guard, why = netguard.available()
        usable = guard
        detail = (
            f"usable (Landlock ABI {abi}, no network rules: the connect guard, "
            f"{netguard.MECHANISM})"
            if guard
            else f"not usable: Landlock ABI {abi} has no network rules (ABI "
            f"{_landlock.MIN_NET_ABI}) and the connect guard cannot work ({why})"
        )
    out.append(
        {
            "name": "landlock backend",
            # Only a failure when it is the one sandbox left and it cannot run either.
            "ok": usable or userns_ok,
            "detail": f"{detail}; beside bubblewrap it loses: " + "; ".join(lost),
            "fix": ""
            if userns_ok
            else (
                "fallback: stockade run --backend landlock, or [container] backend = "
                '"auto" with allow_degraded = true (docs/security-model.md)'
                if usable
                else "no fallback on this kernel: upgrade to Linux 6.7+ (Landlock ABI 4), or "
                "allow pidfd_getfd in the container's seccomp profile (the connect guard)"
            ),
            "layers": ["files", "egress", "container"],
            "loses": lost,
        }
    )
    return out


#: where a pod's service account is mounted (absent when automounting is off, as in the
#: pods ``stockade export kubernetes`` writes)
SERVICE_ACCOUNT_DIR = Path("var/run/secrets/kubernetes.io/serviceaccount")
#: the first line of the /etc/hosts the kubelet writes into every pod not on the host
#: network
KUBELET_HOSTS_HEADER = "# Kubernetes-managed hosts file"
#: the variables that point a pod's clients at the gateway (``proxy = "env"`` reads them)
_GATEWAY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
#: the layers a pod may or may not permit, and the checks (by name) each one needs
_POD_LAYERS = (
    # The user-namespace check makes user, pid and net namespaces: it fails under gVisor
    # (no network namespace for bubblewrap there) and under RuntimeDefault seccomp.
    ("container (bubblewrap)", ("bubblewrap", "user namespaces")),
    ("egress in a network namespace", ("bubblewrap", "user namespaces")),
    ("files (Landlock)", ("landlock",)),
    ("syscalls (seccomp)", ("seccomp",)),
)


def pod_evidence(environ: Mapping[str, str], root: Path = Path("/")) -> tuple[bool, list[str]]:
    """Whether this looks like a Kubernetes pod, and what says so.

    A pod is recognised by the variables the kubelet always sets
    (``KUBERNETES_SERVICE_HOST`` an IP address, ``KUBERNETES_SERVICE_PORT`` a port) *and*
    a file the kubelet writes (the service-account directory with its ``namespace``, or
    its ``/etc/hosts``): a variable alone is too easily set elsewhere. ``root`` is where
    the file system is read from (``/``; a test points it at a directory laid out like a
    pod). Informational: nothing is enforced on the strength of it.
    """
    from stockade.export._names import is_dns1123_label

    evidence: list[str] = []
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    try:
        ipaddress.ip_address(host)
        env_ok = port.isdigit() and 0 < int(port) < 65536
    except ValueError:
        env_ok = False
    if env_ok:
        evidence.append(f"KUBERNETES_SERVICE_HOST={host}")
    files = 0
    directory = root / SERVICE_ACCOUNT_DIR
    try:
        namespace = (directory / "namespace").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        namespace = ""
    if is_dns1123_label(namespace):
        files += 1
        evidence.append(f"a service account of namespace {namespace}")
    try:
        with (root / "etc/hosts").open(encoding="utf-8", errors="replace") as hosts:
            first = hosts.readline()
    except OSError:
        first = ""
    if first.startswith(KUBELET_HOSTS_HEADER):
        files += 1
        evidence.append("/etc/hosts written by the kubelet")
    return env_ok and files > 0, evidence


def _named_gateway(environ: Mapping[str, str]) -> tuple[str, str, str, int] | None:
    """(variable, URL, host, port) of the first proxy variable that names a stockade
    gateway (the Service ``stockade export kubernetes`` writes, ``stockade-gateway.NS``)."""
    from stockade.export._kubernetes import GATEWAY_NAME
    from stockade.policy._upstream import parse_proxy_url, redact_url

    for name in _GATEWAY_VARIABLES:
        value = environ.get(name, "")
        if not value:
            continue
        try:
            host, port = parse_proxy_url(value if "://" in value else "http://" + value)
        except ValueError:
            continue
        if host.split(".", 1)[0] == GATEWAY_NAME:
            return name, redact_url(value), host, port
    return None


def kubernetes_check(
    results: Sequence[Mapping[str, object]],
    policy_path: Path | None = None,
    url: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    root: Path = Path("/"),
) -> dict[str, object]:
    """Whether stockade runs inside a Kubernetes pod; if so, which of its layers this pod
    permits (read from the other checks' ``results``) and, when the proxy variables of
    stockade's own environment name a stockade gateway, whether the upstream in force
    chains to it (the pod's only way out) and how to make it.

    ``environ`` (``os.environ`` when omitted) and ``root`` are the inputs, so that a test
    can lay out a pod. Fails only for a gateway named and not chained to.
    """
    env = os.environ if environ is None else environ
    check: dict[str, object] = {
        "name": "kubernetes pod",
        "ok": True,
        "fix": "",
        "layers": [],
    }
    inside, evidence = pod_evidence(env, root)
    if not inside:
        check["detail"] = "not in a Kubernetes pod" + (
            f" (only {', '.join(evidence)}: not enough to tell)" if evidence else ""
        )
        return check
    by_name = {str(c.get("name")): c for c in results}
    permits: list[str] = []
    refuses: list[str] = []
    for layer, needs in _POD_LAYERS:
        ok = all(bool(by_name[n].get("ok")) for n in needs if n in by_name)
        (permits if ok else refuses).append(layer)
    limits = by_name.get("limits")
    if limits is not None and not str(limits.get("detail", "")).startswith("rlimits only"):
        permits.append("limits (a delegated cgroup)")
    else:
        refuses.append("limits by cgroup (rlimits only)")
    check["layers"] = [layer.split(" ", 1)[0] for layer in permits]
    allowed = ", ".join(permits) or "none of stockade's own layers"
    detail = f"in a Kubernetes pod ({'; '.join(evidence)}); this pod permits {allowed}" + (
        f"; not {', '.join(refuses)}" if refuses else ""
    )
    fixes: list[str] = []
    if refuses and not permits:
        fixes.append(
            "stockade run needs user namespaces (refused by RuntimeDefault seccomp profiles "
            "without CAP_SYS_ADMIN, and unavailable under gVisor); run the agent in the pod "
            "without stockade run, or give the pod a profile that allows them"
        )
    gateway = _named_gateway(env)
    if gateway is None:
        check["detail"] = detail + "; no HTTPS_PROXY or HTTP_PROXY names a stockade gateway"
        check["fix"] = "; ".join(fixes)
        return check
    variable, shown, host, port = gateway
    chained, why = _chains_to(host, port, policy_path, url, env)
    check["detail"] = f"{detail}; {variable}={shown} names the gateway: {why}"
    if not chained:
        check["ok"] = False
        fixes.insert(
            0,
            'chain to it: [network.upstream] proxy = "env" and connect_by = "name" in '
            "~/.config/stockade/policy.toml (or connect_by there and stockade run "
            f"--upstream-proxy http://{host}:{port}); the pod's network lets nothing else out",
        )
    if env.get("STOCKADE_IDENTITY_TOKEN_FILE"):
        fixes.append(
            "this pod presents a projected token to the gateway (--identity tokenreview); "
            "stockade's upstream sends only auth_file's user:password, read when a run "
            "starts, and a token rotates: prefer peer-ip identity for pods that run stockade"
        )
    check["fix"] = "; ".join(fixes)
    return check


def _chains_to(
    host: str, port: int, policy_path: Path | None, url: str | None, env: Mapping[str, str]
) -> tuple[bool, str]:
    """Whether the upstream in force (policy, ``--upstream-proxy``, ``env``) is the
    gateway at ``host:port``, and what it is."""
    import tempfile

    from stockade._exceptions import PolicyError
    from stockade.egress.upstream import resolve_upstream
    from stockade.policy import load_policy
    from stockade.policy._load import with_upstream_proxy

    try:
        with tempfile.TemporaryDirectory(prefix="stockade-doctor-") as ws:
            policy = load_policy(policy_path, workspace=Path(ws))
        if url is not None:
            policy = with_upstream_proxy(policy, url)
        upstream = resolve_upstream(policy.network.upstream, env)
    except PolicyError as exc:
        return False, f"the policy does not load ({exc})"
    if upstream is None:
        return False, "stockade's proxy dials directly (no [network.upstream], or NO_PROXY=*)"
    if (upstream.host, upstream.port) == (host, port):
        if upstream.connect_by != "name":
            # CONNECT 203.0.113.7:443 names no host: the gateway decides it as the
            # literal, which the pod's policy does not list.
            return False, (
                f"stockade's proxy chains to it (from {upstream.source}) by address, which "
                "the gateway refuses: it decides by name"
            )
        return True, f"stockade's proxy chains to it (from {upstream.source}), by name"
    return False, f"stockade's proxy chains to {upstream.url} instead (from {upstream.source})"


def gvisor_check() -> dict[str, object]:
    """runsc for ``[container] backend = "gvisor"``: its release and platform, and
    whether a rootless sandbox starts here; and whether stockade itself runs on gVisor,
    where bubblewrap cannot make a network namespace (gvisor #13438) and Landlock is
    ENOSYS. Missing runsc is fine (the backend is optional)."""
    from stockade import Unavailable
    from stockade.enforce import gvisor

    check: dict[str, object] = {"name": "gvisor", "ok": True, "fix": "", "layers": ["container"]}
    if gvisor.inside_gvisor():
        check.update(
            ok=False,
            detail="stockade itself runs inside gVisor (a GKE Sandbox or Modal host): "
            "bubblewrap cannot make a network namespace here and Landlock is ENOSYS",
            fix="rely on the platform's own sandbox and egress controls, or run stockade on a "
            "host or VM with a Linux kernel of its own",
        )
        return check
    path = gvisor.find_runsc()
    if path is None:
        check.update(detail="runsc not installed (optional: backend gvisor)", fix=gvisor.GET_RUNSC)
        return check
    try:
        found = gvisor.require_runsc()
    except Unavailable as exc:
        check.update(detail=f"{exc} (backend gvisor is refused)", fix=gvisor.GET_RUNSC)
        return check
    have = f"release-{found.release[0]:08d}.{found.release[1]}"
    try:
        probe = subprocess.run(
            [
                str(found.path),
                "--rootless",
                "--network=none",
                f"--platform={found.platform}",
                "do",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        works, why = probe.returncode == 0, probe.stderr.strip().splitlines()[-1:] or [""]
    except (OSError, subprocess.TimeoutExpired) as exc:
        works, why = False, [str(exc)]
    kvm = "; /dev/kvm present (never used unless asked)" if os.path.exists("/dev/kvm") else ""
    check.update(
        ok=works,
        detail=f"{found.path} ({have}, platform {found.platform}); rootless probe "
        + ("works" if works else f"failed: {why[0][:120]}")
        + kvm,
        fix=""
        if works
        else "see docs/gvisor.md; 'runsc --rootless --network=none do true' must work",
    )
    return check


def execute(args: argparse.Namespace) -> int:
    """Print the checks; exit 1 when a layer that is on by default cannot be enforced (or
    the upstream proxy in force does not work)."""
    results = checks(args.policy, args.upstream_proxy, args.connect_to)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for c in results:
            mark = "ok  " if c["ok"] else "FAIL"
            print(f"[{mark}] {c['name']:<18} {c['detail']}")
            if c["fix"]:
                print(f"       fix: {c['fix']}")
    return 0 if all(c["ok"] for c in results) else 1
