"""The README's demonstration: a compromised test step, run bare and under stockade.

It builds a throw-away world (a temporary HOME with canary secrets, a workspace with a
git repository, a recording TCP sink on 127.0.0.1, a GH_TOKEN canary in the
environment), runs the step once under stockade and shows what got through. It never
touches your real HOME: everything lives in a temporary directory removed at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    # ``demo.py --backend landlock``: the same step under another container runtime.
    backend = ["--backend", argv[argv.index("--backend") + 1]] if "--backend" in argv else []
    stockade = shutil.which("stockade") or str(Path(sys.executable).with_name("stockade"))
    canary = f"CANARY-{uuid.uuid4()}"
    with tempfile.TemporaryDirectory(prefix="stockade-demo-") as tmp:
        root = Path(tmp)
        home = root / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text(f"-----BEGIN KEY----- {canary}\n")
        bashrc = "# the user's bashrc\n"
        (home / ".bashrc").write_text(bashrc)
        ws = root / "project"
        (ws / "src").mkdir(parents=True)
        (ws / "build").mkdir()
        (ws / "src" / "app.py").write_text("print('hello')\n")
        subprocess.run(["git", "init", "-q", str(ws)], check=True)
        shutil.copy(HERE / "test_step.py", ws / "test_step.py")
        marker = root / "daemon-alive"

        sink = socket.socket()
        sink.bind(("127.0.0.1", 0))
        sink.listen()
        received: list[bytes] = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = sink.accept()
                except OSError:
                    return
                with conn:
                    received.append(conn.recv(100))

        threading.Thread(target=serve, daemon=True).start()
        env = dict(os.environ)
        env.update(
            HOME=str(home),
            XDG_STATE_HOME=str(root / "state"),
            XDG_CONFIG_HOME=str(root / "config"),
            GH_TOKEN=canary,
            DEMO_REAL_HOME=str(home),
            DEMO_MARKER=str(marker),
            DEMO_SINK_PORT=str(sink.getsockname()[1]),
        )
        print(f"stockade demo: a compromised test step runs in {ws}\n")
        proc = subprocess.run(
            [stockade, "run", *backend, "--workspace", str(ws), "--", "python3", "test_step.py"],
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        time.sleep(2.0)  # give a surviving daemon time to show itself
        sink.close()
        results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if not results:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            print("stockade demo: the step produced no results", file=sys.stderr)
            return 1
        leaked = canary in proc.stdout or any(canary.encode() in r for r in received)
        for r in results:
            if r["action"] == "leave a process behind":
                r["outcome"] = "done" if marker.exists() else "blocked"
            if r["action"] == "append to ~/.bashrc":
                # Judged by its effect: the sandbox's HOME is a throw-away tmpfs.
                r["outcome"] = "done" if (home / ".bashrc").read_text() != bashrc else "blocked"
            if r["action"] == "connect to a host service":
                r["outcome"] = "done" if received else "blocked"
        width = max(len(r["action"]) for r in results)
        print(f"  {'action':<{width}}  {'needed':<6}  outcome")
        for r in results:
            good = r["outcome"] == "done" if r["needed"] else r["outcome"] == "blocked"
            mark = "ok " if good else "BAD"
            print(
                f"  {r['action']:<{width}}  {'yes' if r['needed'] else 'no':<6}  {mark} {r['outcome']}"
            )
        open_unneeded = sum(1 for r in results if not r["needed"] and r["outcome"] == "done")
        broken_needed = sum(1 for r in results if r["needed"] and r["outcome"] != "done")
        print(
            f"\n  unneeded actions still open: {open_unneeded}   needed actions broken: {broken_needed}"
        )
        intact = (home / ".bashrc").read_text() == bashrc
        print(
            f"  canary leaked: {'YES' if leaked else 'no'}   ~/.bashrc unchanged: {'yes' if intact else 'NO'}"
        )
        for line in proc.stderr.splitlines():
            if line.startswith("stockade:"):
                print(f"  {line}")
        return 0 if open_unneeded == 0 and broken_needed == 0 and not leaked and intact else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
