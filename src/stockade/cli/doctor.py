"""``stockade doctor``: what this host can enforce, and how to fix what it cannot."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``doctor``."""
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--policy", type=Path, metavar="FILE", help="the policy whose upstream proxy to check"
    )
    parser.add_argument(
        "--upstream-proxy", metavar="URL", help="check this upstream proxy instead (as run takes)"
    )


def upstream_check(policy_path: Path | None = None, url: str | None = None) -> dict[str, object]:
    """The upstream proxy in force (``[network.upstream]``, ``--upstream-proxy``): which
    one, whether it answers a CONNECT for an allowed host, and the fix when it does not."""
    import tempfile

    from stockade._exceptions import PolicyError
    from stockade.egress.upstream import PROXY_VARIABLES, probe, resolve_upstream
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
    check["detail"] = f"{shown}; no allowed host name to test a CONNECT with"
    return check


def checks(policy_path: Path | None = None, url: str | None = None) -> list[dict[str, object]]:
    """Run every host check; each is a dict with name, ok, detail, fix and layers."""
    from stockade.runtime import _host

    out: list[dict[str, object]] = []
    bwrap = _host.find_bwrap()
    if bwrap:
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, check=False
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
    out.append(upstream_check(policy_path, url))
    out.append(gvisor_check())
    return out


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
    results = checks(args.policy, args.upstream_proxy)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for c in results:
            mark = "ok  " if c["ok"] else "FAIL"
            print(f"[{mark}] {c['name']:<18} {c['detail']}")
            if c["fix"]:
                print(f"       fix: {c['fix']}")
    return 0 if all(c["ok"] for c in results) else 1
