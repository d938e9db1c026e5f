"""The real glibc stub resolver against the server, as a client in the sandbox uses it.

glibc only talks to port 53 on the address ``/etc/resolv.conf`` names, so the test runs in
a fresh user, network and mount namespace (``unshare -rnm``): loopback comes up, the
server binds 127.0.0.1:53 there, and a private ``resolv.conf`` is bind-mounted over the
real one. ``getent`` (libc-bin, on every glibc system) and Python's own ``getaddrinfo``
then resolve through glibc's code, over UDP and, with ``use-vc``, over TCP.

Like the sandbox, the namespace has no address but 127.0.0.1 and ::1, so glibc's
``AI_ADDRCONFIG`` with ``AF_INET`` (``getent ahostsv4``) fails there before any query is
sent; the lookups here are the ones clients make by default (``AF_UNSPEC``, or no
``AI_ADDRCONFIG``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[3]

_SCRIPT = r"""
import asyncio, fcntl, ipaddress, json, os, socket, struct, subprocess, sys, threading, time
from stockade.egress import EgressRules
from stockade.egress.dns import AddressPool, DnsServer

SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
    request = struct.pack("16sH14x", b"lo", 0)
    (flags,) = struct.unpack_from("H", fcntl.ioctl(probe, SIOCGIFFLAGS, request), 16)
    fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | 1))

events = []
rules = EgressRules(
    allow=("allowed.test", "*.wild.test"), deny=("*.attacker.test",), local=frozenset()
)
server = DnsServer(rules, AddressPool(), lambda e, d, f: events.append([str(d.reason), f]))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 53))
tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
tcp.bind(("127.0.0.1", 53))
loop = asyncio.new_event_loop()
threading.Thread(target=loop.run_forever, daemon=True).start()
asyncio.run_coroutine_threadsafe(server.serve(udp, tcp), loop).result(5)

def getent(*args, options=""):
    env = dict(os.environ, RES_OPTIONS=options) if options else None
    start = time.monotonic()
    proc = subprocess.run(["getent", *args], capture_output=True, text=True, env=env)
    return {"rc": proc.returncode, "out": proc.stdout.split(), "s": time.monotonic() - start}

out = {
    "v4": getent("hosts", "allowed.test"),
    "any": getent("ahosts", "allowed.test"),
    "upper": getent("hosts", "ALLOWED.test"),
    "wild": getent("hosts", "a.wild.test"),
    "tcp": getent("hosts", "allowed.test", options="use-vc"),
    "edns": getent("hosts", "allowed.test", options="edns0"),
    "tcp_denied": getent("hosts", "denied.test", options="use-vc"),
    "denied": getent("hosts", "denied.test"),
    "exfil": getent("hosts", "0123456789abcdef0123456789abcdef.attacker.test"),
}
infos = socket.getaddrinfo("allowed.test", 443, type=socket.SOCK_STREAM)
out["py"] = sorted({info[4][0] for info in infos})
infos = socket.getaddrinfo("allowed.test", 80, socket.AF_INET, socket.SOCK_STREAM)
out["py4"] = sorted({info[4][0] for info in infos})
out["ptr"] = socket.gethostbyaddr(out["py"][0])[0]
start = time.monotonic()
try:
    socket.getaddrinfo("x.attacker.test", 443)
    out["py_denied"] = "resolved"
except socket.gaierror as exc:
    out["py_denied"] = exc.errno
out["py_denied_s"] = time.monotonic() - start
out["events"] = events
print(json.dumps(out))
"""


def _unshare_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("mount") and shutil.which("getent")):
        return False
    proc = subprocess.run(["unshare", "-rnm", "true"], capture_output=True, check=False, timeout=30)
    return proc.returncode == 0


@pytest.fixture(scope="module")
def glibc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require(_unshare_works(), "unshare -rnm (user, network and mount namespaces) is not available")
    resolv = tmp_path_factory.mktemp("dns") / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:2 attempts:1\n")
    proc = subprocess.run(
        [
            "unshare",
            "-rnm",
            "sh",
            "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(resolv),
            sys.executable,
            "-c",
            _SCRIPT,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _first_address(result: dict[str, Any]) -> str:
    assert result["rc"] == 0, result
    return str(result["out"][0])


def test_allowed_name_resolves_to_its_synthetic_address(glibc: dict[str, Any]) -> None:
    address = _first_address(glibc["v4"])
    assert address.startswith("127.64.")
    # Both families asked (A and AAAA): NODATA for AAAA, so the A answer is used.
    assert {a for a in glibc["any"]["out"] if a.count(".") == 3 and a[0].isdigit()} == {address}
    assert _first_address(glibc["upper"]) == address
    assert _first_address(glibc["tcp"]) == address
    assert _first_address(glibc["edns"]) == address
    assert glibc["py"] == [address]
    assert glibc["py4"] == [address]
    assert glibc["ptr"] == "allowed.test"
    assert _first_address(glibc["wild"]) not in ("", address)


@pytest.mark.parametrize("case", ["denied", "exfil", "tcp_denied"])
def test_denied_name_fails_fast(glibc: dict[str, Any], case: str) -> None:
    result = glibc[case]
    assert result["rc"] == 2  # getent: key not found
    assert result["out"] == []
    assert result["s"] < 1.0


def test_python_getaddrinfo_of_a_denied_name_is_a_fast_noname(glibc: dict[str, Any]) -> None:
    assert glibc["py_denied"] == -2  # EAI_NONAME: the name does not exist; no retry
    assert glibc["py_denied_s"] < 1.0


def test_events_from_glibc_queries(glibc: dict[str, Any]) -> None:
    by_name = {fields["name"]: reason for reason, fields in glibc["events"]}
    assert by_name["allowed.test"] == "allowed"
    assert by_name["denied.test"] == "host-not-allowed"
    assert by_name["x.attacker.test"] == "host-denied"
    assert by_name["0123456789abcdef0123456789abcdef.attacker.test"] == "host-denied"
