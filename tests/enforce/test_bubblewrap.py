"""Who makes the masks and binds: bubblewrap, or the inner launcher (``launcher_binds``).

Both ways are run for real in tests/runtime (test_container.py runs the protected-path
tests with and without Landlock, the switch between them); here, that the argv and the
launcher's list split the work without dropping or doubling a mount.
"""

from __future__ import annotations

from pathlib import Path

from stockade._record import replace
from stockade.enforce.bubblewrap import ContainerPlan, build_argv, launcher_mounts
from stockade.policy._tables import SYSTEM_SECRETS

WS = Path("/work/project")
PLAN = ContainerPlan(
    workspace=WS,
    home=Path("/home/agent"),
    protected=(WS / ".envrc", WS / ".git" / "hooks"),
    pinned=(WS / ".git",),
    masked_files=(WS / "token.txt",),
    masked_dirs=(WS / "secrets",),
)


def _bound(argv: list[str]) -> set[str]:
    """Targets of every bind and tmpfs in ``argv``."""
    targets = set()
    for i, arg in enumerate(argv):
        if arg in ("--bind", "--ro-bind"):
            targets.add(argv[i + 2])
        elif arg == "--tmpfs":
            targets.add(argv[i + 1])
    return targets


def test_bubblewrap_makes_them_by_default() -> None:
    argv = build_argv(PLAN, ["true"])
    assert launcher_mounts(PLAN) == []
    assert {str(WS / ".envrc"), str(WS / ".git"), str(WS / "token.txt")} <= _bound(argv)
    assert "--cap-add" not in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"


def test_the_launcher_makes_them_when_asked() -> None:
    plan = replace(PLAN, launcher_binds=True)
    argv = build_argv(plan, ["true"])
    mounts = launcher_mounts(plan)
    secrets = [m for m in mounts if m[1] in SYSTEM_SECRETS]
    assert mounts[len(secrets) :] == [
        ("k", str(WS / ".git")),
        ("b", str(WS / ".envrc")),
        ("b", str(WS / ".git" / "hooks")),
        ("t", str(WS / "secrets")),
        ("n", str(WS / "token.txt")),
    ]
    bound = _bound(argv)
    assert not {path for _, path in mounts} & bound  # none made twice
    assert str(WS) in bound  # the workspace itself is still bubblewrap's
    i = argv.index("--cap-drop")
    assert argv[i : i + 6] == [
        "--cap-drop",
        "ALL",
        "--hostname",
        "stockade",
        "--cap-add",
        "CAP_SYS_ADMIN",
    ]
    assert argv[i + 6 : i + 8] == ["--cap-add", "CAP_SETPCAP"]


def test_without_a_container_nothing_goes_to_the_launcher() -> None:
    plan = replace(PLAN, launcher_binds=True, isolate=False)
    assert launcher_mounts(plan) == []
    assert "--cap-add" not in build_argv(plan, ["true"])
