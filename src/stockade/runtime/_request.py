"""What a caller asks of one run (:class:`RunRequest`) and what it gets back
(:class:`RunResult`): the runtime's public data, below its planner and executor."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stockade._record import field, record
from stockade.policy import Policy

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    Event = dict[str, "Any"]
    from typing import IO, Any

    from stockade.egress.approval import ApprovalBroker
    from stockade.runtime._cancel import RunHandle
    from stockade.runtime._egress import EgressPlan
    from stockade.workspace import Layer


@record(frozen=False)
class RunRequest:
    """What to run and how; the policy is already loaded and validated."""

    argv: Sequence[str]
    policy: Policy
    cwd: Path | None = None
    #: append events here; None means one new file per run under the state directory
    audit_path: Path | None = None
    #: keep events in memory only (the API may ask for that); never for the CLI
    audit_to_file: bool = True
    timeout: float | None = None
    stdin: int | IO[Any] | None = None
    stdout: int | IO[Any] | None = None
    stderr: int | IO[Any] | None = None
    input: bytes | None = None
    capture_output: bool = False
    #: a terminal on stdin is relayed through a pty of the command's own (interactive);
    #: False: it is replaced by /dev/null. A terminal on stdout or stderr is relayed
    #: either way: the sandbox never holds the caller's terminal (:mod:`._pty`)
    allow_pty: bool = True
    #: forward SIGINT/SIGTERM/SIGHUP received by this process to the command
    forward_signals: bool = False
    caller_env: Mapping[str, str] | None = None
    on_event: Callable[[Event], None] | None = None
    #: the egress preparation shared by the runs of one Sandbox (None: made per run)
    egress: EgressPlan | None = None
    #: the approval broker (:class:`~stockade.egress.approval.ApprovalBroker`): asks and
    #: live changes; None: the policy is all there is
    approval: ApprovalBroker | None = None
    #: a :class:`~stockade.runtime._cancel.RunHandle`: the sandbox's outermost process is
    #: attached to it once started, so another thread can kill the tree (cancellation,
    #: ``Sandbox.popen``)
    handle: RunHandle | None = None
    #: a host directory bound at /tmp (``Sandbox(tmp="session")``); None: a fresh tmpfs
    tmp: Path | None = None
    #: an overlay workspace's existing layer (:class:`stockade.workspace.Layer`) to mount
    #: again, as the runs of one overlay Sandbox share one; None: a new one per run
    overlay_layer: Layer | None = None
    #: the learn mode's file observer (:class:`stockade.enforce.observe.SyscallObserver`):
    #: the launcher hands it a seccomp listener; None: nothing is observed
    observer: Any = None
    #: where a warning for the person goes, one line each (the CLI prints them to
    #: stderr); the runtime prints nothing itself. They are in ``RunResult.warnings`` too
    report: Callable[[str], None] | None = None


@record(frozen=False)
class RunResult:
    """The outcome of one run."""

    argv: list[str]
    returncode: int
    run_id: str
    stdout: bytes | None = None
    stderr: bytes | None = None
    events: list[Event] = field(default_factory=list)
    audit_path: Path | None = None
    timed_out: bool = False
    duration: float = 0.0
    #: an overlay run's layer directory (``stockade changes RUN_ID`` reads it)
    layer: Path | None = None
    #: the warnings the run gave (each also went to ``RunRequest.report``)
    warnings: list[str] = field(default_factory=list)

    @property
    def denials(self) -> list[Event]:
        """The events whose verdict is ``deny``."""
        return [e for e in self.events if e.get("verdict") == "deny"]

    @property
    def changes(self) -> list[Any]:
        """An overlay run's changes (:class:`stockade.workspace.Change`); [] otherwise."""
        if self.layer is None:
            return []
        from stockade.workspace import Layer, scan

        return scan(Layer(self.layer))
