"""A real test suite inside and outside the sandbox, measured in the same run.

Downloads the source distribution of a pure-Python package from PyPI (more-itertools,
whose test suite needs only the standard library), creates a virtual environment in a
temporary workspace, and runs the package's unittest suite ``ROUNDS`` times directly and
``ROUNDS`` times under ``stockade run`` with every layer on, interleaved. When a runsc is
installed (scripts/setup --gvisor), a third series runs it under ``stockade run --backend
gvisor`` in the same turns (no target: docs/gvisor.md reports what that boundary costs),
and one under ``--backend landlock`` (no namespaces; docs/security-model.md), whose ratio
is given against bare and against bubblewrap (no target: it is the fallback where
bubblewrap cannot run).
Each sandboxed series also records the peak memory of the sandbox: the summed RSS of every
process under ``stockade run`` (bubblewrap, or runsc, its Sentry and gofer, with the test
suite in them), sampled every 50 ms (shared pages counted once per process). The last line
is one JSON object with the mean times, the slowdown ratios and the load average at the
start and the end (the machine's load decides absolute times; the ratios hold for one
run). Target (bubblewrap): <= 1.05.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROUNDS = int(os.environ.get("STOCKADE_BENCH_ROUNDS", "3"))
PACKAGE = os.environ.get("STOCKADE_BENCH_PACKAGE", "more-itertools")


def fetch(ws: Path) -> Path:
    """Download and unpack the package's sdist into ``ws``; return the source tree."""
    dl = ws / "dl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(dl),
            PACKAGE,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    archive = next(dl.iterdir())
    with tarfile.open(archive) as tar:
        tar.extractall(ws, filter="data")
    return next(
        p
        for p in ws.iterdir()
        if p.is_dir() and p.name.lower().startswith(PACKAGE.replace("-", "_")[:4])
    )


def _tree_rss_kib(root: int) -> int:
    """The summed VmRSS of every process below ``root`` (not ``root`` itself)."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            todo.append(child)
            try:
                status = Path(f"/proc/{child}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def timed(argv: list[str], cwd: Path, env: dict[str, str], peak: list[int] | None = None) -> float:
    """Run ``argv``; its wall time. With ``peak``, append the peak RSS (KiB) of the
    processes below it, sampled every 50 ms while it runs."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    highest = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            highest[0] = max(highest[0], _tree_rss_kib(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True) if peak is not None else None
    if sampler is not None:
        sampler.start()
    out, err = proc.communicate()
    elapsed = time.perf_counter() - start
    done.set()
    if sampler is not None and peak is not None:
        sampler.join()
        peak.append(highest[0])
    if proc.returncode != 0:
        raise SystemExit(f"bench/workload.py: {argv[:4]} failed:\n{out[-2000:]}{err[-2000:]}")
    return elapsed


def _runsc() -> str | None:
    """A runsc the gVisor backend accepts, or None (then its series is left out)."""
    from stockade import Unavailable
    from stockade.enforce import gvisor

    try:
        return str(gvisor.require_runsc().path)
    except Unavailable:
        return None


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 3)


def main() -> int:
    stockade = str(Path(sys.executable).with_name("stockade"))
    load = [round(os.getloadavg()[0], 1)]
    with tempfile.TemporaryDirectory(prefix="stockade-workload-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        src = fetch(ws)
        venv = ws / ".venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        suite = [python, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-q"]
        # In process (STOCKADE_SERVER=0): the sandbox's processes are then below the
        # stockade process whose tree the memory sampler walks; a served run's are the
        # run server's (the peak read 0 MiB). About 80 ms of a run of seconds.
        env = dict(
            os.environ,
            XDG_STATE_HOME=str(Path(tmp) / "state"),
            PYTHONDONTWRITEBYTECODE="1",
            STOCKADE_SERVER="0",
        )
        timed(suite, src, env)  # warm the page cache
        runsc = _runsc()
        bare: list[float] = []
        boxed: list[float] = []
        gvisor: list[float] = []
        boxed_kib: list[int] = []
        gvisor_kib: list[int] = []
        landlock: list[float] = []
        landlock_kib: list[int] = []
        run = [stockade, "run", "--workspace", str(ws)]
        for _ in range(ROUNDS):
            bare.append(timed(suite, src, env))
            boxed.append(timed([*run, "--", *suite], src, env, boxed_kib))
            argv = [*run, "--backend", "landlock", "--", *suite]
            landlock.append(timed(argv, src, env, landlock_kib))
            if runsc is not None:
                gvisor_env = dict(env, STOCKADE_RUNSC=runsc)
                argv = [*run, "--backend", "gvisor", "--", *suite]
                gvisor.append(timed(argv, src, gvisor_env, gvisor_kib))
    load.append(round(os.getloadavg()[0], 1))
    result: dict[str, object] = {
        "package": PACKAGE,
        "rounds": ROUNDS,
        "load": load,
        "bare_s": _mean(bare),
        "stockade_s": _mean(boxed),
        "slowdown": round(statistics.fmean(boxed) / statistics.fmean(bare), 3),
        "target": 1.05,
        "sandbox_peak_mib": round(max(boxed_kib) / 1024, 1),
        "landlock_s": _mean(landlock),
        "landlock_slowdown": round(statistics.fmean(landlock) / statistics.fmean(bare), 3),
        "landlock_vs_bubblewrap": round(statistics.fmean(landlock) / statistics.fmean(boxed), 3),
        "landlock_sandbox_peak_mib": round(max(landlock_kib) / 1024, 1),
        "gvisor_s": _mean(gvisor) if gvisor else None,
        "gvisor_slowdown": (
            round(statistics.fmean(gvisor) / statistics.fmean(bare), 3) if gvisor else None
        ),
        "gvisor_vs_bubblewrap": (
            round(statistics.fmean(gvisor) / statistics.fmean(boxed), 3) if gvisor else None
        ),
        "gvisor_sandbox_peak_mib": round(max(gvisor_kib) / 1024, 1) if gvisor_kib else None,
    }
    print(
        f"  {PACKAGE} test suite: bare {result['bare_s']} s, under stockade {result['stockade_s']} s"
        f" ({result['slowdown']}x, sandbox peak {result['sandbox_peak_mib']} MiB)"
    )
    print(
        f"  under stockade --backend landlock {result['landlock_s']} s"
        f" ({result['landlock_slowdown']}x bare, {result['landlock_vs_bubblewrap']}x bubblewrap,"
        f" sandbox peak {result['landlock_sandbox_peak_mib']} MiB)"
    )
    if gvisor:
        print(
            f"  under stockade --backend gvisor {result['gvisor_s']} s ({result['gvisor_slowdown']}x"
            f" bare, {result['gvisor_vs_bubblewrap']}x bubblewrap, sandbox peak"
            f" {result['gvisor_sandbox_peak_mib']} MiB)"
        )
    else:
        print("  gvisor: no usable runsc (scripts/setup --gvisor); its series is left out")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
