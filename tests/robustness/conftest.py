"""Robustness tests: fuzzing, load and faults. Fuzz example counts are reported at the end."""

from __future__ import annotations

from collections import Counter

import pytest

#: fuzz target -> examples run in this session (printed in the terminal summary)
FUZZ_EXAMPLES: Counter[str] = Counter()


def count_example(target: str) -> None:
    """Record one example run against ``target``."""
    FUZZ_EXAMPLES[target] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FUZZ_EXAMPLES:
        return
    terminalreporter.section("fuzz examples run")
    for target, count in sorted(FUZZ_EXAMPLES.items()):
        terminalreporter.write_line(f"{target}: {count}")
