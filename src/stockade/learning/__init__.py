"""Learn mode: observe a task, suggest the smallest policy, verify it, report drift.

::

    import stockade
    from stockade.learning import suggest_from, verify, drift

    result = stockade.learn(["pytest", "-q"], workspace="~/project", runs=2, out="learn-run")
    text = suggest_from([result.run_dir]).to_toml()

DESIGN §3: learning is L3; it drives the runtime and the policy loader (and, for the
attack scenario, the probe, a client of ``api``), and nothing below imports it. The
package is named ``learning`` so that ``stockade.learn`` can be a plain function (this
package's :func:`learn`, which ``stockade`` loads on first use, as it loads
``stockade.run`` from ``api``): a subpackage named ``learn`` would replace that attribute
of ``stockade`` whenever it is imported. See docs/learn.md.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stockade._exceptions import PolicyError, Unavailable
from stockade.learning._observe import (
    LEARN_VISIBLE,
    LearnResult,
    RunDir,
    env_observations,
    file_observations,
    learning_policy,
    observations_from_events,
    run_record,
)
from stockade.learning._suggest import Suggestion, suggest
from stockade.policy import Policy, load_policy

__all__ = [
    "LEARN_VISIBLE",
    "LearnResult",
    "RunDir",
    "Suggestion",
    "VerifyResult",
    "drift",
    "learn",
    "learning_policy",
    "suggest",
    "suggest_from",
    "verify",
]


def _load(
    policy: Policy | str | os.PathLike[str] | None, workspace: str | os.PathLike[str] | None
) -> Policy:
    ws = Path(os.path.expanduser(os.fspath(workspace))).resolve() if workspace else None
    if isinstance(policy, Policy):
        if ws is None:
            return policy
        from stockade._record import replace

        return replace(policy, filesystem=replace(policy.filesystem, workspace=ws))
    return load_policy(Path(os.fspath(policy)) if policy is not None else None, workspace=ws)


def _execute(
    argv: Sequence[str],
    policy: Policy,
    *,
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
    env: Mapping[str, str] | None,
    observer: Any = None,
) -> Any:
    from stockade.runtime import RunRequest, execute

    return execute(
        RunRequest(
            list(argv),
            policy,
            cwd=Path(os.fspath(cwd)) if cwd is not None else None,
            audit_to_file=False,
            timeout=timeout,
            capture_output=True,
            allow_pty=False,
            caller_env=env,
            observer=observer,
        )
    )


def _run_dir(out: str | os.PathLike[str] | None, learning: Policy, env: Mapping[str, str]) -> Path:
    """Where the observations go: ``out``, or a new directory in stockade's state.

    ``suggest`` turns what is written there into policy lines, so a sandbox that could
    write there (the next learning run, any later run in the workspace) could append an
    observation of its own and have a host of its choosing proposed: a place any learning
    or run sandbox can write is refused, as an ``--audit`` log in the workspace is.
    """
    from stockade import _roots
    from stockade._exceptions import PolicyError

    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return _roots.state_dir(env) / "learn" / f"{stamp}-{os.getpid()}"
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(out))))
    fs = learning.filesystem
    why = _roots.sandbox_writable(path, (fs.workspace, *(Path(w) for w in fs.write)), env=env)
    if why is not None:
        raise PolicyError(
            f"learn: the run directory {path}: {why}, and it could add observations "
            "that policy suggest would turn into policy lines; put it outside the "
            "workspace (or leave -o out: a directory in stockade's state is made)"
        )
    return path


def learn(
    argv: Sequence[str],
    *,
    policy: Policy | str | os.PathLike[str] | None = None,
    workspace: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    runs: int = 1,
    see: Sequence[str | os.PathLike[str]] = (),
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> LearnResult:
    """Run ``argv`` ``runs`` times in learning mode and record what it needed.

    Args:
        argv: the task.
        policy: the policy learning starts from (its ``deny`` entries, pins, layers and
            ``env.pass`` stand); default: the usual search order.
        workspace: the read-write root (overrides the policy's).
        out: the run directory; learning again into one adds runs (default: a new one
            in stockade's state, ``$XDG_STATE_HOME/stockade/learn/``); one a sandbox
            could write (the workspace, a write grant) is refused.
        runs: how many times the task runs (the observations merge).
        see: host directories made readable besides :data:`LEARN_VISIBLE`.
        cwd, timeout, env: as for :func:`stockade.run`.

    Raises:
        PolicyError: the policy is invalid, a ``see`` path is missing, or ``out`` lies
            where a sandbox could write.
        Unavailable: the observer cannot run here (no launcher, gVisor).
        ValueError: ``runs`` below 1.
    """
    from stockade.enforce import environment, paths
    from stockade.enforce.observe import MECHANISM, SyscallObserver

    if runs < 1:
        raise ValueError(f"runs {runs!r}: learn at least once")
    base = _load(policy, workspace)
    if base.container.backend == "gvisor":
        # Refused here, before a run directory or a sandbox exists (the runtime refuses
        # an observer it cannot attach as well): under gVisor the Sentry serves the
        # task's system calls itself, so a seccomp listener on the host sees none of them
        # and the suggestion would miss every file the task needs.
        raise Unavailable(
            "learning under the gVisor backend (the Sentry serves the task's system calls "
            "itself: stockade's file observer would see none of them)",
            "learn with the bubblewrap or landlock backend; the suggested policy can then "
            'run with backend = "gvisor"',
        )
    see_paths = [Path(os.path.abspath(os.path.expanduser(os.fspath(p)))) for p in see]
    learning = learning_policy(base, see_paths)
    caller = dict(os.environ if env is None else env)
    run_dir = RunDir(_run_dir(out, learning, caller))
    home = str(paths.caller_home(caller))
    passed = environment.build_environment(
        caller,
        base.env,
        home=home,
        enabled=base.layers.secrets,
    ).env
    # the caller's PATH tools are bound in every run (as in learning): not observations
    toolchains = paths.toolchain_paths(caller.get("PATH", ""), Path(home))
    result = LearnResult(run_dir.path, mechanism=MECHANISM)
    for _ in range(runs):
        observer = SyscallObserver()
        started = time.monotonic()
        try:
            run = _execute(argv, learning, cwd=cwd, timeout=timeout, env=caller, observer=observer)
        finally:
            observer.stop()
        duration = time.monotonic() - started
        from_events = observations_from_events(run.events)
        # a write both opened (the observer) and found in a scratch view is one write
        written = {o["path"] for o in from_events if o["kind"] == "write"}
        files = [
            o
            for o in file_observations(
                observer.seen, base.filesystem.workspace, home, see_paths, granted=toolchains
            )
            if not (o["kind"] == "write" and o["path"] in written)
        ]
        observations = [*from_events, *files, *env_observations(passed)]
        if observer.error or not observer.attached:
            observations.append(
                {"kind": "observer", "detail": observer.error or "the listener never arrived"}
            )
        run_dir.append(run_record(argv, base, run, duration, MECHANISM), observations)
        result.returncodes.append(run.returncode)
        result.stdout, result.stderr = run.stdout, run.stderr
        result.observations += observations
    return result


def _gather(
    run_dirs: Sequence[str | os.PathLike[str]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    observations: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for item in run_dirs:
        rd = RunDir(Path(os.fspath(item)))
        summaries.append(rd.summary())
        observations += rd.observations()
    return observations, summaries


def suggest_from(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    base: Policy | None = None,
    grace_days: int = 0,
    today: datetime.date | None = None,
) -> Suggestion:
    """:func:`suggest` over the merged observations of ``run_dirs``; ``base``'s
    ``env.pass`` names may be suggested (default: none). ``grace_days``: the policy
    states a grace period ending that many days after ``today`` (UTC), at most
    ``GRACE_MAX_DAYS`` (docs/learn.md, "Drift during a grace period"); 0: none."""
    from stockade.policy._load import GRACE_MAX_DAYS

    if not 0 <= grace_days <= GRACE_MAX_DAYS:
        raise PolicyError(
            f"--grace {grace_days}: a grace period is 1 to {GRACE_MAX_DAYS} days (0: none)"
        )
    observations, summaries = _gather(run_dirs)
    env_pass = [e.name for e in base.env.pass_] if base is not None else []
    out = suggest(observations, summaries, env_pass=env_pass)
    if grace_days:
        day = today if today is not None else datetime.datetime.now(datetime.UTC).date()
        out.grace_until = (day + datetime.timedelta(days=grace_days)).isoformat()
    return out


class VerifyResult:
    """What :func:`verify` found: the task's run under the policy, and the attack
    scenario's open unneeded actions (``None`` when the scenario was not run)."""

    def __init__(self) -> None:
        self.returncode = 0
        self.expected_returncode: int | None = None
        self.output_matches: bool | None = None
        #: needed actions the policy broke: each a short text (refusals, exit, output)
        self.broken: list[str] = []
        #: unneeded actions of the attack scenario still open (id, explanation)
        self.open: list[tuple[str, str]] | None = None
        #: unneeded actions of the attack scenario stopped
        self.stopped: list[str] = []

    @property
    def passed(self) -> bool:
        """True when no needed action broke (and the scenario, if run, ran)."""
        return not self.broken


def verify(
    policy: Policy | str | os.PathLike[str],
    argv: Sequence[str],
    *,
    learned: Sequence[str | os.PathLike[str]] = (),
    workspace: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    attacks: bool = True,
) -> VerifyResult:
    """Re-run ``argv`` under ``policy`` and count the needed actions it breaks: every
    refusal of the run that learning did not refuse too, and an exit status or output
    that differs from the learning runs in ``learned``; then (``attacks``) run the probe's seed scenario under the same
    policy's network and file grants and list its unneeded actions still open."""
    import hashlib

    loaded = _load(policy, workspace)
    if loaded.network.grace_until is not None:
        # Verified as it will be enforced once the grace period is over: in it, a host
        # the policy lacks would be let through and no needed action could break.
        from stockade._record import replace

        loaded = replace(loaded, network=replace(loaded.network, grace_until=None))
    out = VerifyResult()
    run = _execute(argv, loaded, cwd=cwd, timeout=timeout, env=env)
    out.returncode = run.returncode
    observations, summaries = _gather(learned) if learned else ([], [])
    # what learning refused too (a metadata address) was never a needed action
    refused_anyway = {
        (o.get("host"), o.get("port"))
        for o in observations
        if o.get("kind") in ("connect", "request") and o.get("verdict") != "allow"
    }
    for event in run.denials:
        if (event.get("host"), event.get("port")) in refused_anyway:
            continue
        what = event.get("host") or event.get("path") or event.get("detail") or ""
        port = f":{event['port']}" if event.get("port") else ""
        req = f" {event.get('method')} {event.get('path')}" if event.get("method") else ""
        out.broken.append(f"{event.get('event')}: {what}{port}{req} ({event.get('reason')})")
    runs = [r for s in summaries for r in s.get("runs", [])]
    if runs:
        last = runs[-1]
        out.expected_returncode = int(last["returncode"])
        if run.returncode != out.expected_returncode:
            tail = (run.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
            out.broken.append(
                f"exit status {run.returncode}, learning runs exited {out.expected_returncode}"
                + (f" (its last error line: {tail[0][:200]})" if tail else "")
            )
        digest = hashlib.sha256(run.stdout or b"").hexdigest()
        out.output_matches = digest == last["stdout_sha256"]
        if not out.output_matches:
            out.broken.append("the output differs from the learning run's")
    if attacks:
        from stockade.learning._attacks import attack_scenario

        out.open, out.stopped = attack_scenario(loaded)
    return out


def drift(
    policy: Policy | str | os.PathLike[str],
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    workspace: str | os.PathLike[str] | None = None,
) -> list[str]:
    """What the runs in ``run_dirs`` needed that ``policy`` does not admit: one line per
    observation, for a person to extend the policy deliberately."""
    loaded = _load(policy, workspace)
    from stockade.learning._drift import not_admitted

    observations, summaries = _gather(run_dirs)
    return not_admitted(loaded, observations, summaries)
