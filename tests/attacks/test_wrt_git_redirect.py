"""WRT-02/03: the sandbox creates ``.git/commondir`` to redirect git's common dir.

A normal repository has no ``.git/commondir``; created, it would point git's common
directory (and so its config and hooks) at a directory the sandbox built, and the next
host-side ``git status`` would run its ``core.fsmonitor``, ``git commit`` its hooks. The
runtime gives ``commondir`` (content ``.``, harmless) and ``config.worktree`` read-only
placeholders for the run and removes them afterwards. The allowed twin (git keeps working
inside the sandbox) is ``tests/runtime/test_container.py::test_git_still_works_inside``.
"""

from __future__ import annotations

import subprocess

from tests.attacks.conftest import Arena

PROBE = r"""
mark = sys.argv[1]
for d in ("evilgit/objects", "evilgit/refs/heads", "evilgit/hooks"):
    os.makedirs(d, exist_ok=True)
open("evilgit/config", "w").write(
    "[core]\n\trepositoryformatversion = 0\n"
    f"\tfsmonitor = touch {mark}.fsmonitor; false\n\thooksPath = evilgit/hooks\n")
open("evilgit/hooks/pre-commit", "w").write(f"#!/bin/sh\ntouch {mark}.hook\n")
os.chmod("evilgit/hooks/pre-commit", 0o755)
emit("commondir", **write(".git/commondir", "../evilgit\n", "w"))
emit("config.worktree", **write(".git/config.worktree", "[core]\n\tfsmonitor = x\n", "w"))
"""


def test_commondir_redirect_cannot_run_code_on_host(arena: Arena) -> None:
    res = arena.py(PROBE, str(arena.mark))
    for args in (("status",), ("commit", "--allow-empty", "-qm", "x")):
        subprocess.run(
            ["git", "-c", "user.email=h@h", "-c", "user.name=h", *args],
            cwd=arena.workspace,
            capture_output=True,
            check=False,
        )
    assert res["commondir"]["ok"] is False
    assert not (arena.workspace / ".git" / "commondir").exists()
    assert not arena.mark.with_name(arena.mark.name + ".fsmonitor").exists()
    assert not arena.mark.with_name(arena.mark.name + ".hook").exists()
