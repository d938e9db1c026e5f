"""Learn, suggest and verify a real ``npm install`` from a local registry.

The registry is a static server on 127.0.0.1 holding the ``stockadetiny`` packument and
tarball (tests/runtime/test_toolchains.py), reached as ``registry.test`` through the
policy's ``network.hosts`` pin. The task installs it into the sandbox's own /tmp (so that
every run starts from the same state) and requires it with Node. The suggestion must
name the registry and nothing else, verify must re-run the install with no needed action
broken, and the attack scenario's unneeded actions must all be stopped; the twin: the
install is refused under a policy that lacks the registry.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import World, require
from tests.runtime.test_toolchains import MESSAGE, NPM, PKG, REQUIRE, Served, Site, npm_registry

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("kernel")]


@pytest.fixture
def registry() -> Iterator[Site]:
    """A static npm registry on 127.0.0.1 that records each request it serves."""
    site = Site(0, {})

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            site.seen.append(f"{self.command} {self.path}")
            data = site.files.get(self.path.split("?", 1)[0])
            self.send_response(200 if data is not None else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    site.port = server.server_address[1]
    npm_registry(site, "registry.test")
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()


def _task(port: int) -> list[str]:
    # npm's own summary line carries a duration ("added 1 package in 312ms"), which would
    # make every run's output differ: only the require's line is the task's output
    install = NPM.format(host="registry.test", port=port, pkg=PKG)
    return ["sh", "-c", f"mkdir -p /tmp/app && cd /tmp/app && {install} >/dev/null && {REQUIRE}"]


def test_npm_install_learn_suggest_verify(world: World, registry: Site) -> None:
    require(shutil.which("npm") is not None, "npm is not installed")
    base = world.root / "base.toml"
    base.write_text('[network.hosts]\n"registry.test" = "127.0.0.1"\n')
    task = _task(registry.port)
    run_dir = world.root / "learnt"
    learnt = world.stockade(
        "learn", "--policy", str(base), "-o", str(run_dir), "--", *task, timeout=300
    )
    assert learnt.returncode == 0, learnt.stderr
    assert MESSAGE in learnt.stdout
    assert f"GET /{PKG}/-/{PKG}-1.0.0.tgz" in registry.seen
    observed = [json.loads(x) for x in (run_dir / "observations.jsonl").read_text().splitlines()]
    requests = {
        (o["method"], o["path"], o["verdict"])
        for o in observed
        if o["kind"] == "request" and o["host"] == "registry.test"
    }
    assert ("GET", f"/{PKG}", "allow") in requests, requests
    assert ("GET", f"/{PKG}/-/{PKG}-1.0.0.tgz", "allow") in requests, requests
    # every host the install reached, as learning saw it
    reached = {
        f"{o['host']}:{o['port']}"
        for o in observed
        if o["kind"] in ("connect", "request") and o["verdict"] == "allow"
    }
    assert reached == {f"registry.test:{registry.port}"}

    policy = world.root / "npm.toml"
    registry.reset()
    verified = world.stockade(
        "policy", "suggest", str(run_dir), "-o", str(policy), "--verify", "--", *task, timeout=600
    )
    assert verified.returncode == 0, verified.stderr
    assert "needed actions broken: 0" in verified.stderr
    # the install really ran again under the suggestion
    assert f"GET /{PKG}/-/{PKG}-1.0.0.tgz" in registry.seen
    # no wider than the observations: the one registry reached, no file or env grant, and
    # every allow line says which observation needs it
    from stockade.learning import suggest_from
    from stockade.policy import load_policy

    loaded = load_policy(policy, workspace=world.workspace)
    assert loaded.network.allow == (f"registry.test:{registry.port}",)
    assert dict(loaded.network.hosts) == {"registry.test": "127.0.0.1"}
    assert loaded.network.rules == ()
    assert loaded.filesystem.read == ()
    assert loaded.filesystem.write == ()
    suggestion = suggest_from([run_dir])
    assert all(line.needs and not line.widening for line in suggestion.lines)
    assert "# WIDENING:" not in policy.read_text()
    # the attack scenario: every unneeded action stopped, or open with explain's reason
    counts = [line for line in verified.stderr.splitlines() if "unneeded actions open" in line]
    assert counts, verified.stderr
    opened = int(counts[0].split(":")[1].split()[0])
    explained = [line for line in verified.stderr.splitlines() if line.startswith("  open: ")]
    assert len(explained) == opened
    assert all("no active layer stops it" in line for line in explained), explained
    assert opened == 0, verified.stderr

    # the twin: without the registry's line the same install is refused, and the
    # registry sees nothing
    narrow = world.root / "narrow.toml"
    narrow.write_text(policy.read_text().replace(f'    "registry.test:{registry.port}",\n', ""))
    registry.reset()
    refused = world.stockade("run", "--policy", str(narrow), "--", *task, timeout=300)
    assert refused.returncode != 0
    assert MESSAGE not in refused.stdout
    assert registry.seen == []


def test_npm_install_drift_names_a_second_registry(world: World, registry: Site) -> None:
    """A policy learnt from one install; a later run that also needs a second registry
    name: ``policy diff`` names that host and only it (its twin: the first run's own
    observations are all admitted)."""
    require(shutil.which("npm") is not None, "npm is not installed")
    base = world.root / "base.toml"
    base.write_text('[network.hosts]\n"registry.test" = "127.0.0.1"\n"mirror.test" = "127.0.0.1"\n')
    first, later = world.root / "first", world.root / "later"
    proc = world.stockade(
        "learn", "--policy", str(base), "-o", str(first), "--", *_task(registry.port), timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    policy = world.root / "npm.toml"
    assert world.stockade("policy", "suggest", str(first), "-o", str(policy)).returncode == 0
    same = world.stockade("policy", "diff", str(policy), str(first))
    assert same.returncode == 0, same.stdout + same.stderr
    mirror = [
        "sh",
        "-c",
        f"curl -sS -m 10 http://mirror.test:{registry.port}/{PKG} >/dev/null; "
        + _task(registry.port)[2],
    ]
    require(shutil.which("curl") is not None, "curl is not installed")
    proc = world.stockade(
        "learn", "--policy", str(base), "-o", str(later), "--", *mirror, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    drift = world.stockade("policy", "diff", str(policy), str(later))
    assert drift.returncode == 1
    assert drift.stdout.splitlines() == [f"run 1: host mirror.test:{registry.port} is not allowed"]


def test_npm_install_over_inspected_tls_becomes_request_rules(world: World, serve: Served) -> None:
    """The registry over TLS that the learning policy inspects (it has a rule): learning
    records each request, the suggestion is one GET rule with exactly the packument and
    tarball paths, verify re-runs the install under it, and the twin: ``npm publish``
    (a PUT never seen) is refused under the suggestion while the install works."""
    require(shutil.which("npm") is not None, "npm is not installed")
    site = serve.start(tls=True)
    npm_registry(site, "registry.test", scheme="https")
    where = f"registry.test:{site.port}"
    base = world.root / "base.toml"
    base.write_text(
        f'[network]\nallow = ["{where}"]\ntls_ports = [443, {site.port}]\n'
        f'tls = {{ upstream_ca = "{serve.ca_path}" }}\n'
        '[network.hosts]\n"registry.test" = "127.0.0.1"\n'
        f'[[network.rules]]\nhost = "{where}"\npaths = ["/**"]\n'
    )
    install = NPM.format(host="registry.test", port=site.port, pkg=PKG).replace(
        "http://", "https://"
    )
    task = ["sh", "-c", f"mkdir -p /tmp/app && cd /tmp/app && {install} >/dev/null && {REQUIRE}"]
    run_dir = world.root / "learnt"
    learnt = world.stockade(
        "learn", "--policy", str(base), "-o", str(run_dir), "--", *task, timeout=300
    )
    assert learnt.returncode == 0, learnt.stderr
    assert MESSAGE in learnt.stdout
    policy = world.root / "npm-tls.toml"
    verified = world.stockade(
        "policy", "suggest", str(run_dir), "-o", str(policy), "--verify", "--", *task, timeout=600
    )
    assert verified.returncode == 0, verified.stderr
    assert "needed actions broken: 0" in verified.stderr
    assert "unneeded actions open: 0" in verified.stderr
    from stockade.policy import load_policy

    loaded = load_policy(policy, workspace=world.workspace)
    assert loaded.network.allow == (where,)
    assert {(r.host, r.methods, r.paths) for r in loaded.network.rules} == {
        (where, ("GET",), (f"/{PKG}", f"/{PKG}/-/{PKG}-1.0.0.tgz"))
    }
    # the twin: a publish is a request never seen, refused; the install still works
    mine = world.workspace / "mine"
    mine.mkdir()
    (mine / "package.json").write_text(json.dumps({"name": "stockade-mine", "version": "1.0.0"}))
    publish = (
        f"cd mine && npm publish --registry https://{where}/ --cache ../.npm-cache "
        f"--//{where}/:_authToken=not-a-secret --fetch-retries 0 --loglevel error; "
        "echo publish-exit=$?"
    )
    site.reset()
    ran = world.stockade(
        "run", "--policy", str(policy), "--", "sh", "-c", f"{task[2]}; {publish}", timeout=300
    )
    assert MESSAGE in ran.stdout, ran.stdout + ran.stderr
    assert "publish-exit=0" not in ran.stdout
    assert not any(s.startswith("PUT") for s in site.seen)
    assert f"GET /{PKG}/-/{PKG}-1.0.0.tgz" in site.seen
