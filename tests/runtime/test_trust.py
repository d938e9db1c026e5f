"""Trust stores pass through: a network whose CA comes from the caller's environment.

The caller names a company CA in ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``; the file lives in
the caller's HOME, which the sandbox does not see. Inside, the variables are set and the
file is readable (read-only), so clients verify a server that CA signed. With inspection
on, the proxy verifies the upstream against the same CA and the clients trust one bundle
that holds it and the run's own CA. Each case has its twin without the variable.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from stockade.policy._tables import TRUST_ENV_NAMES
from tests.conftest import World
from tests.runtime.test_toolchains import Served, run, serve, write_policy

__all__ = ["serve"]  # the fixture, used by name

PROBE = r"""
import json, os, ssl, sys, urllib.request
url = sys.argv[1]
out = {"SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE"),
       "AWS_CA_BUNDLE": os.environ.get("AWS_CA_BUNDLE")}
try:
    # urllib verifies against the default context, which reads SSL_CERT_FILE.
    with urllib.request.urlopen(url, timeout=10) as response:
        out["fetch"] = [response.status, response.read().decode()]
except Exception as exc:
    out["fetch"] = [type(exc).__name__, str(exc)[:300]]
path = os.environ.get("REQUESTS_CA_BUNDLE", "")
out["readable"] = os.path.isfile(path) and "BEGIN CERTIFICATE" in open(path).read()
try:
    open(path, "a").close()
    out["writable"] = True
except OSError:
    out["writable"] = False
print(json.dumps(out))
"""


def corp_env(world: World, serve: Served) -> dict[str, str]:
    """The caller's environment on a network with its own CA, kept in its HOME."""
    ca = world.home / "corp" / "corp-ca.pem"
    ca.parent.mkdir()
    shutil.copy(serve.ca_path, ca)
    env = {k: v for k, v in world.env.items() if k not in TRUST_ENV_NAMES}
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE"):
        env[name] = str(ca)
    return env


def probe(world: World, serve: Served, env: dict[str, str], inspect: bool) -> dict[str, Any]:
    site = serve.start({"/hello": b"hello"}, tls=True)
    (world.workspace / "probe.py").write_text(PROBE)
    rules = ""
    if inspect:
        rules = '[[network.rules]]\nhost = "web.test"\nmethods = ["GET"]\n'
    policy = write_policy(world, ["web.test"], f"tls_ports = [443, {site.port}]")
    if rules:
        policy.write_text(policy.read_text() + rules)
    world.env = env
    ran = run(world, policy, f"python3 probe.py https://web.test:{site.port}/hello")
    assert ran.proc.returncode == 0, ran.out
    out: dict[str, Any] = json.loads(ran.proc.stdout)
    out["events"] = ran.events
    return out


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("inspect", [False, True], ids=["tunnel", "inspected"])
def test_a_caller_ca_in_home_is_trusted_inside(world: World, serve: Served, inspect: bool) -> None:
    env = corp_env(world, serve)
    out = probe(world, serve, env, inspect)
    assert out["fetch"] == [200, "hello"], out["fetch"]
    events = out["events"]
    assert isinstance(events, list)
    # The variable names a public certificate: passed, never reported as a credential.
    assert not [e for e in events if e.get("name") == "AWS_CA_BUNDLE"]
    if inspect:
        # Inside, every trust variable names the run's bundle (caller's CA + run CA); the
        # proxy verified web.test against the caller's CA and the request was inspected.
        assert out["SSL_CERT_FILE"] == out["AWS_CA_BUNDLE"] != env["SSL_CERT_FILE"]
        inspected = [e for e in events if e["event"] == "net_request" and e["verdict"] == "allow"]
        assert inspected, events
    else:
        assert out["SSL_CERT_FILE"] == env["SSL_CERT_FILE"]
    assert out["readable"] is True
    assert out["writable"] is False


@pytest.mark.usefixtures("kernel")
@pytest.mark.parametrize("inspect", [False, True], ids=["tunnel", "inspected"])
def test_without_the_variable_the_server_is_not_trusted(
    world: World, serve: Served, inspect: bool
) -> None:
    env = {k: v for k, v in world.env.items() if k not in TRUST_ENV_NAMES}
    out = probe(world, serve, env, inspect)
    assert out["fetch"][0] != 200, out["fetch"]
    if inspect:
        # The proxy itself refused to trust the upstream: no request reached it.
        refused = [e for e in out["events"] if e["verdict"] == "deny"]
        assert refused, out["events"]
    else:
        assert "CERTIFICATE_VERIFY_FAILED" in str(out["fetch"]), out["fetch"]
