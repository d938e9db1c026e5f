"""The pipes to the sandbox are closed however a run ends.

``Popen.communicate`` closes them on the way out it expects; a run that an error ends
first (a failing step after the start, a cancel) used to leave its pipe files to the
garbage collector, whose ResourceWarning then surfaced in whichever later test happened
to collect them (two intermittent CI failures). Real processes, real pipes.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from stockade.policy import load_policy
from stockade.runtime import _pty
from stockade.runtime._request import RunRequest
from stockade.runtime._spawn import spawn, stdio


class _Boom(Exception):
    pass


def _leaks(action: object) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        assert callable(action)
        action()
        gc.collect()
    return [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


def _request(tmp_path: Path) -> RunRequest:
    policy = load_policy(None, workspace=tmp_path)
    return RunRequest(["sleep", "30"], policy, input=b"x", capture_output=True)


def _spawn(request: RunRequest, tmp_path: Path, on_started: object) -> object:
    choice = _pty.choose(*stdio(request), allow_pty=False)
    assert callable(on_started)
    return spawn(["sleep", "30"], {}, tmp_path, request, 30, 0, choice, (), None, on_started)


def test_a_run_an_error_ends_leaves_no_pipe_open(tmp_path: Path) -> None:
    def fail() -> None:
        raise _Boom

    def run() -> None:
        with pytest.raises(_Boom):
            _spawn(_request(tmp_path), tmp_path, fail)

    assert _leaks(run) == []


def test_a_run_that_ends_as_expected_returns_its_output(tmp_path: Path) -> None:
    # The twin: closing the pipes at the end takes nothing from a run's output.
    argv = ["sh", "-c", "cat; echo out"]
    policy = load_policy(None, workspace=tmp_path)
    request = RunRequest(argv, policy, input=b"in ", capture_output=True)
    choice = _pty.choose(*stdio(request), allow_pty=False)
    result: list[object] = []

    def run() -> None:
        result.append(spawn(argv, {}, tmp_path, request, 30, 0, choice, (), None, lambda: None))

    assert _leaks(run) == []
    assert result == [(0, False, b"in out\n", b"")]
