"""The caller's trust stores reach the clients by default (issue 13).

A corporate CA outside the workspace, named by every trust-store variable of the caller
(``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS``, ``PIP_CERT``,
``GIT_SSL_CAINFO``, ``npm_config_cafile``, ``AWS_CA_BUNDLE``, ...), and a policy that
passes none of them: the clients still verify the HTTPS server with it, in both modes,
the file is readable and not writable inside, and no variable is reported as a
credential. The twin: the same client told to trust only the system roots fails to
verify the server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.conftest import (
    MODES,
    Job,
    Ran,
    Servers,
    check_allowed,
    make_job,
    policy_text,
    require_client,
    run_jobs,
)
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

CLIENTS = (
    "curl",
    "urllib",
    "requests",
    "httpx",
    "aiohttp",
    "node-fetch",
    "go",
    "pip",
    "uv",
    "npm",
    "git",
)
SYSTEM_ROOTS = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module", params=MODES)
def trusted(
    request: pytest.FixtureRequest, cworld: World, servers: Servers, go_client: Path | None
) -> tuple[str, Ran, dict[str, Job], Path]:
    mode: str = request.param
    corp = cworld.root / "corp"
    corp.mkdir(exist_ok=True)
    ca = corp / "corporate-ca.pem"
    ca.write_bytes(servers.ca_pem)
    port = servers.https.port
    jobs = {c: make_job(c, "https", "ok", port, label="trust") for c in CLIENTS}
    policy = policy_text(
        allow=[j.endpoint for j in jobs.values()],
        pins=[j.host for j in jobs.values()],
        tls_ports=[port],
        pass_trust=False,
    )
    twin = f"https://{jobs['curl'].host}:{port}/t/{jobs['curl'].token}-twin/hello"
    after = (
        'echo PROBE trust_file "\\"$SSL_CERT_FILE\\""\n'
        'if head -c 27 "$SSL_CERT_FILE" | grep -q "BEGIN CERTIFICATE"; then '
        'echo PROBE readable "\\"yes\\""; fi\n'
        'if (echo x >> "$SSL_CERT_FILE") 2>/dev/null; then echo PROBE writable "\\"yes\\""; '
        'else echo PROBE writable "\\"no\\""; fi\n'
        f"CURL_CA_BUNDLE={SYSTEM_ROOTS} SSL_CERT_FILE={SYSTEM_ROOTS} curl -sS -m 10 -o /dev/null "
        f"{twin} 2>/dev/null; echo PROBE system_roots $?\n"
    )
    ran = run_jobs(
        cworld,
        list(jobs.values()),
        policy,
        mode=mode,
        go_client=go_client is not None,
        label=f"t-{mode}",
        trust=ca,
        env={"AWS_CA_BUNDLE": str(ca)},
        after=after,
    )
    assert ran.proc.returncode == 0, ran.out
    return mode, ran, jobs, ca


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_verifies_the_server_with_the_callers_trust_store(
    trusted: tuple[str, Ran, dict[str, Job], Path], servers: Servers, client: str
) -> None:
    require_client(client)
    mode, ran, jobs, _ = trusted
    check_allowed(ran, jobs[client], servers, mode)


def test_the_trust_store_is_readable_not_writable_and_no_credential(
    trusted: tuple[str, Ran, dict[str, Job], Path], servers: Servers
) -> None:
    _, ran, jobs, ca = trusted
    p = ran.probes
    assert p["trust_file"] == str(ca)
    assert p.get("readable") == "yes", ran.out
    assert p["writable"] == "no"
    assert ca.read_bytes() == servers.ca_pem
    # The twin: told to trust only the system roots, curl cannot verify the server.
    assert p["system_roots"] == 60, ran.out  # CURLE_PEER_FAILED_VERIFICATION
    assert not servers.https.seen_for(f"{jobs['curl'].token}-twin")
    reported = [e for e in ran.events if e["event"] in ("env_dropped", "denied")]
    assert not [
        e for e in reported if "CA" in str(e.get("name", "")) or "CERT" in str(e.get("name", ""))
    ], reported
    assert "credential" not in ran.proc.stderr, ran.proc.stderr
