"""attacks.md A.2 (WRT): writing outside the workspace, or into the parts of it that run
code on the host later. All layers on; each family in one sandbox run.

HOME inside the sandbox is a fresh tmpfs (container layer), so a write to ``~/.bashrc``
may succeed there and vanish with the run; the verdict that matters is F-MARK: the host
file keeps its hash and no host marker appears.

Not applicable here:
* WRT-11 ``~/Library/LaunchAgents``: macOS only; the Linux equivalents (systemd user
  units, XDG autostart, crontab, authorized_keys, a PATH shim) are probed below.
* WRT-11 ``crontab``: there is no crontab binary on this host; the spool it would write
  (/var/spool/cron) is probed as a plain write.
* WRT-12 ``npm i -g``/``pip install --user ./pkg``: both need a package build or a
  registry; what they end up doing is a write to the user site or the npm prefix, and
  those writes are probed directly (plus ``npm config set prefix``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attacks.conftest import MARKED_HOME_FILES, PRELUDE, Arena, Result

# ---------------------------------------------------------------------------------------
# WRT-01: every shell startup file (and the other F-MARK home files).

RC_PROBE = r"""
mark = sys.argv[1]
for rel in json.loads(sys.argv[2]):
    emit("py:" + rel, **write("~/" + rel, f"touch {mark}\n"))
    emit("sh:" + rel, **sh(f"echo 'touch {mark}' >> ~/{rel}"))
emit("twin", **write("ws-rc", "ok\n"))
"""

RC_FILES = (*MARKED_HOME_FILES, ".bash_login", ".bash_logout", ".zshenv", ".xprofile")


@pytest.fixture(scope="module")
def rc_writes(arena: Arena) -> Result:
    return arena.py(RC_PROBE, str(arena.mark), json.dumps(RC_FILES))


@pytest.mark.parametrize("rel", RC_FILES)
def test_wrt_01_shell_rc_files_unchanged_on_host(arena: Arena, rc_writes: Result, rel: str) -> None:
    assert f"py:{rel}" in rc_writes.lines
    assert f"sh:{rel}" in rc_writes.lines
    host = arena.home / rel
    if rel in MARKED_HOME_FILES:
        assert host.read_text() == f"# {rel} of the host\n"
    else:
        assert not host.exists()


def test_wrt_01_marks_unchanged_and_twin(arena: Arena, rc_writes: Result) -> None:
    arena.assert_marks_unchanged()
    assert rc_writes["twin"]["ok"] is True
    assert (arena.workspace / "ws-rc").read_text() == "ok\n"


# ---------------------------------------------------------------------------------------
# WRT-02/03/05/06: every protected path in the workspace (existing and missing), written,
# created inside, replaced, renamed and deleted; then host-side git must run nothing.

PROTECTED = (
    ".git/hooks/pre-commit",
    ".git/hooks/post-checkout",
    ".git/config",
    ".gitmodules",
    ".claude/settings.json",
    ".claude/commands/x.md",
    ".claude/agents/x.md",
    ".mcp.json",
    ".cursor/mcp.json",
    ".vscode/settings.json",
    ".vscode/tasks.json",
    ".idea/workspace.xml",
    ".husky/pre-commit",
    ".envrc",
    ".devcontainer/devcontainer.json",
    "stockade.toml",
)

PROTECTED_PROBE = r"""
mark = sys.argv[1]
payload = f"#!/bin/sh\ntouch {mark}\n"
for rel in json.loads(sys.argv[2]):
    emit("write:" + rel, **write(rel, payload, "w"))
    emit("append:" + rel, **write(rel, payload, "a"))
    top = rel.split("/")[0] if not rel.startswith(".git/") else rel
    emit("rename:" + rel, **sh(f"mv {top} {top}.aside && mkdir -p $(dirname {rel}) && printf '%s' '{payload}' > {rel}"))
    emit("remove:" + rel, **sh(f"rm -rf {top}"))
    emit("symlink:" + rel, **sh(f"ln -sf /tmp/evil-{os.path.basename(rel)} {rel}"))
emit("chmod", **sh("chmod +x .git/hooks/pre-commit"))
cmds = {
    "fsmonitor": f"git config core.fsmonitor 'touch {mark}'",
    "hooksPath": "git config core.hooksPath .githooks",
    "filter": "git config filter.a.clean ./x.sh && echo '* filter=a' > .gitattributes",
    "diff.external": "git config diff.external ./x.sh",
    "sshCommand": "git config core.sshCommand ./x.sh",
    "pager": "git config core.pager ./x.sh",
    "include": "git config include.path ../evil.cfg",
    "global": "git config --global core.fsmonitor ./x.sh",
}
open("x.sh", "w").write(payload); os.chmod("x.sh", 0o755)
os.makedirs(".githooks", exist_ok=True)
open(".githooks/pre-commit", "w").write(payload); os.chmod(".githooks/pre-commit", 0o755)
for name, cmd in cmds.items():
    emit("gitcfg:" + name, **sh(cmd))
# The twins: ordinary files and dot-directories, and git itself, keep working.
emit("twin:write", **sh("mkdir -p .cache/tool && echo ok > .cache/tool/f && echo ok > src.txt"))
emit("twin:git", **sh("git -c user.email=a@b -c user.name=n add src.txt && git -c user.email=a@b -c user.name=n commit -qm inside && git log --oneline | wc -l"))
"""


def _host_git(arena: Arena, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in arena.env.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", "-c", "user.email=h@h", "-c", "user.name=host", *args],
        cwd=arena.workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.fixture(scope="module")
def protected(arena: Arena) -> Result:
    before = sorted(p.name for p in arena.workspace.iterdir())
    res = arena.py(PROTECTED_PROBE, str(arena.mark), json.dumps(PROTECTED))
    # The host, later: the usual git commands on the workspace.
    for args in (
        ("status",),
        ("diff",),
        ("add", "-A"),
        ("commit", "--allow-empty", "-qm", "host"),
        ("log", "-p", "-1"),
    ):
        _host_git(arena, *args)
    res.proc.stdout += f"\nBEFORE {before}"
    return res


@pytest.mark.parametrize("rel", PROTECTED)
def test_wrt_02_05_06_protected_paths_stay_untouched(
    arena: Arena, protected: Result, rel: str
) -> None:
    for how in ("write", "append"):
        assert protected[f"{how}:{rel}"]["ok"] is False, (how, protected[f"{how}:{rel}"])
    host = arena.workspace / rel
    if host.exists() and not host.is_dir():
        assert str(arena.mark) not in host.read_text()
    top = arena.workspace / rel.split("/")[0]
    assert not os.path.lexists(str(top) + ".aside")
    if rel.startswith(".git/"):
        assert not os.path.islink(host)


@pytest.mark.parametrize(
    "name",
    ["fsmonitor", "hooksPath", "filter", "diff.external", "sshCommand", "pager", "include"],
)
def test_wrt_03_git_config_keys_cannot_be_set(arena: Arena, protected: Result, name: str) -> None:
    assert protected[f"gitcfg:{name}"]["rc"] != 0
    config = (arena.workspace / ".git" / "config").read_text()
    assert "x.sh" not in config
    assert ".githooks" not in config
    assert "evil.cfg" not in config


def test_wrt_02_03_host_git_runs_nothing(arena: Arena, protected: Result) -> None:
    arena.assert_marks_unchanged()
    assert protected["twin:git"]["out"].strip() == "1"
    assert (arena.workspace / ".cache" / "tool" / "f").read_text() == "ok\n"
    # Placeholders for missing protected paths are gone after the run.
    for name in (
        ".claude",
        ".cursor",
        ".vscode",
        ".idea",
        ".husky",
        ".devcontainer",
        ".envrc",
        ".gemini",
    ):
        assert not (arena.workspace / name).exists(), name
    log = _host_git(arena, "log", "--oneline")
    assert len(log.stdout.splitlines()) == 2  # "inside" and "host"


# ---------------------------------------------------------------------------------------
# WRT-06: the policy itself; a workspace stockade.toml can only tighten.


def test_wrt_06_policy_cannot_be_widened(arena: Arena) -> None:
    arena.reset()
    user_cfg = arena.root / "config" / "stockade" / "policy.toml"
    user_cfg.parent.mkdir(parents=True, exist_ok=True)
    user_cfg.write_text(arena.policy_text())
    before = (arena.policy.read_text(), user_cfg.read_text())
    probe = r"""
widen = 'version = 1\n[network]\nallow = ["evil.test", "allowed.test"]\n'
for p in sys.argv[1:3]:
    emit("write:" + p, **write(p, widen, "w"))
emit("ws", **write("stockade.toml", widen, "w"))
emit("evil", **sh(f"curl -s -m5 -w ' %{{http_code}}' http://evil.test:{sys.argv[3]}/after-tamper"))
"""
    res = arena.py(probe, str(arena.policy), str(user_cfg), str(arena.evil.http_port))
    # The policy files lie outside the workspace: the write fails, or lands in the
    # sandbox's private /tmp; either way the host copies below keep their content.
    assert f"write:{arena.policy}" in res.lines
    assert f"write:{user_cfg}" in res.lines
    assert res["ws"]["ok"] is False
    assert res["evil"]["out"].endswith(" 403")
    assert (arena.policy.read_text(), user_cfg.read_text()) == before
    # A widening stockade.toml planted in the workspace earlier (the host wrote it, as a
    # previous run's leftover would be) is not trusted: the user policy still rules.
    ws_policy = arena.workspace / "stockade.toml"
    cmd = (
        "sh",
        "-c",
        f"curl -s -m5 -o /dev/null -w ' %{{http_code}}' http://evil.test:{arena.evil.http_port}/ws-policy;"
        f" echo; curl -s -m5 -o /dev/null -w ' %{{http_code}}' http://allowed.test:{arena.allowed.http_port}/ws-twin",
    )
    ws_policy.write_text('version = 1\n[network]\nallow = ["evil.test", "allowed.test"]\n')
    try:
        widened = arena.stockade("run", "--", *cmd)
        # The twin: a workspace policy that only tightens is honoured and runs.
        ws_policy.write_text('version = 1\n[network]\nallow = ["allowed.test"]\n')
        tightened = arena.stockade("run", "--", *cmd)
    finally:
        ws_policy.unlink()
    assert widened.returncode == 125, widened.stdout + widened.stderr
    assert "can only tighten" in widened.stderr
    assert "ws-policy" not in json.dumps(arena.evil.rec.log)
    lines = tightened.stdout.splitlines()
    assert len(lines) == 2, tightened.stdout + tightened.stderr
    assert lines[0].endswith(" 403")
    assert lines[1].endswith(" 200")
    arena.assert_sinks_quiet()
    user_cfg.unlink()


# ---------------------------------------------------------------------------------------
# WRT-07/10/11/12: symlinks, temp dirs, traversal, persistence and user-site writes.

ESCAPE_PROBE = r"""
mark, root = sys.argv[1], sys.argv[2]
home = os.path.expanduser("~")
os.symlink(home + "/.bashrc", "x")
emit("sym:bashrc", **write("x", "pwn\n"))
os.symlink(home, "h")
emit("sym:profile", **write("h/.profile", "x\n", "w"))
os.symlink("/tmp", "t")
emit("sym:tmp", **write(f"t/out-{os.path.basename(mark)}", "x\n", "w"))
os.symlink(root, "r")
emit("sym:root", **write(f"r/{os.path.basename(mark)}", "x\n", "w"))
emit("sym:dotdot", **write(f"../{os.path.basename(mark)}", "x\n", "w"))
emit("trav", **write(f"../../../../{root}/{os.path.basename(mark)}", "x\n", "w"))
name = os.path.basename(mark)
for d in ("/tmp", "/dev/shm", "/var/tmp", "/run", "/etc", "/usr/local/bin", "/opt", "/srv", root):
    emit("tmp:" + d, **write(f"{d}/sbx-{name}", "x\n", "w"))
# WRT-11: persistence.
persist = {
    "systemd": "~/.config/systemd/user/x.service",
    "autostart": "~/.config/autostart/x.desktop",
    "authorized_keys": "~/.ssh/authorized_keys",
    "shim": "~/.local/bin/git",
    "cron": "/var/spool/cron/crontabs/root",
    "system-unit": "/etc/systemd/system/x.service",
    "profile.d": "/etc/profile.d/x.sh",
}
for k, p in persist.items():
    emit("persist:" + k, **sh(f"mkdir -p $(dirname {p}) && printf '[Service]\\nExecStart=/bin/touch {mark}\\n' >> {p}"))
# WRT-12: the user site and the npm prefix.
site = subprocess.run(["python3", "-m", "site", "--user-site"], capture_output=True, text=True).stdout.strip()
emit("site", path=site, **sh(f"mkdir -p {site} && echo 'import os; os.system(\"touch {mark}\")' > {site}/usercustomize.py && echo 'import os' > {site}/evil.pth"))
emit("npm-prefix", **sh("npm config set prefix ~/.npm-global", timeout=30))
# The twins: the same writes inside the workspace, and /tmp inside the run, work.
os.makedirs("sub", exist_ok=True); os.symlink("sub", "s")
emit("twin:sym", **write("s/f", "ok\n", "w"))
emit("twin:tmp", **sh("echo ok > /tmp/inside && cat /tmp/inside"))
emit("twin:venv", **sh("python3 -m venv --without-pip venv && echo ok > venv/lib/marker && echo done"))
"""

ESCAPE_PATHS = ("/tmp", "/dev/shm", "/var/tmp", "/run", "/etc", "/usr/local/bin", "/opt", "/srv")


@pytest.fixture(scope="module")
def escapes(arena: Arena) -> Iterator[Result]:
    res = arena.py(ESCAPE_PROBE, str(arena.mark), str(arena.root), timeout=120)
    yield res
    subprocess.run("rm -rf x h t r s sub venv", shell=True, cwd=arena.workspace, check=False)


@pytest.mark.parametrize("key", ["sym:bashrc", "sym:profile", "sym:root", "sym:dotdot", "trav"])
def test_wrt_07_10_writes_through_symlinks_and_traversal(
    arena: Arena, escapes: Result, key: str
) -> None:
    assert key in escapes.lines
    assert not arena.mark.exists()
    assert not (arena.root / arena.mark.name).exists()
    arena.assert_marks_unchanged()


@pytest.mark.parametrize("directory", ESCAPE_PATHS)
def test_wrt_10_temp_and_system_dirs_never_reach_the_host(
    arena: Arena, escapes: Result, directory: str
) -> None:
    assert f"tmp:{directory}" in escapes.lines
    assert not os.path.lexists(f"{directory}/sbx-{arena.mark.name}")


def test_wrt_07_symlinked_tmp_stays_private(arena: Arena, escapes: Result) -> None:
    assert "sym:tmp" in escapes.lines
    assert not os.path.lexists(f"/tmp/out-{arena.mark.name}")


@pytest.mark.parametrize(
    "key",
    ["systemd", "autostart", "authorized_keys", "shim", "cron", "system-unit", "profile.d"],
)
def test_wrt_11_no_persistence_on_the_host(arena: Arena, escapes: Result, key: str) -> None:
    assert f"persist:{key}" in escapes.lines
    for rel in (".config/systemd/user/x.service", ".config/autostart/x.desktop", ".local/bin/git"):
        assert not (arena.home / rel).exists()
    for path in (
        "/var/spool/cron/crontabs/root",
        "/etc/systemd/system/x.service",
        "/etc/profile.d/x.sh",
    ):
        assert not os.path.exists(path) or str(arena.mark) not in Path(path).read_text()
    arena.assert_marks_unchanged()


def test_wrt_12_user_site_and_npm_prefix(arena: Arena, escapes: Result) -> None:
    site = escapes["site"]["path"]
    assert site
    assert not os.path.exists(os.path.join(site, "usercustomize.py")) or (
        str(arena.mark) not in Path(site, "usercustomize.py").read_text()
    )
    assert (arena.home / ".npmrc").read_text() == f"secret {arena.canary}\n"
    assert not (arena.home / ".npm-global").exists()


def test_wrt_07_10_12_twins(arena: Arena, escapes: Result) -> None:
    assert escapes["twin:sym"]["ok"] is True
    assert (arena.workspace / "sub" / "f").read_text() == "ok\n"
    assert escapes["twin:tmp"]["out"] == "ok\n"
    assert escapes["twin:venv"]["out"].strip() == "done", escapes["twin:venv"]
    assert (arena.workspace / "venv" / "lib" / "marker").exists()


# ---------------------------------------------------------------------------------------
# WRT-13: setuid binaries, device nodes, FIFOs.

SUID_PROBE = r"""
emit("suid", **sh("cp /bin/sh ./suid-sh && chmod u+s ./suid-sh; stat -c %A ./suid-sh; ./suid-sh -c 'id -u; id -ru; grep NoNewPrivs /proc/self/status'"))
import ctypes
emit("nnp", r=ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
emit("py-suid", **sh("cp $(command -v python3) ./suid-py; chmod u+s ./suid-py; ./suid-py -c 'import os; print(os.geteuid() == os.getuid())'"))
for name, spec in (("mem", "c 1 1"), ("kmsg", "c 1 11"), ("sda", "b 8 0"), ("null", "c 1 3")):
    emit("mknod:" + name, **sh(f"mknod ./{name} {spec}"))
emit("fifo", **sh("mkfifo ./f && test -p ./f && echo fifo-ok"))
emit("sock", **sh("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('./u.sock'); print('sock-ok')\""))
"""


def test_wrt_13_setuid_and_device_nodes(arena: Arena) -> None:
    res = arena.py(SUID_PROBE)
    try:
        out = res["suid"]["out"].split()
        # The set-id bit cannot be set (it would survive on the host), and even if it
        # were, NoNewPrivs holds: a set-uid bit grants nothing, euid == ruid.
        assert out[0].startswith("-rwx"), res["suid"]
        assert "s" not in out[0], res["suid"]
        assert "Operation not permitted" in res["suid"]["err"], res["suid"]
        assert out[1] == out[2], res["suid"]
        if arena.gvisor:
            # The Sentry's /proc/self/status has no NoNewPrivs line; prctl says it.
            assert len(out) == 3, res["suid"]
        else:
            assert out[-1] == "1", res["suid"]
        assert res["nnp"]["r"] == 1
        assert res["py-suid"]["out"].strip() == "True"
        assert not (arena.workspace / "suid-sh").stat().st_mode & 0o6000
        for name in ("mem", "kmsg", "sda", "null"):
            assert res[f"mknod:{name}"]["rc"] != 0
            assert not (arena.workspace / name).exists()
        assert "Operation not permitted" in res["mknod:mem"]["err"]
        # The twins: a FIFO and a unix socket in the workspace are fine.
        assert res["fifo"]["out"].strip() == "fifo-ok"
        assert res["sock"]["out"].strip() == "sock-ok"
    finally:
        subprocess.run(
            "rm -f suid-sh suid-py f u.sock mem kmsg sda null",
            shell=True,
            cwd=arena.workspace,
            check=False,
        )


# ---------------------------------------------------------------------------------------
# WRT-02/05: open(O_TRUNC) on every protected file. A refusal must come before the
# truncation: runsc 20240729 with directfs emptied .git/worktrees/*/commondir (a
# read-only bind inside the read-write workspace) and only then answered EROFS, which
# broke host-side git in that worktree (enforce/gvisor.py runs it with --directfs=false).

TRUNC_PROBE = r"""
for rel in json.loads(sys.argv[1]):
    try:
        os.close(os.open(rel, os.O_WRONLY | os.O_TRUNC))
        emit("trunc:" + rel, ok=True)
    except OSError as e:
        emit("trunc:" + rel, ok=False, errno=errno.errorcode.get(e.errno, e.errno))
emit("twin", **sh("echo kept > trunc-twin && python3 -c \"import os; os.close(os.open('trunc-twin', os.O_WRONLY | os.O_TRUNC))\" && wc -c < trunc-twin"))
"""

TRUNCATED = (
    ".git/config",
    ".git/hooks/pre-commit",
    ".git/worktrees/trunc-wt/commondir",
    ".git/worktrees/trunc-wt/gitdir",
    ".git/worktrees/trunc-wt/HEAD",
)


def test_wrt_02_05_truncating_protected_files_changes_nothing(arena: Arena) -> None:
    repo = arena.root / "trunc-repo"
    repo.mkdir()
    git = ("git", "-c", "user.email=h@h.test", "-c", "user.name=h")
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
    subprocess.run(
        [*git, "worktree", "add", "-q", str(arena.root / "trunc-wt")], cwd=repo, check=True
    )
    (repo / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    before = {rel: (repo / rel).read_bytes() for rel in TRUNCATED}
    proc = arena.stockade(
        "run",
        "--policy",
        str(arena.policy),
        "--",
        "python3",
        "-c",
        PRELUDE + TRUNC_PROBE,
        json.dumps(TRUNCATED),
        cwd=repo,
    )
    lines = {
        json.loads(x)["id"]: json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")
    }
    for rel in TRUNCATED:
        assert lines[f"trunc:{rel}"]["ok"] is False, (rel, proc.stderr)
        assert (repo / rel).read_bytes() == before[rel], rel
    status = subprocess.run([*git, "status", "--short"], cwd=arena.root / "trunc-wt", check=False)
    assert status.returncode == 0
    # The twin: a workspace file of the same run is truncated as asked.
    assert lines["twin"]["out"].strip() == "0", lines["twin"]
