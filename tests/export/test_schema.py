"""Tier 2: every object validates against its schema, unknown fields rejected.

Built-in kinds: ``kubernetes-validate`` in strict mode for three supported minor
versions. agent-sandbox kinds: the ``openAPIV3Schema`` of v1beta1 in the CRDs kept in
``tests/export/crds/`` (their version and licence are in the README there;
``STOCKADE_CRDS`` names another copy), made strict the way the API server
prunes: ``additionalProperties: false`` wherever ``properties`` is given without
``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.conftest import require
from tests.export._helpers import VARIANTS, build, variant_id

K8S_VERSIONS = ("1.31", "1.34", "1.37")
CRDS = {
    "SandboxTemplate": "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    "SandboxWarmPool": "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    "SandboxClaim": "extensions.agents.x-k8s.io_sandboxclaims.yaml",
    "Sandbox": "agents.x-k8s.io_sandboxes.yaml",
}


def crd_dir() -> Path:
    """The CRDs kept in the project (tests/export/crds, README there: version, licence),
    or the copy ``STOCKADE_CRDS`` names."""
    configured = os.environ.get("STOCKADE_CRDS")
    return Path(configured) if configured else Path(__file__).resolve().parent / "crds"


def strict(schema: Any) -> Any:
    """The CRD schema as the API server applies it, in JSON Schema terms."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    path = crd_dir() / CRDS[kind]
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def validate(obj: dict[str, Any]) -> None:
    if obj["apiVersion"].startswith(("agents.x-k8s.io/", "extensions.agents.x-k8s.io/")):
        require(
            crd_dir().is_dir(),
            f"the agent-sandbox CRDs are not at {crd_dir()} (set STOCKADE_CRDS)",
        )
        crd_validator(obj["kind"]).validate(obj)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_every_object_validates(variant: dict[str, Any]) -> None:
    for obj in build(**variant):
        validate(obj)


def test_gateway_in_another_namespace_validates() -> None:
    for obj in build(
        with_gateway=True, gateway_namespace="stockade-system", identity="tokenreview"
    ):
        validate(obj)


# Twins: the validators do reject what is wrong, so a pass above means something.


def test_a_misspelt_builtin_field_is_rejected() -> None:
    pod = next(o for o in build(target="pod") if o["kind"] == "Pod")
    pod["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("kind", "damage"),
    [
        ("SandboxTemplate", lambda o: o["spec"].__setitem__("networkPolicyMode", "Managed")),
        ("SandboxTemplate", lambda o: o["spec"].__setitem__("networkPolicyManagement", "Open")),
        (
            "SandboxTemplate",
            lambda o: o["spec"]["podTemplate"]["spec"].__setitem__("runtimeClass", "x"),
        ),
        ("SandboxWarmPool", lambda o: o["spec"].pop("sandboxTemplateRef")),
        ("SandboxClaim", lambda o: o["spec"]["warmPoolRef"].__setitem__("namespace", "x")),
    ],
)
def test_a_damaged_custom_resource_is_rejected(kind: str, damage: Any) -> None:
    require(
        crd_dir().is_dir(), f"the agent-sandbox CRDs are not at {crd_dir()} (set STOCKADE_CRDS)"
    )
    obj = next(o for o in build() if o["kind"] == kind)
    crd_validator(kind).validate(obj)  # the twin: as written, it passes
    damage(obj)
    with pytest.raises(jsonschema.ValidationError):
        crd_validator(kind).validate(obj)
