"""Export: a policy as the documents of another system (Kubernetes), pure data in and out.

``kubernetes_objects(policy, options)`` gives the objects as plain dicts and
``dump_all(objects)`` writes them as deterministic multi-document YAML; the CLI verb
``stockade export kubernetes`` is a thin layer over the two (docs/kubernetes.md).
"""

from stockade.export._kubernetes import CLUSTER_WORKSPACE as CLUSTER_WORKSPACE
from stockade.export._kubernetes import ExportOptions as ExportOptions
from stockade.export._kubernetes import kubernetes_objects as kubernetes_objects
from stockade.export._kubernetes import load_cluster_policy as load_cluster_policy
from stockade.export._yaml import dump_all as dump_all

__all__ = [
    "CLUSTER_WORKSPACE",
    "ExportOptions",
    "dump_all",
    "kubernetes_objects",
    "load_cluster_policy",
]
