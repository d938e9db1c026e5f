"""A line-protocol client with a plain socket: ``python echo_probe.py HOST PORT... LINE``.

Prints ``PROBE PORT json`` per port: the line the server sent back, or the error.
"""

from __future__ import annotations

import json
import socket
import sys


def main() -> None:
    host, *ports, line = sys.argv[1:]
    for port in ports:
        try:
            with socket.create_connection((host, int(port)), timeout=3) as sock:
                sock.sendall(f"{line} {port}\n".encode())
                out = {"reply": sock.makefile("rb").readline().decode().strip()}
        except OSError as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        print(f"PROBE {port} {json.dumps(out)}", flush=True)


if __name__ == "__main__":
    main()
