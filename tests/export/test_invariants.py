"""Tier 1: what must hold of every export, for every flag combination and for generated
policies (research scale-out.md §6.2): selectors match, the sandbox reaches only the
gateway, no secret value anywhere, valid names, labels and annotation keys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade._exceptions import PolicyError
from stockade.export import ExportOptions, dump_all, kubernetes_objects, load_cluster_policy
from stockade.export import _kubernetes as k
from stockade.export._names import (
    QUALIFIED_NAME,
    is_dns1123_label,
    is_label_value,
    is_restricted_key,
)
from tests.export._helpers import (
    BASIC,
    VARIANTS,
    build,
    of_kind,
    one,
    pod_templates,
    variant_id,
    walk,
)

# --- the checks -------------------------------------------------------------------------


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """A matchLabels selector selects ``labels`` (and an empty selector selects all)."""
    return all(labels.get(key) == value for key, value in selector.items())


def gateway_pod(objects: list[dict[str, Any]]) -> tuple[str, dict[str, str], dict[str, int]]:
    """(namespace, labels, named container ports) of the gateway's pods: from the
    Deployment when it was written, else from the contract the export promises."""
    deployments = [
        o for o in of_kind(objects, "Deployment") if o["metadata"]["name"] == k.GATEWAY_NAME
    ]
    if not deployments:
        return "", dict(k.GATEWAY_LABELS), {"proxy": k.PROXY_PORT, "socks": k.SOCKS_PORT}
    dep = deployments[0]
    ports = {
        p["name"]: p["containerPort"]
        for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    return dep["metadata"]["namespace"], dep["spec"]["template"]["metadata"]["labels"], ports


def check_invariants(objects: list[dict[str, Any]], options: ExportOptions) -> None:
    gw_ns, gw_labels, gw_ports = gateway_pod(objects)
    sandbox_pods = list(
        pod_templates([o for o in objects if o["metadata"]["name"] != k.GATEWAY_NAME])
    )
    assert sandbox_pods, "no sandbox pod"
    text = dump_all(objects)

    # Round trip: the YAML reads back as exactly the objects.
    assert list(yaml.safe_load_all(text)) == objects

    for obj in objects:
        meta = obj["metadata"]
        # names: DNS-1123 labels of at most 63 characters
        assert is_dns1123_label(meta["name"]), meta["name"]
        if "namespace" in meta:
            assert is_dns1123_label(meta["namespace"])
        for path, value in walk(obj):
            if path.endswith((".labels", ".matchLabels")):
                for key, val in value.items():
                    assert QUALIFIED_NAME.fullmatch(key.rpartition("/")[2]), key
                    assert is_label_value(val), (path, key, val)
            if path.endswith(".annotations"):
                for key in value:
                    assert QUALIFIED_NAME.fullmatch(key.rpartition("/")[2]), key
                    assert not is_restricted_key(key), (path, key)
        # no secret values: a Secret is a placeholder, and nothing references one from env
        if obj["kind"] == "Secret":
            assert "data" not in obj
            assert "stringData" not in obj
        assert "secretKeyRef" not in json.dumps(obj)

    for meta, spec in sandbox_pods:
        assert matches({k.SANDBOX_LABEL: "true"}, meta["labels"])
        assert meta["annotations"][k.POLICY_ANNOTATION] == options.name
        assert meta["annotations"][k.DIGEST_ANNOTATION].startswith("sha256:")
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        if options.runtime_class == "none":
            assert "runtimeClassName" not in spec
        else:
            assert spec["runtimeClassName"] == options.runtime_class
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert "envFrom" not in container
        env = {e["name"]: e for e in container["env"]}
        assert all(set(e) == {"name", "value"} for e in env.values()), "valueFrom in sandbox env"
        # the proxy variables name the gateway Service, on the gateway's ports
        host = f"{k.GATEWAY_NAME}.{options.gw_namespace}.svc"
        assert env["HTTPS_PROXY"]["value"] == f"http://{host}:{gw_ports['proxy']}"
        assert env["ALL_PROXY"]["value"] == f"socks5h://{host}:{gw_ports['socks']}"
        assert env["SSL_CERT_FILE"]["value"] == f"{k.CA_DIR}/{k.CA_BUNDLE_KEY}"
        projected = [v for v in spec["volumes"] if "projected" in v]
        if options.identity == "tokenreview":
            (volume,) = projected
            (source,) = volume["projected"]["sources"]
            audience = source["serviceAccountToken"]["audience"]
            assert audience == k.TOKEN_AUDIENCE
            assert env["STOCKADE_IDENTITY_TOKEN_FILE"]["value"] == k.TOKEN_FILE
            for dep in of_kind(objects, "Deployment"):
                if dep["metadata"]["name"] == k.GATEWAY_NAME:
                    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
                    assert args[args.index("--audience") + 1] == audience
        else:
            assert projected == []
            assert "STOCKADE_IDENTITY_TOKEN_FILE" not in env
        # every mounted volume exists, and the CA bundle ConfigMap is written
        names = {v["name"] for v in spec["volumes"]}
        assert {m["name"] for m in container["volumeMounts"]} <= names
        for vol in spec["volumes"]:
            if "configMap" in vol:
                one(objects, "ConfigMap", vol["configMap"]["name"])

    # The sandbox's egress: the gateway pods on exactly the proxy ports, and kube-dns.
    fences = [o["spec"]["networkPolicy"] for o in of_kind(objects, "SandboxTemplate")] + [
        o["spec"]
        for o in of_kind(objects, "NetworkPolicy")
        if o["metadata"]["name"] != k.GATEWAY_NAME
    ]
    assert len(fences) == 1
    (fence,) = fences
    to_gateway, to_dns = fence["egress"]
    (peer,) = to_gateway["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": options.gw_namespace
    }
    assert matches(peer["podSelector"]["matchLabels"], gw_labels)
    assert peer["podSelector"]["matchLabels"]  # never an empty selector (all pods)
    assert sorted(p["port"] for p in to_gateway["ports"]) == sorted(
        [gw_ports["proxy"], gw_ports["socks"]]
    )
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert all("ipBlock" not in peer for rule in fence["egress"] for peer in rule["to"])

    for np in of_kind(objects, "NetworkPolicy"):
        selected = [meta["labels"] for meta, _ in sandbox_pods]
        if np["metadata"]["name"] == k.GATEWAY_NAME:
            selected = [gw_labels]
        assert all(matches(np["spec"]["podSelector"]["matchLabels"], labels) for labels in selected)
        assert np["spec"]["podSelector"]["matchLabels"]

    if options.with_gateway:
        assert gw_ns == options.gw_namespace
        for kind in ("Service", "PodDisruptionBudget", "Deployment"):
            obj = one(objects, kind, k.GATEWAY_NAME)
            selector = obj["spec"]["selector"]
            selector = selector.get("matchLabels", selector) if kind != "Service" else selector
            assert matches(selector, gw_labels), kind
        service = one(objects, "Service", k.GATEWAY_NAME)
        for port in service["spec"]["ports"]:
            assert gw_ports[port["targetPort"]] == port["port"]
        # the gateway admits the sandbox pods of this namespace on its proxy ports
        gw_np = one(objects, "NetworkPolicy", k.GATEWAY_NAME)
        first = gw_np["spec"]["ingress"][0]
        (from_sandbox,) = first["from"]
        assert from_sandbox["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": options.namespace
        }
        assert all(
            matches(from_sandbox["podSelector"]["matchLabels"], m["labels"])
            for m, _ in sandbox_pods
        )
        # the Role that lets the gateway read pods is in the sandboxes' namespace
        role = one(objects, "Role")
        assert role["metadata"]["namespace"] == options.namespace
        binding = one(objects, "RoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": k.GATEWAY_NAME, "namespace": options.gw_namespace}
        ]
        dep = one(objects, "Deployment", k.GATEWAY_NAME)
        pod = dep["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
        for vol in pod["volumes"]:
            if "secret" in vol:
                one(objects, "Secret", vol["secret"]["secretName"])
            if "configMap" in vol:
                one(objects, "ConfigMap", vol["configMap"]["name"])
        assert len(of_kind(objects, "ClusterRoleBinding")) == (options.identity == "tokenreview")
    else:
        assert not [o for o in objects if o["metadata"]["name"] == k.GATEWAY_NAME]


# --- the variants -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_every_variant_keeps_the_invariants(variant: dict[str, Any]) -> None:
    objects = build(**variant)
    check_invariants(objects, ExportOptions(name="agent", namespace="agents", **variant))


@pytest.mark.parametrize("variant", VARIANTS[::5], ids=variant_id)
def test_same_input_same_bytes(variant: dict[str, Any]) -> None:
    assert dump_all(build(**variant)) == dump_all(build(**variant))


def test_gateway_in_its_own_namespace() -> None:
    options: dict[str, Any] = {
        "with_gateway": True,
        "gateway_namespace": "stockade-system",
        "identity": "tokenreview",
    }
    objects = build(**options)
    check_invariants(objects, ExportOptions(name="agent", namespace="agents", **options))
    assert one(objects, "Deployment", k.GATEWAY_NAME)["metadata"]["namespace"] == "stockade-system"
    assert one(objects, "Role")["metadata"]["namespace"] == "agents"


def test_agent_sandbox_objects() -> None:
    objects = build(warm_pool=4)
    assert [o["kind"] for o in objects] == [
        "ConfigMap",
        "SandboxTemplate",
        "SandboxWarmPool",
        "SandboxClaim",
    ]
    template = one(objects, "SandboxTemplate")
    assert template["spec"]["networkPolicyManagement"] == "Managed"
    assert template["spec"]["podTemplate"]["spec"]["runtimeClassName"] == "gvisor"
    pool = one(objects, "SandboxWarmPool")
    assert pool["spec"] == {
        "replicas": 4,
        "sandboxTemplateRef": {"name": "agent"},
        "updateStrategy": {"type": "Recreate"},
    }
    claim = one(objects, "SandboxClaim")
    assert claim["spec"]["warmPoolRef"] == {"name": pool["metadata"]["name"]}
    assert claim["spec"]["additionalPodMetadata"]["annotations"] == {k.POLICY_ANNOTATION: "agent"}
    assert "env" not in claim["spec"]  # would force a cold start


def test_without_warm_pool_the_claim_still_has_a_pool_of_zero() -> None:
    # v1beta1 claims require warmPoolRef: a cold start is a claim against an empty pool.
    assert one(build(), "SandboxWarmPool")["spec"]["replicas"] == 0


def test_with_gateway_objects() -> None:
    objects = build(with_gateway=True)
    assert [o["kind"] for o in objects][:11] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Secret",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ConfigMap",
    ]
    policies = one(objects, "ConfigMap", k.POLICIES_CONFIGMAP)
    assert policies["data"] == {"agent.toml": BASIC}
    dep = one(objects, "Deployment", k.GATEWAY_NAME)
    assert dep["spec"]["replicas"] == 2
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["gateway", "serve"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    credentials = one(objects, "Secret", k.CREDENTIALS_SECRET)
    assert credentials["metadata"]["annotations"][k.KEYS_ANNOTATION] == "GH_TOKEN"
    # the pinned private address is the one private destination the gateway may reach
    egress = one(objects, "NetworkPolicy", k.GATEWAY_NAME)["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]} in egress


def test_pod_target_maps_wall_time_and_limits() -> None:
    pod = one(build(target="pod"), "Pod")
    assert pod["spec"]["activeDeadlineSeconds"] == 600
    assert pod["spec"]["restartPolicy"] == "Never"
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == "2Gi"
    # a Deployment's pods cannot have a deadline: none is written
    dep = one(build(target="deployment"), "Deployment")
    assert "activeDeadlineSeconds" not in dep["spec"]["template"]["spec"]


def test_runtime_class_none_leaves_the_default_runtime() -> None:
    ((_, spec),) = pod_templates(build(runtime_class="none"))
    assert "runtimeClassName" not in spec
    ((_, spec),) = pod_templates(build(runtime_class="kata-qemu"))
    assert spec["runtimeClassName"] == "kata-qemu"


def test_no_secret_value_reaches_the_output(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "ghp_canary0123456789abcdefSECRET"
    monkeypatch.setenv("GH_TOKEN", canary)
    text = dump_all(build(with_gateway=True, identity="tokenreview"))
    assert canary not in text
    # twin: the output does name the secret, as a key the operator fills
    assert "GH_TOKEN" in text


def test_policy_env_set_is_literal_and_the_proxy_wins() -> None:
    text = BASIC.replace(
        'LANG = "C.UTF-8"', 'LANG = "C.UTF-8"\nHTTPS_PROXY = "http://elsewhere.test:8080"'
    )
    ((_, spec),) = pod_templates(build(text))
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["LANG"] == "C.UTF-8"
    assert env["HTTPS_PROXY"] == f"http://{k.GATEWAY_NAME}.agents.svc:{k.PROXY_PORT}"


def test_digest_is_the_policy_digest_and_independent_of_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = load_cluster_policy(BASIC, "x").digest()
    first = dump_all(build())
    monkeypatch.chdir(tmp_path)
    assert dump_all(build()) == first
    assert (
        one(build(), "SandboxTemplate")["metadata"]["annotations"][k.DIGEST_ANNOTATION] == expected
    )
    # twin: another policy has another digest
    other = build(BASIC.replace('"pypi.org", ', ""))
    assert one(other, "SandboxTemplate")["metadata"]["annotations"][k.DIGEST_ANNOTATION] != expected


# --- the checks' own twins ------------------------------------------------------------


def test_restricted_keys() -> None:
    for key in (
        "kubernetes.io/x",
        "app.kubernetes.io/name",
        "agents.x-k8s.io/claim-uid",
        "k8s.io/y",
    ):
        assert is_restricted_key(key), key
    for key in ("stockade.dev/policy", "example.com/kubernetes.io", "plain", "notkubernetes.io/x"):
        assert not is_restricted_key(key), key


def test_matches() -> None:
    assert matches({"a": "1"}, {"a": "1", "b": "2"})
    assert not matches({"a": "1", "c": "3"}, {"a": "1", "b": "2"})


def test_names_and_label_values() -> None:
    assert is_dns1123_label("a" * 63)
    assert not is_dns1123_label("a" * 64)
    assert is_dns1123_label("agent-1")
    assert not is_dns1123_label("Agent")
    assert not is_dns1123_label("-a")
    assert is_label_value("")
    assert is_label_value("A.b_c-1")
    assert not is_label_value("a b")


# --- bad input: each refusal names the key or flag, beside the accepted twin -----------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "Agent"}, "--name: 'Agent' is not a DNS-1123 name"),
        ({"name": "a" * 49}, "--name: "),
        ({"name": ""}, "--name: empty"),
        ({"namespace": "no_such"}, "--namespace: "),
        ({"gateway_namespace": "x" * 64}, "--gateway-namespace: "),
        ({"target": "podman"}, "--target: 'podman'"),
        ({"runtime_class": "runc"}, "--runtime-class: "),
        ({"identity": "mtls"}, "--identity: "),
        ({"warm_pool": -1}, "--warm-pool: -1"),
        ({"image": "a b"}, "--image: "),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"name": "agent", "namespace": "agents", **options}
    with pytest.raises(PolicyError, match=re.escape(message)):
        build(**args)


def test_good_options_at_the_limits() -> None:
    build(
        BASIC.replace('["agents"]', '["*"]'),
        name="a" * 48,
        namespace="n" * 63,
        gateway_namespace="g" * 63,
        warm_pool=0,
        image="registry.test/x@sha256:00",
    )


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (("[layers]", "[layers]\negress = false"), "layers.egress"),
        (
            ("[env.set]", '[env]\npass = [{ name = "NPM_TOKEN", allow_secret = true }]\n[env.set]'),
            "env.pass[0]",
        ),
        (
            ("[kubernetes]", '[labels]\nsecret_files = ["~/.netrc"]\n[kubernetes]'),
            "labels.secret_files",
        ),
        (
            ("[kubernetes]", '[labels]\nsecret_env = ["GH_TOKEN"]\n[kubernetes]'),
            "labels.secret_env",
        ),
        (('from = "env:GH_TOKEN"', 'from = "file:/etc/hostname"'), "secrets.github.from"),
        (('namespaces = ["agents"]', 'namespaces = ["other"]'), "kubernetes.namespaces"),
        (
            ('namespaces = ["agents"]', 'namespaces = ["agents"]\nservice_accounts = ["builder"]'),
            "kubernetes.service_accounts",
        ),
    ],
)
def test_inexpressible_policies_are_refused_by_key(change: tuple[str, str], key: str) -> None:
    text = BASIC + "\n[layers]\n" if change[0] == "[layers]" else BASIC
    text = text.replace(*change)
    with pytest.raises(PolicyError, match=re.escape(key)):
        build(text)


@pytest.mark.parametrize(
    "change",
    [
        ("[env.set]", '[env]\npass = ["TERM"]\n[env.set]'),
        ("[kubernetes]", '[labels]\ncanaries = ["stockade-canary-1234"]\n[kubernetes]'),
        ('namespaces = ["agents"]', 'namespaces = ["*"]'),
        ('namespaces = ["agents"]', 'namespaces = ["agents"]\nservice_accounts = ["default"]'),
    ],
)
def test_expressible_twins_are_accepted(change: tuple[str, str]) -> None:
    objects = build(BASIC.replace(*change))
    check_invariants(objects, ExportOptions(name="agent", namespace="agents"))


# --- generated policies -----------------------------------------------------------------

_label = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_host = st.builds(lambda a, b: f"{a}.{b}.test", _label, _label)
_env_name = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: (
        not re.search(
            r"TOKEN|SECRET|PASS|KEY|AUTH|CRED|PRIVATE|SESSION|COOKIE|WEBHOOK|^AWS|^GCP|^AZURE|DSN",
            n,
        )
    )
)
_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20)


def toml_str(text: str) -> str:
    """A TOML basic string (JSON's escapes, without surrogate pairs; DEL escaped)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


@st.composite
def policies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    hosts = draw(st.lists(_host, min_size=1, max_size=4, unique=True))
    secrets = draw(st.lists(st.sampled_from(hosts), max_size=2, unique=True))
    env = draw(st.dictionaries(_env_name, _text, max_size=3))
    namespace = draw(_label)
    lines = ["version = 1", "", "[network]", f"allow = {json.dumps(hosts)}"]
    if draw(st.booleans()):
        lines.append(
            f'hosts = {{ {json.dumps(hosts[0])} = "192.0.2.{draw(st.integers(1, 254))}" }}'
        )
    lines += ["", "[kubernetes]", f"namespaces = {json.dumps([namespace])}"]
    lines += ["", "[limits]", f"memory = {draw(st.integers(64, 8192)) * 1024 * 1024}"]
    if env:
        lines += ["", "[env.set]"] + [f"{k} = {toml_str(v)}" for k, v in env.items()]
    for i, host in enumerate(secrets):
        lines += ["", f"[secrets.cred{i}]", 'from = "env:CRED"', f"hosts = [{json.dumps(host)}]"]
    options = {
        "name": draw(_label.filter(lambda n: len(n) <= 48)),
        "namespace": namespace,
        "target": draw(st.sampled_from(k.TARGETS)),
        "identity": draw(st.sampled_from(k.IDENTITIES)),
        "runtime_class": draw(st.sampled_from(k.RUNTIME_CLASSES)),
        "with_gateway": draw(st.booleans()),
        "warm_pool": draw(st.none() | st.integers(0, 50)),
        "gateway_namespace": draw(st.none() | _label),
    }
    return "\n".join(lines) + "\n", options


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_generated_policies_keep_the_invariants(case: tuple[str, dict[str, Any]]) -> None:
    text, raw = case
    options = ExportOptions(**raw)
    policy = load_cluster_policy(text, "generated.toml")
    objects = kubernetes_objects(policy, options, policy_text=text)
    check_invariants(objects, options)
    assert dump_all(objects) == dump_all(kubernetes_objects(policy, options, policy_text=text))


def test_digest_is_the_one_the_gateway_computes(tmp_path: Path) -> None:
    # The gateway parses each NAME.toml of its policy directory with that directory as
    # the workspace (stockade.gateway._policies); export, which runs where that
    # directory does not exist, must arrive at the same digest.
    from stockade.policy import parse_policy_text

    text = BASIC.replace("[network]", '[filesystem]\nread = ["data"]\n\n[network]')
    (tmp_path / "data").mkdir()
    gateway = parse_policy_text(text, "agent.toml", workspace=tmp_path)
    exported = load_cluster_policy(text, "agent.toml", policies_dir=str(tmp_path))
    assert exported.digest() == gateway.digest()
    # twin: loaded for another directory, the digest differs
    assert load_cluster_policy(text, "agent.toml").digest() != gateway.digest()
