"""The clients on the ports people use, with a policy that names hosts only (issue 13).

``allow = ["registry.example"]`` with ``https://registry.example/...`` is the common
policy; the other modules give every server a port of its own. Here the origins listen
on 127.0.0.1:80 and :443 (root only), the allow entries carry no port, the URLs none
either, and every client of the matrix must reach its allowed name and not the others,
in both modes. On port 80 a captured request whose Host header names another host is
refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.conftest import (
    MODES,
    Job,
    Origin,
    Ran,
    Servers,
    check_allowed,
    check_denied,
    make_job,
    policy_text,
    require_client,
    run_jobs,
)
from tests.clients.test_clients import CASES
from tests.conftest import World, require

pytestmark = pytest.mark.usefixtures("kernel")


@pytest.fixture(scope="module")
def on_default_ports(servers: Servers) -> Iterator[Servers]:
    require(os.getuid() == 0, "origins on ports 80 and 443 need root")
    try:
        plain = Origin("http", servers.content, None, 80)
    except OSError as exc:
        require(False, f"cannot listen on 127.0.0.1:80: {exc}")
        raise
    try:
        secure = Origin("https", servers.content, servers.context, 443)
    except OSError as exc:
        plain.close()
        require(False, f"cannot listen on 127.0.0.1:443: {exc}")
        raise
    try:
        yield dataclasses.replace(servers, http=plain, https=secure)
    finally:
        plain.close()
        secure.close()


@dataclasses.dataclass
class Defaults:
    mode: str
    ran: Ran
    allowed: dict[str, list[Job]]
    denied: dict[str, list[Job]]
    host_check: Job


@pytest.fixture(scope="module", params=MODES)
def defaults(
    request: pytest.FixtureRequest,
    cworld: World,
    on_default_ports: Servers,
    go_client: Path | None,
) -> Defaults:
    mode: str = request.param
    allowed: dict[str, list[Job]] = {}
    denied: dict[str, list[Job]] = {}
    for client, schemes in CASES.items():
        for scheme in schemes:
            port = 443 if scheme == "https" else 80
            allowed.setdefault(client, []).append(make_job(client, scheme, "ok", port, label="dp"))
            denied.setdefault(client, []).append(make_job(client, scheme, "no", port, label="dp"))
    ok = [job for jobs in allowed.values() for job in jobs]
    no = [job for jobs in denied.values() for job in jobs]
    policy = policy_text(allow=[j.host for j in ok], pins=[j.host for j in ok])
    # A request to an allowed name on port 80 whose Host header names another host.
    target = allowed["curl"][0]
    host_check = dataclasses.replace(target, token=f"{target.token}-host")
    after = (
        "env -u http_proxy -u HTTP_PROXY -u all_proxy -u ALL_PROXY curl -sS -m 10 "
        "-o /dev/null -w 'PROBE host_header \"%{http_code}\"\\n' -H 'Host: other.no.test' "
        f"http://{target.host}/t/{host_check.token}/hello\n"
    )
    ran = run_jobs(
        cworld,
        ok + no,
        policy,
        mode=mode,
        go_client=go_client is not None,
        label=f"dp-{mode}",
        after=after,
    )
    assert ran.proc.returncode == 0, ran.out
    return Defaults(mode, ran, allowed, denied, host_check)


@pytest.mark.parametrize("client", list(CASES))
def test_allowed_on_default_ports(
    defaults: Defaults, on_default_ports: Servers, client: str
) -> None:
    require_client(client)
    for job in defaults.allowed[client]:
        check_allowed(defaults.ran, job, on_default_ports, defaults.mode)


@pytest.mark.parametrize("client", list(CASES))
def test_denied_on_default_ports(
    defaults: Defaults, on_default_ports: Servers, client: str
) -> None:
    require_client(client)
    for job in defaults.denied[client]:
        check_denied(defaults.ran, job, on_default_ports, defaults.mode)


def test_a_host_header_naming_another_host_is_refused_on_port_80(
    defaults: Defaults, on_default_ports: Servers
) -> None:
    ran, job = defaults.ran, defaults.host_check
    assert ran.probes["host_header"] not in ("200", "000"), ran.out
    assert on_default_ports.seen_for(job.token) == []
    # One refusal, naming the host the address was issued for (in its host, or its
    # detail while the host field is left empty for a Host it refused).
    refused = [
        e
        for e in ran.events
        if e["event"] == "net_request"
        and e["verdict"] == "deny"
        and e.get("mode") == "transparent"
        and (e.get("host") == job.host or job.host in str(e.get("detail", "")))
    ]
    assert len(refused) == 1, ran.events
    assert refused[0]["reason"] == "bad-request", refused
