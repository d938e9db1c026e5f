"""Issue 22: nothing the sandbox can write or steer is trusted by the host afterwards.

Each hole is tried as a sandboxed attacker (or a cloned repository) would try it, with
its allowed twin: the ordinary thing still works. The rule these hold
(docs/security-model.md, first rule): every file, directory or variable that stockade or
the user's host tools later trust is out of the sandbox's reach whatever the policy
grants, and everything stockade starts on the host starts from an environment it built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import World, as_nobody

pytestmark = pytest.mark.kernel

# A shared object whose constructor records which program loaded it, where the sandbox
# and the host can both see it (the workspace): "bwrap" or "launcher-" there means it ran
# on the host, outside every layer.
PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char exe[512] = {0};
    const char *log = getenv("MARK_LOG");
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) strcpy(exe, "?");
    int fd = open(log ? log : "/dev/null", O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd >= 0) { dprintf(fd, "%s\n", exe); close(fd); }
}
"""


def _preload(world: World) -> Path:
    cc = shutil.which("cc")
    assert cc, "setup installs gcc"
    src = world.root / "mark.c"
    src.write_text(PRELOAD_C)
    out = world.workspace / "mark.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def _policy(world: World, text: str, where: Path | None = None) -> Path:
    path = (where or world.workspace) / "stockade.toml"
    path.write_text(text)
    return path


def _log_lines(world: World) -> list[str]:
    log = world.workspace / "mark.log"
    return log.read_text().split() if log.exists() else []


# --- hole 1: a workspace stockade.toml ran code on the host --------------------------


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH"])
def test_workspace_policy_cannot_set_loader_variables(
    world: World, kernel: None, name: str
) -> None:
    so = _preload(world)
    _policy(world, f'[env]\nset = {{ {name} = "{so}", MARK_LOG = "{world.workspace}/mark.log" }}\n')
    proc = world.stockade("run", "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert f"env.set.{name}" in proc.stderr or "env.set.MARK_LOG" in proc.stderr
    assert "stockade trust" in proc.stderr
    assert _log_lines(world) == []


def test_twin_a_workspace_policy_that_tightens_still_runs(world: World, kernel: None) -> None:
    _policy(world, "[limits]\npids = 32\n")
    proc = world.stockade("run", "--", "sh", "-c", "echo ok")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_workspace_policy_from_git_clone_cannot_widen(world: World, kernel: None) -> None:
    upstream = world.root / "upstream"
    upstream.mkdir()
    env = {
        **world.env,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", str(upstream)], check=True, env=env)
    (upstream / "stockade.toml").write_text(
        '[env]\nset = { LD_PRELOAD = "/tmp/x.so" }\n[network]\nallow = ["evil.test"]\n'
    )
    subprocess.run(["git", "-C", str(upstream), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(upstream), "commit", "-qm", "x"], check=True, env=env)
    clone = world.root / "clone"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True, env=env)
    proc = world.stockade("run", "--", "true", cwd=clone)
    assert proc.returncode == 125
    assert "can only tighten" in proc.stderr


def test_subdirectory_workspace_policy_is_untrusted_too(world: World, kernel: None) -> None:
    sub = world.workspace / "packages" / "app"
    sub.mkdir(parents=True)
    # Planted by an earlier run whose workspace was the parent (it is not protected there).
    proc = world.stockade(
        "run",
        "--",
        "sh",
        "-c",
        "printf '[network]\\nallow = [\"evil.test\"]\\n' > packages/app/stockade.toml",
    )
    assert proc.returncode == 0, proc.stderr
    proc = world.stockade("run", "--", "true", cwd=sub)
    assert proc.returncode == 125
    assert "network.allow" in proc.stderr


def test_trusted_policy_env_reaches_the_command_never_bwrap(world: World, kernel: None) -> None:
    so = _preload(world)
    log = world.workspace / "mark.log"
    _policy(world, f'[env]\nset = {{ LD_PRELOAD = "{so}", MARK_LOG = "{log}" }}\n')
    trusted = world.stockade("trust")
    assert trusted.returncode == 0, trusted.stderr
    check = world.stockade("check")
    assert "trusted (pinned" in check.stdout
    proc = world.stockade("run", "--", "sh", "-c", "true")
    assert proc.returncode == 0, proc.stderr
    lines = _log_lines(world)
    # The twin: the policy's variable still reaches the command inside.
    assert any(line.endswith(("/sh", "/dash")) for line in lines), lines
    assert not [line for line in lines if "bwrap" in line or "launcher-" in line], lines


def test_direct_launcher_gets_the_environment_inside_its_spec(world: World, kernel: None) -> None:
    # Container and egress off: no bubblewrap, the launcher itself starts on the host.
    so = _preload(world)
    log = world.workspace / "mark.log"
    p = world.root / "p.toml"
    p.write_text(
        f'[env]\nset = {{ LD_PRELOAD = "{so}", MARK_LOG = "{log}" }}\n'
        "[layers]\ncontainer = false\negress = false\n"
    )
    proc = world.stockade("run", "--policy", str(p), "--", "sh", "-c", "true")
    assert proc.returncode == 0, proc.stderr
    lines = _log_lines(world)
    assert any(line.endswith(("/sh", "/dash")) for line in lines), lines
    assert not [line for line in lines if "bwrap" in line or "launcher-" in line], lines


def test_trust_lapses_when_the_file_changes(world: World, kernel: None) -> None:
    _policy(world, '[network]\nallow = ["a.test"]\n')
    assert world.stockade("run", "--", "true").returncode == 125
    assert world.stockade("trust").returncode == 0
    assert world.stockade("run", "--", "true").returncode == 0
    # The pinned file is protected inside: the sandbox cannot edit it.
    proc = world.stockade(
        "run", "--", "sh", "-c", "echo '# edited' >> stockade.toml && echo EDITED; true"
    )
    assert proc.returncode == 0, proc.stderr
    assert "EDITED" not in proc.stdout
    # Changed on the host (a git pull, say): untrusted again until pinned again.
    (world.workspace / "stockade.toml").write_text('[network]\nallow = ["a.test", "b.test"]\n')
    proc = world.stockade("run", "--", "true")
    assert proc.returncode == 125
    assert "can only tighten" in proc.stderr
    (world.workspace / "stockade.toml").write_text("[network]\nallow = []\n")
    assert "CHANGED since you trusted it" in world.stockade("check").stdout


def test_trust_says_what_pinning_the_file_opens(world: World) -> None:
    # A file a cloned repository (or a sandbox, in a subdirectory) wrote may ask for
    # anything: the person pinning it is shown what it opens beside their own policy.
    _policy(
        world,
        'version = 1\n[network]\nallow = ["evil.test"]\n[env]\nset = { LD_PRELOAD = "/x.so" }\n'
        "[layers]\nsyscalls = false\n",
    )
    proc = world.stockade("trust")
    assert proc.returncode == 0, proc.stderr
    assert "network.allow adds: evil.test" in proc.stdout
    assert "env.set sets: LD_PRELOAD=/x.so" in proc.stdout
    assert "layers switched off: syscalls" in proc.stdout
    # the twin: a file that only tightens opens nothing, and says nothing more
    _policy(world, "version = 1\n[limits]\npids = 64\n")
    proc = world.stockade("trust")
    assert proc.returncode == 0, proc.stderr
    assert "compared with your own policy" not in proc.stdout


def test_trust_as_nobody(world: World, kernel: None) -> None:
    _policy(world, '[network]\nallow = ["a.test"]\n')
    assert as_nobody(world, "run", "--", "true").returncode == 125
    assert as_nobody(world, "trust").returncode == 0
    proc = as_nobody(world, "run", "--", "true")
    assert proc.returncode == 0, proc.stderr


# --- hole 2: stockade's own launcher and runsc --------------------------------------


def _cache_in_workspace(world: World) -> dict[str, str]:
    return dict(world.env, XDG_CACHE_HOME=str(world.workspace / ".cache"))


def test_launcher_in_a_workspace_cache_cannot_be_rewritten(world: World, kernel: None) -> None:
    env = _cache_in_workspace(world)
    first = world.stockade("run", "--", "true", env=env)
    assert first.returncode == 0, first.stderr  # the twin: a cache in the tree still runs
    launchers = list((world.workspace / ".cache" / "stockade").glob("launcher-*"))
    assert launchers
    attack = world.stockade(
        "run",
        "--",
        "sh",
        "-c",
        "for f in .cache/stockade/launcher-*; do printf '#!/bin/sh\\nexec \"$@\"\\n' > $f && echo WROTE; done;"
        " mv .cache .cache-old && echo MOVED; mkdir -p .cache/stockade 2>/dev/null; true",
        env=env,
    )
    assert attack.returncode == 0, attack.stderr
    assert "WROTE" not in attack.stdout
    assert "MOVED" not in attack.stdout
    after = world.stockade("run", "--", "grep", "^Seccomp:", "/proc/self/status", env=env)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == ["Seccomp:", "2"]


def test_a_launcher_replaced_on_disk_is_rebuilt_not_run(world: World, kernel: None) -> None:
    env = _cache_in_workspace(world)
    assert world.stockade("run", "--", "true", env=env).returncode == 0
    (launcher,) = (world.workspace / ".cache" / "stockade").glob("launcher-*")
    # As an earlier sandbox (or another tool) with write access to the cache would.
    launcher.write_bytes(b'#!/bin/sh\nshift 2; exec "$@"\n')
    os.chmod(launcher, 0o700)
    proc = world.stockade("run", "--", "grep", "^Seccomp:", "/proc/self/status", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Seccomp:", "2"]
    assert not launcher.read_bytes().startswith(b"#!")


def test_a_network_helper_replaced_on_disk_is_rebuilt_not_run(world: World, kernel: None) -> None:
    """The network namespace helper runs on the host, with the user's own rights: a copy
    changed on disk (by a tool or an earlier run that could write the cache) would be
    code run on the host at the next run's start. It is rebuilt from source instead; the
    run that follows works (its twin: the first run, with the helper as built)."""
    env = _cache_in_workspace(world)
    assert world.stockade("run", "--", "true", env=env).returncode == 0
    (helper,) = (world.workspace / ".cache" / "stockade").glob("netns-helper-*")
    marker = world.root / "helper-ran-on-the-host"
    helper.write_bytes(f"#!/bin/sh\ntouch {marker}\nexit 1\n".encode())
    os.chmod(helper, 0o700)
    proc = world.stockade("run", "--", "true", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert not helper.read_bytes().startswith(b"#!")


def test_a_gvisor_entry_replaced_on_disk_is_rebuilt_not_run(world: World, runsc: str) -> None:
    """The gVisor entry runs on the host, before runsc, with the user's own rights: a copy
    changed on disk (by a tool or an earlier run that could write the cache) would be
    code run on the host at the next gVisor run's start. It is rebuilt from source
    instead; the run that follows works (its twin: the first run, with the entry as
    built)."""
    env = dict(_cache_in_workspace(world), STOCKADE_RUNSC=runsc)
    first = world.stockade("run", "--backend", "gvisor", "--", "true", env=env)
    assert first.returncode == 0, first.stderr
    (entry,) = (world.workspace / ".cache" / "stockade").glob("gvisor-entry-*")
    marker = world.root / "entry-ran-on-the-host"
    entry.write_bytes(f"#!/bin/sh\ntouch {marker}\nexit 1\n".encode())
    os.chmod(entry, 0o700)
    proc = world.stockade("run", "--backend", "gvisor", "--", "cat", "/proc/version", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Linux version 4.4.0")  # the Sentry's: runsc ran
    assert not marker.exists()
    assert not entry.read_bytes().startswith(b"#!")


def test_a_planted_runsc_in_the_cache_is_refused(world: World, tmp_path: Path) -> None:
    from stockade import Unavailable, _digests
    from stockade.enforce import gvisor

    cache = tmp_path / "cache"
    fake = cache / "stockade" / "runsc" / "29990101.0" / "runsc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'runsc version release-29990101.0'\n")
    fake.chmod(0o755)
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache), "PATH": "/nonexistent"}
    state = {**env, "XDG_STATE_HOME": str(tmp_path / "state")}
    old = dict(os.environ)
    try:
        os.environ.update(state)
        with pytest.raises(Unavailable, match="no recorded digest"):
            gvisor.require_runsc(env)
        # The twin: the same file recorded by stockade (as get-runsc does) is accepted...
        _digests.record(fake)
        assert gvisor.require_runsc(env).path == fake
        # ...until its content changes.
        fake.write_text("#!/bin/sh\necho 'runsc version release-29990101.0' # changed\n")
        with pytest.raises(Unavailable, match="content changed"):
            gvisor.require_runsc(env)
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_doctor_does_not_report_a_planted_runsc_as_working(world: World, tmp_path: Path) -> None:
    cache = world.root / "cache"
    fake = cache / "stockade" / "runsc" / "29990101.0" / "runsc"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\ntouch {world.root}/RAN; echo 'runsc version release-29990101.0'\n")
    fake.chmod(0o755)
    env = {k: v for k, v in world.env.items() if k != "STOCKADE_RUNSC"}
    env["XDG_CACHE_HOME"] = str(cache)
    proc = world.stockade("doctor", "--json", env=env)
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    detail = str(checks["gvisor"]["detail"])
    # Missing or refused, the backend is optional (ok); but never reported as working.
    assert "no recorded digest" in detail, detail
    assert "backend gvisor is refused" in detail
    assert not (world.root / "RAN").exists()


# --- hole 3: stockade's configuration under a write grant ---------------------------


def test_config_under_a_write_grant_stays_read_only(world: World, kernel: None) -> None:
    config = world.home / ".config"
    config.mkdir(exist_ok=True)
    env = dict(world.env, XDG_CONFIG_HOME=str(config))
    p = world.root / "p.toml"
    p.write_text(f'[filesystem]\nwrite = ["{config}"]\n')
    proc = world.stockade(
        "run",
        "--policy",
        str(p),
        "--",
        "sh",
        "-c",
        f"mkdir -p {config}/other && echo ok > {config}/other/file && echo TWIN;"
        f" printf '[network]\\nallow=[\"evil.test\"]\\n' > {config}/stockade/policy.toml && echo POLICY;"
        f" printf '[[allow]]\\npattern=\"evil.test\"\\n' > {config}/stockade/approved.toml && echo APPROVED;"
        f" mv {config}/stockade {config}/s-old && echo MOVED; true",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TWIN" in proc.stdout  # the rest of the grant is writable
    for word in ("POLICY", "APPROVED", "MOVED"):
        assert word not in proc.stdout, proc.stdout
    assert not (config / "stockade" / "policy.toml").exists()
    assert not (config / "stockade" / "approved.toml").exists()
    check = world.stockade("check", str(p), env=env)
    assert "narrowed" in check.stdout
    assert "configuration" in check.stdout


# --- hole 4: repositories under a write grant, and a grant above the workspace -------


def _git_env(world: World) -> dict[str, str]:
    return {
        **world.env,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }


def test_write_granted_repository_keeps_its_protected_set(world: World, kernel: None) -> None:
    env = _git_env(world)
    repo = world.root / "other"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "config", "core.hooksPath", ".githooks"], check=True)
    (repo / ".githooks").mkdir()
    marker = world.root / "HOOK-RAN"
    p = world.root / "p.toml"
    p.write_text(f'[filesystem]\nwrite = ["{repo}"]\n')
    hook = f"#!/bin/sh\ntouch {marker}\n"
    script = "; ".join(
        f"(mkdir -p $(dirname {repo}/{rel}) && printf '{hook}' > {repo}/{rel} && chmod +x {repo}/{rel} && echo WROTE {rel})"
        for rel in (
            ".husky/pre-commit",
            ".githooks/pre-commit",
            ".git/hooks/pre-commit",
            ".envrc",
            "stockade.toml",
            ".claude/settings.json",
        )
    )
    proc = world.stockade(
        "run",
        "--policy",
        str(p),
        "--",
        "sh",
        "-c",
        f"{script}; echo code > {repo}/main.py && echo TWIN; true",
    )
    assert proc.returncode == 0, proc.stderr
    assert "TWIN" in proc.stdout
    assert "WROTE" not in proc.stdout, proc.stdout
    # The host's next commit there runs nothing the sandbox wrote (and works: the twin).
    subprocess.run(["git", "-C", str(repo), "add", "main.py"], check=True, env=env)
    commit = subprocess.run(
        ["git", "-C", str(repo), "commit", "-qm", "host"], capture_output=True, env=env
    )
    assert commit.returncode == 0, commit.stderr
    assert not marker.exists()


def test_write_grant_above_the_workspace_pins_it(world: World, kernel: None) -> None:
    env = _git_env(world)
    subprocess.run(["git", "init", "-q", str(world.workspace)], check=True, env=env)
    sibling = world.root / "sibling"
    subprocess.run(["git", "init", "-q", str(sibling)], check=True, env=env)
    marker = world.root / "FSMONITOR-RAN"
    p = world.root / "p.toml"
    p.write_text(f'[filesystem]\nwrite = ["{world.root}"]\n')
    ws = world.workspace
    proc = world.stockade(
        "run",
        "--policy",
        str(p),
        "--",
        "sh",
        "-c",
        f"cd {world.root} && (mv {ws.name} .old && echo MOVED);"
        f" (printf '#!/bin/sh\\ntouch {marker}\\n' > sibling/.git/hooks/post-checkout && echo HOOK);"
        f" echo fine > {world.root}/notes.txt && echo TWIN; true",
    )
    assert proc.returncode == 0, proc.stderr
    assert "TWIN" in proc.stdout
    assert "MOVED" not in proc.stdout, proc.stdout
    assert "HOOK" not in proc.stdout, proc.stdout
    status = subprocess.run(["git", "-C", str(ws), "status"], capture_output=True, env=env)
    assert status.returncode == 0
    assert not marker.exists()


# --- issue 24 item 2: git init in a workspace that is not a repository ----------------


def test_git_init_works_and_the_host_runs_nothing_it_planted(world: World, kernel: None) -> None:
    env = _git_env(world)
    fsmon = world.root / "HOST-FSMONITOR"  # outside the workspace: invisible inside
    hook = world.root / "HOST-HOOK"
    script = (
        "git init -q && git config user.name t && git config user.email t@t"
        f" && git config core.fsmonitor 'touch {fsmon}'"
        " && git config core.hooksPath .hk && mkdir -p .hk"
        f" && printf '#!/bin/sh\\ntouch {hook}\\n' > .hk/pre-commit && chmod +x .hk/pre-commit"
        f" && printf '#!/bin/sh\\ntouch {hook}\\n' > .git/hooks/post-commit"
        " && chmod +x .git/hooks/post-commit"
        " && git config remote.origin.url https://x.test/r.git"
        " && git add README && git commit -qm inside && echo COMMITTED"
    )
    proc = world.stockade("run", "--", "sh", "-c", script, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "COMMITTED" in proc.stdout  # the twin: git works inside
    assert "dropped" in proc.stderr
    # On the host: the repository is there, with its history and its remote...
    log = subprocess.run(
        ["git", "-C", str(world.workspace), "log", "--format=%s"], capture_output=True, env=env
    )
    assert log.stdout.decode().split() == ["inside"]
    url = subprocess.run(
        ["git", "-C", str(world.workspace), "config", "remote.origin.url"],
        capture_output=True,
        env=env,
    )
    assert url.stdout.decode().strip() == "https://x.test/r.git"
    # ...and nothing it planted runs.
    for args in (["status"], ["commit", "--allow-empty", "-qm", "host"]):
        done = subprocess.run(
            ["git", "-C", str(world.workspace), *args], capture_output=True, env=env
        )
        assert done.returncode == 0, done.stderr
    assert not fsmon.exists()
    assert not hook.exists()
    # From the next run on it is an existing repository, protected like any other.
    again = world.stockade(
        "run", "--", "sh", "-c", "git config core.fsmonitor x && echo WROTE; true", env=env
    )
    assert "WROTE" not in again.stdout


def test_a_run_that_makes_no_repository_leaves_no_git_directory(world: World, kernel: None) -> None:
    proc = world.stockade("run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert not (world.workspace / ".git").exists()


# --- issue 24 item 3: stockade init, then a plain run --------------------------------


def test_init_then_run_works(world: World, kernel: None) -> None:
    (world.workspace / "package.json").write_text("{}")
    done = world.stockade("init")
    assert done.returncode == 0, done.stderr
    assert "trusted it" in done.stderr
    proc = world.stockade("run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "trusted (pinned" in world.stockade("check").stdout
    # The twin: with --no-trust it is written, says so, and may only tighten.
    (world.workspace / "stockade.toml").unlink()
    assert world.stockade("trust", "--revoke", "stockade.toml").returncode == 0
    done = world.stockade("init", "--no-trust")
    assert done.returncode == 0, done.stderr
    assert "not trusted" in done.stderr
    assert world.stockade("run", "--", "true").returncode == 125


# --- the same holes under gVisor and as uid 65534 ------------------------------------


def test_gvisor_cache_in_workspace_and_write_granted_repo(world: World, runsc: str) -> None:
    env = dict(_cache_in_workspace(world), STOCKADE_RUNSC=runsc)
    first = world.stockade("run", "--backend", "gvisor", "--", "true", env=env)
    assert first.returncode == 0, first.stderr
    genv = _git_env(world)
    repo = world.root / "other"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=genv)
    p = world.root / "p.toml"
    p.write_text(f'[filesystem]\nwrite = ["{repo}"]\n')
    attack = world.stockade(
        "run",
        "--backend",
        "gvisor",
        "--policy",
        str(p),
        "--",
        "sh",
        "-c",
        "for f in .cache/stockade/launcher-*; do echo x > $f && echo WROTE; done;"
        f" mkdir -p {repo}/.husky && echo x > {repo}/.husky/pre-commit && echo HUSKY;"
        f" echo x > {repo}/.git/hooks/pre-commit && echo HOOK;"
        f" echo code > {repo}/main.py && echo TWIN; true",
        env=env,
    )
    assert attack.returncode == 0, attack.stderr
    assert "TWIN" in attack.stdout
    for word in ("WROTE", "HUSKY", "HOOK"):
        assert word not in attack.stdout, attack.stdout


def test_gvisor_git_init_is_adopted_sanitized(world: World, runsc: str) -> None:
    env = dict(_git_env(world), STOCKADE_RUNSC=runsc)
    fsmon = world.root / "HOST-FSMONITOR"
    proc = world.stockade(
        "run",
        "--backend",
        "gvisor",
        "--",
        "sh",
        "-c",
        f"git init -q && git config core.fsmonitor 'touch {fsmon}' && echo OK",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout
    status = subprocess.run(
        ["git", "-C", str(world.workspace), "status"], capture_output=True, env=env
    )
    assert status.returncode == 0, status.stderr
    assert not fsmon.exists()


def test_nobody_git_init_and_config_under_a_grant(world: World, kernel: None) -> None:
    world.env.update(_git_env(world))
    config = world.root / "config"
    (config / "stockade").mkdir(parents=True)
    p = world.root / "p.toml"
    p.write_text(f'[filesystem]\nwrite = ["{config}"]\n')
    fsmon = world.root / "HOST-FSMONITOR"
    proc = as_nobody(
        world,
        "run",
        "--policy",
        str(p),
        "--",
        "sh",
        "-c",
        f"git init -q && git config core.fsmonitor 'touch {fsmon}' && echo OK;"
        f" echo x > {config}/stockade/policy.toml && echo WROTE;"
        f" echo x > {config}/other && echo TWIN; true",
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout
    assert "TWIN" in proc.stdout
    assert "WROTE" not in proc.stdout
    assert "core.fsmonitor" in proc.stderr  # named as dropped
    cfg = (world.workspace / ".git" / "config").read_text()
    assert "fsmonitor" not in cfg


def test_a_bwrap_the_sandbox_can_write_is_never_run(world: World, kernel: None) -> None:
    # A PATH that starts with the workspace's own bin directory (an activated .venv).
    venv_bin = world.workspace / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    marker = world.root / "FAKE-BWRAP-RAN"
    fake = venv_bin / "bwrap"
    fake.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/bwrap "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in world.env.items() if k != "STOCKADE_BWRAP"}
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    proc = world.stockade("run", "--", "true", env=env, cwd=world.workspace / ".venv")
    assert proc.returncode == 125
    assert not marker.exists()
    other = world.stockade(
        "run", "--workspace", str(world.workspace), "--", "true", env=env, cwd=world.home
    )
    assert other.returncode == 125, other.stderr
    assert "which the sandbox can write" in other.stderr
    assert not marker.exists()
    # The twin: the system's bwrap on the same PATH, minus the planted one, runs.
    fake.unlink()
    assert world.stockade("run", "--", "true", env=env).returncode == 0


def test_concurrent_runs_in_a_workspace_without_a_repository(world: World, kernel: None) -> None:
    env = _git_env(world)
    slow = subprocess.Popen(
        [
            *world.command,
            "run",
            "--",
            "sh",
            "-c",
            "git init -q && touch STARTED && while [ ! -e GO ]; do sleep 0.05; done",
        ],
        cwd=world.workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = 60.0
        t0 = time.monotonic()
        while not (world.workspace / "STARTED").exists():
            assert time.monotonic() - t0 < deadline, "the first run never started"
            assert slow.poll() is None, slow.communicate()
            time.sleep(0.05)
        # A second run while the first holds the staged .git: it starts, and makes one too.
        second = world.stockade("run", "--", "sh", "-c", "git init -q && echo SECOND", env=env)
        assert second.returncode == 0, second.stderr
        assert "SECOND" in second.stdout
        (world.workspace / "GO").touch()
        _out, err = slow.communicate(timeout=60)
        assert slow.returncode == 0, err
    finally:
        if slow.poll() is None:
            slow.kill()
    # One repository adopted, the other kept in stockade's state: neither lost.
    assert (world.workspace / ".git" / "HEAD").exists()
    kept = list((world.root / "state" / "stockade" / "repositories").iterdir())
    assert len(kept) == 1
    assert (kept[0] / "HEAD").exists()
