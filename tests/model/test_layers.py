"""Each layer's predicate on hand-picked actions, each refusal with its allowed twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.model import Action, Boundary, Credential, Kind, Route, evaluate
from stockade.policy import (
    BoundSecret,
    FilesystemPolicy,
    Labels,
    NetworkPolicy,
    Policy,
    Reason,
    RequestRule,
)

POLICY = Policy(
    filesystem=FilesystemPolicy(workspace=Path("/w"), read=(Path("/r"),), deny=("**/.env",)),
    network=NetworkPolicy(
        allow=("reg.test", "*.cdn.test", "10.1.2.3"),
        deny=("bad.cdn.test",),
        hosts={"reg.test": "127.0.0.1", "pinless.test": "127.0.0.1"},
        rules=(RequestRule("reg.test", ("GET",)),),
    ),
    secrets=(BoundSecret("API_KEY", "env:API_KEY", ("api.cdn.test",)),),
)
B = Boundary(POLICY)


def net(host: str, address: str = "", **kw: object) -> Action:
    return Action("n", Kind.NET_CONNECT, host, False, host=host, port=443, address=address, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (net("reg.test", "127.0.0.1"), None),  # pinned: explicit allow of loopback
        (net("x.cdn.test"), None),
        (net("cdn.test"), Reason.HOST_NOT_ALLOWED),  # a wildcard never covers the bare name
        (net("bad.cdn.test"), Reason.HOST_DENIED),
        (net("x.cdn.test", "10.0.0.1"), Reason.ADDRESS_NOT_PUBLIC),
        (net("10.1.2.3"), None),
        (net("127.0.0.1"), Reason.HOST_NOT_ALLOWED),
        (
            Action("d", Kind.DNS_LOOKUP, "q.evil.test", False, host="q.evil.test"),
            Reason.HOST_NOT_ALLOWED,
        ),
        (Action("u", Kind.UNIX_CONNECT, "@bus", False), Reason.UNSUPPORTED_PROTOCOL),
    ],
)
def test_egress(action: Action, reason: Reason | None) -> None:
    route = Route.PROXY if action.kind in (Kind.NET_CONNECT, Kind.DNS_LOOKUP) else None
    assert B.stops("egress", action, route) == reason


@pytest.mark.parametrize("kind", [Kind.NET_CONNECT, Kind.NET_REQUEST, Kind.DNS_LOOKUP])
def test_direct_route_is_stopped_by_egress_alone(kind: Kind) -> None:
    a = Action("d", kind, "https://reg.test/", False, host="reg.test", port=443, method="PUT")
    assert B.stops("egress", a, Route.DIRECT) == Reason.UNSUPPORTED_PROTOCOL
    for layer in ("files", "container", "syscalls", "secrets", "inspect", "limits"):
        assert B.stops(layer, a, Route.DIRECT) is None, layer


def test_either_route_lets_the_action_through() -> None:
    upload = Action(
        "u",
        Kind.NET_REQUEST,
        "https://reg.test/up",
        False,
        host="reg.test",
        port=443,
        method="PUT",
        path="/up",
        address="127.0.0.1",
    )
    # inspect alone: the proxy route is refused, the direct one is not (no namespace).
    alone = evaluate(B, [upload], ("inspect",)).outcome("u")
    assert alone.through
    assert alone.through_routes == (Route.DIRECT,)
    # the layer alone does not stop the action: it stops only one of its routes
    assert B.stops("inspect", upload) is None
    assert B.stops("inspect", upload, Route.PROXY) == Reason.NO_RULE_MATCHED
    both = evaluate(B, [upload], ("egress", "inspect")).outcome("u")
    assert not both.through
    assert both.stopped_by == (
        ("egress", Reason.UNSUPPORTED_PROTOCOL),
        ("inspect", Reason.NO_RULE_MATCHED),
    )
    proxy_only = Action(
        "p",
        Kind.NET_REQUEST,
        "https://reg.test/up",
        False,
        host="reg.test",
        port=443,
        method="PUT",
        path="/up",
        address="127.0.0.1",
        routes=(Route.PROXY,),
    )
    assert not evaluate(B, [proxy_only], ("inspect",)).outcome("p").through


def test_metadata_needs_the_single_address() -> None:
    wide = Boundary(
        Policy(
            filesystem=FilesystemPolicy(workspace=Path("/w")),
            network=NetworkPolicy(allow=("169.254.0.0/16",)),
        )
    )
    exact = Boundary(
        Policy(
            filesystem=FilesystemPolicy(workspace=Path("/w")),
            network=NetworkPolicy(allow=("169.254.169.254",)),
        )
    )
    a = net("169.254.169.254")
    assert wide.stops("egress", a, Route.PROXY) == Reason.ADDRESS_METADATA
    assert exact.stops("egress", a, Route.PROXY) is None


@pytest.mark.parametrize(
    ("kind", "path", "files", "container"),
    [
        (Kind.FILE_READ, "/w/a", None, None),
        (Kind.FILE_READ, "/usr/lib/x", None, None),
        (Kind.FILE_READ, "/r/x", None, None),
        (Kind.FILE_READ, "/home/u/.ssh/id", Reason.PATH_NOT_GRANTED, Reason.PATH_NOT_GRANTED),
        (Kind.FILE_READ, "/etc/shadow", None, Reason.PATH_DENIED),
        (Kind.FILE_READ, "/w/sub/.env", None, Reason.PATH_DENIED),
        (Kind.FILE_WRITE, "/w/a", None, None),
        (Kind.FILE_WRITE, "/w/.git/hooks/pre-commit", None, Reason.PATH_PROTECTED),
        (Kind.FILE_WRITE, "/r/x", Reason.PATH_NOT_GRANTED, Reason.PATH_NOT_GRANTED),
        (Kind.FILE_WRITE, "/etc/x", Reason.PATH_NOT_GRANTED, Reason.PATH_NOT_GRANTED),
    ],
)
def test_files_and_container(
    kind: Kind, path: str, files: Reason | None, container: Reason | None
) -> None:
    a = Action("f", kind, path, False)
    assert B.stops("files", a) == files
    assert B.stops("container", a) == container


def test_symlink_judged_on_the_real_file() -> None:
    a = Action("l", Kind.FILE_READ, "/w/link", False, resolved="/home/u/.ssh/id")
    assert B.stops("files", a) == Reason.PATH_NOT_GRANTED
    assert B.stops("files", Action("l", Kind.FILE_READ, "/w/link", False)) is None


def _req(
    host: str,
    method: str,
    cred: Credential = Credential.NONE,
    *,
    scheme: str = "https",
    port: int = 443,
    labelled: bool = False,
) -> Action:
    return Action(
        "r",
        Kind.NET_REQUEST,
        f"{scheme}://{host}/",
        False,
        host=host,
        port=port,
        method=method,
        path="/",
        credential=cred,
        labelled=labelled,
    )


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (_req("reg.test", "GET"), None),
        (_req("reg.test", "PUT"), Reason.NO_RULE_MATCHED),
        (_req("x.cdn.test", "PUT"), None),  # opaque: no rule, no secret, no labels
        (_req("api.cdn.test", "GET", Credential.FOREIGN), Reason.FOREIGN_CREDENTIAL),
        (_req("api.cdn.test", "GET", Credential.BOUND), None),
        (_req("reg.test", "GET", Credential.BOUND), Reason.SECRET_WRONG_HOST),
        # an uninspected host is an opaque tunnel: a placeholder sent there is not seen
        (_req("x.cdn.test", "GET", Credential.BOUND), None),
        (_req("reg.test", "GET", scheme="http"), Reason.UNSUPPORTED_PROTOCOL),
        (_req("reg.test", "GET", port=8443), Reason.UNSUPPORTED_PROTOCOL),
        (_req("reg.test", "TRACE"), Reason.BAD_REQUEST),
        (_req("x.cdn.test", "GET", labelled=True), None),  # no labels configured
    ],
)
def test_inspect_on_the_proxy_route(action: Action, reason: Reason | None) -> None:
    assert B.stops("inspect", action, Route.PROXY) == reason
    assert B.stops("inspect", action, Route.DIRECT) is None


def test_labels_make_every_host_inspected() -> None:
    labelled = Boundary(
        Policy(
            filesystem=FilesystemPolicy(workspace=Path("/w")),
            network=NetworkPolicy(allow=("x.test",)),
            labels=Labels(canaries=("CANARY",)),
        )
    )
    a = _req("x.test", "POST", labelled=True)
    assert labelled.stops("inspect", a, Route.PROXY) == Reason.LABELLED_DATA
    assert labelled.stops("inspect", _req("x.test", "POST"), Route.PROXY) is None
    assert labelled.stops("inspect", _req("x.test", "GET", scheme="http"), Route.PROXY) == (
        Reason.UNSUPPORTED_PROTOCOL
    )


def test_inspect_refuses_a_raw_tunnel_to_an_inspected_host_on_a_plain_port() -> None:
    raw = Action("c", Kind.NET_CONNECT, "reg.test:22", False, host="reg.test", port=22)
    assert B.stops("inspect", raw, Route.PROXY) == Reason.UNSUPPORTED_PROTOCOL
    tls = Action("c", Kind.NET_CONNECT, "reg.test:443", False, host="reg.test", port=443)
    assert B.stops("inspect", tls, Route.PROXY) is None


def test_secrets_syscalls_limits() -> None:
    env = Action("e", Kind.ENV_READ, "GH_TOKEN", False)
    assert B.stops("secrets", env) == Reason.CREDENTIAL_ENV
    assert B.stops("secrets", Action("e", Kind.ENV_READ, "LANG", True)) is None
    assert B.stops("secrets", Action("e", Kind.ENV_READ, "OTHER", False)) == Reason.ENV_NOT_PASSED
    assert B.stops("syscalls", Action("s", Kind.SYSCALL, "bpf", False)) == Reason.SYSCALL_BLOCKED
    assert B.stops("container", Action("s", Kind.SYSCALL, "bpf", False)) is None
    big = Action("b", Kind.RESOURCE, "file_size", False, amount=POLICY.limits.file_size + 1)
    assert B.stops("limits", big) == Reason.LIMIT_FILE_SIZE
    assert B.stops("limits", Action("b", Kind.RESOURCE, "file_size", True, amount=10)) is None


def test_unknown_layer_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown layer"):
        B.stops("firewall", net("x"))
