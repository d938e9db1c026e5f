"""A repository the sandbox makes below the top of a writable root runs nothing on the host.

No mount point can be laid before the run for a name the sandbox has yet to choose, so a
``sub/.git`` it makes (a directory, a ``.git`` file pointing elsewhere in the workspace,
or an existing deep repository it rewrites) is its own configuration on the host until
stockade sweeps it: git run there obeys ``core.fsmonitor``, and a shell prompt showing git
status runs git on every ``cd``. Each attack is checked as host git sees it afterwards,
beside its twin: a repository the agent makes keeps its remote and history, and one it
never touched keeps every key its owner set.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.attacks.test_trust_boundary import _git_env
from tests.conftest import World, as_nobody, wait_for_file

pytestmark = pytest.mark.usefixtures("kernel")


def _host_git(
    world: World, where: Path, *args: str, who: str = "root"
) -> subprocess.CompletedProcess[str]:
    # as the owner of the repository (git refuses another user's: safe.directory)
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return subprocess.run(
        [*(setpriv if who == "nobody" else []), "git", "-C", str(where), *args],
        capture_output=True,
        text=True,
        env={**_git_env(world), "HOME": "/nonexistent"} if who == "nobody" else _git_env(world),
    )


def _plant(marker: Path) -> str:
    """Shell that makes the current directory a repository whose use runs ``marker``."""
    return (
        "git init -q . && git config remote.origin.url https://x.test/r.git"
        f" && git config core.fsmonitor 'touch {marker}; false'"
        f" && git config alias.st '!touch {marker}'"
        f" && printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/post-checkout"
        " && chmod +x .git/hooks/post-checkout"
        " && git add -A && git -c user.name=t -c user.email=t@t commit -qm inside && echo PLANTED"
    )


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_a_repository_made_below_the_top_runs_nothing_on_the_host(world: World, who: str) -> None:
    marker = world.root / "HOST-RAN"  # outside the workspace: invisible inside
    (world.workspace / "sub").mkdir()
    (world.workspace / "sub" / "f").write_text("x\n")
    script = f"cd sub && {_plant(marker)} && mkdir -p ../a/b/c/d/e && cd ../a/b/c/d/e && touch g && {_plant(marker)}"
    args = ("run", "--", "sh", "-c", script)
    proc = (
        as_nobody(world, *args) if who == "nobody" else world.stockade(*args, env=_git_env(world))
    )
    assert proc.stdout.count("PLANTED") == 2, proc.stderr
    assert "core.fsmonitor" in proc.stderr  # said, not silent
    for where in (world.workspace / "sub", world.workspace / "a/b/c/d/e"):
        for git_args in (("status",), ("st",), ("checkout", "-q", "-b", "x")):
            _host_git(world, where, *git_args, who=who)
        assert not marker.exists(), where
        # the twin: the repository is there, with its history and its remote
        log = _host_git(world, where, "log", "--format=%s", who=who)
        assert log.stdout.split() == ["inside"], log.stderr
        url = _host_git(world, where, "config", "remote.origin.url", who=who).stdout.strip()
        assert url == "https://x.test/r.git"


def test_a_git_file_pointing_into_the_workspace_is_swept_too(world: World) -> None:
    marker = world.root / "HOST-RAN"
    script = (
        "mkdir -p .hidden sub && cd .hidden && git init -q --bare . "
        f"&& git config core.fsmonitor 'touch {marker}; false' && git config core.bare false "
        "&& cd ../sub && printf 'gitdir: ../.hidden\\n' > .git && echo PLANTED"
    )
    proc = world.stockade("run", "--", "sh", "-c", script, env=_git_env(world))
    assert "PLANTED" in proc.stdout, proc.stderr
    _host_git(world, world.workspace / "sub", "status")
    assert not marker.exists()
    assert "fsmonitor" not in (world.workspace / ".hidden" / "config").read_text()


def test_a_deep_existing_repository_the_sandbox_rewrites_is_swept(world: World) -> None:
    # Deeper than the protected set looks (three levels), so writable inside.
    marker = world.root / "HOST-RAN"
    deep = world.workspace / "v" / "w" / "x" / "y" / "lib"
    deep.mkdir(parents=True)
    assert _host_git(world, deep, "init", "-q").returncode == 0
    script = f"cd v/w/x/y/lib && git config core.fsmonitor 'touch {marker}; false' && echo WROTE"
    proc = world.stockade("run", "--", "sh", "-c", script, env=_git_env(world))
    assert "WROTE" in proc.stdout, proc.stderr
    _host_git(world, deep, "status")
    assert not marker.exists()


def test_repositories_the_run_did_not_touch_keep_their_configuration(world: World) -> None:
    # The twin of the sweep: the user's own keys (an alias, a hook) in repositories the
    # run left alone stay, at the top, nested shallow and nested deep; and in a write
    # grant, a repository made there is swept like one in the workspace.
    top, shallow, deep = (
        world.workspace,
        world.workspace / "vendor" / "lib",
        world.workspace / "v" / "w" / "x" / "y" / "lib",
    )
    for repo in (top, shallow, deep):
        repo.mkdir(parents=True, exist_ok=True)
        assert _host_git(world, repo, "init", "-q").returncode == 0
        assert _host_git(world, repo, "config", "alias.mine", "status").returncode == 0
    granted = world.root / "granted"
    granted.mkdir()
    policy = world.root / "p.toml"
    policy.write_text(f'[filesystem]\nwrite = ["{granted}"]\n')
    marker = world.root / "HOST-RAN"
    script = f"echo edit > README && cd {granted} && mkdir r && cd r && touch g && {_plant(marker)}"
    proc = world.stockade(
        "run", "--policy", str(policy), "--", "sh", "-c", script, env=_git_env(world)
    )
    assert "PLANTED" in proc.stdout, proc.stderr
    for repo in (top, shallow, deep):
        assert _host_git(world, repo, "config", "alias.mine").stdout.strip() == "status", repo
    _host_git(world, granted / "r", "status")
    assert not marker.exists()
    assert _host_git(world, granted / "r", "log", "--format=%s").stdout.split() == ["inside"]


@pytest.mark.parametrize("served", [False, True])
def test_a_killed_runs_repositories_are_swept_before_the_next_run_starts(
    world: World, served: bool
) -> None:
    """A run killed outright (SIGKILL to stockade, or to the caller of a served run, whose
    worker then kills itself) never reaches its end-of-run sweep. The next run of the
    workspace sweeps what it left, before its own sandbox starts: the repository the
    killed sandbox made runs nothing on the host from then on, and keeps its history."""
    import os
    import signal

    marker = world.root / "HOST-RAN"
    env = dict(_git_env(world), STOCKADE_SERVER="1" if served else "0")
    if served:
        env.pop("STOCKADE_SERVER")
    killed = subprocess.Popen(
        [*world.command, "run", "--", "sh", "-c",
         f"mkdir sub && cd sub && touch f && {_plant(marker)} && touch ../planted && sleep 60"],
        cwd=world.workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_for_file(world.workspace / "planted", killed)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=30)
    sub = world.workspace / "sub"
    # Left as the sandbox wrote it: nothing swept it at the end of that run.
    assert "fsmonitor" in (sub / ".git" / "config").read_text()
    nxt = subprocess.Popen(
        [*world.command, "run", "--", "sh", "-c", "touch started && sleep 3"],
        cwd=world.workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_file(world.workspace / "started", nxt)
    # The next run's command is running: the sweep came before it.
    assert "fsmonitor" not in (sub / ".git" / "config").read_text()
    for git_args in (("status",), ("st",), ("checkout", "-q", "-b", "x")):
        _host_git(world, sub, *git_args)
    assert not marker.exists()
    _, err = nxt.communicate(timeout=60)
    assert nxt.returncode == 0, err
    assert "core.fsmonitor" in err  # said, not silent, and why
    assert "since a killed run of this workspace began" in err
    # the twin: the repository stays, with its history and its remote
    assert _host_git(world, sub, "log", "--format=%s").stdout.split() == ["inside"]
    url = _host_git(world, sub, "config", "remote.origin.url").stdout.strip()
    assert url == "https://x.test/r.git"
