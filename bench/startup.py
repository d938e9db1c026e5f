"""Start-up cost of one sandboxed command, against its baselines, measured in one run.

Measures the wall time of: plain ``true``; bare ``bwrap ... true`` with the same
namespaces; ``stockade run -- true`` (the CLI, every layer on) as a user types it
(through the installed ``stockade`` command, the compiled front end after
scripts/setup: its first run starts a run server, the runs after it are served; the
first run alone is measured too), in-process (``STOCKADE_SERVER=0``), and handed to a
``stockade server`` started by hand (through the front end and through the Python
client); ``srt true`` (Anthropic's sandbox-runtime, installed into a temporary folder
with npm when npm is available); ``stockade.run(["true"])`` called repeatedly in one
warm Python process; when a runsc is installed (scripts/setup --gvisor), ``stockade run
--backend gvisor -- true`` (served, and in-process) and bare ``runsc do true``; and
``stockade run --backend landlock -- true`` (no namespaces, for hosts that refuse them)
as typed (served) and in-process, beside bare ``true`` and the Python start-up (``python
-c pass``).

Every target is the median of per-round ratios to its baseline, measured in turns with
it (one call of each per round: this machine's speed drifts and its cores are shared,
a ratio must hold for one moment); figures in ms are medians. The load average at the
start and the end is part of the result. The last line is one JSON object with the
figures and the ratios.

Targets (issue 23, every layer on): CLI <= 6x bare bwrap, served CLI <= 2.5x bare bwrap,
gVisor CLI <= 1.6x bare ``runsc do``, warm API call <= 3x bare bwrap; landlock CLI <= 2x
(bare ``true`` + Python start-up) and below the bubblewrap CLI (both as typed; the
in-process landlock run is reported beside them: its imports alone cost several times
the Python start-up); CLI <= 0.3x srt.
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
from collections.abc import Callable
from pathlib import Path

from _srt import install_srt

N = int(os.environ.get("STOCKADE_BENCH_N", "40"))


def mean_ms(fn: Callable[[], object], n: int = N) -> float:
    fn()  # warm caches (page cache, the launcher build)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.fmean(samples)


def turns(
    fns: dict[str, Callable[[], object]], n: int = N, warm: bool = True
) -> dict[str, list[float]]:
    """The ms of each of ``fns`` in ``n`` rounds of one call each, in turns, so that the
    ratio of a round's pair holds for the same moment of a machine whose speed drifts
    (``warm``: one call of each first, not counted)."""
    if warm:
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    return samples


def median_ratio(top: list[float], bottom: list[float]) -> float:
    """The median of the per-round ratios of two series measured in turns."""
    return statistics.median(a / b for a, b in zip(top, bottom, strict=True))


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, **kw)  # type: ignore[call-overload]


def wait_for_server(stockade: str, env: dict[str, str]) -> None:
    """Wait until the run server of ``env``'s user listens (one was started)."""
    deadline = time.monotonic() + 30
    status = [stockade, "server", "status"]
    while subprocess.run(status, env=env, capture_output=True, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the run server the first run started did not come up in 30 s")
        time.sleep(0.02)


def _runsc() -> str | None:
    """A runsc the gVisor backend accepts, or None (then its figures are left out)."""
    from stockade import Unavailable
    from stockade.enforce import gvisor

    try:
        return str(gvisor.require_runsc().path)
    except Unavailable:
        return None


def main() -> int:
    # Other work on the machine shows in every figure: the load is part of the result.
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    stockade = str(Path(sys.executable).with_name("stockade"))
    from stockade.cli._frontend import MARKER

    # Which stockade command is measured: the compiled front end or pip's Python script.
    frontend = "compiled" if MARKER in Path(stockade).read_bytes() else "python"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        print("bench/startup.py: bwrap is not installed", file=sys.stderr)
        return 1
    # The workspace is a project directory beside the repository, as an agent's would be,
    # not one under /tmp: on the machine these figures come from, /tmp makes directories
    # ten times slower (~400 us a mkdir against ~35 us elsewhere on the same disk), and a
    # run makes and removes a few (the placeholders of protected paths).
    base = Path(
        os.environ.get("STOCKADE_BENCH_DIR") or Path(__file__).resolve().parent.parent / "out"
    )
    base.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stockade-bench-", dir=base) as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        env = dict(os.environ, XDG_STATE_HOME=str(Path(tmp) / "state"))
        os.chdir(ws)
        figures: dict[str, float | None] = {}
        figures["true_ms"] = mean_ms(lambda: run(["true"]))
        bare = [
            bwrap,
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            str(ws),
            str(ws),
            "--",
            "true",
        ]
        inprocess_env = dict(env, STOCKADE_SERVER="0")
        ratios: dict[str, float | None] = {}
        stop = [stockade, "server", "stop"]
        figures["python_ms"] = mean_ms(lambda: run([sys.executable, "-c", "pass"]))
        # Each target is the median of per-round ratios to its baseline, measured in
        # turns with it (one call of each per round), so that it holds for the same
        # moment of a drifting machine shared with other work.
        #
        # The first run of a user: no server listens, so the front end starts one and
        # runs the command in Python (docs/server.md, "Started on first use"); each round
        # stops the server again, so every such run is a first one.
        first: dict[str, list[float]] = {"bwrap": [], "first": []}
        for _ in range(max(5, N // 8)):
            run(stop, env=env)
            pair = turns(
                {
                    "bwrap": lambda: run(bare),
                    "first": lambda: run([stockade, "run", "--", "true"], env=env),
                },
                n=1,
                warm=False,
            )
            for name, values in pair.items():
                first[name] += values
            # Stopped only once it listens: a server still loading would answer no stop,
            # and would serve the next round's "first" run.
            wait_for_server(stockade, env)
        figures["stockade_cli_first_ms"] = statistics.median(first["first"])
        ratios["cli_first_vs_bwrap"] = median_ratio(first["first"], first["bwrap"])
        # Cold: the command as a user types it, with nothing started by hand: the runs
        # after the first, served by the server that first run started (once it listens),
        # beside the same command in-process (STOCKADE_SERVER=0: the opt-out, and the
        # Python script's path) and the landlock backend's.
        run(stop, env=env)
        run([stockade, "run", "--", "true"], env=env)  # the first run: it starts the server
        wait_for_server(stockade, env)
        cold = turns(
            {
                "bwrap_cold_turns_ms": lambda: run(bare),
                "stockade_cli_ms": lambda: run([stockade, "run", "--", "true"], env=env),
                "stockade_cli_inprocess_ms": lambda: run(
                    [stockade, "run", "--", "true"], env=inprocess_env
                ),
                # The landlock backend as typed (served, like the bubblewrap line above),
                # and in-process (the Python start-up and imports paid by the run).
                "stockade_cli_landlock_ms": lambda: run(
                    [stockade, "run", "--backend", "landlock", "--", "true"], env=env
                ),
                "stockade_cli_landlock_inprocess_ms": lambda: run(
                    [stockade, "run", "--backend", "landlock", "--", "true"], env=inprocess_env
                ),
            }
        )
        figures.update(medians(cold))
        figures["stockade_cli_turns_ms"] = figures["stockade_cli_inprocess_ms"]
        bw_cold = cold["bwrap_cold_turns_ms"]
        ratios["cli_vs_bwrap"] = median_ratio(cold["stockade_cli_ms"], bw_cold)
        ratios["cli_inprocess_vs_bwrap"] = median_ratio(cold["stockade_cli_inprocess_ms"], bw_cold)
        ratios["landlock_vs_bubblewrap_cli"] = median_ratio(
            cold["stockade_cli_landlock_ms"], cold["stockade_cli_ms"]
        )
        ratios["landlock_inprocess_vs_bubblewrap_inprocess"] = median_ratio(
            cold["stockade_cli_landlock_inprocess_ms"], cold["stockade_cli_inprocess_ms"]
        )
        # The gVisor backend beside it (docs/gvisor.md), in turns with bare ``runsc do``,
        # when a usable runsc is there (scripts/setup --gvisor fetches one): through the
        # server, as any `stockade run`, and in-process.
        figures["stockade_cli_gvisor_ms"] = figures["runsc_do_ms"] = None
        figures["stockade_cli_gvisor_inprocess_ms"] = None
        ratios["gvisor_vs_runsc_do"] = ratios["gvisor_inprocess_vs_runsc_do"] = None
        runsc = _runsc()
        if runsc is not None:
            few = max(5, N // 4)
            # Named explicitly: this run's state directory is a fresh one, which holds no
            # record of the cached runsc's digest (stockade would refuse it).
            gvisor = [stockade, "run", "--backend", "gvisor", "--", "true"]
            gv = turns(
                {
                    "runsc_do_ms": lambda: run(
                        [runsc, "--rootless", "--network=none", "do", "true"]
                    ),
                    "stockade_cli_gvisor_ms": lambda: run(
                        gvisor, env=dict(env, STOCKADE_RUNSC=runsc)
                    ),
                    "stockade_cli_gvisor_inprocess_ms": lambda: run(
                        gvisor, env=dict(inprocess_env, STOCKADE_RUNSC=runsc)
                    ),
                },
                n=few,
            )
            figures.update(medians(gv))
            ratios["gvisor_vs_runsc_do"] = median_ratio(
                gv["stockade_cli_gvisor_ms"], gv["runsc_do_ms"]
            )
            ratios["gvisor_inprocess_vs_runsc_do"] = median_ratio(
                gv["stockade_cli_gvisor_inprocess_ms"], gv["runsc_do_ms"]
            )
        # The same command handed to a warm run server started by hand (stockade server
        # start, docs/server.md), in turns with bare bwrap.
        run(stop, env=env)
        run([stockade, "server", "start"], env=env)
        manual_env = dict(env, STOCKADE_SERVER="manual")
        try:
            served = turns(
                {
                    "bwrap_served_turns_ms": lambda: run(bare),
                    "stockade_cli_served_ms": lambda: run(
                        [stockade, "run", "--", "true"], env=manual_env
                    ),
                }
            )
            figures.update(medians(served))
            ratios["cli_served_vs_bwrap"] = median_ratio(
                served["stockade_cli_served_ms"], served["bwrap_served_turns_ms"]
            )
            # The same through the Python client, for comparison with the compiled front
            # end (which scripts/setup installs as the stockade command).
            python_cli = [sys.executable, "-P", "-m", "stockade"]
            figures["stockade_cli_served_python_ms"] = mean_ms(
                lambda: run([*python_cli, "run", "--", "true"], env=manual_env)
            )
        finally:
            run(stop, env=env)
        srt = install_srt(Path(tmp) / "srt")
        if srt:
            try:
                figures["srt_ms"] = mean_ms(lambda: run([srt, "true"], env=env), n=max(5, N // 4))
            except subprocess.CalledProcessError:
                figures["srt_ms"] = None
        else:
            figures["srt_ms"] = None
        os.environ["XDG_STATE_HOME"] = env["XDG_STATE_HOME"]
        import stockade as sd

        # Bare bwrap and the warm API in turns: their ratio is a target.
        both = turns(
            {
                "bwrap_ms": lambda: run(bare),
                "stockade_api_warm_ms": lambda: sd.run(["true"], workspace=ws),
            }
        )
        figures.update(medians(both))
        ratios["api_vs_bwrap"] = median_ratio(both["stockade_api_warm_ms"], both["bwrap_ms"])
        # A Sandbox with the egress proxy in play: the first run starts the proxy's loop
        # (and makes the policy once); later runs reuse them.
        policy = Path(tmp) / "p.toml"
        policy.write_text(
            '[network]\nallow = ["local.test"]\nhosts = { "local.test" = "127.0.0.1" }\n'
        )
        firsts, laters = [], []
        for _ in range(5):
            t = time.perf_counter()
            with sd.Sandbox(policy, workspace=ws) as box:
                box.run(["true"])
                firsts.append((time.perf_counter() - t) * 1000)
                for _ in range(5):
                    t = time.perf_counter()
                    box.run(["true"])
                    laters.append((time.perf_counter() - t) * 1000)
        figures["sandbox_first_run_ms"] = statistics.fmean(firsts)
        figures["sandbox_later_runs_ms"] = statistics.fmean(laters)
    result: dict[str, object] = {
        k: (round(v, 2) if v is not None else None) for k, v in figures.items()
    }
    result.update({k: (round(v, 2) if v is not None else None) for k, v in ratios.items()})
    inproc, served_ms = figures["stockade_cli_inprocess_ms"], figures["stockade_cli_served_ms"]
    assert inproc is not None
    assert served_ms is not None
    srt_ms = figures["srt_ms"]
    default = figures["stockade_cli_ms"]
    assert default is not None
    result["cli_vs_srt"] = round(default / srt_ms, 3) if srt_ms else None
    result["cli_served_vs_srt"] = round(served_ms / srt_ms, 3) if srt_ms else None
    result["cli_served_vs_cli"] = round(served_ms / inproc, 3)
    gvisor_ms = figures["stockade_cli_gvisor_inprocess_ms"]
    result["gvisor_vs_bubblewrap_cli"] = round(gvisor_ms / inproc, 2) if gvisor_ms else None
    landlock_ms, landlock_inproc, python_ms, true_ms = (
        figures["stockade_cli_landlock_ms"],
        figures["stockade_cli_landlock_inprocess_ms"],
        figures["python_ms"],
        figures["true_ms"],
    )
    assert landlock_ms is not None
    assert landlock_inproc is not None
    assert python_ms is not None
    assert true_ms is not None
    result["landlock_vs_true_plus_python"] = round(landlock_ms / (true_ms + python_ms), 2)
    result["landlock_inprocess_vs_true_plus_python"] = round(
        landlock_inproc / (true_ms + python_ms), 2
    )
    result["frontend"] = frontend
    box_first, box_later = figures["sandbox_first_run_ms"], figures["sandbox_later_runs_ms"]
    assert box_first is not None
    assert box_later is not None
    result["sandbox_later_vs_first"] = round(box_later / box_first, 2)
    result["load_at_start"] = load_at_start
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["targets"] = {
        "cli_vs_bwrap": 6,
        "cli_served_vs_bwrap": 2.5,
        "gvisor_vs_runsc_do": 1.6,
        "cli_ms": 60,
        "cli_vs_srt": 0.3,
        "api_vs_bwrap": 3,
        "sandbox_later_vs_first": "< 1",
        "landlock_vs_true_plus_python": 2,
        "landlock_vs_bubblewrap_cli": "< 1",
    }
    for key, value in result.items():
        if key != "targets":
            print(f"{key:>22}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
