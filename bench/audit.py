"""The cost of the audit log's hash chain per event, measured in one run.

Times :meth:`AuditLog.emit` as it is (chained: ``schema``/``seq``/``prev``, one SHA-256
of the line) against the same sink without the chain (the emit of before, kept here as
``Unchained``), both appending to a file in a temporary directory, in interleaved rounds
of ``EVENTS`` events shaped like the proxy's ``net_connect``. Also times
``stockade log --verify``'s checker on the chained file. The last line is one JSON object
with microseconds per event and the ratio chained/unchained.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stockade.audit import AuditLog
from stockade.audit._verify import verify_file

ROUNDS = int(os.environ.get("STOCKADE_BENCH_ROUNDS", "7"))
EVENTS = int(os.environ.get("STOCKADE_BENCH_EVENTS", "20000"))

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Unchained(AuditLog):
    """The sink before the chain: the same record, one JSON line, one ``os.write``."""

    def emit(
        self,
        event: str,
        *,
        layer: str = "",
        verdict: str = "allow",
        reason: str = "",
        end: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "time": time.time(),
            "run_id": self.run_id,
            "event": event,
            "layer": layer,
            "verdict": verdict,
            "reason": reason,
        }
        record.update(fields)
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if verdict == "deny":
                self.denials += 1
            self.events.append(record)
            if self._fd >= 0:
                os.write(self._fd, line)
        return record


def one_round(kind: type[AuditLog], path: Path) -> float:
    """Seconds per event for ``EVENTS`` events of a fresh log of ``kind`` at ``path``."""
    audit = kind("bench0000000", path)
    audit.emit("run_start", policy_hash="sha256:" + "0" * 64, argv=["npm", "install"])
    start = time.perf_counter()
    for i in range(EVENTS):
        audit.emit(
            "net_connect",
            layer="egress",
            reason="host-allowed",
            protocol="connect",
            host="registry.npmjs.org",
            port=443,
            address="104.16.0.35",
            bytes_up=1200 + i,
            bytes_down=48000,
        )
    elapsed = time.perf_counter() - start
    audit.emit("run_end", returncode=0, duration=elapsed, end=True)
    audit.close()
    return elapsed / EVENTS


def main() -> None:
    """Print each round's figures, then one JSON line with the medians and the ratio."""
    with tempfile.TemporaryDirectory(prefix="stockade-bench-audit-") as tmp:
        chained: list[float] = []
        unchained: list[float] = []
        verify: list[float] = []
        for n in range(ROUNDS):
            # Interleaved, so that drift in the machine's load touches both alike.
            for kind, times in ((Unchained, unchained), (AuditLog, chained)):
                path = Path(tmp) / f"{kind.__name__}-{n}.jsonl"
                times.append(one_round(kind, path))
            path = Path(tmp) / f"AuditLog-{n}.jsonl"
            start = time.perf_counter()
            verdict = verify_file(path)
            verify.append((time.perf_counter() - start) / verdict.events)
            assert verdict.ok, verdict.problems
            print(
                f"round {n}: unchained {unchained[-1] * 1e6:.2f} us/event, "
                f"chained {chained[-1] * 1e6:.2f} us/event, "
                f"verify {verify[-1] * 1e6:.2f} us/event",
                file=sys.stderr,
            )
    c, u, v = (statistics.median(x) * 1e6 for x in (chained, unchained, verify))
    print(
        json.dumps(
            {
                "events": EVENTS,
                "rounds": ROUNDS,
                "unchained_us_per_event": round(u, 2),
                "chained_us_per_event": round(c, 2),
                "added_us_per_event": round(c - u, 2),
                "ratio": round(c / u, 3),
                "verify_us_per_event": round(v, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
