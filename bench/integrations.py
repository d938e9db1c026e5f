"""What each framework adapter adds to one tool call, measured in one process, in turns.

For each adapter whose framework is installed: one call of ``sh -c true`` through the
adapter's own entry point (the OpenAI Agents SDK session's ``exec``, pydantic-ai's
``WorkspaceBackend.run``, deepagents' ``execute``, LangChain's persistent shell through
``StockadeExecutionPolicy``: a spawn, one command, the end; Inspect AI's sandbox ``exec``),
beside the same command through ``stockade.Sandbox.run`` on a warm sandbox of the same
policy (what the adapters call), and ``stockade-sh -c true`` beside ``stockade run -- sh -c true`` as processes. Target: each
adapter adds <= 10% (or <= 5 ms) to the call. The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
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
from typing import Any

import stockade

N = int(os.environ.get("STOCKADE_BENCH_N", "30"))


def interleaved_means(fns: dict[str, Callable[[], object]], n: int = N) -> dict[str, float]:
    """Mean ms of each of ``fns``, one call of each per round (a drifting machine's speed
    is then the same for both sides of a ratio)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.fmean(values) for name, values in samples.items()}


def report(name: str, means: dict[str, float], out: dict[str, Any]) -> None:
    adapter, base = means["adapter"], means["stockade"]
    extra = adapter - base
    ok = extra <= max(0.10 * base, 5.0)
    print(
        f"{name:<14} adapter {adapter:7.1f} ms   stockade {base:7.1f} ms   "
        f"ratio {adapter / base:5.3f}   +{extra:5.1f} ms   {'ok' if ok else 'OVER TARGET'}"
    )
    out[name] = {"adapter_ms": adapter, "stockade_ms": base, "ratio": adapter / base}


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-int-"))
    ws = root / "ws"
    ws.mkdir()
    out: dict[str, Any] = {}
    argv = ["sh", "-c", "true"]
    loop = asyncio.new_event_loop()
    with stockade.Sandbox(workspace=ws) as base:

        def baseline() -> None:
            base.run(argv, capture_output=True, input="")

        try:
            from agents.sandbox import Manifest

            from stockade.integrations.openai_agents import StockadeSandboxClient

            client = StockadeSandboxClient()
            session = loop.run_until_complete(client.create(manifest=Manifest(root=str(ws))))
            means = interleaved_means(
                {
                    "adapter": lambda: loop.run_until_complete(session.exec("true", shell=True)),
                    "stockade": baseline,
                }
            )
            report("openai-agents", means, out)
            loop.run_until_complete(client.delete(session))
        except ImportError:
            print("openai-agents: not installed")

        try:
            from stockade.integrations.pydantic_ai import StockadeWorkspaceBackend

            with stockade.Sandbox(workspace=ws, tmp="session") as sb:
                backend = StockadeWorkspaceBackend(sb)
                means = interleaved_means(
                    {
                        "adapter": lambda: loop.run_until_complete(backend.run("true", shell=True)),
                        "stockade": baseline,
                    }
                )
            report("pydantic-ai", means, out)
        except ImportError:
            print("pydantic-ai: not installed")

        try:
            from stockade.integrations.deepagents import StockadeBackend

            with StockadeBackend(ws) as deep:
                means = interleaved_means(
                    {"adapter": lambda: deep.execute("true"), "stockade": baseline}
                )
            report("deepagents", means, out)
        except ImportError:
            print("deepagents: not installed")

        try:
            from stockade.integrations.langchain import StockadeExecutionPolicy

            policy = StockadeExecutionPolicy()

            def shell_call() -> None:
                proc = policy.spawn(workspace=ws, env={}, command=["sh"])
                proc.communicate("true\n")

            def popen_call() -> None:
                proc = base.popen(["sh"], stdin=subprocess.PIPE, text=True)
                proc.communicate("true\n")

            # A persistent shell's call is a spawn, one command and its end; the baseline is
            # the same through Sandbox.popen on the warm sandbox.
            means = interleaved_means({"adapter": shell_call, "stockade": popen_call})
            report("langchain", means, out)
        except ImportError:
            print("langchain: not installed")

        try:
            from stockade.integrations.inspect_ai import StockadeSandboxEnvironment

            cls = StockadeSandboxEnvironment
            envs = loop.run_until_complete(cls.sample_init("bench", None, {}))
            inspect_env = envs["default"].as_type(cls)
            sample_sb = inspect_env.sandbox

            # Inspect's bash() tool calls exec(); the baseline is Sandbox.run on the
            # sample's own sandbox (its workspace, its session /tmp), what exec() calls.
            means = interleaved_means(
                {
                    "adapter": lambda: loop.run_until_complete(inspect_env.exec(argv)),
                    "stockade": lambda: sample_sb.run(
                        argv, cwd=inspect_env.workspace, capture_output=True, input=b""
                    ),
                }
            )
            report("inspect-ai", means, out)
            loop.run_until_complete(cls.sample_cleanup("bench", None, envs, False))
        except ImportError:
            print("inspect-ai: not installed")
    loop.close()

    sh = shutil.which("stockade-sh")
    cli = shutil.which("stockade")
    if sh and cli:
        env = {**os.environ, "STOCKADE_WORKSPACE": str(ws), "STOCKADE_SERVER": "0"}

        def shim() -> None:
            subprocess.run([sh, "-c", "true"], env=env, cwd=ws, check=True)

        def direct() -> None:
            subprocess.run(
                [cli, "run", "--workspace", str(ws), "--", "sh", "-c", "true"],
                env=env,
                cwd=ws,
                check=True,
            )

        report("stockade-sh", interleaved_means({"adapter": shim, "stockade": direct}), out)
    else:
        print("stockade-sh: not on PATH (scripts/setup installs it)", file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
