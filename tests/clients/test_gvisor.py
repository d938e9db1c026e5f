"""The client matrix under the gVisor backend (issue 17; research §B.9 item 4).

The same cases as test_clients.py, on a subset chosen by mechanism, with ``stockade run
--backend gvisor``: the Sentry's own network calls (hostinet) must meet the same proxy
listener, resolver and capture as bubblewrap's sandbox does, and each client must find
inside the files it needs (its trust store, the resolver files, its runtime).

* ``getent hosts``: the C library's lookup through stockade's resolver (the resolver
  files bound into the OCI bundle);
* curl: reads the proxy variables; in transparent mode, the resolver and capture;
* Python ``http.client``: ignores the proxy variables, so always resolver and capture;
* Node ``fetch``: its own resolver thread pool and TLS, ignores the variables before 24;
* requests and httpx: read the variables, their own trust (``REQUESTS_CA_BUNDLE``,
  ``SSL_CERT_FILE``);
* Go ``net/http`` built with CGO_ENABLED=0: Go's own resolver, which reads
  /etc/resolv.conf and sends its DNS queries over UDP itself (not the C library's);
* pip: a package manager, stat-heavy (the slow kind under gVisor), over HTTPS.

One ``stockade run`` per mode, the clients in parallel, as in test_clients.py; gated by
the ``runsc`` fixture (STOCKADE_GVISOR=1). The rest of the matrix (wget, urllib, both
aiohttp variants, Node ``https.request``, Java, uv, npm, git) passed under gVisor as
well when tried (both modes, about 32 s on 2 cores against about 17 s for this subset):
left out for time, not for a failure. The package manager is what costs (about 5 s of
each run's 7 s).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.clients.conftest import (
    MODES,
    Matrix,
    Servers,
    matrix_jobs,
    policy_text,
    run_jobs,
)
from tests.conftest import World

#: each client with the schemes it is tried on: one of each mechanism (see above)
CASES: dict[str, tuple[str, ...]] = {
    "curl": ("http", "https"),
    "httpclient": ("http", "https"),
    "requests": ("https",),
    "httpx": ("http",),
    "node-fetch": ("http", "https"),
    "go": ("http", "https"),
    "pip": ("https",),
}


@pytest.fixture(scope="module")
def gcworld(cworld: World, runsc: str) -> World:
    # The world's HOME is a fake one: name the runsc to use explicitly.
    cworld.env["STOCKADE_RUNSC"] = runsc
    return cworld


@pytest.fixture(scope="module", params=MODES)
def gmatrix(
    request: pytest.FixtureRequest, gcworld: World, servers: Servers, go_client: Path | None
) -> Matrix:
    mode: str = request.param
    allowed, denied = matrix_jobs(CASES, servers, label="gvisor")
    ports = {"http": servers.http.port, "https": servers.https.port}
    ok = [job for jobs in allowed.values() for job in jobs]
    no = [job for jobs in denied.values() for job in jobs]
    names = (f"getent-{mode}.ok.test", f"getent-{uuid.uuid4().hex[:8]}.no.test")
    policy = policy_text(
        allow=[*(j.endpoint for j in ok), f"{names[0]}:{ports['http']}"],
        pins=[*(j.host for j in ok), names[0]],
        tls_ports=[servers.https.port],
    )
    # After the clients: the kernel release the run saw (the Sentry's, proof that this
    # was gVisor), and getent (it never reads the proxy variables): one PROBE line per
    # name, with its exit status and output.
    after = 'echo "PROBE kernel \\"$(uname -r)\\""\n' + "".join(
        f'out=$(getent hosts {name}); echo "PROBE {key} [$?, \\"$out\\"]"\n'
        for key, name in (("getent_ok", names[0]), ("getent_no", names[1]))
    )
    ran = run_jobs(
        gcworld,
        ok + no,
        policy,
        mode=mode,
        go_client=go_client is not None,
        label=f"g-{mode}",
        after=after,
        backend="gvisor",
    )
    assert ran.proc.returncode == 0, ran.out
    return Matrix(mode, ran, allowed, denied, names)


def test_the_clients_ran_on_gvisor(gmatrix: Matrix) -> None:
    # The Sentry reports a kernel of its own, never the host's: no run here fell back.
    assert gmatrix.ran.probes["kernel"] != os.uname().release, gmatrix.ran.out
    assert gmatrix.ran.probes["kernel"] == "4.4.0", gmatrix.ran.out


@pytest.mark.parametrize("client", list(CASES))
def test_allowed_and_denied(gmatrix: Matrix, servers: Servers, client: str) -> None:
    gmatrix.check(client, servers)


def test_getent_uses_stockades_resolver(gmatrix: Matrix) -> None:
    ran = gmatrix.ran
    ok_name, no_name = gmatrix.names
    status, line = ran.probes["getent_ok"]
    assert status == 0, ran.out
    address = line.split()[0]
    assert address.startswith("127.64."), line  # stockade's synthetic pool
    lookups = [e["verdict"] for e in ran.about(ok_name) if e["event"] == "dns_query"]
    assert lookups, ran.brief(ok_name)
    assert set(lookups) == {"allow"}, ran.brief(ok_name)
    # The twin: a name not in the policy is NXDOMAIN (getent's 2), answered and audited.
    assert ran.probes["getent_no"] == [2, ""], ran.out
    denials = {(e["event"], e["reason"]) for e in ran.denials(no_name)}
    assert denials == {("dns_query", "host-not-allowed")}, ran.brief(no_name)
