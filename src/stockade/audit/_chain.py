"""The hash chain of the audit log, and its verification.

Every event of a run carries ``schema`` (the format version), ``seq`` (its place in the
run, from 0) and ``prev`` (the SHA-256, in hex, of the previous event's line exactly as it
was written, without its newline). The first event's ``prev`` is the run's *seed*, a hash
of the run id, the first event's ``time``, its ``policy_hash`` (``run_start`` carries the
policy digest) and, for a chain begun in a forked process, ``fork_of``. The run's last
event (``run_end``, or ``log_end`` when the log was closed before one) ends with
``"final"``: the hash of its own line without that field, which seals the end.

Hashing the written bytes, rather than a re-serialisation of the parsed object, means the
verifier never has to reproduce the writer's JSON spelling (key order, float digits,
escapes): a line verifies only if it is byte for byte what was written.

A chain shows that a log was edited, cut or reordered by someone who did not rewrite the
hashes after the change. It cannot stop whoever holds the file from writing a whole new
consistent run: the runtime records each run's head where the sandbox cannot write
(:mod:`stockade.audit._record`), and ``stockade log --verify`` checks logs against it;
beyond the machine, keep the ``final`` hash of a run (the API returns it in ``run_end``)
somewhere the user cannot write either.
"""

from __future__ import annotations

from stockade._hash import sha256_hex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: the audit event format written by this stockade (the ``schema`` field of every event)
SCHEMA = 1
#: the bytes a sealed line ends with, before the hash and after it
_SEAL_OPEN = b',"final":"'
_SEAL_CLOSE = b'"}'
HEX_LEN = 64


def line_hash(line: bytes) -> str:
    """The hash of one written line (without its newline), as the next event's ``prev``."""
    return sha256_hex(line)


def seed(event: Mapping[str, Any]) -> str:
    """The ``prev`` of a run's first event: binds the run id, its start and its policy.

    The writer applies this to the event it is about to write, the verifier to the event
    it parsed; both see the same strings and numbers, since JSON gives them back as
    written (a float's ``repr`` is its JSON spelling).
    """

    def text(name: str) -> str:
        value = event.get(name)
        if isinstance(value, str):
            return value
        if isinstance(value, int | float):
            return repr(value)
        return ""

    material = "\n".join(
        (
            "stockade-audit-seed/1",  # fixed: a later schema keeps reading these seeds
            text("run_id"),
            text("time"),
            text("policy_hash"),
            text("fork_of"),
        )
    )
    return sha256_hex(material.encode())


def seal(line: bytes) -> tuple[bytes, str]:
    """Append ``"final"`` to a compact JSON object ``line``; returns it and the hash."""
    final = line_hash(line)
    return line[:-1] + _SEAL_OPEN + final.encode() + _SEAL_CLOSE, final


def unseal(line: bytes) -> tuple[bytes, str] | None:
    """The line as it was before :func:`seal`, and its ``final``; ``None`` if unsealed."""
    tail = len(_SEAL_OPEN) + HEX_LEN + len(_SEAL_CLOSE)
    if len(line) <= tail or not line.endswith(_SEAL_CLOSE):
        return None
    if line[-tail : -tail + len(_SEAL_OPEN)] != _SEAL_OPEN:
        return None
    final = line[-HEX_LEN - len(_SEAL_CLOSE) : -len(_SEAL_CLOSE)].decode("ascii", "replace")
    return line[:-tail] + b"}", final
