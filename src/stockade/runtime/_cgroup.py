"""The run's cgroup (limits layer): where one can be made, and making it, or noting in
the audit log that the run has per-process rlimits only."""

from __future__ import annotations

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from stockade.audit import AuditLog
    from stockade.policy import Policy


def support(policy: Policy) -> Any:
    """Where this run's cgroup can be made (None: nowhere, or the layer is off); read
    from /proc and /sys, nothing made (the run's plan holds it)."""
    if not policy.layers.limits:
        return None
    from stockade.enforce import limits

    return limits.detect()


def prime(support: Any) -> None:
    """Start paying the kernel's first-move cost in the background, as soon as the run
    starts (:func:`limits.prime_attach`): it overlaps with the run's preparation."""
    from stockade.enforce import limits

    limits.prime_attach(support)


def make(policy: Policy, support: Any, audit: AuditLog) -> Any:
    """A cgroup for this run in ``support``, else None (noted in the audit log)."""
    from stockade.enforce import limits

    try:
        pids = policy.limits.pids
        if policy.container.backend == "gvisor":
            from stockade.enforce import gvisor

            # The cgroup holds the runsc tree, whose host tasks are not the command's:
            # inside, the Sentry enforces RLIMIT_NPROC = pids itself (gvisor.host_pids).
            pids = gvisor.host_pids(pids)
        return limits.Cgroup.create(
            support,
            limits.cgroup_name(audit.run_id),
            pids=pids,
            memory=policy.limits.memory,
        )
    except OSError as exc:
        audit.emit(
            "layer_note",
            layer="limits",
            verdict="report",
            reason="limit-pids",
            detail=f"no cgroup ({exc.strerror}); per-process rlimits only",
        )
        return None
