"""Start-up cost of the inner launcher: ``launcher SPEC -- /bin/true`` vs ``/bin/true``.

Both runs go through ``subprocess.run`` the same way (as uid 65534 when run as root,
because the launcher refuses to start with capabilities).  The launcher applies both
layers: a Landlock ruleset over the usual system paths and a workspace, the scopes, the
seccomp filter, and the must-deny probe.  The last line printed is JSON with the means,
the added time and the ratio; the target is at most 10 ms added.

    python bench/launcher.py [N]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from stockade.enforce import landlock, seccomp
from stockade.enforce.launcher import LauncherSpec, prepare

TARGET_ADDED_MS = 10.0


def _time(argv: Sequence[str], n: int, pass_fds: Sequence[int] = ()) -> list[float]:
    user = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = subprocess.run(  # type: ignore[call-overload]
            argv, pass_fds=pass_fds, check=False, stdout=subprocess.DEVNULL, **user
        )
        samples.append((time.perf_counter() - t0) * 1000)
        if r.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {r.returncode}")
    return samples


def main(argv: list[str]) -> int:
    """Run the benchmark and print the figures; exit 1 if the target is missed."""
    n = int(argv[1]) if len(argv) > 1 else 200
    abi = landlock.abi_version()
    with tempfile.TemporaryDirectory() as ws:
        spec = LauncherSpec(
            read_paths=("/usr", "/bin", "/lib", "/lib64", "/etc"),
            write_paths=(ws, "/dev/null"),
            landlock=abi >= 1,
            scope=abi >= 6,
            seccomp_bpf=seccomp.build_filter(),
            seccomp_expected=True,
            deny_probe="/" if abi >= 1 else None,
        )
        prefix, fd = prepare(spec)
        if os.geteuid() == 0:
            # The cache is private to root (0700): give uid 65534 a copy it can run.
            os.chmod(ws, 0o755)
            copy = os.path.join(ws, "stockade-launcher")
            shutil.copy(prefix[0], copy)
            os.chmod(copy, 0o755)
            prefix[0] = copy
        try:
            # Warm-up: page cache, dynamic loader caches.
            _time(["/bin/true"], 10)
            _time([*prefix, "/bin/true"], 10, (fd,))
            plain = _time(["/bin/true"], n)
            launched = _time([*prefix, "/bin/true"], n, (fd,))
        finally:
            os.close(fd)
    plain_ms = statistics.fmean(plain)
    launched_ms = statistics.fmean(launched)
    added = launched_ms - plain_ms
    result = {
        "n": n,
        "landlock_abi": abi,
        "true_mean_ms": round(plain_ms, 3),
        "launcher_true_mean_ms": round(launched_ms, 3),
        "true_median_ms": round(statistics.median(plain), 3),
        "launcher_true_median_ms": round(statistics.median(launched), 3),
        "added_ms": round(added, 3),
        "ratio": round(launched_ms / plain_ms, 3),
        "target_added_ms": TARGET_ADDED_MS,
        "ok": added <= TARGET_ADDED_MS,
    }
    print(f"/bin/true: {plain_ms:.3f} ms; launcher + /bin/true: {launched_ms:.3f} ms")
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
