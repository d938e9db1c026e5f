"""attacks.md A.4 (HOST): host services, through ``stockade run`` with every layer on.

Probes that aim at addresses other than loopback (metadata, private, CGNAT, the host's
own interface addresses, the Docker bridge) run the whole ``stockade run``, proxy
included, inside an isolated network namespace where those addresses are sinks on ``lo``
(``run_isolated`` in conftest): a regression records a hit there and sends nothing off
this machine.

Not applicable here:
* HOST-11 ``/var/run/secrets/kubernetes.io/serviceaccount/token``: this host is no
  Kubernetes pod, and the test must not create files under the host's /var/run; the path
  is probed anyway (it must not be readable), and the CI tokens in the environment
  (``ACTIONS_ID_TOKEN_REQUEST_URL``, ``ACTIONS_RUNTIME_TOKEN``) are planted by the fixture.
* HOST-12 ``docker exec`` into a sibling: there is no Docker daemon here; the Docker CLI
  is run against F-UNIX's fake docker.sock and the bridge gateway's API port instead.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.attacks.conftest import (
    Arena,
    Isolated,
    Result,
    host_addresses,
    isolated_policy,
    run_isolated,
)

# ---------------------------------------------------------------------------------------
# HOST-01/02/04 (and SEC-10/11, PROC-07/08): every unix socket of the host.


def host_sockets(arena: Arena) -> list[str]:
    """F-UNIX plus every pathname socket under the usual host locations."""
    found = subprocess.run(
        ["find", "/run", "/var/run", "/tmp", "/dev", "-xdev", "-maxdepth", "5", "-type", "s"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    fixed = [
        "/var/run/docker.sock",
        "/run/podman/podman.sock",
        "/run/containerd/containerd.sock",
        "/run/dbus/system_bus_socket",
        "/run/systemd/private",
        "/run/user/0/bus",
        "/dev/log",
    ]
    return sorted({*map(str, arena.unix.values()), *found, *fixed})


UNIX_PROBE = r"""
for path in json.loads(sys.argv[1]):
    emit("connect:" + path, **connect(socket.AF_UNIX, path))
    emit("dgram:" + path, **sh(f"python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b'x', sys.argv[1])\" {path!r}"))
emit("abstract", **connect(socket.AF_UNIX, "\0" + sys.argv[2]))
docker, bus, system_bus = sys.argv[3:6]
emit("curl-docker", **sh(f"curl -s -m3 --unix-socket {docker} http://d/containers/json"))
emit("docker-cli", **sh(f"DOCKER_HOST=unix://{docker} docker ps", timeout=20))
emit("docker-run", **sh(f"DOCKER_HOST=unix://{docker} docker run --rm -v /:/h alpine cat /h/etc/shadow", timeout=20))
emit("busctl-system", **sh(f"DBUS_SYSTEM_BUS_ADDRESS=unix:path={system_bus} busctl list", timeout=20))
emit("busctl-user", **sh(f"DBUS_SESSION_BUS_ADDRESS=unix:path={bus} busctl --user list", timeout=20))
emit("find", **sh("find / -xdev -type s 2>/dev/null", timeout=60))
# The twins: a socket and an abstract socket served inside the sandbox are reachable.
srv = socket.socket(socket.AF_UNIX); srv.bind("\0" + sys.argv[2] + "-own"); srv.listen(1)
emit("twin:abstract", **connect(socket.AF_UNIX, "\0" + sys.argv[2] + "-own"))
srv2 = socket.socket(socket.AF_UNIX); srv2.bind("twin.sock"); srv2.listen(1)
emit("twin:path", **connect(socket.AF_UNIX, "twin.sock"))
os.unlink("twin.sock")
"""


@pytest.fixture(scope="module")
def sockets(arena: Arena) -> tuple[Result, list[str]]:
    arena.reset()
    paths = host_sockets(arena)
    res = arena.py(
        UNIX_PROBE,
        json.dumps(paths),
        arena.abstract,
        str(arena.unix["docker"]),
        str(arena.unix["session_bus"]),
        str(arena.unix["system_bus"]),
        timeout=120,
    )
    return res, paths


def test_host_01_02_04_no_host_unix_socket_connects(
    arena: Arena, sockets: tuple[Result, list[str]]
) -> None:
    res, paths = sockets
    assert len(paths) >= len(arena.unix)
    reached = [p for p in paths if res[f"connect:{p}"]["ok"]]
    assert reached == []
    sent = [p for p in paths if res[f"dgram:{p}"]["rc"] == 0]
    assert sent == []
    assert res["abstract"]["ok"] is False
    arena.assert_sinks_quiet()


@pytest.mark.parametrize(
    "tool", ["curl-docker", "docker-cli", "docker-run", "busctl-system", "busctl-user"]
)
def test_host_01_02_clients_fail(sockets: tuple[Result, list[str]], tool: str) -> None:
    res, _ = sockets
    assert res[tool]["rc"] != 0, res[tool]


def test_host_04_no_host_socket_is_even_visible(
    arena: Arena, sockets: tuple[Result, list[str]]
) -> None:
    res, _ = sockets
    visible = [p for p in res["find"]["out"].split() if not p.startswith(str(arena.workspace))]
    assert visible == []


def test_host_04_twins(sockets: tuple[Result, list[str]]) -> None:
    res, _ = sockets
    assert res["twin:abstract"]["ok"] is True
    assert res["twin:path"]["ok"] is True


# ---------------------------------------------------------------------------------------
# HOST-05: host loopback TCP services, every spelling, directly and through the proxy.

LOOPBACK_V4 = (
    "127.0.0.1",
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "127.000.000.001",
    "127.0.0.2",
    "127.255.255.254",
    "0.0.0.0",
    "0",
    "localhost",
    "LOCALHOST",
    "localhost.",
    "sub.localhost",
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",
    "[::]",
    "[64:ff9b::127.0.0.1]",
    "127.0.0.1.",
)

LOOPBACK_PROBE = r"""
port = int(sys.argv[1])
for h in json.loads(sys.argv[2]):
    url = f"http://{h}:{port}/"
    emit("fwd:" + h, **sh(f"curl -s -m4 -o /dev/null -w '%{{http_code}}' -g {url!r}"))
    emit("connect:" + h, **sh(f"curl -s -m4 -o /dev/null -w '%{{http_code}}' -g -p -x $HTTP_PROXY {url!r}"))
    emit("socks:" + h, **sh(f"curl -s -m4 -o /dev/null -w '%{{http_code}}' -g -x socks5h://127.0.0.1:3128 {url!r}"))
    emit("direct:" + h, **sh(f"curl -s -m4 -o /dev/null -w '%{{http_code}}' -g --noproxy '*' {url!r}"))
for fam, addr in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port))):
    emit(f"py:{addr[0]}", **connect(fam, addr))
emit("nc", **sh(f"python3 -c \"import socket; socket.create_connection(('localhost', {port}), 2)\""))
# The twins: allowed.test (pinned to 127.0.0.1 by the operator) through the proxy, and a
# listener inside the sandbox's own loopback.
emit("twin:allowed", **sh(f"curl -s -m5 -o /dev/null -w '%{{http_code}}' http://allowed.test:{sys.argv[3]}/loop-twin"))
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen(1)
emit("twin:own", **connect(socket.AF_INET, own.getsockname()))
"""


@pytest.fixture(scope="module")
def loopback(arena: Arena) -> Result:
    arena.reset()
    res = arena.py(
        LOOPBACK_PROBE,
        str(arena.tcp_port),
        json.dumps(LOOPBACK_V4),
        str(arena.allowed.http_port),
        timeout=240,
    )
    res.lines["sinks"] = {"tcp": arena.rec_tcp.take()}
    return res


@pytest.mark.parametrize("how", ["fwd", "connect", "socks", "direct"])
@pytest.mark.parametrize("host", LOOPBACK_V4)
def test_host_05_loopback_spellings_blocked(loopback: Result, host: str, how: str) -> None:
    got = loopback[f"{how}:{host}"]
    assert got["out"] in ("403", "000"), got


def test_host_05_sinks_logged_nothing(arena: Arena, loopback: Result) -> None:
    assert loopback["sinks"]["tcp"] == []
    for key in ("py:127.0.0.1", "py:::1"):
        assert loopback[key]["ok"] is False
    assert loopback["nc"]["rc"] != 0
    denied = [e for e in loopback.audit if e.get("verdict") == "deny" and e["layer"] == "egress"]
    assert denied, "the proxy recorded no denial"


def test_host_05_twins(arena: Arena, loopback: Result) -> None:
    assert loopback["twin:allowed"]["out"] == "200"
    assert loopback["twin:own"]["ok"] is True


# ---------------------------------------------------------------------------------------
# HOST-07/09/11/12: metadata, private ranges, the host's own addresses, the bridge.

METADATA = (
    "169.254.169.254",
    "2852039166",
    "0xA9FEA9FE",
    "0xa9.0xfe.0xa9.0xfe",
    "0251.0376.0251.0376",
    "169.254.43518",
    "[::ffff:a9fe:a9fe]",
    "[::ffff:169.254.169.254]",
    "[0:0:0:0:0:ffff:a9fe:a9fe]",
    "[fd00:ec2::254]",
    "metadata.google.internal",
    "metadata",
    "instance-data",
    "100.100.100.200",
    "169.254.170.2",
)

PRIVATE = (
    "10.0.0.1",
    "172.17.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "[fd00::1]",
    "host.docker.internal",
    "kubernetes.default.svc",
    "172.17.0.1:2375",
)

ADDRESS_PROBE = r"""
hdr = "-H 'Metadata-Flavor: Google' -H 'Metadata: true' -H 'X-aws-ec2-metadata-token: x'"
for h in json.loads(sys.argv[1]):
    url = f"http://{h}/latest/meta-data/iam/security-credentials/"
    emit("fwd:" + h, **sh(f"curl -s -m4 {hdr} -o /dev/null -w '%{{http_code}}' -g {url!r}"))
    emit("connect:" + h, **sh(f"curl -s -m4 {hdr} -o /dev/null -w '%{{http_code}}' -g -p -x $HTTP_PROXY {url!r}"))
    emit("socks:" + h, **sh(f"curl -s -m4 {hdr} -o /dev/null -w '%{{http_code}}' -g -x socks5h://127.0.0.1:3128 {url!r}"))
    emit("direct:" + h, **sh(f"curl -s -m4 {hdr} -o /dev/null -w '%{{http_code}}' -g --noproxy '*' {url!r}"))
emit("k8s-token", **read("/var/run/secrets/kubernetes.io/serviceaccount/token"))
emit("oidc", **sh("curl -s -m4 -o /dev/null -w '%{http_code}' \"$ACTIONS_ID_TOKEN_REQUEST_URL\""))
emit("docker-tcp", **sh("DOCKER_HOST=tcp://172.17.0.1:2375 docker version", timeout=20))
emit("scan", **sh("for i in 1 2 3 4 5; do curl -s -m1 -o /dev/null -p -x $HTTP_PROXY http://172.17.0.$i:80/; done; echo done"))
emit("twin", **sh("curl -s -m5 -o /dev/null -w '%{http_code}' http://allowed.test:80/addr-twin"))
"""


@pytest.fixture(scope="module")
def addresses(arena: Arena) -> Isolated:
    own = tuple(host_addresses())
    hosts = (*METADATA, *PRIVATE, *(f"[{a}]" if ":" in a else a for a in own))
    iso = run_isolated(
        arena,
        ADDRESS_PROBE,
        json.dumps(hosts),
        policy_text=isolated_policy(),
        extra_v4=own,
        timeout=300,
    )
    iso.result.lines["hosts"] = {"hosts": list(hosts)}
    return iso


def _targets(addresses: Isolated) -> list[str]:
    return list(addresses.result["hosts"]["hosts"])


@pytest.mark.parametrize("how", ["fwd", "connect", "socks", "direct"])
def test_host_07_09_12_addresses_blocked(addresses: Isolated, how: str) -> None:
    for host in _targets(addresses):
        got = addresses.result[f"{how}:{host}"]
        assert got["out"] in ("403", "000"), (host, got)


def test_host_07_09_no_sink_and_no_resolver_saw_anything(addresses: Isolated) -> None:
    # Only the twin's request may reach a sink (allowed.test -> 127.0.0.1:80).
    hits = [e for e in addresses.log if "addr-twin" not in e.get("data", "")]
    assert hits == []


def test_host_11_ci_and_orchestrator_credentials(arena: Arena, addresses: Isolated) -> None:
    assert addresses.result["k8s-token"]["ok"] is False
    assert addresses.result["oidc"]["out"] in ("000", "403")
    assert addresses.result["docker-tcp"]["rc"] != 0
    assert addresses.result["scan"]["out"].strip() == "done"
    assert arena.canary not in addresses.result.proc.stdout + addresses.result.proc.stderr


def test_host_07_09_twin(addresses: Isolated) -> None:
    assert addresses.result["twin"]["out"] == "200"
    assert any("addr-twin" in e.get("data", "") for e in addresses.log)


def test_host_07_bare_wildcard_allow_is_refused(arena: Arena) -> None:
    policy = arena.root / "star.toml"
    policy.write_text('version = 1\n[network]\nallow = ["*"]\n')
    marker = arena.workspace / "star-ran"
    res = arena.run("touch", str(marker), policy=policy)
    assert res.proc.returncode == 125
    assert "wildcard" in res.proc.stderr
    assert not marker.exists()


def test_host_own_addresses_known() -> None:
    # The HOST-09 family includes every address of this host's interfaces; make sure
    # the helper finds them where the host has any (a bare namespace has none).
    addrs = host_addresses()
    ifaces = Path("/sys/class/net")
    if any(p.name != "lo" for p in ifaces.iterdir()):
        assert addrs, os.listdir(ifaces)
