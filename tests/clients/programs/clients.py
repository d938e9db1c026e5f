"""Python HTTP clients of the compatibility suite, run inside the sandbox.

``python clients.py JOBS`` reads tab-separated jobs (id, client, method, url, header) and
prints one ``RESULT id status text`` line per job: the HTTP status and the body, or the
exception's name and message. Each client is used as a program would use it, with its
defaults: trust and proxies come from the environment, or not at all (``http.client``,
``aiohttp`` without ``trust_env``).
"""

from __future__ import annotations

import asyncio
import http.client
import importlib
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

TIMEOUT = 10


def headers_of(spec: str) -> dict[str, str]:
    """``name=env:VAR`` (the variable's value) or ``name=value``; ``-`` for none."""
    if spec == "-":
        return {}
    name, _, value = spec.partition("=")
    if value.startswith("env:"):
        value = os.environ.get(value[4:], "")
    return {name: value}


def body_of(method: str) -> bytes | None:
    return b"x" if method in ("PUT", "POST") else None


def with_urllib(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body_of(method), headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def with_http_client(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=TIMEOUT)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT)
    try:
        conn.request(method, parts.path, body=body_of(method), headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def with_requests(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    requests: Any = importlib.import_module("requests")
    r = requests.request(method, url, data=body_of(method), headers=headers, timeout=TIMEOUT)
    return int(r.status_code), str(r.text)


def with_httpx(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    httpx: Any = importlib.import_module("httpx")
    with httpx.Client(timeout=TIMEOUT) as client:
        r = client.request(method, url, content=body_of(method), headers=headers)
        return int(r.status_code), str(r.text)


def with_aiohttp(trust_env: bool) -> Any:
    def run(method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
        aiohttp: Any = importlib.import_module("aiohttp")

        async def go() -> tuple[int, str]:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT)
            async with (
                aiohttp.ClientSession(trust_env=trust_env, timeout=timeout) as session,
                session.request(method, url, data=body_of(method), headers=headers) as r,
            ):
                return int(r.status), str(await r.text())

        return asyncio.run(go())

    return run


CLIENTS = {
    "urllib": with_urllib,
    "httpclient": with_http_client,
    "requests": with_requests,
    "httpx": with_httpx,
    "aiohttp": with_aiohttp(False),
    "aiohttp-env": with_aiohttp(True),
}


def one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def main() -> None:
    with open(sys.argv[1]) as jobs:
        for line in jobs:
            if not line.strip():
                continue
            job_id, client, method, url, header = line.rstrip("\n").split("\t")
            try:
                status, text = CLIENTS[client](method, url, headers_of(header))
                out = f"{status} {one_line(text)}"
            except Exception as e:
                cause = e.__cause__ or e.__context__
                detail = f"{e} <- {cause!r}" if cause else str(e)
                out = f"{type(e).__name__} {one_line(detail)}"
            print(f"RESULT {job_id} {out}", flush=True)


if __name__ == "__main__":
    main()
