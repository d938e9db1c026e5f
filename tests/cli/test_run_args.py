"""``stockade run``'s fast argument parser agrees with argparse wherever it answers."""

from __future__ import annotations

import argparse

import pytest

from stockade.cli import run

CASES = [
    ["--", "true"],
    ["true"],
    ["pytest", "-q", "--disable", "files"],
    ["--policy", "p.toml", "--", "sh", "-c", "echo hi"],
    ["--policy=p.toml", "--workspace", "/tmp/x", "--", "true"],
    [
        "--allow-host",
        "a.test",
        "--allow-host=b.test",
        "--disable",
        "egress",
        "--disable=files",
        "--",
        "true",
    ],
    ["--timeout", "2.5", "--audit", "a.jsonl", "--srt-settings", "s.json", "--", "make", "--", "x"],
    # argparse's business: help, unknown options, bad values, missing values, no command
    ["--help"],
    ["--bogus", "--", "true"],
    ["--disable", "walls", "--", "true"],
    ["--timeout", "soon", "--", "true"],
    ["--policy"],
    ["--"],
    [],
]


def _argparse(argv: list[str]) -> argparse.Namespace | None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    run.add_arguments(parser)
    try:
        return parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit):
        return None


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) or "(none)" for c in CASES])
def test_fast_parse_matches_argparse(argv: list[str]) -> None:
    fast = run.fast_parse(argv)
    if fast is None:
        return  # argparse answers these; the CLI then behaves exactly as before
    assert vars(fast) == vars(_argparse(argv))


def test_fast_parse_leaves_help_and_errors_to_argparse() -> None:
    for argv in (
        ["--help"],
        ["--bogus", "--", "true"],
        ["--disable", "walls", "--", "true"],
        ["--"],
        [],
    ):
        assert run.fast_parse(argv) is None
    assert run.fast_parse(["--", "true"]) is not None
