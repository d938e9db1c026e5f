"""``stockade run`` (and ``stockade proxy``, ``stockade doctor``) on a company network.

stockade runs in network namespace A, whose only way to the ``.test`` servers is squid
in namespace B (``tests/egress/upstream/_net.py``): every request a target logs came
through squid, and squid's access log names each one with the user of ``auth_file``.
The sandboxed probe uses curl and Python the way a build would: proxy variables for
CONNECT and plain HTTP, SOCKS5 on the same listener, inspected TLS, and a client without
proxy variables (transparent capture).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NOBODY, World, _nobody_python, require
from tests.egress.upstream._net import CompanyNet, company_net

pytestmark = pytest.mark.usefixtures("kernel")

PROBE = r"""
import json, os, subprocess, sys
port, tls_port, squid = sys.argv[1], sys.argv[2], sys.argv[3]
def curl(*args, env=None):
    proc = subprocess.run(["curl", "-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          capture_output=True, text=True, env=env)
    return proc.stdout or f"exit {proc.returncode}"
no_proxy_env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
own_proxy = dict(os.environ, HTTPS_PROXY=squid, https_proxy=squid, HTTP_PROXY=squid, http_proxy=squid)
out = {
    "connect": curl(f"https://opaque.test:{tls_port}/connect"),
    "plain": curl(f"http://web.test:{port}/plain"),
    "socks5": curl("-x", "socks5h://127.0.0.1:3128", f"http://web.test:{port}/socks5"),
    "inspected": curl(f"https://tls.test:{tls_port}/inspected"),
    "captured": curl(f"http://web.test:{port}/captured", env=no_proxy_env),
    "denied": curl(f"http://denied.test:{port}/denied"),
    "own_proxy": curl(f"https://opaque.test:{tls_port}/own-proxy", env=own_proxy),
    "own_proxy_var_twin": curl(f"https://opaque.test:{tls_port}/after-own-proxy"),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def net() -> Iterator[CompanyNet]:
    with company_net() as built:
        yield built


def policy_for(net: CompanyNet, world: World, **kwargs: Any) -> Path:
    rules = (
        '[[network.rules]]\nhost = "tls.test"\nmethods = ["GET"]\npaths = ["/**"]\n'
        'action = "allow"\n'
    )
    text = net.policy(
        allow=(
            "web.test",
            f"web.test:{net.http.port}",  # named with its port: captured transparently too
            "tls.test",
            "opaque.test",
            "denied.test",
        ),
        deny=("denied.test",),
        extra=rules,
        **kwargs,
    )
    path = world.root / f"policy-{secrets.token_hex(4)}.toml"
    path.write_text(text)
    return path


def in_a(
    net: CompanyNet, world: World, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``python -m stockade ARGS`` in namespace A, in ``world``."""
    # The company's CA in the caller's trust store: how its interception is trusted.
    env = dict(world.env, SSL_CERT_FILE=str(net.ca_path))
    return subprocess.run(
        ["ip", "netns", "exec", net.a, *world.command, *args],
        cwd=world.workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_probe(
    net: CompanyNet, world: World, policy: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    (world.workspace / "probe.py").write_text(PROBE)
    audit = world.root / f"audit-{secrets.token_hex(4)}.jsonl"
    proc = in_a(
        net,
        world,
        "run",
        "--policy",
        str(policy),
        "--audit",
        str(audit),
        *extra,
        "--",
        "python3",
        "probe.py",
        str(net.http.port),
        str(net.https.port),
        net.squid.url,
    )
    events = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    return proc, events


def test_every_path_from_the_sandbox_goes_through_squid(net: CompanyNet, world: World) -> None:
    proc, events = run_probe(net, world, policy_for(net, world))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["connect"] == "200", out
    assert out["plain"] == "200", out
    assert out["socks5"] == "200", out
    assert out["inspected"] == "200", out
    assert out["captured"] == "200", out
    assert out["denied"] == "403", out
    # The sandbox pointing its own variables at squid reaches nothing (it has no route);
    # stockade's own path is unchanged right after.
    assert out["own_proxy"] != "200", out
    assert out["own_proxy_var_twin"] == "200", out

    def seen(target: Any, path: str) -> list[dict[str, Any]]:
        return [r for r in target.requests() if r["path"] == path]

    for target, path in (
        (net.https, "/connect"),
        (net.http, "/plain"),
        (net.http, "/socks5"),
        (net.https, "/inspected"),
        (net.http, "/captured"),
        (net.https, "/after-own-proxy"),
    ):
        found = seen(target, path)
        assert found, path
        assert found[0]["peer"] == net.squid.address, (path, found)  # squid's connection
    assert not seen(net.https, "/own-proxy")
    assert not seen(net.http, "/denied")
    # squid logged each, with the user of auth_file; plain HTTP in absolute-form.
    log = net.squid.log()
    assert [line for line in log if f"GET http://web.test:{net.http.port}/plain" in line]
    connects = [line for line in log if f"CONNECT {net.target_address}:" in line]
    assert len(connects) >= 5, log[-10:]
    assert all(" alice " in line for line in connects)
    assert not [line for line in log if "denied" in line]

    connect_events = [e for e in events if e["event"] == "net_connect" and e["verdict"] == "allow"]
    chained = [e for e in connect_events if e.get("upstream") == net.squid.url]
    assert {e["protocol"] for e in chained} >= {"connect", "socks5", "tcp"}, connect_events
    assert any(e.get("mode") == "transparent" for e in chained)
    assert all(e["upstream_status"] == 200 for e in chained)
    requests = [e for e in events if e["event"] == "net_request" and e["verdict"] == "allow"]
    assert any(e.get("upstream") == net.squid.url and e["path"] == "/plain" for e in requests)
    inspected = [e for e in requests if e.get("path") == "/inspected"]
    assert inspected
    assert inspected[0]["upstream_status"] == 200
    # No credential anywhere in the audit.
    text = json.dumps(events)
    assert "s3cret" not in text
    assert "YWxpY2" not in text  # base64 of "alice:"


def test_upstream_proxy_option_and_wrong_credentials(net: CompanyNet, world: World) -> None:
    policy = policy_for(net, world, upstream="http://192.0.2.1:9", auth_file=net.bad_auth_file)
    script = (
        "import subprocess, sys; print(subprocess.run(['curl', '-s', '-o', '/dev/null', '-w', "
        "'%{http_code}', sys.argv[1]], capture_output=True, text=True).stdout)"
    )
    url = f"http://web.test:{net.http.port}/bad-credentials"
    # --upstream-proxy replaces the policy's URL (here one that would never answer).
    args = ["run", "--policy", str(policy), "--upstream-proxy", net.squid.url]
    proc = in_a(net, world, *args, "--", "python3", "-c", script, url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "502"
    assert "upstream-refused" in proc.stderr
    assert not [r for r in net.http.requests() if r["path"] == "/bad-credentials"]


def test_the_upstream_down_means_no_network_not_a_direct_one(net: CompanyNet, world: World) -> None:
    policy = policy_for(net, world, upstream=f"http://{net.squid.address}:3129")
    before = len(net.http.requests()) + len(net.https.requests())
    proc, events = run_probe(net, world, policy)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("connect", "plain", "socks5", "inspected", "captured"):
        assert out[key] != "200", (key, out)
    assert len(net.http.requests()) + len(net.https.requests()) == before
    reasons = {e["reason"] for e in events if e["event"] in ("net_connect", "net_request")}
    assert "upstream-unreachable" in reasons
    # Every tunnel failed, except the inspected one (its requests failed, one by one).
    tunnels = [e for e in events if e["event"] == "net_connect" and e["protocol"] != "http"]
    assert tunnels
    for e in tunnels:
        assert e["reason"] == "upstream-unreachable" or e.get("inspected"), e
    inspected = [e for e in events if e["event"] == "net_request" and e.get("host") == "tls.test"]
    assert inspected
    assert inspected[0]["reason"] == "upstream-unreachable"


def test_no_proxy_sends_a_host_direct(net: CompanyNet, world: World) -> None:
    policy = world.root / "direct.toml"
    policy.write_text(net.policy(no_proxy=("direct.test",)))
    script = (
        "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read())"
    )
    url = f"http://direct.test:{net.direct.port}/direct-run"
    proc = in_a(net, world, "run", "--policy", str(policy), "--", "python3", "-c", script, url)
    assert proc.returncode == 0, proc.stderr
    assert "hello from" in proc.stdout
    assert [r for r in net.direct.requests() if r["path"] == "/direct-run"]
    assert not [line for line in net.squid.log() if "direct-run" in line]


def test_invalid_settings_refuse_every_run(net: CompanyNet, world: World) -> None:
    cases = {
        "network.upstream.proxy": net.policy(upstream="http://alice:s3cret-pw@proxy.test:3128"),
        "network.upstream.connect_by": net.policy(connect_by="ip"),
    }
    loose = world.root / "loose-auth"
    loose.write_text("alice:s3cret-pw\n")
    loose.chmod(0o644)
    cases["network.upstream.auth_file"] = net.policy(auth_file=loose)
    for key, text in cases.items():
        policy = world.root / "bad.toml"
        policy.write_text(text)
        marker = world.workspace / "ran"
        proc = in_a(net, world, "run", "--policy", str(policy), "--", "touch", str(marker))
        assert proc.returncode == 125, (key, proc.stderr)
        assert key in proc.stderr, proc.stderr
        assert "s3cret" not in proc.stderr
        assert not marker.exists()
    proc = in_a(net, world, "run", "--upstream-proxy", "socks5://proxy.test:1080", "--", "true")
    assert proc.returncode == 125
    assert "--upstream-proxy" in proc.stderr


def test_a_workspace_policy_cannot_set_the_upstream(net: CompanyNet, world: World) -> None:
    (world.workspace / "stockade.toml").write_text(
        f'[network.upstream]\nproxy = "{net.squid.url}"\n'
    )
    proc = in_a(net, world, "run", "--", "true")
    assert proc.returncode == 125
    assert "network.upstream" in proc.stderr
    assert "only tighten" in proc.stderr
    (world.workspace / "stockade.toml").unlink()
    assert in_a(net, world, "run", "--", "true").returncode == 0  # the twin


def test_stockade_proxy_takes_the_same_settings(net: CompanyNet, world: World) -> None:
    policy = world.root / "proxy.toml"
    policy.write_text(net.policy(upstream="http://192.0.2.1:9"))
    port = 20000 + secrets.randbelow(20000)
    proc = subprocess.Popen(
        [
            "ip", "netns", "exec", net.a, *world.command, "proxy",
            "--listen", f"tcp:127.0.0.1:{port}", "--policy", str(policy),
            "--upstream-proxy", net.squid.url, "--quiet",
        ],
        cwd=world.workspace,
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                sock = net.connect(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "stockade proxy did not listen"
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        with sock:
            sock.settimeout(10)
            url = f"http://web.test:{net.http.port}/standalone"
            sock.sendall(
                f"GET {url} HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n".encode()
            )
            data = b""
            while part := sock.recv(65536):
                data += part
        assert b"hello from" in data, data
        found = [r for r in net.http.requests() if r["path"] == "/standalone"]
        assert found
        assert found[0]["peer"] == net.squid.address
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_doctor_shows_and_tests_the_upstream(net: CompanyNet, world: World) -> None:
    policy = world.root / "doctor.toml"
    policy.write_text(net.policy(allow=(f"web.test:{net.http.port}",)))
    proc = in_a(net, world, "doctor", "--json", "--policy", str(policy))
    check = {c["name"]: c for c in json.loads(proc.stdout)}["upstream proxy"]
    assert check["ok"] is True, check
    assert net.squid.url in check["detail"]
    assert "answers CONNECT" in check["detail"]
    policy.write_text(net.policy(auth_file=net.bad_auth_file))
    proc = in_a(net, world, "doctor", "--json", "--policy", str(policy))
    assert proc.returncode == 1
    check = {c["name"]: c for c in json.loads(proc.stdout)}["upstream proxy"]
    assert check["ok"] is False
    assert "407" in check["detail"]
    assert str(net.bad_auth_file) in check["fix"]
    proc = in_a(
        net, world, "doctor", "--json", "--upstream-proxy", f"http://{net.squid.address}:3129"
    )
    check = {c["name"]: c for c in json.loads(proc.stdout)}["upstream proxy"]
    if check["detail"].startswith("none") or "no allowed host" in check["detail"]:
        return  # the user policy allows no host to test with: nothing more to check
    assert check["ok"] is False


def test_an_unprivileged_user_is_chained_too(net: CompanyNet, world: World) -> None:
    python = _nobody_python()
    require(
        python is not None and shutil.which("setpriv") is not None,
        "no Python >= 3.11 executable by uid 65534, or no setpriv",
    )
    assert python is not None
    auth = world.root / "nobody-auth"
    auth.write_text("alice:s3cret-pw\n")
    policy = world.root / "nobody.toml"
    policy.write_text(net.policy(auth_file=auth))
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(world.root)], check=True)
    auth.chmod(0o600)
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(
        world.env,
        PYTHONPATH=f"{src}:{sysconfig.get_paths()['purelib']}",
        XDG_CACHE_HOME=str(world.root / "cache"),
    )
    url = f"http://web.test:{net.http.port}/as-nobody"
    script = (
        "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).status)"
    )
    proc = subprocess.run(
        [
            "ip", "netns", "exec", net.a,
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            python, "-m", "stockade", "run", "--policy", str(policy),
            "--", "python3", "-c", script, url,
        ],
        cwd=world.workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "200"
    found = [r for r in net.http.requests() if r["path"] == "/as-nobody"]
    assert found
    assert found[0]["peer"] == net.squid.address
    assert [line for line in net.squid.log() if "/as-nobody" in line and " alice " in line]
