"""``stockade doctor``: what this host can enforce, and how to fix what it cannot."""

from __future__ import annotations

import argparse
import json
import subprocess


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``doctor``."""
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def checks() -> list[dict[str, object]]:
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
    return out


def execute(args: argparse.Namespace) -> int:
    """Print the checks; exit 1 when a layer that is on by default cannot be enforced."""
    results = checks()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for c in results:
            mark = "ok  " if c["ok"] else "FAIL"
            print(f"[{mark}] {c['name']:<18} {c['detail']}")
            if c["fix"]:
                print(f"       fix: {c['fix']}")
    return 0 if all(c["ok"] for c in results) else 1
