"""Every common client reaches what the policy allows, and nothing else (issue 13).

One ``stockade run`` per mode runs every client twice over: against its own allowed name
(``CLIENT-SCHEME.ok.test``, pinned to 127.0.0.1 and allowed on the server's port), where
it must get the right server's answer, and against a name not in the policy
(``CLIENT-SCHEME.no.test``), where it must fail with the denial in the audit log: a
``net_connect``/``net_request`` denial when the client used the proxy, a ``dns_query``
denial when it looked the name up itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.conftest import (
    MODES,
    Matrix,
    Servers,
    check_allowed,
    check_denied,
    make_job,
    matrix_jobs,
    policy_text,
    require_client,
    run_jobs,
)
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")

#: each client with the schemes it is tried on (pip refuses a plain-HTTP index)
CASES: dict[str, tuple[str, ...]] = {
    "curl": ("http", "https"),
    "wget": ("http", "https"),
    "urllib": ("http", "https"),
    "httpclient": ("http", "https"),
    "requests": ("http", "https"),
    "httpx": ("http", "https"),
    "aiohttp": ("http", "https"),
    "aiohttp-env": ("http", "https"),
    "node-fetch": ("http", "https"),
    "node-get": ("http", "https"),
    "java": ("http", "https"),
    "go": ("http", "https"),
    "pip": ("https",),
    "uv": ("https",),
    "npm": ("http", "https"),
    "git": ("http", "https"),
}


@pytest.fixture(scope="module", params=MODES)
def matrix(
    request: pytest.FixtureRequest, cworld: World, servers: Servers, go_client: Path | None
) -> Matrix:
    mode: str = request.param
    allowed, denied = matrix_jobs(CASES, servers)
    ok = [job for jobs in allowed.values() for job in jobs]
    no = [job for jobs in denied.values() for job in jobs]
    policy = policy_text(
        allow=[j.endpoint for j in ok],
        pins=[j.host for j in ok],
        tls_ports=[servers.https.port],
    )
    ran = run_jobs(
        cworld, ok + no, policy, mode=mode, go_client=go_client is not None, label=f"m-{mode}"
    )
    assert ran.proc.returncode == 0, ran.out
    return Matrix(mode, ran, allowed, denied)


@pytest.mark.parametrize("client", list(CASES))
def test_allowed(matrix: Matrix, servers: Servers, client: str) -> None:
    require_client(client)
    for job in matrix.allowed[client]:
        check_allowed(matrix.ran, job, servers, matrix.mode)


@pytest.mark.parametrize("client", list(CASES))
def test_denied(matrix: Matrix, servers: Servers, client: str) -> None:
    require_client(client)
    for job in matrix.denied[client]:
        check_denied(matrix.ran, job, servers, matrix.mode)


def test_socks5_is_served_on_the_proxy_listener(cworld: World, servers: Servers) -> None:
    # ALL_PROXY is http:// (socks5h:// broke httpx), but a client told to use SOCKS5 on
    # the same listener still gets the same decisions.
    require_client("curl-socks")
    ports = {"http": servers.http.port, "https": servers.https.port}
    ok = [make_job("curl-socks", s, "ok", p) for s, p in ports.items()]
    no = [make_job("curl-socks", s, "no", p) for s, p in ports.items()]
    policy = policy_text(
        allow=[j.endpoint for j in ok], pins=[j.host for j in ok], tls_ports=[ports["https"]]
    )
    ran = run_jobs(cworld, ok + no, policy, mode="proxy", go_client=False, label="socks")
    assert ran.proc.returncode == 0, ran.out
    for job in ok:
        check_allowed(ran, job, servers, "proxy")
        assert {e.get("protocol") for e in ran.allowed(job.host)} == {"socks5"}
    for job in no:
        check_denied(ran, job, servers, "proxy")


def test_transparent_false_leaves_only_the_proxy(cworld: World, servers: Servers) -> None:
    # The off switch: clients that read the proxy variables still work; one that does not
    # has no resolver and nothing captures its connections, so it fails without traffic.
    port = servers.http.port
    ok = [
        make_job("curl", "http", "ok", port, label="off"),
        make_job("urllib", "http", "ok", port, label="off"),
    ]
    ignoring = make_job("httpclient", "http", "ok", port, label="off")
    jobs = [*ok, ignoring]
    policy = policy_text(
        allow=[j.endpoint for j in jobs],
        pins=[j.host for j in jobs],
        tail="transparent = false\n",
    )
    ran = run_jobs(cworld, jobs, policy, mode="proxy", go_client=False, label="off")
    assert ran.proc.returncode == 0, ran.out
    for job in ok:
        check_allowed(ran, job, servers, "proxy")
    status, text = ran.results[ignoring.id]
    assert status != "200", text
    assert servers.seen_for(ignoring.token) == []
    assert not [e for e in ran.events if e["event"] == "dns_query"]
    assert not [e for e in ran.events if e.get("mode") == "transparent"]
