"""The learning tests' local HTTP server (127.0.0.1), reached as ``*.test`` names pinned
by ``network.hosts``."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"served {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_DELETE = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


# the TLS-capable static server of the toolchain tests (trustme CA, *.test names)
from tests.runtime.test_toolchains import serve  # noqa: E402, F401
