"""What every adapter shares: denials put into words for a model."""

from __future__ import annotations

from typing import Any

from stockade._denials import explain_denial
from stockade.api import CompletedRun


def denials(result: CompletedRun | Any) -> list[dict[str, str]]:
    """The run's denials as ``{layer, reason, target, hint}``, each once."""
    events = result.denials if result is not None else []
    out: list[dict[str, str]] = []
    for event in events:
        explained = explain_denial(event)
        if explained not in out:
            out.append(explained)
    return out


def denial_text(result: CompletedRun | Any) -> str:
    """The run's denials as lines for the model ("" when there were none)."""
    lines = [f"[stockade] denied ({d['reason']}): {d['hint']}" for d in denials(result)]
    return "".join(f"\n{line}" for line in lines)


def refusal_text(exc: BaseException) -> str:
    """A refused host-side file operation, in the words of the matching hint."""
    reason = getattr(exc, "reason", "")
    detail = getattr(exc, "detail", "") or str(exc)
    explained = explain_denial({"layer": "files", "reason": reason, "path": detail})
    return f"[stockade] denied ({reason}): {explained['hint']}"
