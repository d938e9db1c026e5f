"""WRT-02/03: git's redirect files, in every repository layout.

Files through which git picks another directory, a configuration or a hook
(``policy._tables.GIT_DIR_PROTECTED``): written inside, the next host-side ``git status``
would run a ``core.fsmonitor`` of the sandbox's choosing, ``git commit`` its hooks. Each
case writes one such file (or makes a new linked worktree) in a repository with a linked
worktree, a submodule whose name holds a slash and a nested submodule; each has its
allowed twin from the same run (git keeps working inside). Then git runs on the host in
every one of those repositories and no marker appears.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.attacks.conftest import Arena, Result
from tests.conftest import World, as_nobody

GIT = ("git", "-c", "user.email=h@h.test", "-c", "user.name=h", "-c", "protocol.file.allow=always")

#: Builds ``evil/``, a git directory whose config and hooks touch the marker, then
#: tries every redirect and every allowed twin; one JSON line each.
PROBE = r"""
mark, common = sys.argv[1], sys.argv[2]
for d in ("evil/objects", "evil/refs/heads", "evil/hooks"):
    os.makedirs(d, exist_ok=True)
open("evil/HEAD", "w").write("ref: refs/heads/main\n")
open("evil/config", "w").write(
    "[core]\n\trepositoryformatversion = 0\n"
    f"\tfsmonitor = touch {mark}.fsmonitor; false\n\thooksPath = {os.getcwd()}/evil/hooks\n")
open("evil/hooks/pre-commit", "w").write(f"#!/bin/sh\ntouch {mark}.hook\n")
os.chmod("evil/hooks/pre-commit", 0o755)
evil = os.path.abspath("evil")
hook = f"#!/bin/sh\ntouch {mark}.hook\n"
cfg = f"[core]\n\tfsmonitor = touch {mark}.fsmonitor; false\n"
def attempt(id, path, text):
    emit(id, **write(path, text, "w"))
def git(id, cmd):
    emit(id, **sh("git -c user.email=a@b.test -c user.name=n " + cmd))
G = common
attempt("worktrees/wt/commondir", f"{G}/worktrees/wt/commondir", evil + "\n")
attempt("worktrees/wt/gitdir", f"{G}/worktrees/wt/gitdir", evil + "/.git\n")
attempt("worktrees/wt/config.worktree", f"{G}/worktrees/wt/config.worktree", cfg)
git("worktree add", "worktree add -q inside-wt")
emit("worktrees/new", ok=os.path.isdir(f"{G}/worktrees/inside-wt"))
attempt("hooks (missing at start)", f"{G}/hooks/pre-commit", hook)
attempt("objects/info/alternates", f"{G}/objects/info/alternates", evil + "/objects\n")
attempt("commondir", f"{G}/commondir", evil + "\n")
attempt("config.worktree", f"{G}/config.worktree", cfg)
M = f"{G}/modules/libs/outer"
attempt("modules/libs/outer/config", f"{M}/config", cfg)
attempt("modules/libs/outer/commondir", f"{M}/commondir", evil + "\n")
attempt("modules/libs/outer/modules/in/hooks", f"{M}/modules/in/hooks/pre-commit", hook)
attempt("libs/outer/.git", "libs/outer/.git", f"gitdir: {evil}\n")
attempt("HEAD at the top", "HEAD", "ref: refs/heads/main\n")
# The twins.
git("commit", "commit -q --allow-empty -m inside")
git("branch", "branch feature && git branch --list feature")
git("worktree list", "worktree list")
git("submodule commit", "-C libs/outer commit -q --allow-empty -m inside-sub")
git("status", "status --porcelain")
attempt("info/exclude", f"{G}/info/exclude", "evil/\n")
attempt("top-level file", "NOTES", "written\n")
"""

#: (blocked, its allowed twin) by the ids of :data:`PROBE`.
CASES = [
    ("worktrees/wt/commondir", "worktree list"),
    ("worktrees/wt/gitdir", "worktree list"),
    ("worktrees/wt/config.worktree", "info/exclude"),
    ("worktrees/new", "branch"),
    ("hooks (missing at start)", "commit"),
    ("objects/info/alternates", "commit"),
    ("commondir", "status"),
    ("config.worktree", "info/exclude"),
    ("modules/libs/outer/config", "submodule commit"),
    ("modules/libs/outer/commondir", "submodule commit"),
    ("modules/libs/outer/modules/in/hooks", "submodule commit"),
    ("libs/outer/.git", "submodule commit"),
    ("HEAD at the top", "top-level file"),
]


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GIT, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )


def _layout(root: Path) -> Path:
    """repo/ (with a commit, no hooks directory), a linked worktree wt/ beside it, the
    submodule libs/outer (a slash in its name) holding the nested submodule in/."""
    repo, inner, outer = root / "repo", root / "inner", root / "outer"
    for path in (repo, inner, outer):
        path.mkdir(parents=True)
        _git(path, "init", "-q", "-b", "main")
        _git(path, "commit", "-q", "--allow-empty", "-m", path.name)
    _git(outer, "submodule", "add", "-q", str(inner), "in")
    _git(outer, "commit", "-q", "-m", "sub")
    _git(repo, "submodule", "add", "-q", str(outer), "libs/outer")
    _git(repo, "submodule", "update", "-q", "--init", "--recursive")
    _git(repo, "commit", "-q", "-m", "with submodule")
    _git(repo, "worktree", "add", "-q", str(root / "wt"))
    subprocess.run(["rm", "-rf", str(repo / ".git" / "hooks")], check=True)
    return repo


@pytest.fixture(scope="module")
def probed(arena: Arena) -> tuple[Path, Result]:
    repo = _layout(arena.root / "layouts")
    res = arena.stockade(
        "run",
        "--policy",
        str(arena.policy),
        "--",
        "python3",
        "-c",
        _prelude() + PROBE,
        str(arena.mark),
        str(repo / ".git"),
        cwd=repo,
    )
    lines: dict[str, dict[str, Any]] = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            obj = json.loads(line)
            lines[obj["id"]] = obj
    return repo, Result(res, lines, [])


def _prelude() -> str:
    from tests.attacks.conftest import PRELUDE

    return PRELUDE


@pytest.mark.parametrize(("blocked", "twin"), CASES, ids=[c[0] for c in CASES])
def test_git_redirect_is_read_only_inside(
    probed: tuple[Path, Result], blocked: str, twin: str
) -> None:
    _repo, res = probed
    assert res[blocked]["ok"] is False, res[blocked]
    outcome = res[twin]
    assert outcome.get("ok", outcome.get("rc") == 0), outcome


def test_worktree_list_and_branch_inside_see_the_repository(
    probed: tuple[Path, Result],
) -> None:
    repo, res = probed
    assert str(repo.parent / "wt") in res["worktree list"]["out"]
    assert "feature" in res["branch"]["out"]
    assert _git(repo, "log", "--format=%s", "-1").stdout.strip() == "inside"


def test_host_git_in_every_layout_runs_nothing(arena: Arena, probed: tuple[Path, Result]) -> None:
    repo, _res = probed
    root = repo.parent
    for where in (repo, root / "wt", repo / "libs" / "outer", repo / "libs" / "outer" / "in"):
        for args in (("status",), ("commit", "--allow-empty", "-qm", "host")):
            proc = _git(where, *args)
            assert proc.returncode == 0, (where, proc.stderr)
    _git(repo, "worktree", "add", "-q", str(root / "wt2"))
    _git(root / "wt2", "status")
    assert not arena.mark.with_name(arena.mark.name + ".fsmonitor").exists()
    assert not arena.mark.with_name(arena.mark.name + ".hook").exists()
    # Every placeholder went again.
    git = repo / ".git"
    for path in (repo / "HEAD", git / "hooks", git / "commondir", git / "objects/info/alternates"):
        assert not path.exists(), path


def test_a_worktree_workspace_protects_its_common_directory(arena: Arena) -> None:
    """The workspace is a linked worktree; its common directory is granted writable
    (filesystem.write), so its redirects are protected as a workspace's would be."""
    repo = _layout(arena.root / "wt-layout")
    wt = repo.parent / "wt"
    common = repo / ".git"
    policy = arena.root / "wt-policy.toml"
    policy.write_text(f'{arena.policy_text()}\n[filesystem]\nwrite = ["{common}"]\n')
    body = r"""
G = sys.argv[1]
for id, path in (("hooks", f"{G}/hooks/pre-commit"), ("config", f"{G}/config"),
                 ("own commondir", f"{G}/worktrees/wt/commondir"),
                 ("new worktree", f"{G}/worktrees/new"),
                 (".git file", ".git")):
    emit(id, **write(path, "x", "w"))
emit("status", **sh("git status --porcelain && git log --format=%s -1 && git worktree list"))
emit("objects", **write(f"{G}/info/exclude", "x\n", "a"))
"""
    proc = arena.stockade(
        "run",
        "--policy",
        str(policy),
        "--",
        "python3",
        "-c",
        _prelude() + body,
        str(common),
        cwd=wt,
    )
    lines = {
        json.loads(x)["id"]: json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")
    }
    assert "status" in lines, proc.stderr
    for blocked in ("hooks", "config", "own commondir", "new worktree", ".git file"):
        assert lines[blocked]["ok"] is False, blocked
    assert lines["status"]["rc"] == 0, lines["status"]
    assert str(wt) in lines["status"]["out"]
    assert lines["objects"]["ok"] is True


def test_a_git_file_pointing_at_a_repository_yet_to_be_built_is_refused(arena: Arena) -> None:
    ws = arena.root / "gitfile-ws"
    ws.mkdir()
    (ws / ".git").write_text("gitdir: .real\n")
    proc = arena.stockade("run", "--policy", str(arena.policy), "--", "true", cwd=ws)
    assert proc.returncode == 125, proc.stderr
    assert "does not exist but could be created inside the sandbox" in proc.stderr
    # The twin: the same workspace once the repository exists runs, and git works.
    (ws / ".git").unlink()
    _git(ws, "init", "-q", "--separate-git-dir", str(ws / ".real"))
    proc = arena.stockade(
        "run", "--policy", str(arena.policy), "--", "git", "rev-parse", "--git-dir", cwd=ws
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ws / ".real")


def test_unprivileged_user_gets_the_same_protection(world: World) -> None:
    ws = world.workspace
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "commit", "-q", "--allow-empty", "-m", "x")
    _git(ws, "worktree", "add", "-q", str(world.root / "wt"))
    script = (
        "echo x > .git/worktrees/wt/commondir; echo c1=$?; "
        "mkdir .git/worktrees/new; echo c2=$?; "
        "echo x > .git/objects/info/alternates; echo c3=$?; "
        "git -c user.email=a@b.test -c user.name=n commit -q --allow-empty -m in && "
        "git branch feature && git worktree list | wc -l"
    )
    proc = as_nobody(world, "run", "--", "sh", "-c", script)
    out = proc.stdout.split()
    assert [x.split("=")[0] for x in out[:3]] == ["c1", "c2", "c3"], proc.stdout + proc.stderr
    assert all(not x.endswith("=0") for x in out[:3]), proc.stdout
    assert proc.stderr.count("Read-only file system") == 3, proc.stderr
    assert out[-1] == "2", proc.stdout + proc.stderr
