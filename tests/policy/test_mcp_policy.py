"""``[mcp] allow_always``: the user's to set; a workspace file may only turn it off."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy, parse_policy_text
from tests.policy.conftest import user_policy


def test_off_by_default_and_set_by_the_user(home: Path) -> None:
    assert load_policy().mcp.allow_always is False
    assert "mcp" not in load_policy().to_dict()  # digests of other policies are unchanged
    user_policy(home, "[mcp]\nallow_always = true\n")
    p = load_policy()
    assert p.mcp.allow_always is True
    assert p.to_dict()["mcp"] == {"allow_always": True}


def test_an_explicit_policy_file_may_set_it(home: Path) -> None:
    assert parse_policy_text("[mcp]\nallow_always = true\n", "p.toml").mcp.allow_always


def test_a_workspace_file_cannot_turn_it_on(home: Path) -> None:
    Path("stockade.toml").write_text("[mcp]\nallow_always = true\n")
    with pytest.raises(PolicyError, match=r"mcp\.allow_always.*can only tighten"):
        load_policy()


def test_a_workspace_file_may_turn_it_off_and_the_twin_keeps_it(home: Path) -> None:
    user_policy(home, "[mcp]\nallow_always = true\n")
    Path("stockade.toml").write_text('[network]\ndeny = ["x.test"]\n')
    assert load_policy().mcp.allow_always is True
    Path("stockade.toml").write_text("[mcp]\nallow_always = false\n")
    assert load_policy().mcp.allow_always is False


@pytest.mark.parametrize("value", ['"yes"', "1", "[]"])
def test_only_a_boolean(home: Path, value: str) -> None:
    with pytest.raises(PolicyError, match=r"mcp\.allow_always.*expected true or false"):
        parse_policy_text(f"[mcp]\nallow_always = {value}\n", "p.toml")


def test_unknown_key_in_mcp_is_refused(home: Path) -> None:
    with pytest.raises(PolicyError, match=r"mcp\.ask.*unknown key"):
        parse_policy_text("[mcp]\nask = true\n", "p.toml")
