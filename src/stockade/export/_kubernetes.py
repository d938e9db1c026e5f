"""Policy → Kubernetes objects: the sandbox side and, on request, the gateway side.

In a cluster the pod and its RuntimeClass are the sandbox boundary and the stockade
gateway is the egress layer: a sandbox pod reaches nothing but the gateway (a
NetworkPolicy is the fence) and the gateway decides each connection under the policy
named by the pod's ``stockade.dev/policy`` annotation. So the objects written here carry
the policy's *name and digest* to the pods, the policy itself to the gateway's ConfigMap,
and never a secret value: credentials become Secret placeholders without data.

Everything here is pure: a :class:`Policy` and :class:`ExportOptions` in, a list of
plain dicts out, in a fixed order (gateway first, so its Service exists before the
sandbox pods that use it).
"""

from __future__ import annotations

from stockade._exceptions import PolicyError
from stockade._record import record
from stockade.export._names import (
    DATA_KEY,
    MAX_BASE_NAME,
    bounded,
    check_name,
)
from stockade.policy import Policy
from stockade.policy._addresses import NON_PUBLIC_RANGES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Obj = dict[str, Any]

# --- the contract with the gateway (and with what a user's cluster already has) -------

#: Names and ports the gateway Deployment, its Service and the sandbox pods agree on.
GATEWAY_NAME = "stockade-gateway"
PROXY_PORT = 3128
SOCKS_PORT = 1080
METRICS_PORT = 9102
#: The audience of the projected token a sandbox presents (``--identity tokenreview``):
#: the gateway asks TokenReview for exactly this one, so the token is useless elsewhere.
TOKEN_AUDIENCE = "stockade-gateway"  # noqa: S105 (a name, not a secret)
#: Kubelet rotates a projected token at 80 % of its life; 600 s is the minimum it allows.
TOKEN_EXPIRATION_SECONDS = 600
TOKEN_DIR = "/var/run/secrets/stockade"  # noqa: S105 (a name, not a secret)
TOKEN_FILE = f"{TOKEN_DIR}/token"

#: The gateway's pod selector; the sandbox egress peer uses exactly this.
GATEWAY_SELECTOR: dict[str, str] = {"app.kubernetes.io/name": GATEWAY_NAME}
GATEWAY_LABELS: dict[str, str] = {
    **GATEWAY_SELECTOR,
    "app.kubernetes.io/component": "egress-gateway",
    "app.kubernetes.io/part-of": "stockade",
}
#: Every sandbox pod carries it; the gateway's ingress admits only such pods.
SANDBOX_LABEL = "stockade.dev/sandbox"
TEMPLATE_LABEL = "stockade.dev/template"
#: The pod annotation that names the policy the gateway applies to its connections.
POLICY_ANNOTATION = "stockade.dev/policy"
#: sha256 of the canonical policy (:meth:`Policy.digest`), for audit and drift checks.
DIGEST_ANNOTATION = "stockade.dev/policy-digest"
#: Which data keys a placeholder Secret or ConfigMap is expected to receive.
KEYS_ANNOTATION = "stockade.dev/expected-keys"
FILL_ANNOTATION = "stockade.dev/fill"

POLICIES_CONFIGMAP = "stockade-policies"
CA_SECRET = "stockade-ca"  # noqa: S105 (a name, not a secret)
CREDENTIALS_SECRET = "stockade-credentials"  # noqa: S105 (a name, not a secret)
#: The trust bundle of sandbox pods: the system roots plus the gateway's CA certificate
#: (public data), so intercepted and opaque TLS both verify.
CA_BUNDLE_CONFIGMAP = "stockade-ca-bundle"
CA_BUNDLE_KEY = "ca-bundle.crt"
CA_DIR = "/etc/stockade/ca"

#: Where the gateway reads what it is given (the flags of ``stockade gateway serve``).
GATEWAY_POLICIES_DIR = "/etc/stockade/policies"
GATEWAY_CA_DIR = "/etc/stockade/ca"
GATEWAY_SECRETS_DIR = "/etc/stockade/secrets"

#: The sandbox pods run as the namespace's default account (their token is not mounted).
SANDBOX_SERVICE_ACCOUNT = "default"
#: The workspace a policy is loaded with for a cluster: the gateway has no sandbox
#: workspace, and the digest (which includes the workspace path) must not depend on the
#: directory export ran in. A directory every Linux system has, and not "/".
CLUSTER_WORKSPACE = "/tmp"

#: A non-root user for both pods: the restricted Pod Security Standard requires
#: runAsNonRoot, and images that run as root by default start only with a uid set.
RUN_AS = 65532

#: kube-dns, which the sandbox needs to resolve the gateway Service's name.
KUBE_DNS_PEER: dict[str, Any] = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
#: agent-sandbox's router, the only ingress its default policy admits; kept so the SDK
#: still reaches the sandbox's runtime API.
SANDBOX_ROUTER_PEER: dict[str, Any] = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
    "podSelector": {"matchLabels": {"app": "sandbox-router"}},
}
#: Ranges the gateway's own egress never needs for the public internet (RFC 1918,
#: CGNAT, link-local with the metadata endpoints, IPv6 ULA and link-local).
#: Taken from the egress layer's own address classes (policy._addresses).
PRIVATE_V4 = tuple(str(n) for n in NON_PUBLIC_RANGES if n.version == 4)
PRIVATE_V6 = tuple(str(n) for n in NON_PUBLIC_RANGES if n.version == 6)

TARGETS = ("agent-sandbox", "pod", "deployment")
RUNTIME_CLASSES = ("gvisor", "kata-qemu", "none")
IDENTITIES = ("peer-ip", "tokenreview")

SANDBOX_API = "extensions.agents.x-k8s.io/v1beta1"


@record
class ExportOptions:
    """What ``stockade export kubernetes`` was asked for (its flags, validated here)."""

    name: str
    namespace: str = "default"
    target: str = "agent-sandbox"
    image: str = "python:3.11-slim"
    runtime_class: str = "gvisor"
    #: warm sandboxes kept ready (agent-sandbox) or replicas (deployment); a v1beta1
    #: claim needs a pool, so the pool is written with 0 ("cold start") when unset
    warm_pool: int | None = None
    with_gateway: bool = False
    #: the gateway's namespace (None: the sandboxes' own)
    gateway_namespace: str | None = None
    identity: str = "peer-ip"
    gateway_image: str = "localhost/stockade:dev"

    @property
    def gw_namespace(self) -> str:
        """The namespace of the gateway."""
        return self.gateway_namespace or self.namespace


def gateway_url(options: ExportOptions, scheme: str = "http", port: int = PROXY_PORT) -> str:
    """The gateway Service's address as sandbox pods spell it in their proxy variables."""
    return f"{scheme}://{GATEWAY_NAME}.{options.gw_namespace}.svc:{port}"


def kubernetes_objects(
    policy: Policy, options: ExportOptions, *, policy_text: str | None = None
) -> list[Obj]:
    """The Kubernetes objects that run sandboxes under ``policy`` behind the gateway.

    Args:
        policy: the validated policy.
        options: name, namespaces, target and the other flags.
        policy_text: the policy file's text, for the gateway's ConfigMap (needed only
            with ``options.with_gateway``).

    Raises:
        PolicyError: an option is invalid, or the policy holds something a cluster
            cannot express; the message names the flag or the key.
    """
    _check_options(options)
    _check_expressible(policy, options)
    digest = policy.digest()
    objects: list[Obj] = []
    if options.with_gateway:
        if policy_text is None:
            raise PolicyError("--with-gateway: the policy file's text is needed for its ConfigMap")
        objects.extend(gateway_objects(policy, options, policy_text=policy_text, digest=digest))
    objects.append(_ca_bundle_configmap(options))
    if options.target == "agent-sandbox":
        objects.extend(_agent_sandbox_objects(policy, options, digest))
    else:
        objects.extend(_plain_objects(policy, options, digest))
    return objects


# --- checks ------------------------------------------------------------------------------


def _check_options(options: ExportOptions) -> None:
    check_name(options.name, "--name", max_len=MAX_BASE_NAME)
    check_name(options.namespace, "--namespace")
    check_name(options.gw_namespace, "--gateway-namespace")
    _choice(options.target, TARGETS, "--target")
    _choice(options.runtime_class, RUNTIME_CLASSES, "--runtime-class")
    _choice(options.identity, IDENTITIES, "--identity")
    if options.warm_pool is not None and not 0 <= options.warm_pool <= 10_000:
        raise PolicyError(f"--warm-pool: {options.warm_pool}: give a count from 0 to 10000")
    for flag, image in (("--image", options.image), ("--gateway-image", options.gateway_image)):
        if not image or any(c.isspace() for c in image):
            raise PolicyError(f"{flag}: {image!r} is not an image reference")


def _choice(value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise PolicyError(f"{flag}: {value!r}: choose one of {', '.join(allowed)}")


def _check_expressible(policy: Policy, options: ExportOptions) -> None:
    """Refuse what a pod behind the gateway cannot honour, naming the key.

    Locally these read the caller's environment or files on this machine; in a cluster
    there is no caller, the gateway cannot see the sandbox's files, and export never
    writes a secret value, so exporting them would silently drop a protection.
    """
    if not policy.layers.egress:
        raise PolicyError(
            "layers.egress: false: in a cluster the gateway is the egress layer and a "
            "sandbox pod reaches nothing else; turn the layer on to export the policy"
        )
    for i, entry in enumerate(policy.env.pass_):
        if entry.allow_secret:
            raise PolicyError(
                f"env.pass[{i}]: {entry.name!r} passes a secret from the caller's environment; "
                "a pod has no caller and export writes no secret value: bind it with "
                f"[secrets.{entry.name.lower()}] so only the gateway holds it"
            )
    if policy.labels.secret_files:
        raise PolicyError(
            "labels.secret_files: files on this machine cannot label data sent from a pod; "
            "label the values with labels.canaries instead"
        )
    if policy.labels.secret_env:
        raise PolicyError(
            "labels.secret_env: a pod has no caller environment to label; "
            "label the values with labels.canaries instead"
        )
    if policy.network.upstream_ca is not None:
        raise PolicyError(
            "network.tls.upstream_ca: a file on this machine, which the gateway pod does not "
            "have; remove it (the gateway verifies upstream TLS against its system roots)"
        )
    upstream = policy.network.upstream
    if upstream is not None and upstream.auth_file is not None:
        raise PolicyError(
            "network.upstream.auth_file: a file on this machine, which the gateway pod does "
            "not have; remove it from the exported policy"
        )
    _check_namespaces(policy, options)
    for secret in policy.secrets:
        # The gateway reads an ``env:NAME`` source from the file NAME of its credentials
        # Secret; a ``file:`` source names a file on this machine, which it does not have.
        key = secret.source.removeprefix("env:")
        if not secret.source.startswith("env:"):
            raise PolicyError(
                f"secrets.{secret.name}.from: {secret.source!r} names a file on this machine; "
                f'in a cluster write from = "env:NAME" and put the value under key NAME of '
                f"the {CREDENTIALS_SECRET} Secret"
            )
        if DATA_KEY.fullmatch(key) is None or len(key) > 253:
            raise PolicyError(
                f"secrets.{secret.name}.from: {key!r} is not usable as a Secret key (letters, "
                "digits, '-', '_' and '.')"
            )


def _check_namespaces(policy: Policy, options: ExportOptions) -> None:
    """The gateway applies a policy only to pods its ``[kubernetes]`` table admits: an
    export whose sandboxes it would refuse is an error here, not a silent deny-all."""
    table = getattr(policy, "kubernetes", None)
    if table is None:  # a policy model without the table: nothing to check
        return
    if not table.permits(options.namespace, SANDBOX_SERVICE_ACCOUNT):
        what = (
            f"namespace {options.namespace!r}"
            if "*" not in table.namespaces and options.namespace not in table.namespaces
            else f"service account {SANDBOX_SERVICE_ACCOUNT!r}"
        )
        key = "namespaces" if what.startswith("namespace") else "service_accounts"
        raise PolicyError(
            f"kubernetes.{key}: the policy does not admit the sandboxes' {what}, so the "
            f"gateway would refuse every connection of theirs; add it to kubernetes.{key}"
        )


# --- shared pieces ---------------------------------------------------------------------


def _meta(name: str, namespace: str | None, **extra: dict[str, str]) -> Obj:
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta.update({k: v for k, v in extra.items() if v})
    return meta


def _policy_annotations(options: ExportOptions, digest: str) -> dict[str, str]:
    return {POLICY_ANNOTATION: options.name, DIGEST_ANNOTATION: digest}


def sandbox_labels(options: ExportOptions) -> dict[str, str]:
    """The labels of every sandbox pod of this export (selected by the fences)."""
    return {SANDBOX_LABEL: "true", TEMPLATE_LABEL: options.name}


def _ns_peer(namespace: str, pod_labels: dict[str, str]) -> Obj:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def _tcp(*ports: int) -> list[Obj]:
    return [{"port": p, "protocol": "TCP"} for p in ports]


def sandbox_egress(options: ExportOptions) -> list[Obj]:
    """The sandbox's only egress: the gateway pods on the proxy ports, and kube-dns."""
    return [
        {
            "to": [_ns_peer(options.gw_namespace, GATEWAY_SELECTOR)],
            "ports": _tcp(PROXY_PORT, SOCKS_PORT),
        },
        {
            "to": [dict(KUBE_DNS_PEER)],
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        },
    ]


def _quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity, in the largest binary unit that divides them."""
    for unit, factor in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _resources(policy: Policy) -> Obj:
    """``[limits]`` as container resources.

    ``memory`` is the memory limit. ``file_size`` (the largest file) becomes the pod's
    ephemeral-storage limit: a pod has no per-file cap, and the total it may write is
    the nearest bound. ``pids`` is a node setting and ``cpu_seconds`` has no pod
    equivalent; both stay with in-pod stockade (docs/kubernetes.md).
    """
    limits: dict[str, str] = {}
    requests: dict[str, str] = {"cpu": "100m"}
    lim = policy.limits
    if policy.layers.limits and lim.memory > 0:
        limits["memory"] = _quantity(lim.memory)
        requests["memory"] = _quantity(min(lim.memory, 256 * 1024**2))
    if policy.layers.limits and lim.file_size > 0:
        limits["ephemeral-storage"] = _quantity(lim.file_size)
    out: Obj = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def _sandbox_env(policy: Policy, options: ExportOptions) -> list[Obj]:
    """Literal values only: the policy's ``env.set``, then the proxy and trust-store
    variables, which win (as locally) so a policy cannot point clients around the
    gateway. ``env.pass`` has no caller to pass from in a pod and is left out."""
    env: dict[str, str] = {k: str(v) for k, v in policy.env.set.items()}
    proxy = gateway_url(options)
    socks = gateway_url(options, "socks5h", SOCKS_PORT)
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["ALL_PROXY"] = env["all_proxy"] = socks
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    bundle = f"{CA_DIR}/{CA_BUNDLE_KEY}"
    for name in (
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
        "NPM_CONFIG_CAFILE",
    ):
        env[name] = bundle
    # HOME must be writable under a read-only root file system.
    env["HOME"] = "/tmp"
    if options.identity == "tokenreview":
        env["STOCKADE_IDENTITY_TOKEN_FILE"] = TOKEN_FILE
    return [{"name": k, "value": env[k]} for k in sorted(env)]


def _restricted_container_security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def _restricted_pod_security() -> Obj:
    return {
        "fsGroup": RUN_AS,
        "runAsGroup": RUN_AS,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sandbox_pod_spec(policy: Policy, options: ExportOptions) -> Obj:
    """The sandbox pod: restricted, no API token, its proxy variables at the gateway."""
    mounts: list[Obj] = [
        {"mountPath": CA_DIR, "name": "stockade-ca", "readOnly": True},
        {"mountPath": "/tmp", "name": "tmp"},
        {"mountPath": "/workspace", "name": "workspace"},
    ]
    volumes: list[Obj] = [
        {"configMap": {"name": CA_BUNDLE_CONFIGMAP}, "name": "stockade-ca"},
        {"emptyDir": {}, "name": "tmp"},
        {"emptyDir": {}, "name": "workspace"},
    ]
    if options.identity == "tokenreview":
        # Only this audience-bound, short-lived token, never the API token: it proves
        # the pod to the gateway and is worthless against the API server.
        mounts.append({"mountPath": TOKEN_DIR, "name": "stockade-identity", "readOnly": True})
        volumes.append(
            {
                "name": "stockade-identity",
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": TOKEN_AUDIENCE,
                                "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
                                "path": "token",
                            }
                        }
                    ]
                },
            }
        )
    container: Obj = {
        "env": _sandbox_env(policy, options),
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "name": "sandbox",
        "resources": _resources(policy),
        "securityContext": _restricted_container_security(),
        "volumeMounts": mounts,
        "workingDir": "/workspace",
    }
    spec: Obj = {
        # The API server is not the sandbox's business; a token would be a credential
        # the workload could read.
        "automountServiceAccountToken": False,
        "containers": [container],
        # Service links would add every Service of the namespace to the environment,
        # which is built from an allow-list everywhere else in stockade.
        "enableServiceLinks": False,
        "securityContext": _restricted_pod_security(),
        "volumes": volumes,
    }
    if options.runtime_class != "none":
        spec["runtimeClassName"] = options.runtime_class
    return spec


def _ca_bundle_configmap(options: ExportOptions) -> Obj:
    # A placeholder without ``data``: an apply of a later export leaves data filled in by
    # the operator alone (neither client- nor server-side apply owns a field it never set).
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            CA_BUNDLE_CONFIGMAP,
            options.namespace,
            annotations={
                KEYS_ANNOTATION: CA_BUNDLE_KEY,
                FILL_ANNOTATION: "the system CA roots plus the gateway's CA certificate (public)",
            },
            labels={"app.kubernetes.io/part-of": "stockade"},
        ),
    }


# --- sandbox side ----------------------------------------------------------------------


def _agent_sandbox_objects(policy: Policy, options: ExportOptions, digest: str) -> list[Obj]:
    annotations = _policy_annotations(options, digest)
    template: Obj = {
        "apiVersion": SANDBOX_API,
        "kind": "SandboxTemplate",
        "metadata": _meta(options.name, options.namespace, annotations=annotations),
        "spec": {
            "podTemplate": {
                "metadata": {"annotations": dict(annotations), "labels": sandbox_labels(options)},
                "spec": sandbox_pod_spec(policy, options),
            },
            # Managed with our own rules: the controller's default would be unioned with
            # any policy added beside it and re-open egress to the internet.
            "networkPolicyManagement": "Managed",
            "networkPolicy": {
                "egress": sandbox_egress(options),
                "ingress": [{"from": [dict(SANDBOX_ROUTER_PEER)]}],
            },
            # A claim must not set HTTPS_PROXY="" or mount its own volumes.
            "envVarsInjectionPolicy": "Disallowed",
            "volumeClaimTemplatesPolicy": "Disallowed",
        },
    }
    pool: Obj = {
        "apiVersion": SANDBOX_API,
        "kind": "SandboxWarmPool",
        "metadata": _meta(f"{options.name}-pool", options.namespace, annotations=annotations),
        "spec": {
            "replicas": options.warm_pool if options.warm_pool is not None else 0,
            "sandboxTemplateRef": {"name": options.name},
            # Only the blueprint makes pool pods stale, and that holds no egress policy
            # (it lives in the gateway): recreate them when it does change.
            "updateStrategy": {"type": "Recreate"},
        },
    }
    claim: Obj = {
        "apiVersion": SANDBOX_API,
        "kind": "SandboxClaim",
        "metadata": _meta(f"{options.name}-example", options.namespace, annotations=annotations),
        "spec": {
            "warmPoolRef": {"name": f"{options.name}-pool"},
            "lifecycle": {"shutdownPolicy": "Delete"},
            # Late-bound metadata keeps a warm pod warm (env on a claim forces a cold
            # start); the gateway reads the policy name from the live pod.
            "additionalPodMetadata": {"annotations": {POLICY_ANNOTATION: options.name}},
        },
    }
    return [template, pool, claim]


def _plain_objects(policy: Policy, options: ExportOptions, digest: str) -> list[Obj]:
    annotations = _policy_annotations(options, digest)
    labels = sandbox_labels(options)
    spec = sandbox_pod_spec(policy, options)
    workload: Obj
    if options.target == "pod":
        spec["restartPolicy"] = "Never"
        if policy.layers.limits and policy.limits.wall_seconds > 0:
            spec["activeDeadlineSeconds"] = max(1, int(policy.limits.wall_seconds))
        workload = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _meta(
                options.name, options.namespace, annotations=annotations, labels=labels
            ),
            "spec": spec,
        }
    else:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(
                options.name, options.namespace, annotations=annotations, labels=labels
            ),
            "spec": {
                "replicas": options.warm_pool if options.warm_pool is not None else 1,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"annotations": dict(annotations), "labels": dict(labels)},
                    "spec": spec,
                },
            },
        }
    fence: Obj = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(
            f"{options.name}-network-policy", options.namespace, annotations=annotations
        ),
        "spec": {
            "podSelector": {"matchLabels": dict(labels)},
            "policyTypes": ["Egress", "Ingress"],
            "egress": sandbox_egress(options),
            # No ingress rule: nothing reaches a plain sandbox pod.
            "ingress": [],
        },
    }
    return [workload, fence]


# --- gateway side ----------------------------------------------------------------------


def gateway_args(options: ExportOptions) -> list[str]:
    """The arguments of ``stockade gateway serve`` in the gateway's container."""
    identity = "peer-ip,tokenreview" if options.identity == "tokenreview" else "peer-ip"
    args = [
        "gateway",
        "serve",
        "--listen",
        f"0.0.0.0:{PROXY_PORT}",
        # the gateway listens on loopback only unless told it serves the pod network
        "--listen-pod-network",
        "--socks",
        f"0.0.0.0:{SOCKS_PORT}",
        "--metrics",
        f"0.0.0.0:{METRICS_PORT}",
        "--policies",
        GATEWAY_POLICIES_DIR,
        "--ca",
        GATEWAY_CA_DIR,
        "--secrets",
        GATEWAY_SECRETS_DIR,
        "--identity",
        identity,
        "--namespace",
        options.namespace,
    ]
    if options.identity == "tokenreview":
        args += ["--audience", TOKEN_AUDIENCE]
    return args


def gateway_objects(
    policy: Policy, options: ExportOptions, *, policy_text: str, digest: str
) -> list[Obj]:
    """The gateway: its account and rights, its inputs, the Deployment and its fences."""
    gw_ns = options.gw_namespace
    part_of = {"app.kubernetes.io/part-of": "stockade"}
    objects: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(GATEWAY_NAME, gw_ns, labels=dict(GATEWAY_LABELS)),
        },
        # Pods are read in the sandboxes' namespace (which may differ from the
        # gateway's): a Role there, bound to the gateway's account. Never a ClusterRole:
        # pod specs can carry environment values.
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(f"{GATEWAY_NAME}-pods", options.namespace, labels=dict(part_of)),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(f"{GATEWAY_NAME}-pods", options.namespace, labels=dict(part_of)),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{GATEWAY_NAME}-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": GATEWAY_NAME, "namespace": gw_ns}],
        },
    ]
    if options.identity == "tokenreview":
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                # cluster-scoped: the namespace in the name keeps two gateways apart
                "metadata": _meta(
                    bounded(f"{GATEWAY_NAME}-{gw_ns}-auth-delegator"), None, labels=dict(part_of)
                ),
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [{"kind": "ServiceAccount", "name": GATEWAY_NAME, "namespace": gw_ns}],
            }
        )
    objects += [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(
                POLICIES_CONFIGMAP,
                gw_ns,
                annotations={DIGEST_ANNOTATION: digest, POLICY_ANNOTATION: options.name},
                labels=dict(part_of),
            ),
            "data": {f"{options.name}.toml": policy_text},
        },
        _placeholder_secret(
            CA_SECRET, gw_ns, ("ca-cert.pem", "ca-key.pem"), "the gateway's interception CA"
        ),
        _placeholder_secret(
            CREDENTIALS_SECRET,
            gw_ns,
            tuple(sorted({s.source.removeprefix("env:") for s in policy.secrets})),
            "one key per env:NAME source of the policies' [secrets], holding the credential",
        ),
        _gateway_deployment(options),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(GATEWAY_NAME, gw_ns, labels=dict(GATEWAY_LABELS)),
            "spec": {
                "type": "ClusterIP",
                "selector": dict(GATEWAY_SELECTOR),
                "ports": [
                    {"name": "proxy", "port": PROXY_PORT, "protocol": "TCP", "targetPort": "proxy"},
                    {"name": "socks", "port": SOCKS_PORT, "protocol": "TCP", "targetPort": "socks"},
                    {
                        "name": "metrics",
                        "port": METRICS_PORT,
                        "protocol": "TCP",
                        "targetPort": "metrics",
                    },
                ],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(GATEWAY_NAME, gw_ns, labels=dict(GATEWAY_LABELS)),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": dict(GATEWAY_SELECTOR)}},
        },
        _gateway_network_policy(policy, options),
    ]
    return objects


def _placeholder_secret(name: str, namespace: str, keys: tuple[str, ...], what: str) -> Obj:
    # No ``data`` or ``stringData`` at all: the operator fills it (kubectl create secret
    # ... or a secret manager), and a later apply of the export leaves it alone.
    annotations = {FILL_ANNOTATION: what}
    if keys:
        annotations[KEYS_ANNOTATION] = ",".join(keys)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(
            name,
            namespace,
            annotations=annotations,
            labels={"app.kubernetes.io/part-of": "stockade"},
        ),
        "type": "Opaque",
    }


def _gateway_deployment(options: ExportOptions) -> Obj:
    container: Obj = {
        "name": "gateway",
        "image": options.gateway_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["stockade"],
        "args": gateway_args(options),
        "ports": [
            {"containerPort": PROXY_PORT, "name": "proxy", "protocol": "TCP"},
            {"containerPort": SOCKS_PORT, "name": "socks", "protocol": "TCP"},
            {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"},
        ],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "metrics"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        },
        "securityContext": _restricted_container_security(),
        "volumeMounts": [
            {"mountPath": GATEWAY_CA_DIR, "name": "ca", "readOnly": True},
            {"mountPath": GATEWAY_POLICIES_DIR, "name": "policies", "readOnly": True},
            {"mountPath": GATEWAY_SECRETS_DIR, "name": "secrets", "readOnly": True},
            {"mountPath": "/tmp", "name": "tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(GATEWAY_NAME, options.gw_namespace, labels=dict(GATEWAY_LABELS)),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": dict(GATEWAY_SELECTOR)},
            "template": {
                "metadata": {"labels": dict(GATEWAY_LABELS)},
                "spec": {
                    "serviceAccountName": GATEWAY_NAME,
                    # the gateway watches pods and calls TokenReview with this token
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": _restricted_pod_security(),
                    "containers": [container],
                    "volumes": [
                        {"name": "ca", "secret": {"secretName": CA_SECRET}},
                        {"name": "policies", "configMap": {"name": POLICIES_CONFIGMAP}},
                        {"name": "secrets", "secret": {"secretName": CREDENTIALS_SECRET}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _gateway_network_policy(policy: Policy, options: ExportOptions) -> Obj:
    sandbox_peer = _ns_peer(options.namespace, {SANDBOX_LABEL: "true"})
    egress: list[Obj] = [
        {
            "to": [dict(KUBE_DNS_PEER)],
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        },
        # The API server's address is the cluster's own (often a private one): allowed
        # on its ports to any address, narrowed by the operator where it is known. The
        # gateway itself refuses to proxy to cluster ranges unless a policy names them.
        {"ports": _tcp(443, 6443)},
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
                {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
            ]
        },
    ]
    pinned = sorted({_host_cidr(addr) for addr in policy.network.hosts.values()})
    if pinned:
        # ``[network] hosts`` pins names to addresses, often private ones: exactly those.
        egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in pinned]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(GATEWAY_NAME, options.gw_namespace, labels=dict(GATEWAY_LABELS)),
        "spec": {
            "podSelector": {"matchLabels": dict(GATEWAY_SELECTOR)},
            "policyTypes": ["Egress", "Ingress"],
            "ingress": [
                {"from": [sandbox_peer], "ports": _tcp(PROXY_PORT, SOCKS_PORT)},
                # metrics and probes: Prometheus from any namespace
                {"from": [{"namespaceSelector": {}}], "ports": _tcp(METRICS_PORT)},
            ],
            "egress": egress,
        },
    }


def _host_cidr(address: str) -> str:
    import ipaddress

    ip = ipaddress.ip_address(address)
    return f"{ip}/{ip.max_prefixlen}"


def load_cluster_policy(
    text: str, source: str, *, policies_dir: str = GATEWAY_POLICIES_DIR
) -> Policy:
    """Validate a policy file's text as the gateway loads it from its ConfigMap.

    The gateway parses each file alone (no user policy composed in) with its policy
    directory as the workspace, and the digest covers the workspace path: the policy is
    parsed here with :data:`CLUSTER_WORKSPACE` (that directory need not exist on this
    machine) and then moved to ``policies_dir``, so the digest in the annotations is
    the one the gateway computes and audits.
    """
    from pathlib import Path

    from stockade._record import replace
    from stockade.policy import parse_policy_text

    policy = parse_policy_text(text, source, workspace=Path(CLUSTER_WORKSPACE))
    here, there = Path(CLUSTER_WORKSPACE), Path(policies_dir)

    def move(path: Path) -> Path:
        return there / path.relative_to(here) if path.is_relative_to(here) else path

    fs = policy.filesystem
    moved = replace(
        fs,
        workspace=there,
        read=tuple(move(p) for p in fs.read),
        write=tuple(move(p) for p in fs.write),
    )
    return replace(policy, filesystem=moved)
