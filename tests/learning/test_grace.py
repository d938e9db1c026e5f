"""A learnt policy's grace period, end to end through the real proxy and sandbox.

``thing.test`` is what the task was learnt with; a later run also needs ``other.test``
(both pinned to a local server). In the grace period the run gets ``other.test``, the
audit log has it as ``report`` (rule ``grace``) and ``stockade run`` prints it; the policy
file is never changed. Its twins: once the period is over the same run is refused; a
deny entry and the metadata address stay refused inside the period; a workspace file
cannot start one.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from tests.conftest import World, as_nobody, require
from tests.learning.test_learn import PYTHON

pytestmark = pytest.mark.usefixtures("kernel")

FETCH = """
import sys, urllib.request
for host in sys.argv[2:]:
    try:
        body = urllib.request.urlopen(f"http://{host}:{sys.argv[1]}/x", timeout=5).read()
        print(host, "fetched", body.decode())
    except Exception as exc:
        print(host, "refused")
"""


def _day(days: int) -> str:
    return (datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=days)).isoformat()


def _policy(world: World, port: int, grace: str) -> Path:
    path = world.root / "learnt.toml"
    path.write_text(
        f'[network]\nallow = ["thing.test:{port}"]\ndeny = ["evil.test"]\n'
        + (f"grace_until = {grace}\n" if grace else "")
        + '[network.hosts]\n"thing.test" = "127.0.0.1"\n"other.test" = "127.0.0.1"\n'
        '"evil.test" = "127.0.0.1"\n'
    )
    return path


def _run(world: World, policy: Path, port: int) -> tuple[str, str, list[dict[str, object]]]:
    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    (world.workspace / "fetch.py").write_text(FETCH)
    audit = world.root / "audit.jsonl"
    audit.unlink(missing_ok=True)
    hosts = ("thing.test", "other.test", "evil.test", "169.254.169.254")
    proc = world.stockade(
        "run", "--policy", str(policy), "--audit", str(audit), "--",
        PYTHON, "fetch.py", str(port), *hosts,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    return proc.stdout, proc.stderr, events


def test_in_the_grace_period_a_host_the_policy_lacks_is_reported_not_refused(
    world: World, server: int
) -> None:
    policy = _policy(world, server, _day(7))
    before = policy.read_text()
    out, err, events = _run(world, policy, server)
    assert "thing.test fetched served /x" in out
    assert "other.test fetched served /x" in out
    # a deny entry and the metadata address stay refused inside the period
    assert "evil.test refused" in out
    assert "169.254.169.254 refused" in out
    reported = [e for e in events if e.get("rule") == "grace"]
    assert reported, events
    assert {e["verdict"] for e in reported} == {"report"}
    assert {e["host"] for e in reported if e.get("host")} == {"other.test"}
    start = events[0]
    assert (start["event"], start["grace_until"], start["grace_in_force"]) == (
        "run_start",
        _day(7),
        True,
    )
    assert any(e["event"] == "policy_grace" for e in events)
    assert any(e.get("host") == "evil.test" and e["verdict"] == "deny" for e in events)
    # the person is told, and what to do; the policy file is never widened by a run
    line = next(x for x in err.splitlines() if "grace period until" in x)
    assert f"other.test:{server}" in line
    assert "thing.test" not in line
    assert str(policy) in line
    assert policy.read_text() == before
    check = world.stockade("check", "--policy", str(policy))
    assert f"GRACE     in force until {_day(7)}" in check.stdout
    explain = world.stockade("explain", "--policy", str(policy))
    assert f"grace period: until {_day(7)}" in explain.stdout


def test_after_the_grace_period_the_same_run_is_refused(world: World, server: int) -> None:
    policy = _policy(world, server, _day(-1))
    out, err, events = _run(world, policy, server)
    assert "thing.test fetched served /x" in out
    assert "other.test refused" in out
    assert not any(e.get("rule") == "grace" for e in events)
    assert any(
        e.get("host") == "other.test"
        and e["reason"] == "host-not-allowed"
        and e["verdict"] == "deny"
        for e in events
    )
    assert events[0]["grace_in_force"] is False
    assert "grace period until" not in err
    check = world.stockade("check", "--policy", str(policy))
    assert f"ended {_day(-1)}: the policy is enforced as written" in check.stdout
    assert "grace period:" not in world.stockade("explain", "--policy", str(policy)).stdout


def test_a_workspace_file_cannot_start_a_grace_period(world: World, server: int) -> None:
    # the user's own policy (no --policy: only then is a workspace file composed)
    user = Path(world.env["XDG_CONFIG_HOME"]) / "stockade" / "policy.toml"
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(_policy(world, server, "").read_text())
    (world.workspace / "stockade.toml").write_text(f"[network]\ngrace_until = {_day(7)}\n")
    (world.workspace / "fetch.py").write_text(FETCH)
    argv = ("run", "--", PYTHON, "fetch.py", str(server), "thing.test", "other.test")
    proc = world.stockade(*argv)
    assert proc.returncode == 125
    assert "network.grace_until" in proc.stderr
    assert "can only tighten" in proc.stderr
    assert "fetched" not in proc.stdout
    # the twin: a workspace file that only tightens is composed, and the run is enforced
    (world.workspace / "stockade.toml").write_text("[limits]\npids = 100\n")
    proc = world.stockade(*argv)
    assert proc.returncode == 0, proc.stderr
    assert "thing.test fetched served /x" in proc.stdout
    assert "other.test refused" in proc.stdout


def test_suggest_states_the_period_and_verify_and_diff_judge_it_as_enforced(
    world: World, server: int
) -> None:
    from tests.learning.test_learn import _learn, _setup, _task

    conf, base = _setup(world)
    first, later = world.root / "first", world.root / "later"
    _learn(world, base, first, _task(conf, server))
    policy = world.root / "suggested.toml"
    made = world.stockade(
        "policy", "suggest", str(first), "-o", str(policy), "--grace", "14",
        "--verify", "--no-attacks", "--", *_task(conf, server), timeout=240,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"grace_until = {_day(14)}" in policy.read_text()
    assert "GRACE PERIOD" in policy.read_text()
    _learn(world, base, later, _task(conf, server, "thing.test", "other.test"))
    drift = world.stockade("policy", "diff", str(policy), str(later))
    assert drift.returncode == 1
    assert f"host other.test:{server} is not allowed" in drift.stdout
    too_long = world.stockade("policy", "suggest", str(first), "--grace", "91")
    assert too_long.returncode == 125
    assert "1 to 90 days" in too_long.stderr


def test_the_grace_period_holds_for_an_unprivileged_user(world: World, server: int) -> None:
    require(os.getuid() == 0, "switching to uid 65534 needs root")
    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    policy = _policy(world, server, _day(7))
    (world.workspace / "fetch.py").write_text(FETCH)
    proc = as_nobody(
        world, "run", "--policy", str(policy), "--",
        PYTHON, "fetch.py", str(server), "other.test", "evil.test",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "other.test fetched" in proc.stdout
    assert "evil.test refused" in proc.stdout
    assert "grace period until" in proc.stderr
