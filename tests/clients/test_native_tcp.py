"""Any TCP protocol to an allowed ``host:port`` works without proxy variables (issue 13).

A line-protocol echo server listens on two ports of 127.0.0.1; the policy allows
``echo.test`` on the first only. A plain Python socket with no proxy variables reaches
the first through stockade's resolver and capture (an opaque, audited relay), and cannot
reach the second, nor the first under a name the policy does not know.
"""

from __future__ import annotations

import uuid

import pytest

from tests.clients.conftest import TRANSPARENT_PRELUDE, Servers, policy_text, run_script
from tests.conftest import World

pytestmark = pytest.mark.usefixtures("kernel")


def test_a_line_protocol_reaches_an_allowed_port_and_no_other(
    cworld: World, servers: Servers
) -> None:
    allowed, other = servers.echo.ports
    line = f"ping-{uuid.uuid4().hex[:12]}"
    policy = policy_text(allow=[f"echo.test:{allowed}"], pins=["echo.test"])
    script = (
        "cd run-echo || exit 1\n"
        + TRANSPARENT_PRELUDE
        + f'"$CLIENT_PY" ../echo_probe.py echo.test {allowed} {other} {line}\n'
        + f'"$CLIENT_PY" ../echo_probe.py echo.no.test {allowed} {line}-denied\n'
    )
    ran = run_script(cworld, script, policy, label="echo")
    assert ran.proc.returncode == 0, ran.out
    replies = [x for x in ran.proc.stdout.splitlines() if x.startswith("PROBE ")]
    assert len(replies) == 3, ran.out
    # The allowed port: the server's own answer came back through the relay.
    assert f'{{"reply": "echo {line} {allowed}"}}' in replies[0], replies
    assert f"{line} {allowed}" in servers.echo.lines
    connects = [e for e in ran.about("echo.test") if e["event"] == "net_connect"]
    assert [(e["verdict"], e["port"], e.get("mode")) for e in connects] == [
        ("allow", allowed, "transparent")
    ], ran.brief("echo.test")
    # The other port is not captured (nothing listens on it inside), so nothing is
    # relayed; the unknown name does not even resolve.
    assert '"error"' in replies[1], replies
    assert other not in servers.echo.connections
    assert f"{line} {other}" not in servers.echo.lines
    assert '"error"' in replies[2], replies
    assert f"{line}-denied {allowed}" not in servers.echo.lines
    assert {e["event"] for e in ran.denials("echo.no.test")} == {"dns_query"}
