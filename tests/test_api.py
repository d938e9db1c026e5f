"""The public Python API: run(), Sandbox (warm, sync and async), the curated namespace."""

from __future__ import annotations

import asyncio

import pytest

import stockade
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")


def test_public_names_are_curated() -> None:
    assert sorted(stockade.__all__) == sorted(
        [
            "AccessRequest",
            "Answer",
            "CompletedRun",
            "Denied",
            "Grant",
            "Policy",
            "PolicyError",
            "Sandbox",
            "SandboxError",
            "SandboxTimeout",
            "Scope",
            "StockadeError",
            "Unavailable",
            "__version__",
            "arun",
            "learn",
            "run",
        ]
    )
    for name in stockade.__all__:
        assert getattr(stockade, name) is not None


def test_run_mirrors_subprocess(world: World) -> None:
    r = stockade.run(
        ["sh", "-c", "cat; echo err >&2; exit 3"],
        workspace=world.workspace,
        capture_output=True,
        text=True,
        input="hello",
        env=world.env,
    )
    assert (r.returncode, r.stdout, r.stderr) == (3, "hello", "err\n")
    assert r.events[0]["event"] == "run_start"
    assert r.events[-1]["event"] == "run_end"
    with pytest.raises(stockade.SandboxError, match="exited with 3"):
        stockade.run(["sh", "-c", "exit 3"], workspace=world.workspace, check=True, env=world.env)


def test_run_timeout(world: World) -> None:
    r = stockade.run(["sleep", "30"], workspace=world.workspace, timeout=0.5, env=world.env)
    assert r.returncode == 124
    assert r.timed_out
    with pytest.raises(stockade.SandboxTimeout):
        stockade.run(
            ["sleep", "30"], workspace=world.workspace, timeout=0.5, check=True, env=world.env
        )


def test_run_keeps_credentials_out(world: World) -> None:
    r = stockade.run(
        ["env"], workspace=world.workspace, capture_output=True, text=True, env=world.env
    )
    assert world.canary not in r.stdout
    dropped = {e["name"] for e in r.events if e["event"] == "env_dropped"}
    assert dropped >= {"GH_TOKEN", "NPM_TOKEN"}
    # The policy working is no denial of the command's: the summary stays quiet.
    assert not [d for d in r.denials if d.get("name") in dropped]


def test_unknown_layer_is_refused(world: World) -> None:
    with pytest.raises(ValueError, match="unknown layer"):
        stockade.run(["true"], workspace=world.workspace, disable=["walls"], env=world.env)


def test_sandbox_runs_many_commands_with_one_proxy(world: World, ok_server: int) -> None:
    (world.root / "p.toml").write_text(
        '[network]\nallow = ["local.test"]\nhosts = { "local.test" = "127.0.0.1" }\n'
    )
    url = f"http://local.test:{ok_server}/"
    with stockade.Sandbox(world.root / "p.toml", workspace=world.workspace, env=world.env) as sb:
        ids = set()
        for _ in range(3):
            r = sb.run(["curl", "-sS", "-m", "5", url], capture_output=True, text=True)
            assert r.stdout == "ok", r.stderr
            ids.add(r.run_id)
            assert any(e["event"] == "net_connect" and e["verdict"] == "allow" for e in r.events)
        denied = sb.run(
            ["curl", "-fsS", "-m", "5", f"http://evil.test:{ok_server}/"],
            capture_output=True,
            text=True,
        )
        assert denied.returncode != 0
        assert any(e.get("reason") == "host-not-allowed" for e in denied.denials)
        assert len(ids) == 3

        async def both() -> list[stockade.CompletedRun]:
            return list(
                await asyncio.gather(
                    sb.arun(["curl", "-sS", "-m", "5", url], capture_output=True, text=True),
                    sb.arun(["sh", "-c", "echo async"], capture_output=True, text=True),
                )
            )

        first, second = asyncio.run(both())
        assert first.stdout == "ok"
        assert second.stdout == "async\n"
    with pytest.raises(stockade.SandboxError, match="closed"):
        sb.run(["true"])
