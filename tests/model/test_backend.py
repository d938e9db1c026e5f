"""The model under each container runtime: what gVisor changes, each with its twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade._record import replace
from stockade.model import (
    Action,
    Boundary,
    Kind,
    Route,
    check_monotonic,
    evaluate,
    exercised_layers,
    kernel_only,
    subsets,
)
from stockade.policy import LAYERS, FilesystemPolicy, NetworkPolicy, Policy, Reason
from stockade.policy._model import ContainerPolicy
from stockade.probe import scenarios
from stockade.probe.scenarios import Layout

POLICY = Policy(
    filesystem=FilesystemPolicy(workspace=Path("/w")),
    network=NetworkPolicy(allow=("reg.test",)),
)
GVISOR_POLICY = replace(POLICY, container=ContainerPolicy(backend="gvisor"))
BWRAP = Boundary(POLICY)
GVISOR = Boundary(GVISOR_POLICY)

HOST_KERNEL = Action("k", Kind.HOST_KERNEL, "sendmsg:SCM_RIGHTS", False)
SSH = Action("ssh", Kind.FILE_READ, "/home/u/.ssh/id_ed25519", False)
WORKSPACE = Action("ws", Kind.FILE_READ, "/w/src/app.py", True)
ABSTRACT = Action("a", Kind.UNIX_CONNECT, "@/tmp/.X11-unix/X0", False)
SIGNAL = Action("sig", Kind.PROCESS_SIGNAL, "pid 1", False)
USERNS = Action("u", Kind.SYSCALL, "userns", False)
BPF = Action("b", Kind.SYSCALL, "bpf", False)
EVIL = Action("e", Kind.NET_CONNECT, "evil.test:443", False, host="evil.test", port=443)
REGISTRY = Action("r", Kind.NET_CONNECT, "reg.test:443", True, host="reg.test", port=443)
ACTIONS = (HOST_KERNEL, SSH, WORKSPACE, ABSTRACT, SIGNAL, USERNS, BPF, EVIL, REGISTRY)


def test_the_boundary_reads_the_policys_backend_and_can_be_told_another() -> None:
    assert BWRAP.backend == "bubblewrap"
    assert not BWRAP.own_kernel
    assert GVISOR.backend == "gvisor"
    assert GVISOR.own_kernel
    assert BWRAP.with_backend("gvisor").own_kernel
    assert not GVISOR.with_backend("bubblewrap").own_kernel
    assert BWRAP.with_backend("gvisor").policy is POLICY
    with pytest.raises(ValueError, match="unknown backend 'firecracker'"):
        Boundary(POLICY, runtime="firecracker")


def test_the_host_kernel_action_is_stopped_by_the_gvisor_container_alone() -> None:
    assert GVISOR.stops("container", HOST_KERNEL) == Reason.PROCESS_CONTAINED
    for layer in LAYERS:
        if layer != "container":
            assert GVISOR.stops(layer, HOST_KERNEL) is None, layer


def test_on_bubblewrap_no_layer_stops_the_host_kernel_action() -> None:
    # The twin: the same call on the host kernel; every layer lets it on (the seccomp
    # filter allows sendmsg on a unix socket), so all of them together do too.
    for layer in LAYERS:
        assert BWRAP.stops(layer, HOST_KERNEL) is None, layer
    assert evaluate(BWRAP, (HOST_KERNEL,), LAYERS).outcome("k").through
    for subset in subsets(LAYERS):
        through = evaluate(GVISOR, (HOST_KERNEL,), subset).outcome("k").through
        assert through is ("container" not in subset), subset


def test_files_stops_nothing_under_gvisor_and_the_container_still_hides_home() -> None:
    for action in (SSH, SIGNAL, ABSTRACT, Action("w", Kind.FILE_WRITE, "/etc/x", False)):
        assert GVISOR.stops("files", action) is None, action.id
    assert BWRAP.stops("files", SSH) == Reason.PATH_NOT_GRANTED
    assert BWRAP.stops("files", SIGNAL) == Reason.PROCESS_CONTAINED
    assert GVISOR.stops("container", SSH) == Reason.PATH_NOT_GRANTED
    assert GVISOR.stops("container", WORKSPACE) is None
    assert "files" not in exercised_layers(GVISOR, ACTIONS)
    assert "files" in exercised_layers(BWRAP, ACTIONS)


def test_abstract_sockets_stay_in_the_sentry() -> None:
    assert GVISOR.stops("container", ABSTRACT) == Reason.PROCESS_CONTAINED
    assert GVISOR.stops("egress", ABSTRACT) is None
    # On the host kernel the abstract namespace is the network namespace's.
    assert BWRAP.stops("container", ABSTRACT) is None
    assert BWRAP.stops("egress", ABSTRACT) == Reason.UNSUPPORTED_PROTOCOL


def test_a_user_namespace_is_the_sentrys_own_only_seccomp_refuses_it() -> None:
    assert GVISOR.stops("container", USERNS) is None
    assert BWRAP.stops("container", USERNS) == Reason.SYSCALL_BLOCKED
    for boundary in (BWRAP, GVISOR):
        assert boundary.stops("syscalls", USERNS) == Reason.SYSCALL_BLOCKED
        assert boundary.stops("syscalls", BPF) == Reason.SYSCALL_BLOCKED
        assert boundary.stops("container", BPF) is None


def test_egress_not_the_gvisor_container_stops_the_direct_route() -> None:
    # With egress off the gVisor entry makes no network namespace (runsc's host
    # networking is the caller's, as bubblewrap's --share-net): the container alone
    # lets a socket that ignores the proxy out, and egress's netns stops it.
    assert GVISOR.stops("container", EVIL, Route.DIRECT) is None
    assert GVISOR.stops("egress", EVIL, Route.DIRECT) == Reason.UNSUPPORTED_PROTOCOL
    assert GVISOR.stops("container", EVIL, Route.PROXY) is None
    # The proxy route stays egress's to judge: the allowed host is let on.
    assert GVISOR.stops("egress", REGISTRY, Route.PROXY) is None
    assert GVISOR.stops("egress", EVIL, Route.PROXY) == Reason.HOST_NOT_ALLOWED
    assert BWRAP.stops("container", EVIL, Route.DIRECT) is None
    full = evaluate(GVISOR, ACTIONS, LAYERS)
    assert full.outcome("r").through
    assert full.broken_needed == 0


def test_monotonic_on_every_subset_under_gvisor() -> None:
    assert check_monotonic(GVISOR, ACTIONS) == []
    for name in scenarios.SCENARIOS:
        sc = scenarios.build(name, Layout(Path("/w")))
        boundary = Boundary(sc.policy).with_backend("gvisor")
        assert check_monotonic(boundary, sc.actions) == [], name


def test_kernel_only_names_what_only_a_kernel_of_its_own_stops() -> None:
    assert kernel_only(BWRAP, ACTIONS) == ("k",)
    assert kernel_only(GVISOR, ACTIONS) == ("k",)
    extended = scenarios.build("extended", Layout(Path("/w")))
    assert kernel_only(Boundary(extended.policy), extended.actions) == ("host-kernel",)
    seed = scenarios.build("seed", Layout(Path("/w")))
    assert kernel_only(Boundary(seed.policy), seed.actions) == ()


def test_the_extended_scenario_under_gvisor_every_layer_on() -> None:
    sc = scenarios.build("extended", Layout(Path("/w")))
    boundary = Boundary(sc.policy).with_backend("gvisor")
    ev = evaluate(boundary, sc.actions, LAYERS)
    stoppers = {o.action.id: [layer for layer, _ in o.stopped_by] for o in ev.outcomes}
    assert stoppers["host-kernel"] == ["container"]
    assert stoppers["read-ssh-key"] == ["container"]
    assert stoppers["nested-userns"] == ["syscalls"]
    assert ev.open_unneeded == 0
    assert ev.broken_needed == 0
