"""Anthropic's sandbox-runtime (srt), the peer the benchmarks measure against.

Installed into a folder of the benchmark's with npm when npm is available; nothing is
installed globally except, as root, the two Debian packages srt refuses to start without.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit


def install_srt(root: Path) -> str | None:
    """Install sandbox-runtime into ``root`` with npm; return the srt path, or None."""
    # srt refuses to start without ripgrep and socat; install them as root when missing.
    missing = [
        pkg for pkg, binary in (("ripgrep", "rg"), ("socat", "socat")) if not shutil.which(binary)
    ]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *missing], capture_output=True, check=False
        )
    existing = shutil.which("srt")
    if existing:
        return existing
    if not shutil.which("npm"):
        return None
    proc = subprocess.run(
        ["npm", "install", "--silent", "--prefix", str(root), "@anthropic-ai/sandbox-runtime"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    srt = root / "node_modules" / ".bin" / "srt"
    return str(srt) if proc.returncode == 0 and srt.exists() else None


@contextlib.contextmanager
def srt_proxy(srt: str, workdir: Path, allowed: str) -> Iterator[tuple[int, str] | None]:
    """srt's own proxy, as a sandboxed command would reach it: ``(port, auth header)``.

    srt starts its HTTP/SOCKS proxy on the host for each sandbox and bridges it inside;
    the host end (``CLAUDE_CODE_HOST_HTTP_PROXY_PORT``) is what is measured, as stockade's
    and squid's proxies are measured from the host. It wants the credentials srt gives
    the sandbox in ``HTTP_PROXY``. Yields None when srt does not start.
    """
    settings = workdir / "srt-settings.json"
    env_file = workdir / "srt-env"
    settings.write_text(
        json.dumps(
            {
                "network": {"allowedDomains": [allowed], "deniedDomains": []},
                "filesystem": {"denyRead": [], "allowWrite": [str(workdir)], "denyWrite": []},
            }
        )
    )
    proc = subprocess.Popen(
        [srt, "-s", str(settings), "-c", f"env > {env_file}; sleep 3600"],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        env: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if env_file.exists():
                env = dict(
                    line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line
                )
                if "CLAUDE_CODE_HOST_HTTP_PROXY_PORT" in env and "HTTP_PROXY" in env:
                    break
            time.sleep(0.1)
        if "CLAUDE_CODE_HOST_HTTP_PROXY_PORT" not in env or "HTTP_PROXY" not in env:
            yield None
            return
        url = urlsplit(env["HTTP_PROXY"])
        token = f"{unquote(url.username or '')}:{unquote(url.password or '')}"
        auth = f"Proxy-Authorization: Basic {base64.b64encode(token.encode()).decode()}\r\n"
        yield int(env["CLAUDE_CODE_HOST_HTTP_PROXY_PORT"]), auth
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
