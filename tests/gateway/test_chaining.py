"""``stockade run`` inside a pod chains its own proxy to the gateway (issue 18 item 5).

The pod's own stockade proxy (``stockade proxy``, the process ``stockade run`` starts,
with ``[network.upstream] proxy = "env"`` reading the HTTPS_PROXY an exported pod
carries) decides by its local policy, then opens what it allowed through the gateway,
which decides again by the pod's policy: both must allow. The pod's address here is
127.0.0.1, the address the local proxy dials the gateway from.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.harness import Harness, Origin, pod

ORIGIN = Origin("chained-origin")
PINS = '[network.hosts]\n"a.test" = "127.0.0.1"\n"b.test" = "127.0.0.1"\n'
#: the pod's policy, held by the gateway: a.test only
GATEWAY_POLICY = '[network]\nallow = ["a.test"]\n' + PINS + '[kubernetes]\nnamespaces = ["team"]\n'
#: the policy of stockade inside the pod: a.test and b.test, chained to the gateway by name
LOCAL_POLICY = """\
[network]
allow = ["a.test", "b.test", "c.test"]

[network.upstream]
proxy = "env"
connect_by = "name"
"""


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[Harness, int]]:
    gw = Harness(tmp_path, {"a": GATEWAY_POLICY})
    gw.api.put(pod("pod-chain", "127.0.0.1", policy="a"))
    gw.start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "local.toml").write_text(LOCAL_POLICY)
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    # What an exported pod's environment says (with the gateway's test address).
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = f"http://127.0.0.1:{gw.port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stockade",
            "proxy",
            "--listen",
            f"tcp:127.0.0.1:{port}",
            "--policy",
            str(tmp_path / "local.toml"),
            "--audit",
            str(tmp_path / "local-audit.jsonl"),
            "--quiet",
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert proc.poll() is None, "stockade proxy exited"
                assert time.monotonic() < deadline, "stockade proxy did not listen"
                time.sleep(0.05)
        yield gw, port
    finally:
        proc.terminate()
        proc.wait(10)
        gw.close()


def get(port: int, host: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        target = f"http://{host}:{ORIGIN.port}/"
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def connect(port: int, host: str) -> int:
    """The status of a CONNECT to ``host`` through stockade's proxy."""
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        authority = f"{host}:{ORIGIN.port}"
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and (chunk := sock.recv(1)):
            head += chunk
    return int(head.split(b" ", 2)[1])


def test_both_policies_decide_a_chained_connection(chain: tuple[Harness, int]) -> None:
    gw, port = chain
    # Allowed here and by the pod's policy at the gateway: reaches the origin.
    assert get(port, "a.test") == (200, b"chained-origin")
    assert connect(port, "a.test") == 200
    # Allowed here, refused by the gateway: a plain request gets the gateway's answer,
    # a tunnel stockade's 502 (upstream-refused); nothing is dialled directly.
    assert get(port, "b.test") == (403, b"stockade: host-not-allowed: b.test\n")
    assert connect(port, "b.test") == 502
    # Refused here: the gateway never hears of it.
    assert get(port, "d.test")[0] == 403
    assert connect(port, "d.test") == 403
    gw.wait(lambda: len(gw.events_of(pod="pod-chain", verdict="deny")) >= 2, "the events")
    # (A forward connection whose only request was refused names no host: left out.)
    seen = {(e["host"], e["verdict"]) for e in gw.events if e.get("pod") == "pod-chain"}
    seen.discard(("", "allow"))
    assert seen == {("a.test", "allow"), ("b.test", "deny")}
    for refused in gw.events_of(pod="pod-chain", host="b.test"):
        assert refused["reason"] == "host-not-allowed"
        assert refused["policy"] == "a"


def test_the_local_audit_names_the_gateway_as_upstream(
    chain: tuple[Harness, int], tmp_path: Path
) -> None:
    _, port = chain
    assert get(port, "a.test")[0] == 200
    assert connect(port, "b.test") == 502
    events: list[dict[str, object]] = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        lines = (tmp_path / "local-audit.jsonl").read_text().splitlines()
        events = [
            e
            for e in map(json.loads, lines)
            if (e.get("event"), e.get("host"))
            in {("net_request", "a.test"), ("net_connect", "b.test")}
        ]
        time.sleep(0.05)
    by_host = {e["host"]: e for e in events}
    assert by_host["a.test"]["verdict"] == "allow"
    assert by_host["a.test"]["address_class"] == "resolved-by-upstream"
    assert by_host["a.test"]["upstream"] == f"http://127.0.0.1:{chain[0].port}"
    assert by_host["b.test"]["reason"] == "upstream-refused"
    assert by_host["b.test"]["upstream_status"] == 403
