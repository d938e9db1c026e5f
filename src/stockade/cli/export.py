"""``stockade export kubernetes``: a policy as Kubernetes manifests (docs/kubernetes.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# The choices are repeated from stockade.export so that --help needs no import of it;
# the export functions check them again (they are the authority).
_TARGETS = ("agent-sandbox", "pod", "deployment")
_RUNTIME_CLASSES = ("gvisor", "kata-qemu", "none")
_IDENTITIES = ("peer-ip", "tokenreview")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the formats of ``export`` and their options."""
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    k8s = formats.add_parser(
        "kubernetes",
        help="agent-sandbox, Pod or Deployment manifests behind the stockade gateway",
        description=(
            "Write deterministic multi-document YAML that runs sandboxes under POLICY in a "
            "cluster: the sandbox pods reach only the stockade gateway, which applies the "
            "policy. No secret value is ever written."
        ),
    )
    k8s.add_argument("policy", type=Path, metavar="POLICY", help="the policy file (TOML)")
    k8s.add_argument(
        "--name", help="name of the policy and its objects (default: from the file name)"
    )
    k8s.add_argument("--namespace", default="default", help="the sandboxes' namespace")
    k8s.add_argument(
        "--target", choices=_TARGETS, default="agent-sandbox", help="what runs the sandboxes"
    )
    k8s.add_argument("--image", default="python:3.11-slim", help="the sandbox container image")
    k8s.add_argument(
        "--runtime-class",
        choices=_RUNTIME_CLASSES,
        default="gvisor",
        help="RuntimeClass of the sandbox pods ('none': the cluster's default runtime)",
    )
    k8s.add_argument(
        "--warm-pool",
        type=int,
        metavar="N",
        help="sandboxes kept warm (agent-sandbox; default 0) or replicas (deployment)",
    )
    k8s.add_argument("--with-gateway", action="store_true", help="also write the gateway's objects")
    k8s.add_argument(
        "--gateway-namespace", metavar="NS", help="the gateway's namespace (default: --namespace)"
    )
    k8s.add_argument(
        "--gateway-image", default="localhost/stockade:dev", help="the gateway container image"
    )
    k8s.add_argument(
        "--identity",
        choices=_IDENTITIES,
        default="peer-ip",
        help="how the gateway knows a pod: its address, or also a projected token",
    )
    out = k8s.add_mutually_exclusive_group()
    out.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write to FILE ('-': stdout)"
    )
    out.add_argument("--dir", type=Path, metavar="DIR", help="write one file per object into DIR")
    k8s.add_argument(
        "--force", action="store_true", help="overwrite files that exist (as init and import)"
    )


def execute(args: argparse.Namespace) -> int:
    """Write the manifests; exit 125 on a bad policy or option (the message names it)."""
    import sys

    from stockade._exceptions import PolicyError
    from stockade.export import ExportOptions, dump_all, kubernetes_objects, load_cluster_policy
    from stockade.export._names import name_from

    path: Path = args.policy
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such policy file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read: {exc}") from None
    name = args.name
    if name is None:
        name = name_from(path.stem)
        if not name:
            raise PolicyError(f"{path}: no name can be made of the file name; give --name")
    policy = load_cluster_policy(text, str(path))
    options = ExportOptions(
        name=name,
        namespace=args.namespace,
        target=args.target,
        image=args.image,
        runtime_class=args.runtime_class,
        warm_pool=args.warm_pool,
        with_gateway=args.with_gateway,
        gateway_namespace=args.gateway_namespace,
        identity=args.identity,
        gateway_image=args.gateway_image,
    )
    objects = kubernetes_objects(policy, options, policy_text=text)
    if args.dir is not None:
        _write_dir(args.dir, objects, args.force)
        return 0
    stream = dump_all(objects)
    if args.output is None or str(args.output) == "-":
        sys.stdout.write(stream)
    else:
        _refuse_existing([args.output], args.force)
        _write(args.output, stream)
    return 0


def _refuse_existing(paths: list[Path], force: bool) -> None:
    """Refuse (before anything is written) to overwrite a file without ``--force``."""
    from stockade._exceptions import PolicyError

    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise PolicyError(f"{existing[0]}{more} exists; pass --force to overwrite it")


def _write_dir(directory: Path, objects: list[dict[str, object]], force: bool = False) -> None:
    from stockade.export._yaml import dump_all

    width = len(str(len(objects)))
    files = []
    for i, obj in enumerate(objects, 1):
        meta = obj.get("metadata")
        name = meta.get("name", "") if isinstance(meta, dict) else ""
        # The number keeps the apply order (gateway first) for `kubectl apply -f DIR`,
        # which reads files in name order.
        files.append(directory / f"{i:0{width}d}-{str(obj['kind']).lower()}-{name}.yaml")
    _refuse_existing(files, force)
    directory.mkdir(parents=True, exist_ok=True)
    for file, obj in zip(files, objects, strict=True):
        _write(file, dump_all([obj]))


def _write(path: Path, text: str) -> None:
    from stockade._exceptions import PolicyError

    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot write: {exc.strerror}") from None
