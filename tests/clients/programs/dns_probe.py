"""What a program without proxy variables sees of names and addresses in the sandbox.

``python dns_probe.py ALLOWED DENIED EXFIL HTTP_PORT OTHER_PORT TOKEN`` prints one
``PROBE key json`` line per check: lookups through the C library and by hand (UDP to the
name server of /etc/resolv.conf, with their rcode and time), a plain-HTTP request to the
allowed name, and connections that must fail (an IP literal, an address stockade did not
issue, a port the policy does not name).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import struct
import sys
import time
from typing import Any


def probe(key: str, value: Any) -> None:
    print(f"PROBE {key} {json.dumps(value)}", flush=True)


def nameserver() -> str:
    with open("/etc/resolv.conf") as conf:
        for line in conf:
            parts = line.split()
            if parts[:1] == ["nameserver"]:
                return parts[1]
    return ""


def query(
    server: str, name: str, qtype: int, raw: bytes | None = None, timeout: float = 1.0
) -> dict[str, Any]:
    """One UDP question; the reply's rcode, answer count and A addresses, and the time."""
    ident = int.from_bytes(os.urandom(2), "big")
    if raw is None:
        labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
        raw = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0"
        raw += struct.pack("!HH", qtype, 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(timeout)
    started = time.monotonic()
    try:
        sock.sendto(raw, (server, 53))
        data = sock.recv(4096)
    except OSError as e:
        return {"error": type(e).__name__, "seconds": time.monotonic() - started}
    finally:
        sock.close()
    seconds = time.monotonic() - started
    _, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    addresses = []
    if ancount and qtype == 1 and len(data) >= 4:
        addresses.append(str(ipaddress.IPv4Address(data[-4:])))
    return {"rcode": flags & 0xF, "answers": ancount, "a": addresses, "seconds": seconds}


def lookup(name: str, family: int = 0, flags: int = 0) -> dict[str, Any]:
    started = time.monotonic()
    try:
        infos = socket.getaddrinfo(name, 80, family, socket.SOCK_STREAM, 0, flags)
        addresses = sorted({str(info[4][0]) for info in infos})
        return {"addresses": addresses, "seconds": time.monotonic() - started}
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - started}


def connect(host: str, port: int, send: bytes = b"") -> dict[str, Any]:
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            if send:
                sock.sendall(send)
            data = sock.recv(4096)
            return {
                "data": data.decode(errors="replace")[:200],
                "seconds": time.monotonic() - started,
            }
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - started}


def main() -> None:
    allowed, denied, exfil, http_port, other_port, token = sys.argv[1:7]
    server = nameserver()
    probe("nameserver", server)
    first, second = lookup(allowed), lookup(allowed)
    probe("allowed", first)
    probe("allowed_again", second)
    # IPv4 only, and only for families the host has addresses of (what many clients ask).
    probe("allowed_addrconfig", lookup(allowed, socket.AF_INET, socket.AI_ADDRCONFIG))
    probe("allowed_addrconfig_any", lookup(allowed, 0, socket.AI_ADDRCONFIG))
    probe("allowed_raw_a", query(server, allowed, 1))
    probe("allowed_raw_aaaa", query(server, allowed, 28))
    probe("allowed_raw_txt", query(server, allowed, 16))
    conn = http.client.HTTPConnection(allowed, int(http_port), timeout=5)
    try:
        conn.request("GET", f"/t/{token}/hello")
        r = conn.getresponse()
        probe("allowed_http", [r.status, r.read().decode()])
    except OSError as e:
        probe("allowed_http", [type(e).__name__, str(e)])
    finally:
        conn.close()
    probe("denied", lookup(denied))
    probe("denied_raw_a", query(server, denied, 1))
    probe("exfil_raw_a", query(server, exfil, 1))
    probe("exfil_raw_aaaa", query(server, exfil, 28))
    probe("exfil", lookup(exfil))
    probe("localhost", lookup("localhost"))
    # Garbage, a name too long for the wire, then a good question: answered or not,
    # nothing stops the resolver.
    probe("garbage", query(server, "", 1, raw=b"\x12\x34\x01", timeout=0.2))
    probe("too_long", query(server, ".".join(["a" * 63] * 5), 1))
    probe("after_garbage", query(server, allowed, 1))
    address = (first.get("addresses") or ["127.64.0.1"])[0]
    unissued = str(ipaddress.IPv4Address(address) + 40000)
    probe("unissued", connect(unissued, 443, b"GET / HTTP/1.0\r\n\r\n"))
    probe("loopback_literal", connect("127.0.0.1", int(http_port), b"GET / HTTP/1.0\r\n\r\n"))
    probe(
        "documentation_literal",
        connect("192.0.2.1", 80, b"GET / HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n"),
    )
    probe("port_not_in_policy", connect(allowed, int(other_port), b"ping\n"))


if __name__ == "__main__":
    main()
