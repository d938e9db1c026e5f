"""The audit log out of the sandbox's reach, and its head recorded where it cannot write.

A log the sandboxed command can write is the command's own account of what it did: it
can read ``run_start``, write a whole consistent chain with a sealed ``run_end`` and
rename it over the file, and the chain still verifies. So a run refuses a log path (and
a run-record directory) that the sandbox could write, by the same rule that keeps
``approved.toml`` out of its reach (:func:`stockade._roots.sandbox_writable`: the
workspace, the write grants, a run's scratch directory, minus stockade's trust roots,
which are read-only inside every sandbox); and at the end it records the run's head (:mod:`stockade.audit._record`), against which
``stockade log --verify`` tells stockade's log from anyone else's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stockade._exceptions import SandboxError
from stockade._roots import sandbox_writable
from stockade.audit import AuditLog
from stockade.audit._record import records_dir, write_record
from stockade.policy import Policy


def _default_dir() -> Path:
    from stockade.runtime._state import default_audit_dir

    return default_audit_dir()


def refuse_reachable(path: Path, policy: Policy, *, explicit: bool) -> None:
    """Raise :class:`SandboxError` (exit 125) when the sandbox of ``policy`` could write
    the audit log ``path`` or the run records; ``explicit``: the caller named ``path``
    (``--audit``, ``audit=``), rather than it being the default per-run file."""
    fs = policy.filesystem
    roots = (fs.workspace, *fs.write)
    why = sandbox_writable(path, roots)
    if why is not None:
        if explicit:
            where = (
                f"put it outside the workspace and every filesystem.write path, or leave "
                f"--audit out for the default per-run file under {_default_dir()}"
            )
        else:
            where = "set XDG_STATE_HOME to a directory outside the workspace and every filesystem.write path"
        raise SandboxError(
            f"audit log {why}: it could rewrite its own log (a chain it wrote itself "
            f"verifies); {where}"
        )
    # The records need no such check: they live in stockade's state, a trust root,
    # which every sandbox gets read-only wherever it lies (or the run is refused).
    records = records_dir()
    try:
        records.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        # Without a record the log proves order only: refuse, as for a log that cannot
        # be opened, rather than run with a log no one can authenticate.
        raise SandboxError(
            f"cannot make the run-record directory {records}: {exc.strerror}; "
            "set XDG_STATE_HOME to a writable directory"
        ) from exc


def refuse_linked(audit: AuditLog) -> None:
    """Close ``audit`` and raise :class:`SandboxError` when its file has other hard links:
    another name of the same inode may lie where the sandbox can write."""
    if audit.links > 1:
        audit.close()
        raise SandboxError(
            f"audit log {audit.path} has {audit.links} hard links: another name of the file "
            "may be within the sandbox's reach; give --audit a file of its own"
        )


def record_head(audit: AuditLog, report: Callable[[str], None]) -> None:
    """Record where ``audit``'s chain ended (after :meth:`AuditLog.close`); warn
    (``report``, which the CLI prints) when its path no longer names the file stockade
    wrote, or when no record could be kept. Never raises: the command has run, and its
    status is the run's."""
    head = audit.head()
    if head is None:
        return
    if head.replaced:
        report(
            f"stockade: warning: the audit log was replaced during the run: {head.replaced}; "
            "stockade wrote the run's events to the file it had opened, and its run record "
            "says so ('stockade log --verify' refuses the file now at that path)"
        )
    try:
        write_record(head)
    except OSError as exc:
        report(
            f"stockade: warning: cannot record the audit log's head in {records_dir()}: "
            f"{exc.strerror}; 'stockade log --verify' cannot check who wrote {audit.path}"
        )
