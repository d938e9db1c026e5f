"""The model under the landlock backend (issue 28): what it keeps, what it loses."""

from __future__ import annotations

from pathlib import Path

from stockade._record import replace
from stockade.model import Action, Boundary, Kind, Route, evaluate
from stockade.policy import Reason, load_policy
from stockade.policy._model import ContainerPolicy
from stockade.probe import scenarios


def _boundary(tmp_path: Path, backend: str, degraded: bool = False) -> Boundary:
    policy = load_policy(None, workspace=tmp_path)
    policy = replace(policy, container=ContainerPolicy(backend=backend, allow_degraded=degraded))
    return Boundary(policy)


def test_container_is_only_the_reaper(tmp_path: Path) -> None:
    b = _boundary(tmp_path, "landlock")
    survive = Action("survive", Kind.PROCESS_SURVIVE, "daemon", False)
    assert b.stops("container", survive) is Reason.PROCESS_CONTAINED
    for action in (
        Action("userns", Kind.SYSCALL, "userns", False),
        Action("sock", Kind.UNIX_CONNECT, "/run/docker.sock", False),
        Action("read", Kind.FILE_READ, "/root/.ssh/id_rsa", False),
        Action("signal", Kind.PROCESS_SIGNAL, "pid 1", False),
    ):
        assert b.stops("container", action) is None, action.id
        assert _boundary(tmp_path, "bubblewrap").stops("container", action) is not None


def test_files_carries_protected_paths_and_system_secrets(tmp_path: Path) -> None:
    b = _boundary(tmp_path, "landlock")
    hook = Action("hook", Kind.FILE_WRITE, str(tmp_path / ".git" / "hooks" / "pre-commit"), False)
    shadow = Action("shadow", Kind.FILE_READ, "/etc/shadow", False)
    assert b.stops("files", hook) is Reason.PATH_PROTECTED
    assert b.stops("files", shadow) is Reason.PATH_DENIED
    # the twins: a workspace file and /etc/passwd stay open
    ok_write = Action("w", Kind.FILE_WRITE, str(tmp_path / "src" / "a.py"), True)
    ok_read = Action("r", Kind.FILE_READ, "/etc/passwd", True)
    assert b.stops("files", ok_write) is None
    assert b.stops("files", ok_read) is None
    # under bubblewrap these are the container's (binds and masks), not Landlock's
    bw = _boundary(tmp_path, "bubblewrap")
    assert bw.stops("files", hook) is None
    assert bw.stops("files", shadow) is None


def test_egress_and_abstract_sockets(tmp_path: Path) -> None:
    b = _boundary(tmp_path, "landlock")
    direct = Action("c", Kind.NET_CONNECT, "127.0.0.1:9", False, host="127.0.0.1", port=9)
    assert b.stops("egress", direct, Route.DIRECT) is Reason.UNSUPPORTED_PROTOCOL
    abstract = Action("a", Kind.UNIX_CONNECT, "@bus", False)
    # no network namespace: only Landlock's scope (files) keeps the host's abstract sockets
    assert b.stops("egress", abstract) is None
    assert _boundary(tmp_path, "bubblewrap").stops("egress", abstract) is not None
    assert b.stops("files", abstract) is Reason.PROCESS_CONTAINED


def test_pids_cap_only_in_a_cgroup(tmp_path: Path) -> None:
    fork = Action("fork", Kind.RESOURCE, "pids", False, amount=10**6)
    assert _boundary(tmp_path, "landlock").stops("limits", fork) is None
    in_cgroup = Boundary(_boundary(tmp_path, "landlock").policy, cgroup=True)
    assert in_cgroup.stops("limits", fork) is Reason.LIMIT_PIDS
    assert _boundary(tmp_path, "bubblewrap").stops("limits", fork) is Reason.LIMIT_PIDS


def test_auto_is_judged_as_its_worst_case(tmp_path: Path) -> None:
    assert _boundary(tmp_path, "auto").backend == "bubblewrap"
    assert _boundary(tmp_path, "auto", degraded=True).backend == "landlock"


def test_what_landlock_loses_on_the_extended_scenario() -> None:
    layout = scenarios.Layout(Path("/nonexistent-probe-world"))
    sc = scenarios.build("extended", layout)
    active = sc.policy.layers.active()
    bw = evaluate(Boundary(sc.policy, runtime="bubblewrap"), sc.actions, active)
    ll = evaluate(Boundary(sc.policy, runtime="landlock"), sc.actions, active)
    through = {o.action.id for o in ll.outcomes if o.through and not o.action.needed}
    held = {o.action.id for o in bw.outcomes if not o.through}
    assert through & held == {"host-socket"}
    # every needed action still works
    assert all(o.through for o in ll.outcomes if o.action.needed)
