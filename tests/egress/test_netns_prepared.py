"""The netns helper forked in advance (``prepare_helper``), as a run server's worker does.

It must make the same sockets in the same namespace as a freshly forked helper, be used
once, keep nothing of its parent's open but its channel (a run server's listener above
all), and a prepared helper that died must not fail the run: a fresh one is forked.
Real namespaces (a bwrap sandbox), as root and as uid 65534.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.egress.conftest import must_work_or_skip

pytestmark = pytest.mark.kernel

# Runs in a fresh interpreter: prepares a helper (with a listening socket open, as a run
# server's worker has), checks what it holds, then makes the listener inside a bwrap
# sandbox and accepts the sandboxed command's connection through it.
SCRIPT = r"""
import json, os, signal, socket, subprocess, sys, time
from stockade.egress import _netns, listener_in_netns

port, mode = int(sys.argv[1]), sys.argv[2]
server_like = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server_like.bind("\0stockade-test-prepared-%d" % os.getpid())
server_like.listen(1)
_netns.prepare_helper()
channel, helper = _netns._prepared
# The helper is a child of ours that holds 0, 1, 2 and its end of the channel only, once
# it waits for its request (it closes the rest first).
deadline = time.monotonic() + 10
while True:
    held = sorted(int(fd) for fd in os.listdir(f"/proc/{helper}/fd"))
    if len(held) == 4 or time.monotonic() > deadline:
        break
    time.sleep(0.01)
print("HELD", len(held), held[:3] == [0, 1, 2])
if mode == "dead":
    os.kill(helper, signal.SIGKILL)
    os.waitpid(helper, 0)
inner = (
    "import socket, time\n"
    "for _ in range(250):\n"
    "    try:\n"
    f"        s = socket.create_connection(('127.0.0.1', {port}), 1)\n"
    "    except OSError:\n"
    "        time.sleep(0.02)\n"
    "        continue\n"
    "    s.sendall(b'from-sandbox'); s.close(); break\n"
)
inner_python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
read_fd, write_fd = os.pipe()
proc = subprocess.Popen(
    ["bwrap", "--unshare-user", "--unshare-net", "--die-with-parent", "--ro-bind", "/", "/",
     "--info-fd", str(write_fd), "--", inner_python, "-c", inner],
    pass_fds=(write_fd,),
)
os.close(write_fd)
info = b""
while b"}" not in info:
    chunk = os.read(read_fd, 4096)
    if not chunk:
        break
    info += chunk
pid = json.loads(info)["child-pid"]
listener = listener_in_netns(pid, port)
print("USED", _netns._prepared is None)
try:
    os.waitpid(helper, os.WNOHANG)
    print("REAPED", False)
except ChildProcessError:
    print("REAPED", True)
listener.settimeout(10)
conn, _ = listener.accept()
data = conn.recv(100)
conn.close()
listener.close()
proc.wait(10)
print("RESULT", data.decode(), os.geteuid())
"""


def _run(prefix: list[str], mode: str) -> str:
    if shutil.which("bwrap") is None:
        must_work_or_skip("bwrap is not installed")
    port = 20000 + (os.getpid() + len(mode)) % 20000
    result = subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT, str(port), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 and "No permissions to create new namespace" in result.stderr:
        must_work_or_skip(f"user namespaces are not available: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def _nobody() -> list[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        must_work_or_skip("switching to uid 65534 needs root and setpriv")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.parametrize("who", ["current", "nobody"])
def test_a_prepared_helper_makes_the_listener_and_holds_nothing_else(who: str) -> None:
    out = _run(_nobody() if who == "nobody" else [], "prepared")
    uid = 65534 if who == "nobody" else os.geteuid()
    # Four descriptors: 0, 1, 2 and the channel; not the listening socket it was forked with.
    assert "HELD 4 True" in out
    assert "USED True" in out  # taken for this listener, not forked anew
    assert "REAPED True" in out
    assert f"RESULT from-sandbox {uid}" in out


@pytest.mark.parametrize("who", ["current", "nobody"])
def test_a_prepared_helper_that_died_is_replaced_by_a_fresh_one(who: str) -> None:
    out = _run(_nobody() if who == "nobody" else [], "dead")
    uid = 65534 if who == "nobody" else os.geteuid()
    assert "USED True" in out
    assert f"RESULT from-sandbox {uid}" in out
