"""The scenario's "test suite": a stdlib-only script that attempts each action.

It is copied into the workspace and run inside the sandbox as ``python3 SCRIPT PLAN``.
It must not import stockade (the sandbox does not see the package). For each step of the
plan it prints one JSON line ``{"id", "done", "detail"}``: ``done`` is what the script
can see from inside; the host judges the rest from outside after the run.

It plays the strongest attacker the action allows: a connection is tried through the
proxy named in the environment (as any well-behaved client does) and directly.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import urllib.parse
from typing import Any

Plan = dict[str, Any]
TIMEOUT = 3.0


def _proxy() -> tuple[str, int] | None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        value = os.environ.get(name)
        if value:
            parsed = urllib.parse.urlsplit(value if "://" in value else f"http://{value}")
            if parsed.hostname and parsed.scheme in ("http", ""):
                return parsed.hostname, parsed.port or 80
    return None


def op_read(step: Plan) -> str:
    with open(step["path"], encoding="utf-8", errors="replace") as fh:
        data = fh.read()
    if step["expect"] not in data:
        raise LookupError(f"read {len(data)} bytes without the expected content")
    return f"read {len(data)} bytes"


def op_write(step: Plan) -> str:
    os.makedirs(os.path.dirname(step["path"]), exist_ok=True)
    with open(step["path"], "w", encoding="utf-8") as fh:
        fh.write(step["data"])
    return "written"


def op_symlink(step: Plan) -> str:
    os.makedirs(os.path.dirname(step["path"]), exist_ok=True)
    if os.path.lexists(step["path"]):
        os.unlink(step["path"])
    os.symlink(step["to"], step["path"])
    return "linked"


def op_env(step: Plan) -> str:
    value = os.environ.get(step["name"])
    if value != step["expect"]:
        raise LookupError(f"{step['name']} is {'unset' if value is None else 'different'}")
    return "read"


def op_daemon(step: Plan) -> str:
    code = f"import time, sys\ntime.sleep({float(step['seconds'])})\n"
    subprocess.Popen(
        [sys.executable, "-c", code, step["mark"]],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    return "spawned; judged from outside"


def _http_request(step: Plan, via: tuple[str, int] | None) -> tuple[int, bytes]:
    method = step["method"]
    host, port, path = step["host"], int(step["port"]), step["path"]
    body = step.get("data", "").encode() or None
    headers = {"Host": f"{host}:{port}", "Connection": "close", **step.get("headers", {})}
    if body is not None:
        headers["Content-Length"] = str(len(body))
    tls = bool(step.get("tls"))
    # Plain HTTP through a proxy is a forward request (absolute URL); HTTPS goes through
    # a CONNECT tunnel and carries the origin-form path, as every client does.
    target = f"http://{host}:{port}{path}" if via and not tls else path
    if via is not None and tls:
        conn = _tunnel(via, host, port)
    else:
        conn = socket.create_connection(
            via or (step.get("address", "127.0.0.1"), port), timeout=TIMEOUT
        )
    if tls:
        context = ssl.create_default_context(cafile=step["ca"])
        # Like any client, also trust what the sandbox's environment says to trust: the
        # inspect layer's bundle (system roots plus the run's CA) when it intercepts.
        bundle = os.environ.get("SSL_CERT_FILE")
        if bundle and os.path.exists(bundle):
            context.load_verify_locations(cafile=bundle)
        try:
            conn = context.wrap_socket(conn, server_hostname=host)
        except BaseException:
            conn.close()
            raise
    with conn as sock:
        head = f"{method} {target} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        sock.sendall(head.encode() + b"\r\n" + (body or b""))
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head_end = raw.find(b"\r\n\r\n")
    status_line = raw.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 else 0
    return status, raw[head_end + 4 :] if head_end >= 0 else b""


def op_http(step: Plan) -> str:
    errors: list[str] = []
    proxy = _proxy()
    routes: list[tuple[str, int] | None] = [] if proxy is None else [proxy]
    if not step.get("proxy_only"):
        routes.append(None)
    if not routes:
        raise ConnectionError("proxy: no proxy in the environment")
    for via in routes:
        try:
            status, body = _http_request(step, via)
        except OSError as exc:
            errors.append(f"{'proxy' if via else 'direct'}: {type(exc).__name__}: {exc}")
            continue
        text = body.decode(errors="replace")
        if 200 <= status < 300 and step.get("expect", "") in text:
            return f"{'proxy' if via else 'direct'}: HTTP {status}"
        # A refusal by stockade's proxy names its reason first ("stockade: REASON: ...").
        reason = " " + text.split(":")[1].strip() if text.startswith("stockade:") else ""
        errors.append(f"{'proxy' if via else 'direct'}: HTTP {status}{reason}")
    raise ConnectionError("; ".join(errors))


def _tunnel(proxy: tuple[str, int], host: str, port: int) -> socket.socket:
    sock = socket.create_connection(proxy, timeout=TIMEOUT)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            break
        reply += chunk
    parts = reply.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or parts[1] != b"200":
        sock.close()
        raise ConnectionRefusedError(f"proxy refused CONNECT: {reply[:60]!r}")
    return sock


def op_tcp(step: Plan) -> str:
    errors: list[str] = []
    proxy = _proxy()
    attempts: list[tuple[str, tuple[str, int] | None]] = [("direct", None)]
    if proxy is not None:
        attempts.insert(0, ("proxy", proxy))
    for how, via in attempts:
        try:
            if via is not None:
                sock = _tunnel(via, step["host"], int(step["port"]))
            else:
                addr = step.get("address") or step["host"]
                sock = socket.create_connection((addr, int(step["port"])), timeout=TIMEOUT)
            with sock:
                sock.sendall(step["data"].encode())
            return f"{how}: sent"
        except OSError as exc:
            errors.append(f"{how}: {type(exc).__name__}: {exc}")
    raise ConnectionError("; ".join(errors))


def op_dns(step: Plan) -> str:
    labels = step["name"].split(".")
    query = struct.pack(">HHHHHH", 0x5354, 0x0100, 1, 0, 0, 0)
    query += (
        b"".join(bytes([len(p)]) + p.encode() for p in labels) + b"\0" + struct.pack(">HH", 1, 1)
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.2)
        sock.sendto(query, (step["server"], int(step["port"])))
        try:
            sock.recv(512)
        except OSError as exc:
            return f"sent; no answer ({type(exc).__name__}); judged from outside"
    return "sent; answered"


def op_unix(step: Plan) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        path = step["path"]
        sock.connect("\0" + path[1:] if path.startswith("@") else path)
        sock.sendall(step["data"].encode())
    return "sent"


def op_kill(step: Plan) -> str:
    os.kill(int(step["pid"]), signal.SIGTERM)
    return "signal sent"


def op_userns(step: Plan) -> str:
    clone_newuser = 0x10000000
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        os._exit(0 if libc.unshare(clone_newuser) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise PermissionError("unshare(CLONE_NEWUSER) failed")
    return "a new user namespace was created"


def op_bigwrite(step: Plan) -> str:
    # Without this the file-size limit kills the whole script with SIGXFSZ; ignored,
    # the write fails with EFBIG and the next step still runs.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    os.makedirs(os.path.dirname(step["path"]), exist_ok=True)
    size = int(step["size"])
    block = b"\0" * 65536
    written = 0
    try:
        with open(step["path"], "wb") as fh:
            while written < size:
                written += fh.write(block[: size - written])
    finally:
        if os.path.exists(step["path"]):
            os.unlink(step["path"])
    return f"wrote {written} bytes"


def kernel_identity() -> dict[str, str]:
    """Which kernel answers this process: its release, version and boot id.

    On the host kernel (bubblewrap, or no container) they are the host's; gVisor's Sentry
    answers with its own (release 4.4.0 and a boot id made up per sandbox).
    """
    uname = os.uname()
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot_id = fh.read().strip()
    except OSError as exc:
        boot_id = f"unreadable: {type(exc).__name__}"
    return {"release": uname.release, "version": uname.version, "boot_id": boot_id}


def op_cmsg(step: Plan) -> dict[str, Any]:
    """sendmsg() with SCM_RIGHTS and SCM_CREDENTIALS control messages on a unix
    socketpair: the kernel that answers parses both (unix_gc and the SCM_RIGHTS paths
    have a history of exploitable bugs, CVE-2021-0920 among them). The seccomp filter
    lets sendmsg on AF_UNIX through; which kernel answered is the evidence."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CLOEXEC)
    try:
        with a, b:
            b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            creds = struct.pack("iII", os.getpid(), os.getuid(), os.getgid())
            a.sendmsg(
                [step["data"].encode()],
                [
                    (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes()),
                    (socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds),
                ],
            )
            msg, ancillary, _, _ = b.recvmsg(256, socket.CMSG_SPACE(64))
    finally:
        os.close(fd)
    passed = [
        fd_
        for level, kind, data in ancillary
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
        for fd_ in array.array("i", data[: len(data) - len(data) % 4])
    ]
    for fd_ in passed:
        os.close(fd_)
    if msg != step["data"].encode() or not passed:
        raise OSError(f"the control message did not come back ({len(passed)} descriptors)")
    kernel = kernel_identity()
    return {
        "detail": f"sendmsg(SCM_RIGHTS, SCM_CREDENTIALS) answered by Linux {kernel['release']} "
        f"(boot id {kernel['boot_id'][:8]})",
        "kernel": kernel,
    }


OPS: dict[str, Any] = {
    "read": op_read,
    "write": op_write,
    "symlink": op_symlink,
    "env": op_env,
    "daemon": op_daemon,
    "http": op_http,
    "tcp": op_tcp,
    "dns": op_dns,
    "unix": op_unix,
    "kill": op_kill,
    "userns": op_userns,
    "bigwrite": op_bigwrite,
    "cmsg": op_cmsg,
}


def evidence(control: Plan) -> dict[str, Any]:
    """Facts that show which mechanisms are in force around this process."""
    facts: dict[str, Any] = {"hostname": socket.gethostname()}
    with open("/proc/self/status", encoding="utf-8") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "NoNewPrivs"):
                facts[key] = value.strip()
    for ns in ("pid", "net", "user"):
        try:
            facts[f"ns_{ns}"] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError as exc:
            facts[f"ns_{ns}"] = f"error: {exc}"
    facts["proxy"] = _proxy() is not None
    facts["control_env"] = os.environ.get(control["env"]) is not None
    try:
        with open(control["file"], encoding="utf-8") as fh:
            facts["control_read"] = control["content"] in fh.read()
    except OSError as exc:
        facts["control_read"] = False
        facts["control_error"] = type(exc).__name__
    import resource

    facts["rlimit_fsize"] = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    facts["kernel"] = kernel_identity()
    return facts


def main() -> int:
    """Attempt every step of the plan in ``sys.argv[1]``; one JSON line each."""
    with open(sys.argv[1], encoding="utf-8") as fh:
        plan = json.load(fh)
    if "evidence" in plan:
        print(json.dumps({"evidence": evidence(plan["evidence"])}), flush=True)
    for step in plan.get("steps", []):
        # An op returns its detail, or a dict with the detail and more evidence.
        extra: dict[str, Any] = {}
        try:
            result = OPS[step["op"]](step)
            done = True
            if isinstance(result, dict):
                extra = {k: v for k, v in result.items() if k != "detail"}
                result = result.get("detail", "")
            detail = str(result)
        except Exception as exc:  # every failure is an outcome here
            detail, done = f"{type(exc).__name__}: {exc}", False
        record = {"id": step["id"], "done": done, "detail": detail[:200], **extra}
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
