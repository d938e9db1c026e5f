"""Start-up cost of one sandboxed command, against its baselines, measured in one run.

Measures the mean wall time of: plain ``true``; bare ``bwrap ... true`` with the same
namespaces; ``stockade run -- true`` (the CLI, every layer on), in-process and handed to a
warm ``stockade server`` (through the installed ``stockade`` command, the compiled front
end after scripts/setup, and through the Python client); ``srt true`` (Anthropic's
sandbox-runtime, installed into a temporary folder with npm when npm is available);
``stockade.run(["true"])`` called repeatedly in one warm Python process; when a runsc is
installed (scripts/setup --gvisor), ``stockade run --backend gvisor -- true`` and bare
``runsc do true``; and ``stockade run --backend landlock -- true`` (no namespaces, for
hosts that refuse them), beside bare ``true`` and the Python start-up (``python -c
pass``). Every figure that is a target's numerator is measured in turns with its
baseline (one call of each per round: this machine's speed drifts, a ratio must hold
for one moment). The last line is one JSON object with the figures and the ratios.

Targets (issue 23, every layer on): cold CLI <= 6x bare bwrap, served CLI <= 2.5x bare
bwrap, gVisor CLI <= 1.6x bare ``runsc do``, warm API call <= 3x bare bwrap; landlock
CLI <= 2x (bare ``true`` + Python start-up) and below the bubblewrap CLI; CLI <= 0.3x srt.
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


def interleaved_means(fns: dict[str, Callable[[], object]], n: int = N) -> dict[str, float]:
    """Mean ms of each of ``fns``, measured in turns (one call of each per round), so that
    a ratio between them holds for the same moment of a machine whose speed drifts."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.fmean(values) for name, values in samples.items()}


def run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, **kw)  # type: ignore[call-overload]


def _runsc() -> str | None:
    """A runsc the gVisor backend accepts, or None (then its figures are left out)."""
    from stockade import Unavailable
    from stockade.enforce import gvisor

    try:
        return str(gvisor.require_runsc().path)
    except Unavailable:
        return None


def main() -> int:
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
        cold_env = dict(env, STOCKADE_SERVER="0")
        # Each target is a ratio to its baseline, measured in turns with it (one call of
        # each per round), so that it holds for the same moment of a drifting machine:
        # the cold CLI and the landlock backend against bare bwrap; the landlock target
        # is also relative to bare true plus the Python start-up that both CLIs pay.
        figures["python_ms"] = mean_ms(lambda: run([sys.executable, "-c", "pass"]))
        cold = interleaved_means(
            {
                "bwrap_cold_turns_ms": lambda: run(bare),
                "stockade_cli_ms": lambda: run([stockade, "run", "--", "true"], env=cold_env),
                "stockade_cli_landlock_ms": lambda: run(
                    [stockade, "run", "--backend", "landlock", "--", "true"], env=cold_env
                ),
            }
        )
        figures.update(cold)
        figures["stockade_cli_turns_ms"] = cold["stockade_cli_ms"]
        # The gVisor backend beside it (docs/gvisor.md), in turns with bare ``runsc do``,
        # when a usable runsc is there (scripts/setup --gvisor fetches one).
        figures["stockade_cli_gvisor_ms"] = figures["runsc_do_ms"] = None
        runsc = _runsc()
        if runsc is not None:
            few = max(5, N // 4)
            # Named explicitly: this run's state directory is a fresh one, which holds no
            # record of the cached runsc's digest (stockade would refuse it).
            gvisor_env = dict(cold_env, STOCKADE_RUNSC=runsc)
            figures.update(
                interleaved_means(
                    {
                        "runsc_do_ms": lambda: run(
                            [runsc, "--rootless", "--network=none", "do", "true"]
                        ),
                        "stockade_cli_gvisor_ms": lambda: run(
                            [stockade, "run", "--backend", "gvisor", "--", "true"],
                            env=gvisor_env,
                        ),
                    },
                    n=few,
                )
            )
        # The same command handed to a warm run server (stockade server, docs/server.md),
        # in turns with bare bwrap.
        run([stockade, "server", "start"], env=env)
        try:
            figures.update(
                interleaved_means(
                    {
                        "bwrap_served_turns_ms": lambda: run(bare),
                        "stockade_cli_served_ms": lambda: run(
                            [stockade, "run", "--", "true"], env=env
                        ),
                    }
                )
            )
            # The same through the Python client, for comparison with the compiled front
            # end (which scripts/setup installs as the stockade command).
            python_cli = [sys.executable, "-P", "-m", "stockade"]
            figures["stockade_cli_served_python_ms"] = mean_ms(
                lambda: run([*python_cli, "run", "--", "true"], env=env)
            )
        finally:
            run([stockade, "server", "stop"], env=env)
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
        both = interleaved_means(
            {
                "bwrap_ms": lambda: run(bare),
                "stockade_api_warm_ms": lambda: sd.run(["true"], workspace=ws),
            }
        )
        figures.update(both)
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
    cli, api, bw = figures["stockade_cli_ms"], figures["stockade_api_warm_ms"], figures["bwrap_ms"]
    assert cli is not None
    assert api is not None
    assert bw is not None
    served = figures["stockade_cli_served_ms"]
    assert served is not None
    result["cli_vs_srt"] = round(cli / figures["srt_ms"], 3) if figures["srt_ms"] else None
    result["cli_served_vs_srt"] = (
        round(served / figures["srt_ms"], 3) if figures["srt_ms"] else None
    )
    result["cli_served_vs_cli"] = round(served / cli, 3)
    gvisor, runsc_do = figures["stockade_cli_gvisor_ms"], figures["runsc_do_ms"]
    result["gvisor_vs_bubblewrap_cli"] = round(gvisor / cli, 2) if gvisor else None
    # The targets of issue 23: each ratio is to the baseline measured in turns with it.
    bw_cold, bw_served = figures["bwrap_cold_turns_ms"], figures["bwrap_served_turns_ms"]
    assert bw_cold is not None
    assert bw_served is not None
    result["cli_vs_bwrap"] = round(cli / bw_cold, 2)
    result["cli_served_vs_bwrap"] = round(served / bw_served, 2)
    result["gvisor_vs_runsc_do"] = round(gvisor / runsc_do, 2) if gvisor and runsc_do else None
    landlock, turns = figures["stockade_cli_landlock_ms"], figures["stockade_cli_turns_ms"]
    assert landlock is not None
    assert turns is not None
    python_ms, true_ms = figures["python_ms"], figures["true_ms"]
    assert python_ms is not None
    assert true_ms is not None
    result["landlock_vs_bubblewrap_cli"] = round(landlock / turns, 2)
    result["landlock_vs_true_plus_python"] = round(landlock / (true_ms + python_ms), 2)
    result["frontend"] = frontend
    result["api_vs_bwrap"] = round(api / bw, 2)
    first, later = figures["sandbox_first_run_ms"], figures["sandbox_later_runs_ms"]
    assert first is not None
    assert later is not None
    result["sandbox_later_vs_first"] = round(later / first, 2)
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
