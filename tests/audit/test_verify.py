"""The chain verifier: every kind of tampering is found and named, an untouched log passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stockade.audit import AuditLog
from stockade.audit._chain import SCHEMA
from stockade.audit._verify import Verdict, verify_file, verify_lines
from stockade.policy import Decision, Reason


@pytest.fixture
def log(tmp_path: Path) -> list[bytes]:
    """Two runs interleaved in one file, as a warm Sandbox or a shared --audit writes them.

    line 1  a run_start   line 4  a denied      line 7  a run_end
    line 2  b run_start   line 5  a net_connect line 8  b run_end
    line 3  b denied      line 6  b denied
    """
    path = tmp_path / "run.jsonl"
    a, b = AuditLog("aaaa", path), AuditLog("bbbb", path)
    a.emit("run_start", policy_hash="sha256:" + "a" * 64, argv=["npm", "test"])
    b.emit("run_start", policy_hash="sha256:" + "b" * 64, argv=["env"])
    b.decision("denied", Decision.deny("secrets", Reason.CREDENTIAL_ENV), name="GH_TOKEN")
    a.decision("denied", Decision.deny("egress", Reason.HOST_NOT_ALLOWED), host="evil.test")
    a.decision("net_connect", Decision.allow("egress"), host="registry.npmjs.org", port=443)
    b.decision("denied", Decision.deny("secrets", Reason.CREDENTIAL_ENV), name="NPM_TOKEN")
    a.emit("run_end", returncode=1, end=True)
    b.emit("run_end", returncode=0, end=True)
    a.close()
    b.close()
    return path.read_bytes()[:-1].split(b"\n")


def check(lines: list[bytes]) -> Verdict:
    return verify_lines(lines)


def first(verdict: Verdict) -> str:
    assert not verdict.ok
    return str(verdict.problems[0])


def test_an_untouched_log_verifies(log: list[bytes]) -> None:
    verdict = check(log)
    assert verdict.ok, verdict.problems
    assert (verdict.runs, verdict.events) == (2, 8)


def test_an_edited_field_is_named_by_line_and_run(log: list[bytes]) -> None:
    edited = list(log)
    edited[3] = log[3].replace(b"evil.test", b"good.test")
    message = first(check(edited))
    assert message.startswith("line 4: run aaaa: changed after it was written (denied, seq 1)")
    assert "line 5" in message


def test_an_edited_start_no_longer_matches_its_seed(log: list[bytes]) -> None:
    edited = list(log)
    edited[0] = log[0].replace(b"sha256:a", b"sha256:c")  # another policy
    assert first(check(edited)).startswith("line 1: run aaaa: the run's first event does not")


def test_an_edited_end_no_longer_matches_its_final_hash(log: list[bytes]) -> None:
    edited = list(log)
    edited[6] = log[6].replace(b'"returncode":1', b'"returncode":0')
    assert first(check(edited)).startswith("line 7: run aaaa: changed after it was written")
    assert "final hash" in first(check(edited))


def test_a_removed_line_is_named(log: list[bytes]) -> None:
    message = first(check(log[:3] + log[4:]))
    assert message == "line 4: run aaaa: events removed: seq 1 missing before this line"


def test_swapped_lines_are_named_as_reordered(log: list[bytes]) -> None:
    swapped = list(log)
    swapped[3], swapped[4] = log[4], log[3]
    message = first(check(swapped))
    assert message.startswith("line 4: run aaaa: events reordered: seq 2 comes before seq 1")


def test_runs_interleaved_otherwise_still_verify(log: list[bytes]) -> None:
    # Lines of different runs may come in any order (two writers race for the file).
    swapped = list(log)
    swapped[2], swapped[3] = log[3], log[2]
    assert check(swapped).ok


def test_a_cut_log_is_truncated(log: list[bytes], tmp_path: Path) -> None:
    verdict = check(log[:6])
    assert [str(p) for p in verdict.problems] == [
        "line 5: run aaaa: no end: the run stops at net_connect (seq 2) without run_end; "
        "the log was cut or its end removed, or the run was killed",
        "line 6: run bbbb: no end: the run stops at denied (seq 2) without run_end; "
        "the log was cut or its end removed, or the run was killed",
    ]
    # Cut in the middle of a line, as a truncate(2) to any size leaves it.
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b"\n".join(log)[:-40])
    problems = [str(p) for p in verify_file(path).problems]
    assert problems[0].startswith("line 6: run bbbb: no end")
    assert problems[-1].startswith("line 8: an incomplete last line")


def test_a_dropped_run_end_is_found(log: list[bytes]) -> None:
    message = first(check(log[:6] + log[7:]))
    assert message.startswith("line 5: run aaaa: no end: the run stops at net_connect")


def test_a_removed_final_field_is_a_missing_end(log: list[bytes]) -> None:
    stripped = json.loads(log[6])
    del stripped["final"]
    edited = [*log[:6], json.dumps(stripped, separators=(",", ":")).encode(), log[7]]
    assert "run aaaa: no end" in first(check(edited))


def test_an_inserted_line_is_found(log: list[bytes]) -> None:
    # A copy of a real line with a forged field, and a plain duplicate.
    forged = log[3].replace(b"evil.test", b"other.test")
    message = first(check([*log[:4], forged, *log[4:]]))
    assert message.startswith("line 5: run aaaa: seq 1 comes after seq 1")
    message = first(check([*log[:1], log[0], *log[1:]]))
    assert message.startswith("line 2: run aaaa: seq 0 comes after seq 0")


def test_a_replaced_line_is_found(log: list[bytes]) -> None:
    forged = json.loads(log[3])
    forged["host"] = "innocent.test"
    line = json.dumps(forged, separators=(",", ":")).encode()
    message = first(check([*log[:3], line, *log[4:]]))
    assert message.startswith("line 4: run aaaa: changed after it was written")


def test_an_event_appended_after_the_end_is_found(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog("aaaa", path)
    audit.emit("run_start")
    audit.emit("run_end", returncode=0, end=True)
    audit.emit("denied", verdict="deny")  # chained, but after the seal
    audit.close()
    message = first(verify_file(path))
    assert message == "line 3: run aaaa: an event after the run's end (run_end, line 2)"


def test_a_run_id_restarted_on_the_same_log(tmp_path: Path) -> None:
    # The run server keeps one run id and one file across its restarts.
    path = tmp_path / "server.jsonl"
    for _ in range(2):
        server = AuditLog("server-k", path)
        server.emit("server_start")
        server.emit("server_stop", end=True)
        server.close()
    verdict = verify_file(path)
    assert verdict.ok
    assert verdict.runs == 2
    # A server killed before its end: that incarnation is reported, the next verifies.
    killed = AuditLog("server-k", path)
    killed.emit("server_start")
    again = AuditLog("server-k", path)
    again.emit("server_start")
    again.emit("server_stop", end=True)
    problems = [str(p) for p in verify_file(path).problems]
    assert len(problems) == 1
    assert problems[0].startswith("line 5: run server-k: no end: the run stops at server_start")


GARBAGE = [
    (b"not json at all", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"time": 1}', "no run_id"),
    (b'{"run_id": 7}', "no run_id"),
    (b'{"run_id": "old", "event": "run_start"}', "no schema field"),
    (b'{"run_id": "x", "schema": "1", "seq": 0, "prev": ""}', "is not a version number"),
    (b'{"run_id": "x", "schema": 99, "seq": 0}', "schema 99 is newer"),
    (b'{"run_id": "x", "schema": 1, "seq": -1, "prev": ""}', "no valid seq"),
    (b'{"run_id": "x", "schema": 1, "seq": true, "prev": ""}', "no valid seq"),
    (b'{"run_id": "x", "schema": 1, "seq": 0, "prev": "zz"}', "no valid prev"),
    (b'{"run_id": "x", "schema": 1, "seq": 0, "prev": null}', "no valid prev"),
    (b"\xff\xfe\x00binary", "not UTF-8"),
    (b"", "an empty line"),
    (b"[" * 100000, "not JSON"),
]


@pytest.mark.parametrize(("line", "why"), GARBAGE, ids=[g[1] for g in GARBAGE])
def test_garbage_is_named_not_a_crash(log: list[bytes], line: bytes, why: str) -> None:
    verdict = check([*log, line])
    assert why in first(verdict)
    assert str(verdict.problems[0]).startswith("line 9: ")


def test_a_final_field_on_a_foreign_line_does_not_crash() -> None:
    line = json.dumps(
        {"run_id": "x", "schema": SCHEMA, "seq": 0, "prev": "0" * 64, "final": ["odd"]}
    )
    assert "run x" in first(check([line.encode()]))


def test_an_empty_file_and_an_old_unchained_log(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert first(verify_file(empty)) == "no events: the log is empty"
    old = tmp_path / "old.jsonl"
    old.write_text('{"time":1,"run_id":"r","event":"run_start"}\n')
    assert first(verify_file(old)) == (
        "line 1: run r: no schema field: written before the log was chained, or edited"
    )
