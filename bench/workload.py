"""A real test suite inside and outside the sandbox, measured in the same run.

Downloads the source distribution of a pure-Python package from PyPI (more-itertools,
whose test suite needs only the standard library), creates a virtual environment in a
temporary workspace, and runs the package's unittest suite ``ROUNDS`` times directly and
``ROUNDS`` times under ``stockade run`` with every layer on, interleaved. The last line is
one JSON object with the mean times and the slowdown ratio. Target: <= 1.05.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
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


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"bench/workload.py: {argv[:4]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return elapsed


def main() -> int:
    stockade = str(Path(sys.executable).with_name("stockade"))
    with tempfile.TemporaryDirectory(prefix="stockade-workload-") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        src = fetch(ws)
        venv = ws / ".venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        suite = [python, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-q"]
        env = dict(os.environ, XDG_STATE_HOME=str(Path(tmp) / "state"), PYTHONDONTWRITEBYTECODE="1")
        timed(suite, src, env)  # warm the page cache
        bare: list[float] = []
        boxed: list[float] = []
        for _ in range(ROUNDS):
            bare.append(timed(suite, src, env))
            boxed.append(timed([stockade, "run", "--workspace", str(ws), "--", *suite], src, env))
    result = {
        "package": PACKAGE,
        "rounds": ROUNDS,
        "bare_s": round(statistics.fmean(bare), 3),
        "stockade_s": round(statistics.fmean(boxed), 3),
        "slowdown": round(statistics.fmean(boxed) / statistics.fmean(bare), 3),
        "target": 1.05,
    }
    print(
        f"  {PACKAGE} test suite: bare {result['bare_s']} s, under stockade {result['stockade_s']} s"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
