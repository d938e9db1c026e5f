"""``stockade doctor`` inside a Kubernetes pod: recognising one, the layers it permits,
and whether stockade's proxy chains to the gateway the pod's variables name.

The check reads its inputs (an environment, a root for the files the kubelet writes) as
parameters: here they are a temporary directory laid out like a pod and the variables an
exported SandboxTemplate sets. The end-to-end tests run ``stockade doctor --json`` as a
process: with the variables alone (not a pod: a variable is too easy to set), and, as
root, in a mount namespace whose ``/etc/hosts`` is the kubelet's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stockade.cli.doctor import (
    KUBELET_HOSTS_HEADER,
    SERVICE_ACCOUNT_DIR,
    kubernetes_check,
    pod_evidence,
)
from tests.conftest import require

GATEWAY = "http://stockade-gateway.agents.svc:3128"
#: what an exported SandboxTemplate (and the kubelet) put in a sandbox's environment
POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "HTTPS_PROXY": GATEWAY,
    "https_proxy": GATEWAY,
    "HTTP_PROXY": GATEWAY,
    "http_proxy": GATEWAY,
    "ALL_PROXY": "socks5h://stockade-gateway.agents.svc:1080",
    "NO_PROXY": "localhost,127.0.0.1,::1",
}
KUBELET_HOSTS = f"{KUBELET_HOSTS_HEADER}.\n127.0.0.1\tlocalhost\n10.244.1.7\tsandbox-x\n"


def _passed(name: str, detail: str = "") -> dict[str, object]:
    return {"name": name, "ok": True, "detail": detail, "fix": "", "layers": []}


#: every layer's check passed (as on a permissive pod)
ALL_OK = [
    *(_passed(n) for n in ("bubblewrap", "user namespaces", "landlock", "seccomp")),
    _passed("limits", "cgroup v2: /sys/fs/cgroup/x + rlimits"),
]


def pod_root(tmp: Path, *, hosts: bool = True, namespace: str | None = None) -> Path:
    """A directory laid out like a pod's file system."""
    root = tmp / "pod"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hosts").write_text(KUBELET_HOSTS if hosts else "127.0.0.1 localhost\n")
    if namespace is not None:
        sa = root / SERVICE_ACCOUNT_DIR
        sa.mkdir(parents=True)
        (sa / "namespace").write_text(namespace)
        (sa / "token").write_text("not-a-real-token")
    return root


def policy(tmp: Path, text: str) -> Path:
    path = tmp / "policy.toml"
    path.write_text(text)
    return path


def test_a_pod_needs_the_kubelets_variables_and_one_of_its_files(tmp_path: Path) -> None:
    plain = pod_root(tmp_path / "a", hosts=False)
    assert pod_evidence({}, plain) == (False, [])
    # The variables alone: not enough (anyone can set them).
    inside, evidence = pod_evidence(POD_ENV, plain)
    assert not inside
    assert evidence == ["KUBERNETES_SERVICE_HOST=10.96.0.1"]
    # The kubelet's /etc/hosts, or a mounted service account, with the variables: a pod.
    assert pod_evidence(POD_ENV, pod_root(tmp_path / "b"))[0]
    inside, evidence = pod_evidence(
        POD_ENV, pod_root(tmp_path / "c", hosts=False, namespace="agents")
    )
    assert inside
    assert "a service account of namespace agents" in evidence
    # Files alone, or variables that are not an address and a port: not a pod.
    both = pod_root(tmp_path / "d", namespace="agents")
    assert not pod_evidence({}, both)[0]
    assert not pod_evidence({**POD_ENV, "KUBERNETES_SERVICE_HOST": "kubernetes"}, both)[0]
    assert not pod_evidence({**POD_ENV, "KUBERNETES_SERVICE_PORT": "https"}, both)[0]
    # A namespace file that is no namespace name does not count.
    odd = pod_root(tmp_path / "e", hosts=False, namespace="Not A Namespace\n")
    assert not pod_evidence(POD_ENV, odd)[0]


def test_outside_a_pod_the_check_passes_and_says_so(tmp_path: Path) -> None:
    check = kubernetes_check(ALL_OK, environ=POD_ENV, root=pod_root(tmp_path, hosts=False))
    assert check["ok"] is True
    assert str(check["detail"]).startswith("not in a Kubernetes pod (only KUBERNETES_SERVICE_HOST")


def test_a_gateway_not_chained_to_fails_with_the_fix(tmp_path: Path) -> None:
    no_upstream = policy(tmp_path, '[network]\nallow = ["pypi.org"]\n')
    check = kubernetes_check(ALL_OK, no_upstream, environ=POD_ENV, root=pod_root(tmp_path))
    assert check["ok"] is False
    detail = str(check["detail"])
    assert detail.startswith("in a Kubernetes pod (KUBERNETES_SERVICE_HOST=10.96.0.1; /etc/hosts")
    assert f"HTTPS_PROXY={GATEWAY} names the gateway" in detail
    assert "dials directly" in detail
    assert '[network.upstream] proxy = "env"' in str(check["fix"])
    assert "--upstream-proxy http://stockade-gateway.agents.svc:3128" in str(check["fix"])


def test_proxy_env_or_the_flag_chains_to_the_gateway(tmp_path: Path) -> None:
    root = pod_root(tmp_path)
    chained = policy(tmp_path, '[network.upstream]\nproxy = "env"\nconnect_by = "name"\n')
    check = kubernetes_check(ALL_OK, chained, environ=POD_ENV, root=root)
    assert check["ok"] is True, check
    assert str(check["detail"]).endswith(
        "stockade's proxy chains to it (from HTTPS_PROXY), by name"
    )
    assert check["fix"] == ""
    # --upstream-proxy naming the gateway does the same.
    corp = policy(
        tmp_path, '[network.upstream]\nproxy = "http://proxy.corp:8080"\nconnect_by = "name"\n'
    )
    assert kubernetes_check(ALL_OK, corp, GATEWAY, environ=POD_ENV, root=root)["ok"] is True
    # An upstream that is some other proxy is not the gateway.
    other = kubernetes_check(ALL_OK, corp, environ=POD_ENV, root=root)
    assert other["ok"] is False
    assert "chains to http://proxy.corp:8080 instead" in str(other["detail"])


def test_chaining_by_address_is_named_as_refused_by_the_gateway(tmp_path: Path) -> None:
    # CONNECT to the vetted address names no host: the gateway would refuse it.
    by_address = policy(tmp_path, '[network.upstream]\nproxy = "env"\n')
    check = kubernetes_check(ALL_OK, by_address, environ=POD_ENV, root=pod_root(tmp_path))
    assert check["ok"] is False
    assert "by address, which the gateway refuses" in str(check["detail"])
    assert 'connect_by = "name"' in str(check["fix"])


def test_the_layers_a_pod_permits_come_from_the_other_checks(tmp_path: Path) -> None:
    root = pod_root(tmp_path)
    env = {k: v for k, v in POD_ENV.items() if "PROXY" not in k.upper()}
    check = kubernetes_check(ALL_OK, environ=env, root=root)
    assert check["ok"] is True
    assert check["layers"] == ["container", "egress", "files", "syscalls", "limits"]
    assert "no HTTPS_PROXY or HTTP_PROXY names a stockade gateway" in str(check["detail"])
    # A restricted pod: no user namespaces (RuntimeDefault seccomp, gVisor), no Landlock,
    # no cgroup of its own.
    restricted: list[dict[str, Any]] = [dict(c) for c in ALL_OK]
    for c in restricted:
        if c["name"] in ("user namespaces", "landlock"):
            c["ok"] = False
        if c["name"] == "limits":
            c["detail"] = "rlimits only (per process; no cgroup this user may create)"
    check = kubernetes_check(restricted, environ=env, root=root)
    assert check["layers"] == ["syscalls"]
    detail = str(check["detail"])
    assert "this pod permits syscalls (seccomp); not container (bubblewrap)" in detail
    assert "files (Landlock)" in detail
    assert "limits by cgroup (rlimits only)" in detail
    # Nothing of stockade's own: the fix says what a pod must allow.
    for c in restricted:
        c["ok"] = False
    check = kubernetes_check(restricted, environ=env, root=root)
    assert check["layers"] == []
    assert "user namespaces" in str(check["fix"])


def test_a_token_identity_is_named_as_unsupported_by_chaining(tmp_path: Path) -> None:
    chained = policy(tmp_path, '[network.upstream]\nproxy = "env"\nconnect_by = "name"\n')
    env = {**POD_ENV, "STOCKADE_IDENTITY_TOKEN_FILE": "/var/run/secrets/stockade/token"}
    check = kubernetes_check(ALL_OK, chained, environ=env, root=pod_root(tmp_path))
    assert "prefer peer-ip identity" in str(check["fix"])


def doctor_json(
    env: dict[str, str], prefix: list[str] | None = None
) -> tuple[int, dict[str, dict[str, Any]]]:
    proc = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "stockade", "doctor", "--json"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=120,
    )
    assert proc.stdout.startswith("["), proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)}


def home(tmp: Path, user_policy: str | None) -> dict[str, str]:
    config = tmp / "config"
    (config / "stockade").mkdir(parents=True)
    if user_policy is not None:
        (config / "stockade/policy.toml").write_text(user_policy)
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    return {**env, **POD_ENV, "XDG_CONFIG_HOME": str(config)}


def test_doctor_is_not_fooled_by_the_variables_alone(tmp_path: Path) -> None:
    _, checks = doctor_json(home(tmp_path, None))
    pod = checks["kubernetes pod"]
    assert pod["ok"] is True
    assert pod["detail"] == (
        "not in a Kubernetes pod (only KUBERNETES_SERVICE_HOST=10.96.0.1: not enough to tell)"
    )


@pytest.mark.skipif(not shutil.which("unshare"), reason="util-linux unshare is missing")
def test_doctor_in_a_mount_namespace_with_the_kubelets_hosts_file(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "binding over /etc/hosts needs root")
    hosts = tmp_path / "hosts"
    # The gateway's name resolves (to a closed port): the upstream check's CONNECT probe
    # fails at once instead of waiting on a resolver.
    hosts.write_text(KUBELET_HOSTS + "127.0.0.1\tstockade-gateway.agents.svc\n")
    prefix = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        f'mount --bind "{hosts}" /etc/hosts && exec "$@"',
        "sh",
    ]
    code, checks = doctor_json(home(tmp_path / "a", None), prefix)
    pod = checks["kubernetes pod"]
    assert pod["ok"] is False
    assert code == 1
    assert "in a Kubernetes pod (KUBERNETES_SERVICE_HOST=10.96.0.1; /etc/hosts" in pod["detail"]
    assert '[network.upstream] proxy = "env"' in pod["fix"]
    # This host's layers, as its own checks found them.
    layers = pod["layers"]
    assert ("files" in layers) == checks["landlock"]["ok"]
    assert ("syscalls" in layers) == checks["seccomp"]["ok"]
    container = checks["bubblewrap"]["ok"] and checks["user namespaces"]["ok"]
    assert ("container" in layers) == ("egress" in layers) == container
    code, checks = doctor_json(
        home(tmp_path / "b", '[network.upstream]\nproxy = "env"\nconnect_by = "name"\n'), prefix
    )
    pod = checks["kubernetes pod"]
    assert pod["ok"] is True, pod
    assert "stockade's proxy chains to it" in pod["detail"]
