"""The same clients with the inspect layer on (issue 13): a GET-only rule and a bound secret.

Each client has its own HTTPS name ``CLIENT-https.api.test``, intercepted because a rule
names it (GET and HEAD only) and the secret ``API_KEY`` is bound to it (``x-api-key``).
The client sends its placeholder with a GET, which must reach the server with the real
value swapped in, and with a PUT, which the proxy must refuse (403, ``no-rule-matched``)
before anything reaches the server: whichever way the client reached the proxy (proxy
variables, or the resolver and capture). The clients trust the run's CA through the
bundle stockade points the trust-store variables at (it holds the caller's ca.pem too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clients.conftest import (
    IGNORE_PROXY_VARIABLES,
    MODES,
    REAL_KEY,
    Job,
    Ran,
    Servers,
    make_job,
    policy_text,
    require_client,
    run_jobs,
)
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

CLIENTS = (
    "curl",
    "wget",
    "urllib",
    "httpclient",
    "requests",
    "httpx",
    "aiohttp",
    "aiohttp-env",
    "node-fetch",
    "node-get",
    "java",
    "go",
)
HEADER = "x-api-key=env:API_KEY"


@dataclass
class Inspected:
    mode: str
    ran: Ran
    get: dict[str, Job]
    put: dict[str, Job]


def inspect_tail(hosts: list[str], ca: Path) -> str:
    rules = "".join(
        f'[[network.rules]]\nhost = "{h}"\nmethods = ["GET", "HEAD"]\npaths = ["/**"]\n'
        'action = "allow"\n'
        for h in hosts
    )
    names = ", ".join(f'"{h}"' for h in hosts)
    return (
        f'tls = {{ upstream_ca = "{ca}" }}\n'
        f"{rules}"
        f'[secrets.API_KEY]\nfrom = "env:API_KEY"\nhosts = [{names}]\nheader = "x-api-key"\n'
    )


@pytest.fixture(scope="module", params=MODES)
def inspected(
    request: pytest.FixtureRequest, cworld: World, servers: Servers, go_client: Path | None
) -> Inspected:
    mode: str = request.param
    port = servers.https.port
    get = {c: make_job(c, "https", "api", port, header=HEADER) for c in CLIENTS}
    put = {c: make_job(c, "https", "api", port, method="PUT", header=HEADER) for c in CLIENTS}
    endpoints = sorted(j.endpoint for j in get.values())
    policy = policy_text(
        allow=endpoints,
        pins=[j.host for j in get.values()],
        tls_ports=[port],
        tail=inspect_tail(endpoints, servers.ca_path),
    )
    ran = run_jobs(
        cworld,
        [*get.values(), *put.values()],
        policy,
        mode=mode,
        go_client=go_client is not None,
        label=f"i-{mode}",
        env={"API_KEY": REAL_KEY},
    )
    assert ran.proc.returncode == 0, ran.out
    assert REAL_KEY not in ran.proc.stdout + ran.proc.stderr
    return Inspected(mode, ran, get, put)


def requests_of(ran: Ran, job: Job) -> list[dict[str, object]]:
    return [
        e
        for e in ran.about(job.host)
        if e["event"] == "net_request" and str(e.get("path", "")).startswith(f"/t/{job.token}/")
    ]


@pytest.mark.parametrize("client", CLIENTS)
def test_get_is_allowed_and_the_bound_credential_injected(
    inspected: Inspected, servers: Servers, client: str
) -> None:
    require_client(client)
    ran, job = inspected.ran, inspected.get[client]
    status, text = ran.results.get(job.id, ("missing", ""))
    assert (status, text) == ("200", f"hello {job.token} via https:{servers.https.port}"), (
        f"{client} in {inspected.mode} mode: {status} {text}\n{ran.brief(job.host)}"
    )
    seen = servers.https.seen_for(job.token)
    assert [s.method for s in seen] == ["GET"], seen
    # The placeholder went in; the real value came out of the proxy.
    assert seen[0].headers.get("x-api-key") == REAL_KEY
    events = requests_of(ran, job)
    assert [(e["method"], e["verdict"], e.get("secrets")) for e in events] == [
        ("GET", "allow", ["API_KEY"])
    ], ran.brief(job.host)
    connects = [e for e in ran.about(job.host) if e["event"] == "net_connect"]
    assert connects, ran.brief(job.host)
    if inspected.mode == "transparent" or client in IGNORE_PROXY_VARIABLES:
        assert all(e.get("mode") == "transparent" for e in connects), ran.brief(job.host)
    else:
        assert any(e.get("mode") != "transparent" for e in connects), ran.brief(job.host)


@pytest.mark.parametrize("client", CLIENTS)
def test_put_is_refused_by_the_get_only_rule(
    inspected: Inspected, servers: Servers, client: str
) -> None:
    require_client(client)
    ran, job = inspected.ran, inspected.put[client]
    status, text = ran.results.get(job.id, ("missing", ""))
    assert status == "403", f"{client} in {inspected.mode} mode: {status} {text}"
    assert servers.seen_for(job.token) == []
    events = requests_of(ran, job)
    assert [(e["method"], e["verdict"], e["reason"]) for e in events] == [
        ("PUT", "deny", "no-rule-matched")
    ], ran.brief(job.host)
