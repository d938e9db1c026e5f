"""``[container] backend``: bubblewrap by default; a workspace file may choose gvisor
(a kernel of its own only adds a boundary), never go back to bubblewrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade import PolicyError
from stockade.policy import load_policy, parse_policy_text
from tests.policy.conftest import user_policy


def test_bubblewrap_by_default_and_the_digest_is_unchanged(home: Path) -> None:
    policy = load_policy()
    assert policy.container.backend == "bubblewrap"
    assert "container" not in policy.to_dict()


def test_gvisor_from_the_user_policy(home: Path) -> None:
    user_policy(home, '[container]\nbackend = "gvisor"\n')
    policy = load_policy()
    assert policy.container.backend == "gvisor"
    assert policy.to_dict()["container"] == {"backend": "gvisor"}


def test_a_workspace_file_may_choose_gvisor(home: Path) -> None:
    Path("stockade.toml").write_text('[container]\nbackend = "gvisor"\n')
    assert load_policy().container.backend == "gvisor"


def test_a_workspace_file_cannot_go_back_to_bubblewrap(home: Path) -> None:
    user_policy(home, '[container]\nbackend = "gvisor"\n')
    Path("stockade.toml").write_text('[container]\nbackend = "bubblewrap"\n')
    with pytest.raises(PolicyError, match=r"container\.backend.*can only tighten"):
        load_policy()


def test_a_workspace_file_without_the_key_keeps_gvisor(home: Path) -> None:
    user_policy(home, '[container]\nbackend = "gvisor"\n')
    Path("stockade.toml").write_text('[network]\ndeny = ["x.test"]\n')
    assert load_policy().container.backend == "gvisor"


@pytest.mark.parametrize("value", ['"kvm"', '"runc"', "1", "[]"])
def test_only_a_known_backend(home: Path, value: str) -> None:
    with pytest.raises(PolicyError, match=r"container\.backend.*bubblewrap.*gvisor"):
        parse_policy_text(f"[container]\nbackend = {value}\n", "p.toml")
