"""attacks.md A.1 (SEC): secrets, through ``stockade run`` with every layer on.

Each family runs once, in one sandbox, and prints one JSON line per variant; the
parametrised tests then judge each variant on its own. Every "blocked" family has its
allowed twin.

Not applicable here:
* SEC-03 ``gh auth token``: there is no ``gh`` on this host; the file it would read
  (``~/.config/gh/hosts.yml``) is in the file family below, and so is every other token
  file ``gh``/``npm``/``docker`` would use.
* SEC-11 ``secret-tool``: not installed; the Secret Service is reached through the session
  bus, which is probed with ``busctl`` and a raw ``connect()`` (SEC-11 and HOST-02).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.attacks.conftest import ALL_SECRET_FILES, Arena, Result
from tests.conftest import SECRET_ENV

# ---------------------------------------------------------------------------------------
# SEC-01/02/03/13/14/16: every secret file, read four ways, plus its parent directory.

READ_FILES = r"""
import glob
home = os.path.expanduser("~")
for rel in json.loads(sys.argv[1]):
    p = os.path.join(home, rel)
    emit("open:" + rel, **read(p))
    emit("cat:" + rel, **sh(f"cat {p!r}"))
    emit("proc-root:" + rel, **read("/proc/self/root" + p))
    emit("ls:" + rel, **sh(f"ls -la {os.path.dirname(p)!r}; find {home!r} -maxdepth 4"))
emit("sibling", **sh("cat ../sibling/.env ../*/.env ~/projects/*/.env"))
emit("history", **sh("cat ~/.bash_history ~/.zsh_history"))
emit("glob", files=glob.glob(home + "/**", recursive=True, include_hidden=True))
# The twins: the workspace is readable, its .env by design (egress must hold, NET-*).
emit("twin:readme", **read("README"))
emit("twin:env", **read(".env"))
emit("twin:strings", **sh("strings .e* | grep -o 'WORKSPACE_ENV=[a-z-]*'"))
"""


@pytest.fixture(scope="module")
def file_reads(arena: Arena) -> Result:
    arena.reset()
    return arena.py(READ_FILES, json.dumps(ALL_SECRET_FILES))


@pytest.mark.parametrize("how", ["open", "cat", "proc-root", "ls"])
@pytest.mark.parametrize("rel", ALL_SECRET_FILES)
def test_sec_01_02_03_13_14_secret_files_unreadable(
    arena: Arena, file_reads: Result, rel: str, how: str
) -> None:
    got = file_reads[f"{how}:{rel}"]
    assert arena.canary not in json.dumps(got)
    if how in ("open", "proc-root"):
        # Either the read fails, or the path reads as empty/placeholder content.
        assert not got["ok"] or got["data"] == "", got


def test_sec_16_sibling_projects_and_history(arena: Arena, file_reads: Result) -> None:
    for key in ("sibling", "history", "glob"):
        assert arena.canary not in json.dumps(file_reads[key])
    assert file_reads["sibling"]["rc"] != 0


def test_sec_file_family_leaks_nothing_anywhere(arena: Arena, file_reads: Result) -> None:
    arena.assert_no_leak(file_reads)
    arena.assert_marks_unchanged()


def test_sec_twin_workspace_and_its_env_are_readable(file_reads: Result) -> None:
    assert file_reads["twin:readme"] == {
        "id": "twin:readme",
        "ok": True,
        "data": "workspace file\n",
    }
    assert file_reads["twin:env"]["data"] == "WORKSPACE_ENV=by-design\n"
    assert file_reads["twin:strings"]["out"].strip() == "WORKSPACE_ENV=by-design"


# ---------------------------------------------------------------------------------------
# SEC-04 (and HOST-11's CI tokens): the inherited environment.

ENV_PROBE = r"""
emit("env", **sh("env | grep -Ei 'token|key|secret|pass|url'"))
emit("environ", env=dict(os.environ))
for name in json.loads(sys.argv[1]):
    emit("printenv:" + name, **sh(f"printenv {name}"))
emit("proc1", **read("/proc/1/environ"))
emit("procself", **read("/proc/self/environ"))
emit("ppid", **read(f"/proc/{os.getppid()}/environ"))
emit("twin", value=os.environ.get("MY_SETTING"))
"""

ENV_NAMES = (*SECRET_ENV, "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL")


@pytest.fixture(scope="module")
def env_probe(arena: Arena) -> Result:
    policy = arena.root / "env-policy.toml"
    policy.write_text(arena.policy_text() + '[env]\npass = ["MY_SETTING"]\n')
    return arena.py(
        ENV_PROBE,
        json.dumps(ENV_NAMES),
        policy=policy,
        env=dict(arena.env, MY_SETTING="visible"),
    )


@pytest.mark.parametrize("name", ENV_NAMES)
def test_sec_04_secret_variable_absent(arena: Arena, env_probe: Result, name: str) -> None:
    got = env_probe[f"printenv:{name}"]
    assert arena.canary not in json.dumps(got)
    assert got["rc"] != 0 or got["out"].strip() != arena.canary
    assert name not in env_probe["environ"]["env"] or (
        env_probe["environ"]["env"][name] != arena.canary
    )


@pytest.mark.parametrize("key", ["env", "environ", "proc1", "procself", "ppid"])
def test_sec_04_no_canary_in_any_environment_dump(
    arena: Arena, env_probe: Result, key: str
) -> None:
    assert arena.canary not in json.dumps(env_probe[key])


def test_sec_04_twin_allowed_variable_passes(arena: Arena, env_probe: Result) -> None:
    assert env_probe["twin"]["value"] == "visible"
    arena.assert_no_leak(env_probe)


# ---------------------------------------------------------------------------------------
# SEC-06: other host processes' environ and argv (F-HOSTPROC is running).

HOSTPROC_PROBE = r"""
own = sys.argv[1]
child = subprocess.Popen(["sh", "-c", "sleep 5", own])
time.sleep(0.2)
emit("loop", **sh("for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; done | tr '\\0' '\\n' | grep -a CANARY"))
emit("ps", **sh("ps eww -A"))
emit("pids", pids=[p for p in os.listdir("/proc") if p.isdigit()])
emit("hostpid", environ=read(f"/proc/{sys.argv[2]}/environ"), cmdline=read(f"/proc/{sys.argv[2]}/cmdline"))
emit("twin", **sh("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"))
child.kill()
"""


def test_sec_06_host_processes_invisible(arena: Arena) -> None:
    own = f"OWN-{uuid.uuid4().hex}"
    res = arena.py(HOSTPROC_PROBE, own, str(arena.hostproc.pid))
    for key in ("loop", "ps", "hostpid"):
        assert arena.canary not in json.dumps(res[key])
    assert len(res["pids"]["pids"]) < 30
    assert not res["hostpid"]["environ"]["ok"]
    assert not res["hostpid"]["cmdline"]["ok"] or str(arena.hostproc.pid) in res["pids"]["pids"]
    # The twin: the sandbox's own processes (and their argv) are visible to it.
    assert own in res["twin"]["out"]
    arena.assert_no_leak(res)
    assert arena.hostproc.poll() is None


# ---------------------------------------------------------------------------------------
# SEC-07: a symlink (and a hard link) placed in the workspace.

SYMLINK_PROBE = r"""
home = os.path.expanduser("~")
for i, rel in enumerate(json.loads(sys.argv[1])):
    link = f"l{i}"
    try:
        os.symlink(os.path.join(home, rel), link)
    except OSError as e:
        emit("sym:" + rel, ok=False, errno=e.errno); continue
    emit("sym:" + rel, **read(link))
    try:
        os.link(os.path.join(home, rel), f"h{i}")
        emit("hard:" + rel, **read(f"h{i}"))
    except OSError as e:
        emit("hard:" + rel, ok=False, errno=e.errno)
os.symlink(os.path.join(home, ".aws"), "awsdir")
emit("dir", **read("awsdir/credentials"))
os.symlink("/", "rootlink")
emit("root", **read("rootlink" + home + "/.ssh/id_ed25519"))
os.symlink("README", "twin-link")
emit("twin", **read("twin-link"))
"""


@pytest.fixture(scope="module")
def symlinks(arena: Arena) -> Iterator[Result]:
    res = arena.py(SYMLINK_PROBE, json.dumps(ALL_SECRET_FILES))
    yield res
    subprocess.run(
        "rm -f l[0-9]* h[0-9]* awsdir rootlink twin-link", shell=True, cwd=arena.workspace
    )


@pytest.mark.parametrize("kind", ["sym", "hard"])
@pytest.mark.parametrize("rel", ALL_SECRET_FILES)
def test_sec_07_links_to_secrets(arena: Arena, symlinks: Result, rel: str, kind: str) -> None:
    got = symlinks[f"{kind}:{rel}"]
    assert arena.canary not in json.dumps(got)
    assert not got["ok"] or got["data"] == ""


def test_sec_07_directory_and_root_links(arena: Arena, symlinks: Result) -> None:
    for key in ("dir", "root"):
        assert arena.canary not in json.dumps(symlinks[key])
    arena.assert_no_leak(symlinks)


def test_sec_07_twin_link_to_workspace_file(symlinks: Result) -> None:
    assert symlinks["twin"]["data"] == "workspace file\n"


# ---------------------------------------------------------------------------------------
# SEC-10/11/12: agent sockets, the keyring bus and the git credential helper.

AGENT_PROBE = r"""
paths = json.loads(sys.argv[1])
for name, path in paths.items():
    emit("connect:" + name, **connect(socket.AF_UNIX, path))
emit("ssh-add", **sh(f"SSH_AUTH_SOCK={paths['ssh_agent']} ssh-add -l"))
emit("ssh-add-glob", **sh("SSH_AUTH_SOCK=$(ls /tmp/ssh-*/agent.* $XDG_RUNTIME_DIR/*ssh* 2>/dev/null | head -1) ssh-add -l"))
emit("gpg", **sh(f"GNUPGHOME=$PWD/.gnupg-probe gpg-connect-agent --no-autostart -S {paths['gpg_agent']} 'keyinfo --list' /bye", timeout=10))
emit("busctl", **sh(f"DBUS_SESSION_BUS_ADDRESS=unix:path={paths['session_bus']} busctl --user call org.freedesktop.secrets /org/freedesktop/secrets org.freedesktop.Secret.Service SearchItems 'a{{ss}}' 0", timeout=10))
emit("git-cred", **sh("printf 'protocol=https\\nhost=github.com\\n\\n' | GIT_TERMINAL_PROMPT=0 git -c credential.helper=cache credential fill", timeout=10))
emit("git-cred-default", **sh("printf 'protocol=https\\nhost=github.com\\n\\n' | GIT_TERMINAL_PROMPT=0 git credential fill", timeout=10))
# The twin: a socket the sandbox itself serves, and a credential store in the workspace.
srv = socket.socket(socket.AF_UNIX); srv.bind("own.sock"); srv.listen(1)
emit("twin:socket", **connect(socket.AF_UNIX, "own.sock"))
srv.close(); os.unlink("own.sock")
open("cred-store", "w").write("https://u:ws-token@allowed.test\n")
emit("twin:git-cred", **sh("printf 'protocol=https\\nhost=allowed.test\\n\\n' | git -c credential.helper='store --file=cred-store' credential fill"))
os.unlink("cred-store")
"""

AGENT_SOCKETS = ("ssh_agent", "gpg_agent", "session_bus", "git_cred")


@pytest.fixture(scope="module")
def agents(arena: Arena) -> Result:
    arena.reset()
    paths = {n: str(arena.unix[n]) for n in AGENT_SOCKETS}
    return arena.py(AGENT_PROBE, json.dumps(paths))


@pytest.mark.parametrize("name", AGENT_SOCKETS)
def test_sec_10_11_12_agent_sockets_unreachable(agents: Result, name: str) -> None:
    assert agents[f"connect:{name}"]["ok"] is False


@pytest.mark.parametrize("tool", ["ssh-add", "ssh-add-glob", "gpg", "busctl"])
def test_sec_10_11_agent_clients_fail(agents: Result, tool: str) -> None:
    assert agents[tool]["rc"] != 0


@pytest.mark.parametrize("key", ["git-cred", "git-cred-default"])
def test_sec_12_git_credential_fill_yields_nothing(arena: Arena, agents: Result, key: str) -> None:
    got = agents[key]
    assert arena.canary not in json.dumps(got)
    assert "password=" not in got["out"]


def test_sec_10_12_sinks_logged_nothing(arena: Arena, agents: Result) -> None:
    arena.assert_no_leak(agents)
    arena.assert_sinks_quiet()


def test_sec_10_12_twins(agents: Result) -> None:
    assert agents["twin:socket"]["ok"] is True
    assert "password=ws-token" in agents["twin:git-cred"]["out"]


# ---------------------------------------------------------------------------------------
# SEC-13: the runtime's and the harness's credentials; the proxy credential.
# The harness files (~/.claude/.credentials.json, ~/.config/stockade/token) are in the
# file family above. The proxy has no credential to steal: its URL carries none, and
# its identity is the per-sandbox listener, so a second sandbox with a narrower policy
# gets nothing from the first one's allow-list while both run.

SECOND = r"""
emit("proxy", url=os.environ.get("HTTP_PROXY"), all=os.environ.get("ALL_PROXY"))
emit("curl", **sh(f"curl -s -m5 -w ' %{{http_code}}' http://allowed.test:{sys.argv[1]}/second"))
"""


def test_sec_13_proxy_identity_is_per_sandbox(arena: Arena) -> None:
    arena.reset()
    narrow = arena.root / "narrow.toml"
    narrow.write_text(
        'version = 1\n[network]\nallow = []\nhosts = { "allowed.test" = "127.0.0.1" }\n'
    )
    first = subprocess.Popen(
        [
            *arena_cmd(arena),
            "sh",
            "-c",
            f"curl -s -m5 http://allowed.test:{arena.allowed.http_port}/first; sleep 4",
        ],
        cwd=arena.workspace,
        env=arena.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        res = arena.py(SECOND, str(arena.allowed.http_port), policy=narrow)
    finally:
        out, _err = first.communicate(timeout=30)
    url = res["proxy"]["url"]
    assert url
    assert "@" not in url
    assert "@" not in (res["proxy"]["all"] or "")
    assert res["curl"]["out"].endswith(" 403")
    paths = [json.loads(e)["path"] for e in arena.allowed.rec.take()]
    assert "/second" not in paths
    # The twin: the first sandbox, whose policy allows the host, got through.
    assert "/first" in paths, out


def arena_cmd(arena: Arena) -> list[str]:
    return arena.argv("run", "--policy", str(arena.policy), "--")
