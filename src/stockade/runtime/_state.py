"""Where stockade keeps a run's records on the host: its state directory (audit logs,
the workspaces' placeholder registry), and the error that names the fix when it cannot
be made."""

from __future__ import annotations

from pathlib import Path

from stockade import _roots
from stockade._exceptions import SandboxError


def default_audit_dir() -> Path:
    """``$XDG_STATE_HOME/stockade/runs`` (``~/.local/state`` when unset or relative): in
    stockade's state, the trust root every sandbox gets read-only."""
    return _roots.state_dir() / "runs"


def require_state_dir(path: Path, what: str, *, audit_option: bool = False) -> None:
    """Make stockade's state directory ``path`` (where it keeps ``what``), or raise a
    :class:`SandboxError` that names it and the fix (``XDG_STATE_HOME``)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        either = " (or pass --audit FILE)" if audit_option else ""
        raise SandboxError(
            f"cannot create {path}, where stockade keeps {what}: {exc.strerror}; set "
            f"XDG_STATE_HOME to a writable directory{either}"
        ) from None
