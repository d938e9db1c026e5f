"""Run records and the one "can the sandbox write this" check: real files, real renames.

The runs themselves (bubblewrap, the CLI, uid 65534) are in ``test_forgery.py``; here the
pieces each run relies on, each refusal beside the path that is accepted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stockade._roots import is_scratch_name, sandbox_writable
from stockade.audit import AuditLog
from stockade.audit._chain import line_hash
from stockade.audit._record import Head, load_records, write_record
from stockade.audit._verify import authorship, verify_file


def test_sandbox_writable_workspace_grants_scratch_and_links(tmp_path: Path) -> None:
    ws, grant, out = tmp_path / "ws", tmp_path / "cache", tmp_path / "out"
    for d in (ws, grant, out):
        d.mkdir()
    roots = (ws, grant)
    scratch = tmp_path / "tmp"
    (scratch / "stockade-123-0a1b2c3d").mkdir(parents=True)
    # Inside the workspace, a write grant, a run's scratch directory: refused, by name.
    why = sandbox_writable(ws / "logs" / "a.jsonl", roots, scratch=scratch)
    assert why == f"{ws / 'logs' / 'a.jsonl'} lies inside {ws}, which the sandbox can write"
    assert sandbox_writable(grant / "a.jsonl", roots, scratch=scratch) is not None
    assert sandbox_writable(grant, roots, scratch=scratch) is not None
    in_scratch = sandbox_writable(scratch / "stockade-123-0a1b2c3d" / "a", roots, scratch=scratch)
    assert in_scratch is not None
    assert "a run's scratch directory" in in_scratch
    # A symlink outside that leads inside, and one inside (the sandbox can repoint it).
    (out / "to-ws").symlink_to(ws)
    assert sandbox_writable(out / "to-ws" / "a.jsonl", roots, scratch=scratch) is not None
    (ws / "to-out").symlink_to(out)
    assert sandbox_writable(ws / "to-out" / "a.jsonl", roots, scratch=scratch) is not None
    # The allowed twins: beside the workspace, under a directory merely named like one
    # of stockade's (a test world, a Sandbox's egress files), and the scratch base itself.
    assert sandbox_writable(out / "a.jsonl", roots, scratch=scratch) is None
    assert sandbox_writable(tmp_path / "ws2" / "a.jsonl", roots, scratch=scratch) is None
    assert sandbox_writable(scratch / "stockade-world-x" / "a", roots, scratch=scratch) is None
    assert sandbox_writable(scratch / "a.jsonl", roots, scratch=scratch) is None
    # stockade's own state inside the workspace is read-only in every sandbox (a trust
    # root): a log there is out of reach; beside it in the workspace, or through a
    # symlink the sandbox could repoint, it is not.
    env = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(ws / ".state")}
    runs = ws / ".state" / "stockade" / "runs"
    assert sandbox_writable(runs / "a.jsonl", roots, scratch=scratch, env=env) is None
    assert sandbox_writable(ws / ".state" / "a.jsonl", roots, scratch=scratch, env=env)
    (ws / "to-state").symlink_to(runs, target_is_directory=True)
    assert sandbox_writable(ws / "to-state" / "a.jsonl", roots, scratch=scratch, env=env)
    assert is_scratch_name("stockade-42-deadbeef")
    assert not is_scratch_name("stockade-sandbox-x1")
    assert not is_scratch_name("stockade-world-abc")


def _run(path: Path, run_id: str, denials: int = 1) -> AuditLog:
    audit = AuditLog(run_id, path)
    audit.emit("run_start", policy_hash="sha256:" + "c" * 64, argv=["true"])
    for _ in range(denials):
        audit.emit("denied", verdict="deny", reason="host-not-allowed", host="evil.test")
    audit.emit("run_end", returncode=0, end=True)
    audit.close()
    return audit


def test_the_head_is_where_the_file_ends(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = _run(path, "run1")
    head = audit.head()
    assert head is not None
    raw = path.read_bytes()[:-1].split(b"\n")
    st = path.stat()
    assert (head.run_id, head.events, head.head) == ("run1", 3, line_hash(raw[-1]))
    assert (head.dev, head.ino, head.path) == (st.st_dev, st.st_ino, str(path.resolve()))
    assert head.final == json.loads(raw[-1])["final"]
    assert head.replaced == ""
    assert "log_replaced" not in json.loads(raw[-1])
    # In memory only: nothing to record.
    assert AuditLog("run2", None).head() is None


def test_records_round_trip_and_junk_is_skipped(tmp_path: Path) -> None:
    records = tmp_path / "records"
    head = Head("abc123", "/x/a.jsonl", 1, 2, 3, "d" * 64, "e" * 64, "")
    written = write_record(head, records)
    assert written == records / "abc123.json"
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    (records / "junk.json").write_text("{not json")
    (records / "other.json").write_text(json.dumps({"version": 1, "run_id": "abc123"}))
    (records / "typed.json").write_text(
        json.dumps({**json.loads(written.read_text()), "run_id": "typed", "events": "3"})
    )
    assert load_records(records) == {"abc123": head}
    assert load_records(tmp_path / "none") == {}
    with pytest.raises(ValueError):
        write_record(Head("../x", "/x", 1, 2, 3, "d" * 64), records)


def test_a_path_swapped_under_the_writer_is_said_in_the_end_event(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog("run1", path)
    audit.emit("run_start")
    path.rename(tmp_path / "aside.jsonl")
    path.write_text("someone else's file\n")
    assert "now names another file" in audit.replaced()
    end = audit.emit("run_end", returncode=0, end=True)
    audit.close()
    # The events went on into the file stockade opened, wherever it is now.
    kept = [json.loads(line) for line in (tmp_path / "aside.jsonl").read_text().splitlines()]
    assert kept[-1]["log_replaced"] == end["log_replaced"]
    assert "the file was replaced" in end["log_replaced"]
    head = audit.head()
    assert head is not None
    assert head.replaced == end["log_replaced"]
    # Removed rather than replaced: said too. Still there: nothing said.
    gone = AuditLog("run2", tmp_path / "b.jsonl")
    gone.emit("run_start")
    (tmp_path / "b.jsonl").unlink()
    assert "is gone" in gone.emit("run_end", end=True)["log_replaced"]
    gone.close()
    kept_log = AuditLog("run3", tmp_path / "c.jsonl")
    kept_log.emit("run_start")
    assert "log_replaced" not in kept_log.emit("run_end", end=True)
    kept_log.close()


def _forge(path: Path, events: int) -> bytes:
    """What a forger does: read run_start, write a consistent run of ``events`` events
    with a sealed run_end of its own (stockade's code not needed: the chain has no key)."""
    import hashlib

    def h(line: bytes) -> str:
        return hashlib.sha256(line).hexdigest()

    first = path.read_bytes().split(b"\n")[0]
    start = json.loads(first)
    lines, prev = [first], h(first)
    for seq in range(1, events):
        event = {
            "time": start["time"] + seq,
            "run_id": start["run_id"],
            "event": "run_end" if seq == events - 1 else "net_connect",
            "layer": "",
            "verdict": "allow",
            "reason": "",
            "returncode": 0,
            "schema": 1,
            "seq": seq,
            "prev": prev,
        }
        line = json.dumps(event, separators=(",", ":")).encode()
        if seq == events - 1:
            line = line[:-1] + b',"final":"' + h(line).encode() + b'"}'
        lines.append(line)
        prev = h(line)
    return b"\n".join(lines) + b"\n"


def test_authorship_against_the_records(tmp_path: Path) -> None:
    records = tmp_path / "records"
    path = tmp_path / "a.jsonl"
    audit = _run(path, "run1", denials=2)
    head = audit.head()
    assert head is not None
    write_record(head, records)
    recs = load_records(records)

    def check(file: Path) -> tuple[bool, list[str], list[str]]:
        verdict = verify_file(file)
        found = authorship(file, verdict, recs)
        return verdict.ok, found.problems, found.unrecorded

    assert check(path) == (True, [], [])
    # A copy elsewhere is still stockade's log: its run ends where the record says.
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    assert check(copy) == (True, [], [])
    # Forged with as many events, and with fewer: the chain holds, the record does not.
    for events, why in ((4, "is not the one stockade wrote"), (2, "the log was cut")):
        forged = tmp_path / f"forged{events}.jsonl"
        forged.write_bytes(_forge(path, events))
        ok, problems, _ = check(forged)
        assert ok, "a forger's chain verifies on its own: that is the hole"
        assert len(problems) == 1, problems
        assert why in problems[0], problems
    # Extended: a second, valid chain under the same run id after the end.
    extended = tmp_path / "extended.jsonl"
    extended.write_bytes(path.read_bytes() + _forge(path, 2))
    ok, problems, _ = check(extended)
    assert any("events were added" in p for p in problems), problems
    # Rewritten in place (the same inode) with another run: the recorded run is gone.
    genuine = path.read_bytes()
    _run(tmp_path / "third.jsonl", "run3")
    path.write_bytes((tmp_path / "third.jsonl").read_bytes())
    _, problems, _ = check(path)
    assert problems == [
        "run run1: stockade wrote it to this file, which no longer holds it: "
        "the log was cut or rewritten"
    ]
    path.write_bytes(genuine)
    assert check(path) == (True, [], [])
    # Swapped: the forgery renamed over the path stockade wrote.
    os.replace(tmp_path / "forged4.jsonl", path)
    _, problems, _ = check(path)
    assert problems
    assert "is not the one stockade wrote" in problems[0]
    # A file at the recorded path that does not hold the run at all.
    path.write_bytes(b"")
    other = _run(tmp_path / "other.jsonl", "run2")
    path.write_bytes((tmp_path / "other.jsonl").read_bytes())
    _, problems, unrecorded = check(path)
    assert unrecorded == ["run2"]
    assert len(problems) == 1
    assert "does not hold it: the log was swapped" in problems[0]
    assert other.head() is not None
    # No record at all: not a failure, but not authentic either.
    assert check(tmp_path / "other.jsonl") == (True, [], ["run2"])
