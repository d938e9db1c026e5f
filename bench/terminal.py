"""Throughput of the relay's terminal filter (runtime/_escapes.py) beside a plain copy.

What a sandboxed command writes to a person's terminal passes the filter. Three kinds of
output, fed in the relay's 64 KiB reads, in turns with the baseline (the same bytes
joined unfiltered, what the relay did before): plain text, coloured text (a CSI every
few words, as ``ls --color`` or a test runner prints) and a TUI's redraws (cursor moves
and an OSC title per line). The last line is JSON with MB/s for each and the ratios;
the target is that coloured output stays above 20 MB/s, faster than terminals draw.

    python bench/terminal.py [MEGABYTES]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from stockade.runtime._escapes import TerminalFilter

TARGET_COLOURED_MBS = 20.0
READ = 65536


def _stream(kind: str, size: int) -> list[bytes]:
    if kind == "plain":
        line = b"a line of ordinary output, as a build or a test run prints it\n"
    elif kind == "coloured":
        line = b"\x1b[1;32mPASSED\x1b[0m tests/test_x.py::\x1b[36mtest_case\x1b[0m [ 42%]\n"
    else:
        line = b"\x1b[12;1H\x1b[2K\x1b[7m status \x1b[27m\x1b]0;editor - file.py\x07 text\r\n"
    data = line * (size // len(line))
    return [data[i : i + READ] for i in range(0, len(data), READ)]


def _time(chunks: list[bytes], work: Callable[[list[bytes]], object]) -> float:
    t0 = time.perf_counter()
    work(chunks)
    return time.perf_counter() - t0


def _filtered(chunks: list[bytes]) -> object:
    f = TerminalFilter()
    return [f.feed(c) for c in chunks]


def _copied(chunks: list[bytes]) -> object:
    return [bytearray(c) for c in chunks]  # a copy of each read, as the relay passed it


def main(argv: list[str]) -> int:
    megabytes = int(argv[1]) if len(argv) > 1 else 32
    size = megabytes * 1_000_000
    load = os.getloadavg()[0]
    result: dict[str, object] = {"megabytes": megabytes, "load": round(load, 2)}
    for kind in ("plain", "coloured", "tui"):
        chunks = _stream(kind, size)
        filt, copy = [], []
        for _ in range(5):  # in turns, so that load falls on both alike
            filt.append(_time(chunks, _filtered))
            copy.append(_time(chunks, _copied))
        f_mbs = size / statistics.median(filt) / 1e6
        c_mbs = size / statistics.median(copy) / 1e6
        result[kind] = {
            "filtered_MBps": round(f_mbs, 1),
            "copied_MBps": round(c_mbs, 1),
            "ratio": round(f_mbs / c_mbs, 4),
        }
        print(f"{kind:9} filtered {f_mbs:10.1f} MB/s   copied {c_mbs:10.1f} MB/s", file=sys.stderr)
    coloured = result["coloured"]
    assert isinstance(coloured, dict)
    result["target_met"] = coloured["filtered_MBps"] >= TARGET_COLOURED_MBS
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
