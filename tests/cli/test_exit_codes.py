"""Every error of stockade's own, a usage error included, exits 125 (README, Exit codes).

argparse's 2 collides with the commands' own codes (pytest, grep and diff use 2): a
caller must be able to tell "stockade refused the command line" from "the tests
failed". The twins: a command's own 2 and 1 still pass through unchanged.
"""

from __future__ import annotations

import pytest

from tests.conftest import World

CASES = {
    "no-verb": (),
    "unknown-verb": ("frobnicate",),
    "run-no-command": ("run",),
    "run-unknown-option": ("run", "--frobnicate", "--", "true"),
    "run-timeout-0": ("run", "--timeout", "0", "--", "true"),
    "run-policy-and-srt": ("run", "--policy", "a.toml", "--srt-settings", "b.json", "--", "true"),
    "run-control-fd-closed": ("run", "--control-fd", "99", "--", "true"),
    "run-bad-backend": ("run", "--backend", "qemu", "--", "true"),
    "run-ask-never-and-control-fd": ("run", "--ask", "never", "--control-fd", "5", "--", "true"),
    "run-ask-tty-and-control-fd": ("run", "--ask", "tty", "--control-fd", "5", "--", "true"),
    "init-no-workspace": ("init", "--workspace", "/nonexistent/ws"),
    "proxy-listen-port-only": ("proxy", "--listen", "3128"),
    "log-no-such-file": ("log", "--file", "/nonexistent/x.jsonl"),
    "log-follow-and-denials": ("log", "--follow", "--denials"),
    "approvals-revoke-nothing": ("approvals", "revoke"),
    "gateway-serve-bad-identity": ("gateway", "serve", "--identity", "nobody-knows"),
    "check-unknown-option": ("check", "--frobnicate"),
    "check-two-policies": ("check", "a.toml", "--policy", "b.toml"),
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_a_usage_error_exits_125(world: World, args: tuple[str, ...]) -> None:
    proc = world.stockade(*args)
    assert proc.returncode == 125, (proc.returncode, proc.stdout, proc.stderr)
    assert "stockade" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_init_over_an_existing_file_exits_125(world: World) -> None:
    first = world.stockade("init")
    assert first.returncode == 0, first.stderr
    again = world.stockade("init")
    assert again.returncode == 125
    assert "pass --force" in again.stderr


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("code", [1, 2])
def test_the_commands_own_codes_pass_through(world: World, code: int) -> None:
    proc = world.stockade("run", "--", "sh", "-c", f"exit {code}")
    assert proc.returncode == code, proc.stderr


def test_check_takes_policy_as_run_does(world: World) -> None:
    # One convention: --policy FILE everywhere; the positional FILE is still accepted.
    policy = world.root / "p.toml"
    policy.write_text('version = 1\n[network]\nallow = ["a.test"]\n')
    old = world.stockade("check", str(policy))
    new = world.stockade("check", "--policy", str(policy))
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert new.stdout == old.stdout
    assert "a.test" in new.stdout


def test_check_shows_the_request_rules(world: World) -> None:
    # Issue 24 (polish): the human output left out network.rules (the JSON had them).
    policy = world.root / "rules.toml"
    policy.write_text(
        'version = 1\n[network]\nallow = ["reg.test"]\n'
        '[[network.rules]]\nhost = "reg.test"\nmethods = ["GET"]\npaths = ["/pkg/**"]\n'
        '[[network.rules]]\nhost = "reg.test"\naction = "deny"\n'
    )
    proc = world.stockade("check", "--policy", str(policy))
    assert proc.returncode == 0, proc.stderr
    assert "network.rules[0]: allow GET reg.test /pkg/**" in proc.stdout
    assert "network.rules[1]: deny any method reg.test /**" in proc.stdout
