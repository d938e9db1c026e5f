"""Shared pieces of the export tests: policies, builds, and walking the objects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stockade.export import ExportOptions, kubernetes_objects, load_cluster_policy

BASIC = """\
version = 1

[network]
allow = ["pypi.org", "files.pythonhosted.org", "api.github.test"]
hosts = { "git.internal.test" = "10.1.2.3" }

[[network.rules]]
host = "api.github.test"
methods = ["GET"]
paths = ["/repos/**"]

[secrets.github]
from = "env:GH_TOKEN"
hosts = ["api.github.test"]

[env.set]
LANG = "C.UTF-8"

[limits]
memory = "2GiB"
wall_seconds = 600

[kubernetes]
namespaces = ["agents"]
"""

#: every combination of the flags that change the shape of the output
VARIANTS: list[dict[str, Any]] = [
    {"target": target, "identity": identity, "with_gateway": gw, "warm_pool": pool}
    for target in ("agent-sandbox", "pod", "deployment")
    for identity in ("peer-ip", "tokenreview")
    for gw in (False, True)
    for pool in (None, 3)
]


def variant_id(v: dict[str, Any]) -> str:
    return "-".join(str(x) for x in v.values())


def build(
    text: str = BASIC, *, name: str = "agent", namespace: str = "agents", **kwargs: Any
) -> list[dict[str, Any]]:
    policy = load_cluster_policy(text, "test.toml")
    options = ExportOptions(name=name, namespace=namespace, **kwargs)
    return kubernetes_objects(policy, options, policy_text=text)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in of_kind(objects, kind)])
    return found[0]


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(metadata, spec) of every pod an object makes, with the object's kind."""
    for obj in objects:
        kind = obj["kind"]
        if kind == "Pod":
            yield obj["metadata"], obj["spec"]
        elif kind == "Deployment":
            yield obj["spec"]["template"]["metadata"], obj["spec"]["template"]["spec"]
        elif kind == "SandboxTemplate":
            yield obj["spec"]["podTemplate"]["metadata"], obj["spec"]["podTemplate"]["spec"]


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a nested document."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")
