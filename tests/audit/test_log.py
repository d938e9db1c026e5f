"""The audit sink writes a hash chain: real files, read back byte for byte."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from stockade.audit import AuditLog
from stockade.audit._chain import SCHEMA, line_hash, seed, unseal
from stockade.audit._verify import verify_file
from stockade.policy import Decision, Reason


def lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def test_every_event_names_the_hash_of_the_line_before(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog("run1", path)
    audit.emit("run_start", policy_hash="sha256:" + "ab" * 32, argv=["true"])
    audit.decision("denied", Decision.deny("egress", Reason.HOST_NOT_ALLOWED), host="x.test")
    end = audit.emit("run_end", returncode=0, end=True)
    audit.close()
    raw = lines(path)
    events = [json.loads(line) for line in raw]
    # What the API returns is what the file holds, chain fields included.
    assert events == audit.events
    assert [e["schema"] for e in events] == [SCHEMA] * 3
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert events[0]["prev"] == seed(events[0])
    assert events[1]["prev"] == line_hash(raw[0])
    assert events[2]["prev"] == line_hash(raw[1])
    # The end is sealed: its final hash covers its own line, written without it.
    assert "final" not in events[0]
    assert "final" not in events[1]
    unsealed = unseal(raw[2])
    assert unsealed is not None
    assert unsealed[1] == end["final"] == line_hash(unsealed[0])
    assert "final" not in json.loads(unsealed[0])
    assert verify_file(path).ok


def test_the_seed_binds_the_policy_the_run_id_and_the_start() -> None:
    first = {"run_id": "r", "time": 1700000000.25, "policy_hash": "sha256:00"}
    for name, other in (("run_id", "s"), ("time", 1700000000.5), ("policy_hash", "sha256:01")):
        assert seed({**first, name: other}) != seed(first)
    # As JSON gives the values back, so the verifier finds the writer's seed.
    assert seed(json.loads(json.dumps(first))) == seed(first)


def test_a_callers_fields_cannot_forge_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog("run1", path)
    audit.emit("run_start", seq=7, prev="0" * 64, schema=99, final="f" * 64, run_id="other")
    audit.emit("run_end", returncode=0, end=True)
    audit.close()
    first = json.loads(lines(path)[0])
    assert (first["run_id"], first["seq"], first["schema"]) == ("run1", 0, SCHEMA)
    assert first["prev"] == seed(first)
    assert "final" not in first
    assert verify_file(path).ok


def test_close_seals_a_log_left_without_its_end(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog("run1", path)
    audit.emit("run_start")
    audit.emit("denied", verdict="deny")
    audit.close()  # as when a run stops on an error before run_end
    events = [json.loads(line) for line in lines(path)]
    assert [e["event"] for e in events] == ["run_start", "denied", "log_end"]
    assert "final" in events[-1]
    assert verify_file(path).ok


def test_close_adds_nothing_after_an_end_or_to_an_empty_log(tmp_path: Path) -> None:
    ended = AuditLog("run1", tmp_path / "a.jsonl")
    ended.emit("run_end", returncode=0, end=True)
    ended.close()
    assert len(lines(tmp_path / "a.jsonl")) == 1
    empty = AuditLog("run2", tmp_path / "b.jsonl")
    empty.close()
    assert (tmp_path / "b.jsonl").read_bytes() == b""


def test_threads_writing_one_run_keep_one_chain(tmp_path: Path) -> None:
    # The proxy's thread and the runtime's write to the same run: the order of the
    # lines must be the order of the chain.
    path = tmp_path / "a.jsonl"
    audit = AuditLog("run1", path)
    audit.emit("run_start")

    def writer(n: int) -> None:
        for i in range(200):
            audit.emit("net_connect", host=f"h{n}-{i}.test")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    audit.emit("run_end", returncode=0, end=True)
    audit.close()
    verdict = verify_file(path)
    assert verdict.ok, verdict.problems
    assert verdict.events == 802


def test_runs_sharing_one_file_chain_independently(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    a, b = AuditLog("aaaa", path), AuditLog("bbbb", path)
    a.emit("run_start", policy_hash="sha256:aa")
    b.emit("run_start", policy_hash="sha256:bb")
    b.emit("denied", verdict="deny")
    a.emit("denied", verdict="deny")
    a.emit("run_end", returncode=0, end=True)
    b.emit("run_end", returncode=1, end=True)
    a.close()
    b.close()
    runs = [json.loads(line)["run_id"] for line in lines(path)]
    assert runs == ["aaaa", "bbbb", "bbbb", "aaaa", "aaaa", "bbbb"]
    verdict = verify_file(path)
    assert verdict.ok
    assert verdict.runs == 2


def test_a_forked_writer_starts_a_chain_of_its_own(tmp_path: Path) -> None:
    # The run server's workers are forks holding the server's log: their events
    # cannot continue the chain the server goes on writing.
    path = tmp_path / "server.jsonl"
    audit = AuditLog("server-k", path)
    audit.emit("server_start")
    parent_head = json.loads(lines(path)[-1])
    pid = os.fork()
    if pid == 0:
        try:
            audit.emit("server_run", argv=["true"], end=True)
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    audit.emit("server_stop", end=True)
    audit.close()
    events = [json.loads(line) for line in lines(path)]
    worker = next(e for e in events if e["event"] == "server_run")
    assert worker["run_id"] == f"server-k.{pid}"
    assert worker["seq"] == 0
    assert worker["fork_of"] == line_hash(lines(path)[0])
    assert worker["prev"] == seed(worker)
    assert events[-1]["run_id"] == "server-k"
    assert events[-1]["seq"] == 1
    assert parent_head["seq"] == 0
    verdict = verify_file(path)
    assert verdict.ok, verdict.problems
    assert verdict.runs == 2
