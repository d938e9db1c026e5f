"""The learn mode's cost, measured in one run, in turns.

- learning overhead: the same task (a Python program that imports a few modules, reads a
  configuration file outside the workspace and fetches from a local HTTP server mapped
  as ``thing.test``) run by :func:`stockade.run` under its suggested policy, and learnt by
  :func:`stockade.learning.learn` (observer, events, run directory), one of each per round
  (target: learning <= 1.3x the normal run);
- suggestion time for a run of 10,000 observed events (hosts, requests, reads), and the
  size of what it suggests.

The last line is one JSON object with the figures and ratios. STOCKADE_BENCH_N sets the
rounds (default 10).
"""

from __future__ import annotations

import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

N = int(os.environ.get("STOCKADE_BENCH_N", "10"))
PYTHON = "/usr/bin/python3"

TASK = """
import json, sys, urllib.request, email.parser, http.client, decimal
conf = open(sys.argv[1]).read().strip()
print(urllib.request.urlopen(f"http://thing.test:{sys.argv[2]}/{conf}", timeout=10).read())
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _events(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(
                {
                    "kind": "connect",
                    "host": f"h{i % 40}.pkg{i % 7}.test",
                    "port": 443,
                    "verdict": "allow",
                    "run": 1,
                }
            )
        elif kind == 1:
            out.append(
                {
                    "kind": "request",
                    "protocol": "https",
                    "host": f"api{i % 5}.test",
                    "port": 443,
                    "method": ("GET", "POST")[i % 2],
                    "path": f"/v1/items/{i % 300}",
                    "verdict": "allow",
                    "run": 1,
                }
            )
        else:
            out.append({"kind": "read", "path": f"/data/d{i % 50}/f{i % 97}", "run": 1})
    return out


def main() -> int:
    import stockade
    from stockade.learning import learn, suggest, suggest_from

    if not os.path.exists(PYTHON):
        print(f"bench/learn.py: {PYTHON} is needed inside the sandbox", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-learn-"))
    ws = root / "ws"
    ws.mkdir()
    (ws / "task.py").write_text(TASK)
    etc = root / "etc-app"
    etc.mkdir()
    (etc / "app.conf").write_text("alpha\n")
    base = root / "base.toml"
    base.write_text('[network.hosts]\n"thing.test" = "127.0.0.1"\n')
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    argv = [PYTHON, "task.py", str(etc / "app.conf"), str(srv.server_address[1])]

    first = learn(argv, policy=base, workspace=ws, out=root / "learnt", see=[etc])
    assert first.returncodes == [0], first.stderr
    policy = root / "policy.toml"
    policy.write_text(suggest_from([root / "learnt"]).to_toml())

    def normal() -> None:
        result = stockade.run(argv, policy=policy, workspace=ws, cwd=ws, capture_output=True)
        assert result.returncode == 0, result.stderr

    def learning() -> None:
        result = learn(argv, policy=base, workspace=ws, out=root / "learnt", see=[etc], cwd=ws)
        assert result.returncodes == [0], result.stderr

    samples: dict[str, list[float]] = {"normal": [], "learn": []}
    normal()  # warm: the launcher is built, .pyc written
    for _ in range(N):
        for name, fn in (("normal", normal), ("learn", learning)):
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    mean = {k: statistics.mean(v) for k, v in samples.items()}
    ratio = mean["learn"] / mean["normal"]
    print(f"normal run:   {mean['normal'] * 1000:8.1f} ms")
    print(f"learning run: {mean['learn'] * 1000:8.1f} ms  ({ratio:.2f}x, target <= 1.3x)")

    events = _events(10_000)
    start = time.perf_counter()
    s = suggest(events, exists=lambda p: True, isdir=lambda p: False)
    text = s.to_toml()
    suggest_s = time.perf_counter() - start
    print(
        f"suggest over 10,000 events: {suggest_s * 1000:.1f} ms "
        f"({len(s.lines)} lines, {len(text)} bytes)"
    )
    srv.shutdown()
    print(
        json.dumps(
            {
                "normal_ms": round(mean["normal"] * 1000, 1),
                "learn_ms": round(mean["learn"] * 1000, 1),
                "learn_ratio": round(ratio, 3),
                "suggest_10k_ms": round(suggest_s * 1000, 1),
                "suggest_lines": len(s.lines),
                "rounds": N,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
