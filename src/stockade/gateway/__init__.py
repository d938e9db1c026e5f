"""The multi-tenant egress gateway for a Kubernetes cluster (``stockade gateway serve``).

* :class:`Gateway` — identity per connection (peer address → pod, optionally a
  TokenReview'd token of that pod), then the pod's policy decides, by the same
  :class:`~stockade.egress.EgressProxy` code as a local sandbox;
* :class:`KubeClient` — the small API client it watches pods with;
* :class:`Metrics` — Prometheus text metrics.
"""

from __future__ import annotations

from stockade.gateway._kube import KubeClient, KubeConfig, KubeError
from stockade.gateway._metrics import Metrics
from stockade.gateway._pods import CLAIM_ANNOTATION, POLICY_ANNOTATION, Pod, PodCache
from stockade.gateway._server import Gateway, GatewayConfig

__all__ = [
    "CLAIM_ANNOTATION",
    "POLICY_ANNOTATION",
    "Gateway",
    "GatewayConfig",
    "KubeClient",
    "KubeConfig",
    "KubeError",
    "Metrics",
    "Pod",
    "PodCache",
]
