"""Orchestration of one sandbox: policy -> plans -> proxy -> spawn -> wait -> cleanup -> audit."""

from stockade.runtime._request import RunRequest as RunRequest
from stockade.runtime._request import RunResult as RunResult
from stockade.runtime._run import execute as execute

__all__ = ["RunRequest", "RunResult", "execute"]
