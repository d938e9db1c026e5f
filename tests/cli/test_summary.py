"""The stderr summary of ``stockade run``: what counts as a refusal, what it names.

Pure: events in, lines out (the end-to-end runs are in tests/runtime/test_default_network.py
and tests/approval/test_cli.py).
"""

from __future__ import annotations

from pathlib import Path

from stockade.cli.run import denial_summary


def _deny(event: str, reason: str, **fields: object) -> dict[str, object]:
    return {"event": event, "layer": "egress", "verdict": "deny", "reason": reason, **fields}


def test_an_answer_and_a_revoke_are_no_refusals() -> None:
    events = [
        _deny("answer", "user-denied", host="a.test"),
        _deny("net_request", "user-denied", host="a.test", port=443, method="GET", path="/"),
        _deny("policy_change", "allowed", remove=["b.test"]),
    ]
    lines = denial_summary(events, Path("/tmp/run.jsonl"))
    assert lines == [
        "stockade: denied 1: 1 egress user-denied (GET a.test:443/); details in /tmp/run.jsonl"
    ]
    # The twin: a revoke alone (no refusal) prints nothing.
    assert denial_summary([events[2]], None) == []


def test_targets_are_named_a_few_at_a_time_with_one_hint_per_reason() -> None:
    names = [f"h{i}.test" for i in range(5)]
    events = [_deny("dns_query", "host-not-allowed", name=n) for n in names]
    lines = denial_summary(events, None, Path("/etc/p.toml"))
    assert lines[0] == (
        "stockade: denied 5: 5 egress host-not-allowed (h0.test, h1.test, h2.test, and 2 more)"
    )
    assert lines[1] == (
        "stockade: hint: to allow h0.test: --allow-host h0.test, or network.allow in /etc/p.toml"
    )
    assert len(lines) == 2
    # A name from the sandbox cannot break the line.
    odd = denial_summary([_deny("dns_query", "host-not-allowed", name="x\n\x1b[2J")], None)
    assert all("\n" not in line and "\x1b" not in line for line in odd)
