"""Each layer's predicate on hand-picked actions, each refusal with its allowed twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.model import Action, Boundary, Credential, Inspection, Kind, RequestRule
from stockade.policy import FilesystemPolicy, NetworkPolicy, Policy, Reason

POLICY = Policy(
    filesystem=FilesystemPolicy(workspace=Path("/w"), read=(Path("/r"),), deny=("**/.env",)),
    network=NetworkPolicy(
        allow=("reg.test", "*.cdn.test", "10.1.2.3"),
        deny=("bad.cdn.test",),
        hosts={"reg.test": "127.0.0.1", "pinless.test": "127.0.0.1"},
    ),
)
B = Boundary(
    POLICY, Inspection(rules=(RequestRule("reg.test", ("GET",)),), bound_hosts=("api.cdn.test",))
)


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
    assert B.stops("egress", action) == reason


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
    assert wide.stops("egress", a) == Reason.ADDRESS_METADATA
    assert exact.stops("egress", a) is None


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


def test_inspect_rules_and_credentials() -> None:
    def req(host: str, method: str, cred: Credential = Credential.NONE) -> Action:
        return Action(
            "r", Kind.NET_REQUEST, host, False, host=host, method=method, path="/", credential=cred
        )

    assert B.stops("inspect", req("reg.test", "GET")) is None
    assert B.stops("inspect", req("reg.test", "PUT")) == Reason.RULE_DENIED
    assert B.stops("inspect", req("x.cdn.test", "PUT")) is None  # opaque: no rules
    assert (
        B.stops("inspect", req("api.cdn.test", "GET", Credential.FOREIGN))
        == Reason.FOREIGN_CREDENTIAL
    )
    assert B.stops("inspect", req("api.cdn.test", "GET", Credential.BOUND)) is None
    assert (
        B.stops("inspect", req("x.cdn.test", "GET", Credential.BOUND)) == Reason.SECRET_WRONG_HOST
    )


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
