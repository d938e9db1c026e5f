"""Learn mode end to end, for real: learn a task, suggest its policy, verify it, drift.

The task reads a configuration file outside the workspace and fetches from a local HTTP
server reached as ``thing.test`` (pinned to 127.0.0.1 by ``network.hosts``); it also
tries the cloud metadata address, which learning must keep refused and suggest never
admit. Each "stopped" check has its twin "the needed thing still works".
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import World, as_nobody, require
from tests.learning.conftest import _Handler

PYTHON = "/usr/bin/python3"

TASK = """
import os, sys, urllib.request
conf = open(sys.argv[1]).read().strip()
hosts = sys.argv[3:] or ["thing.test"]
for host in hosts:
    body = urllib.request.urlopen(f"http://{host}:{sys.argv[2]}/data/{conf}", timeout=10).read()
    print(host, body.decode())
try:
    urllib.request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=3)
    print("metadata reached")
except Exception as exc:
    print("metadata refused")
"""


def _setup(world: World) -> tuple[Path, Path]:
    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    conf_dir = world.root / "etc-app"
    conf_dir.mkdir()
    conf = conf_dir / "app.conf"
    conf.write_text("alpha\n")
    (world.workspace / "task.py").write_text(TASK)
    base = world.root / "base.toml"
    base.write_text('[network.hosts]\n"thing.test" = "127.0.0.1"\n"other.test" = "127.0.0.1"\n')
    return conf, base


def _task(conf: Path, port: int, *hosts: str) -> list[str]:
    return [PYTHON, "task.py", str(conf), str(port), *hosts]


def _learn(world: World, base: Path, run_dir: Path, task: list[str], *extra: str) -> str:
    proc = world.stockade(
        "learn",
        "--policy",
        str(base),
        "--see",
        str(world.root / "etc-app"),
        "-o",
        str(run_dir),
        *extra,
        "--",
        *task,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _observations(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "observations.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.usefixtures("kernel")
def test_learn_suggest_verify_config_and_fetch(world: World, server: int) -> None:
    conf, base = _setup(world)
    run_dir = world.root / "learnt"
    task = _task(conf, server)
    out = _learn(world, base, run_dir, task, "--runs", "2")
    # learning refused nothing the task needed, and kept the metadata address refused
    assert "thing.test served /data/alpha" in out
    assert "metadata refused" in out
    summary = json.loads((run_dir / "learn.json").read_text())
    assert [r["returncode"] for r in summary["runs"]] == [0, 0]
    seen = _observations(run_dir)
    reads = {o["path"] for o in seen if o["kind"] == "read"}
    assert str(conf) in reads
    requests = [o for o in seen if o["kind"] == "request" and o["host"] == "thing.test"]
    assert {(o["method"], o["path"], o["verdict"]) for o in requests} == {
        ("GET", "/data/alpha", "allow")
    }
    assert {o["run"] for o in requests} == {1, 2}
    metadata = [o for o in seen if o.get("host") == "169.254.169.254"]
    assert metadata
    assert all(o["verdict"] == "deny" for o in metadata)

    policy = world.root / "suggested.toml"
    proc = world.stockade(
        "policy", "suggest", str(run_dir), "-o", str(policy), "--verify", "--", *task, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    assert "needed actions broken: 0" in proc.stderr
    assert "unneeded actions open: 0" in proc.stderr
    text = policy.read_text()
    assert f'"thing.test:{server}"' in text
    assert f'"{conf}"' in text
    assert "169.254.169.254" not in text.split("# Observed and not suggested:")[0]
    # the whole policy is this (nothing beyond the observations): one host, one file
    from stockade.policy import load_policy

    loaded = load_policy(policy, workspace=world.workspace)
    assert loaded.network.allow == (f"thing.test:{server}",)
    assert loaded.filesystem.read == (conf,)
    assert loaded.filesystem.write == ()


@pytest.mark.usefixtures("kernel")
def test_verify_counts_a_needed_read_the_policy_breaks(world: World, server: int) -> None:
    conf, base = _setup(world)
    run_dir = world.root / "learnt"
    task = _task(conf, server)
    _learn(world, base, run_dir, task)
    good = world.root / "good.toml"
    assert world.stockade("policy", "suggest", str(run_dir), "-o", str(good)).returncode == 0
    # the twin: without the config file's read line the task breaks, and verify says so
    narrow = world.root / "narrow.toml"
    narrow.write_text(good.read_text().replace(f'    "{conf}",\n', ""))
    assert f'"{conf}"' not in narrow.read_text()
    bad = world.stockade(
        "policy",
        "verify",
        str(narrow),
        "--learned",
        str(run_dir),
        "--no-attacks",
        "--",
        *task,
        timeout=120,
    )
    assert bad.returncode == 1, bad.stderr
    assert "needed actions broken: 0" not in bad.stderr
    assert "exit status" in bad.stderr
    ok = world.stockade(
        "policy",
        "verify",
        str(good),
        "--learned",
        str(run_dir),
        "--no-attacks",
        "--",
        *task,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "needed actions broken: 0" in ok.stderr
    # suggest --verify writes nothing when the task breaks under the suggestion: a run
    # directory whose learnt output differs (another configuration) cannot pass
    conf.write_text("beta\n")
    target = world.root / "never.toml"
    refused = world.stockade(
        "policy",
        "suggest",
        str(run_dir),
        "-o",
        str(target),
        "--verify",
        "--no-attacks",
        "--",
        *task,
        timeout=120,
    )
    assert refused.returncode == 1
    assert "not written" in refused.stderr
    assert not target.exists()


@pytest.mark.usefixtures("kernel")
def test_drift_names_a_host_needed_only_on_a_later_run(world: World, server: int) -> None:
    conf, base = _setup(world)
    first, later = world.root / "first", world.root / "later"
    _learn(world, base, first, _task(conf, server))
    policy = world.root / "policy.toml"
    assert world.stockade("policy", "suggest", str(first), "-o", str(policy)).returncode == 0
    # the twin: the runs the policy was learnt from need nothing it lacks
    same = world.stockade("policy", "diff", str(policy), str(first))
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout == ""
    _learn(world, base, later, _task(conf, server, "thing.test", "other.test"))
    drift = world.stockade("policy", "diff", str(policy), str(later))
    assert drift.returncode == 1
    assert f"host other.test:{server} is not allowed" in drift.stdout
    assert "thing.test" not in drift.stdout


@pytest.mark.usefixtures("kernel")
def test_learn_as_nobody_observes_the_read(world: World, server: int) -> None:
    """The seccomp observer needs no privilege: uid 65534 learns the same read."""
    require(os.getuid() == 0, "switching to uid 65534 needs root")
    conf, base = _setup(world)
    run_dir = world.root / "nobody-learnt"
    proc = as_nobody(
        world,
        "learn",
        "--policy",
        str(base),
        "--see",
        str(conf.parent),
        "-o",
        str(run_dir),
        "--",
        *_task(conf, server),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "thing.test served /data/alpha" in proc.stdout
    reads = {o["path"] for o in _observations(run_dir) if o["kind"] == "read"}
    assert str(conf) in reads


def test_learn_refuses_bad_input(world: World) -> None:
    bad = world.stockade("learn", "--runs", "0", "--", "true")
    assert bad.returncode == 125
    assert "at least once" in bad.stderr
    missing = world.stockade("learn", "--see", str(world.root / "nope"), "--", "true")
    assert missing.returncode == 125
    assert "no such file" in missing.stderr
    not_a_run = world.stockade("policy", "suggest", str(world.root))
    assert not_a_run.returncode == 125
    assert "not a learn run directory" in not_a_run.stderr


class _GitHandler(http.server.BaseHTTPRequestHandler):
    """Smart HTTP through ``git http-backend`` (CGI), for the repositories under
    ``server.git_root``."""

    def _serve(self) -> None:
        import subprocess

        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        script, _, query = self.path.partition("?")
        env = {
            "PATH": "/usr/bin:/bin",
            "GIT_PROJECT_ROOT": str(self.server.git_root),  # type: ignore[attr-defined]
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": script,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "GIT_PROTOCOL": self.headers.get("git-protocol", ""),
            "REMOTE_ADDR": "127.0.0.1",
        }
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.usefixtures("kernel")
def test_git_clone_over_smart_http_learn_suggest_verify(world: World) -> None:
    import shutil

    require(shutil.which("git") is not None, "git is needed")
    from tests.clients.conftest import bare_repository
    from tests.runtime.test_toolchains import MESSAGE

    repos = world.root / "repos"
    repos.mkdir()
    bare_repository(repos)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GitHandler)
    srv.git_root = repos  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        base = world.root / "base.toml"
        base.write_text('[network.hosts]\n"git.test" = "127.0.0.1"\n')
        task = [
            "sh",
            "-c",
            # into the sandbox's own /tmp: each run starts from the same state
            f"git clone -q http://git.test:{port}/repo.git /tmp/clone && cat /tmp/clone/hello.txt",
        ]
        run_dir = world.root / "learnt"
        proc = world.stockade("learn", "--policy", str(base), "-o", str(run_dir), "--", *task)
        assert proc.returncode == 0, proc.stderr
        assert MESSAGE in proc.stdout
        requests = {
            (o["method"], o["path"])
            for o in _observations(run_dir)
            if o["kind"] == "request" and o["host"] == "git.test"
        }
        assert ("GET", "/repo.git/info/refs") in requests
        assert ("POST", "/repo.git/git-upload-pack") in requests
        policy = world.root / "git.toml"
        proc = world.stockade(
            "policy",
            "suggest",
            str(run_dir),
            "-o",
            str(policy),
            "--verify",
            "--",
            *task,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        assert "needed actions broken: 0" in proc.stderr
        assert "unneeded actions open: 0" in proc.stderr
        from stockade.policy import load_policy

        assert load_policy(policy, workspace=world.workspace).network.allow == (f"git.test:{port}",)
        # the twin: the same clone under the default policy (no host) is refused
        refused = world.stockade("run", "--policy", str(base), "--", *task)
        assert refused.returncode != 0
        assert MESSAGE not in refused.stdout
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.usefixtures("kernel")
def test_the_api_learns_and_suggests(world: World, server: int) -> None:
    """``stockade.learn(...)`` is a plain function (the learning package's :func:`learn`,
    whatever was imported before); two runs merge."""
    import inspect

    import stockade
    import stockade.learning
    from stockade.learning import suggest_from

    # importing the package does not replace the function (it did when it was named learn)
    assert inspect.isfunction(stockade.learn)
    assert stockade.learn is stockade.learning.learn
    conf, base = _setup(world)
    run_dir = world.root / "api-learnt"
    result = stockade.learn(
        _task(conf, server),
        policy=base,
        workspace=world.workspace,
        cwd=world.workspace,
        out=run_dir,
        runs=2,
        see=[conf.parent],
        env=world.env,
    )
    assert result.returncodes == [0, 0]
    assert b"thing.test served /data/alpha" in result.stdout
    suggestion = suggest_from([run_dir])
    assert [line.value for line in suggestion.section("allow")] == [f"thing.test:{server}"]
    assert [line.value for line in suggestion.section("read")] == [str(conf)]
    # each line names the observations of both runs
    assert {n.split(":")[0] for n in suggestion.section("read")[0].needs} == {"run 1", "run 2"}


@pytest.mark.slow
@pytest.mark.usefixtures("kernel")
def test_pip_install_from_a_local_index_learn_suggest_verify(world: World) -> None:
    from tests.runtime.test_toolchains import IMPORT, MESSAGE, PIP, PKG, simple_index

    files = simple_index()

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = files.get(self.path.split("?", 1)[0])
            self.send_response(200 if data is not None else 404)
            kind = "text/html" if self.path.endswith("/") else "application/octet-stream"
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        base = world.root / "base.toml"
        base.write_text('[network.hosts]\n"index.test" = "127.0.0.1"\n')
        index = f"http://index.test:{port}/simple/"
        # into the sandbox's own /tmp, so that every run starts from the same state
        script = (
            "cd /tmp && "
            + PIP.format(args=f"--index-url {index} --trusted-host index.test", pkg=PKG)
            + " && "
            + IMPORT
        )
        task = ["sh", "-c", script]
        run_dir = world.root / "learnt"
        proc = world.stockade(
            "learn", "--policy", str(base), "-o", str(run_dir), "--", *task, timeout=240
        )
        assert proc.returncode == 0, proc.stderr
        assert MESSAGE in proc.stdout
        paths = {o["path"] for o in _observations(run_dir) if o.get("host") == "index.test"}
        assert f"/simple/{PKG}/" in paths
        policy = world.root / "pip.toml"
        proc = world.stockade(
            "policy",
            "suggest",
            str(run_dir),
            "-o",
            str(policy),
            "--verify",
            "--",
            *task,
            timeout=360,
        )
        assert proc.returncode == 0, proc.stderr
        assert "needed actions broken: 0" in proc.stderr
        assert "unneeded actions open: 0" in proc.stderr
        from stockade.policy import load_policy

        loaded = load_policy(policy, workspace=world.workspace)
        assert loaded.network.allow == (f"index.test:{port}",)
        # pip's own files come from the PATH tools every run binds: nothing to grant
        assert loaded.filesystem.write == ()
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.usefixtures("kernel")
def test_inspected_tls_requests_become_rules_per_method(world: World) -> None:
    """A host the learning policy inspects (it has request rules): the suggestion has one
    rule per method with the paths seen (six sibling paths widen to ``dir/*``, named),
    and under it a request never seen (DELETE) is refused while the seen ones pass."""
    import ssl

    import trustme

    ca = trustme.CA()
    ca_path = world.root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.test").configure_cert(ctx)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        base = world.root / "base.toml"
        base.write_text(
            f'[network]\nallow = ["api.test:{port}"]\ntls_ports = [443, {port}]\n'
            f'tls = {{ upstream_ca = "{ca_path}" }}\n'
            '[network.hosts]\n"api.test" = "127.0.0.1"\n'
            f'[[network.rules]]\nhost = "api.test:{port}"\npaths = ["/**"]\n'
        )
        url = f"https://api.test:{port}"
        curl = 'curl -sS -m 10 --cacert "$SSL_CERT_FILE" -o /dev/null -w "%{http_code} "'
        task = [
            "sh",
            "-c",
            f"for i in 0 1 2 3 4 5; do {curl} {url}/v1/items/$i; done; "
            f"{curl} -X POST -d x {url}/v1/orders; echo",
        ]
        run_dir = world.root / "learnt"
        proc = world.stockade("learn", "--policy", str(base), "-o", str(run_dir), "--", *task)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["200"] * 7, proc.stdout
        policy = world.root / "api.toml"
        proc = world.stockade(
            "policy",
            "suggest",
            str(run_dir),
            "-o",
            str(policy),
            "--verify",
            "--",
            *task,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr
        assert "needed actions broken: 0" in proc.stderr
        text = policy.read_text()
        assert "WIDENING: 6 paths seen under /v1/items/" in text
        from stockade.policy import load_policy

        rules = {
            (r.methods, r.paths)
            for r in load_policy(policy, workspace=world.workspace).network.rules
        }
        assert rules == {(("GET",), ("/v1/items/*",)), (("POST",), ("/v1/orders",))}
        # the twin: what was never seen is refused under the suggestion
        other = world.stockade(
            "run",
            "--policy",
            str(policy),
            "--",
            "sh",
            "-c",
            f"{curl} -X DELETE {url}/v1/orders; {curl} -X POST -d x {url}/v1/items/1; "
            f"{curl} {url}/v1/items/9; echo",
        )
        assert other.stdout.split() == ["403", "403", "200"], other.stdout + other.stderr
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.usefixtures("kernel")
def test_a_host_socket_in_a_visible_directory_stays_out_of_reach(world: World) -> None:
    """``connect()`` needs no write permission: learning masks the unix sockets of what it
    makes visible, while the directory's files stay readable (the twin)."""
    import socket

    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    shown = world.root / "etc-app"
    shown.mkdir()
    (shown / "app.conf").write_text("alpha\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(shown / "daemon.sock"))
    listener.listen(1)
    try:
        probe = (
            "import socket\n"
            f"print(open({str(shown / 'app.conf')!r}).read().strip())\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect({str(shown / 'daemon.sock')!r}); print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        proc = world.stockade(
            "learn", "--see", str(shown), "-o", str(world.root / "l"), "--", PYTHON, "-c", probe
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == "alpha"
        assert lines[1].startswith("refused"), proc.stdout
    finally:
        listener.close()


INJECTION_TASK = r"""
import os
# A name is the sandbox's to choose: one with line breaks that would read as policy lines
for path in ('/nonexistent-\n[layers]\negress = false\n#', '/opt/x\n"/" ,\n#'):
    try:
        open(path)
    except OSError:
        pass
print("done")
"""


@pytest.mark.usefixtures("kernel")
def test_an_observed_name_never_becomes_a_line_of_the_suggested_policy(world: World) -> None:
    # The sandbox opens paths whose names hold line breaks and TOML; what learning saw
    # reaches the suggestion only as one comment line each (escaped), so the policy
    # parses to nothing but what was observed as needed.
    import tomllib

    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    (world.workspace / "task.py").write_text(INJECTION_TASK)
    run_dir = world.root / "learnt"
    proc = world.stockade("learn", "-o", str(run_dir), "--", PYTHON, "task.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("done")
    paths = {o.get("path") for o in _observations(run_dir)}
    assert "/nonexistent-\n[layers]\negress = false\n#" in paths  # it was observed
    policy = world.root / "suggested.toml"
    suggest = world.stockade("policy", "suggest", str(run_dir), "-o", str(policy))
    assert suggest.returncode == 0, suggest.stderr
    text = policy.read_text()
    doc = tomllib.loads(text)
    assert "layers" not in doc
    assert "/" not in doc.get("filesystem", {}).get("read", [])
    # the twin: the observation is still there for the person to read, on one line
    assert "/nonexistent-\\n[layers]\\negress = false\\n#" in text
    assert world.stockade("check", "--policy", str(policy)).returncode == 0


@pytest.mark.usefixtures("kernel")
def test_a_run_directory_the_sandbox_could_write_is_refused(world: World) -> None:
    # A second learning run (or any later run) could append an observation of its own
    # to a run directory in the workspace, and suggest would propose its host.
    require(os.path.exists(PYTHON), f"{PYTHON} is needed inside the sandbox")
    inside = world.stockade("learn", "-o", "learnt", "--", "true", cwd=world.workspace)
    assert inside.returncode == 125, inside.stderr
    assert "outside the workspace" in inside.stderr
    assert not (world.workspace / "learnt").exists()
    # the twin: without -o, a directory in stockade's state, named on stderr
    default = world.stockade("learn", "--", "true", cwd=world.workspace)
    assert default.returncode == 0, default.stderr
    run_dir = Path(default.stderr.split("Next: stockade policy suggest ")[1].split()[0])
    assert (run_dir / "observations.jsonl").is_file()
    assert not run_dir.is_relative_to(world.workspace)
    assert world.stockade("policy", "suggest", str(run_dir)).returncode == 0


def test_learning_under_gvisor_fails_closed_with_the_reason(world: World, runsc: str) -> None:
    """gVisor's Sentry serves the task's system calls: the observer would see nothing, so
    learning refuses (125, the reason named, no run directory) rather than learn blind;
    the twin: the same policy runs the task under gVisor."""
    world.env["STOCKADE_RUNSC"] = runsc  # the world's HOME is a fake one
    base = world.root / "gvisor.toml"
    base.write_text('[container]\nbackend = "gvisor"\n')
    run_dir = world.root / "learnt"
    refused = world.stockade(
        "learn", "--policy", str(base), "-o", str(run_dir), "--", "sh", "-c", "echo ran"
    )
    assert refused.returncode == 125, refused.stdout + refused.stderr
    assert "learning under the gVisor backend" in refused.stderr
    assert "bubblewrap or landlock" in refused.stderr
    assert "ran" not in refused.stdout
    assert not run_dir.exists()
    ran = world.stockade("run", "--policy", str(base), "--", "sh", "-c", "echo ran")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "ran\n"
