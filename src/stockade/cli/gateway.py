"""``stockade gateway serve``: the egress proxy for the pods of a Kubernetes cluster.

Run as a Deployment (see docs/kubernetes.md). Each connection is attributed to its pod
(peer address through a pod watch; optionally a TokenReview'd projected token of that
same pod), and decided by that pod's policy, with the same code as ``stockade proxy``.
Audit events go to stdout as JSON lines, for the cluster's log pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import signal
import socket
import sys
from pathlib import Path

from stockade._exceptions import EXIT_STOCKADE_ERROR, SandboxError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``gateway``."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = sub.add_parser(
        "serve",
        help="serve HTTP, CONNECT and SOCKS5 for a cluster's pods",
        description="Serve HTTP, CONNECT and SOCKS5 to a cluster's sandbox pods: each "
        "connection is decided by the policy its pod names (docs/kubernetes.md).",
    )
    serve.add_argument(
        "--listen", default="0.0.0.0:3128", metavar="HOST:PORT", help="proxy listener"
    )
    serve.add_argument(
        "--socks", metavar="HOST:PORT", help="another listener (SOCKS5 and HTTP are told apart)"
    )
    serve.add_argument(
        "--listen-pod-network",
        action="store_true",
        help="allow a non-loopback --listen/--socks/--metrics (the pod network): required, "
        "since a gateway reachable by the wrong peers is only as safe as its NetworkPolicy",
    )
    serve.add_argument(
        "--policies", type=Path, required=True, metavar="DIR", help="NAME.toml per policy"
    )
    serve.add_argument("--default-policy", metavar="NAME", help="for pods without the annotation")
    serve.add_argument(
        "--unclaimed",
        choices=("refuse", "serve"),
        default="refuse",
        help="agent-sandbox warm-pool pods no claim has adopted yet: refuse every connection "
        "(default), or serve them by their policy like any pod",
    )
    serve.add_argument("--ca", type=Path, metavar="DIR", help="interception CA (a Secret)")
    serve.add_argument("--secrets", type=Path, metavar="DIR", help="bound credentials (a Secret)")
    serve.add_argument(
        "--identity",
        default="peer-ip",
        choices=("peer-ip", "peer-ip,tokenreview"),
        # argparse would print the choices as {peer-ip,peer-ip,tokenreview}
        metavar="peer-ip|peer-ip,tokenreview",
        help="peer-ip alone (default), or also a projected token of the same pod (TokenReview)",
    )
    serve.add_argument("--audience", default="stockade-gateway", help="the tokens' audience")
    scope = serve.add_mutually_exclusive_group()
    scope.add_argument("--namespace", metavar="NS", help="watch pods of this namespace")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    serve.add_argument(
        "--cluster-cidrs",
        default="",
        metavar="CIDRS",
        help="pod and service ranges (and node range), comma-separated: refused as "
        "destinations unless a policy allows the address itself",
    )
    serve.add_argument("--metrics", metavar="HOST:PORT", help="/healthz, /readyz and /metrics")
    serve.add_argument("--api", metavar="HOST:PORT", help="API server (default: in-cluster)")
    serve.add_argument("--token-file", type=Path, metavar="FILE", help="service-account token")
    serve.add_argument("--ca-file", type=Path, metavar="FILE", help="the cluster's CA")
    serve.add_argument(
        "--cache-ttl", type=float, default=10.0, metavar="S", help="trust the pod cache this long"
    )


def _bind(spec: str, flag: str, pod_network: bool) -> socket.socket:
    host, sep, port = spec.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{flag} {spec!r}: write an IP address and a port") from None
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag} {spec!r}: write HOST:PORT")
    if not address.is_loopback and not pod_network:
        raise ValueError(
            f"{flag} {spec!r} is not loopback: pass --listen-pod-network to serve the pod "
            "network (and fence the gateway with a NetworkPolicy)"
        )
    from stockade.egress._proxy import tcp_listener

    try:
        return tcp_listener(address, int(port), backlog=4096)
    except OSError as exc:
        raise SandboxError(f"cannot listen on {spec}: {exc.strerror}") from None


def execute(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, 2 on bad arguments."""
    from stockade.egress._addr import ClusterRanges
    from stockade.gateway import Gateway, GatewayConfig, KubeClient, KubeConfig
    from stockade.gateway._server import LINK_LOCAL

    try:
        kube = KubeConfig.in_cluster(args.api, args.token_file, args.ca_file)
        networks = list(LINK_LOCAL)
        for entry in filter(None, (e.strip() for e in args.cluster_cidrs.split(","))):
            networks.append(ipaddress.ip_network(entry, strict=False))
        refused = set()
        for host in (kube.host, os.environ.get("KUBERNETES_SERVICE_HOST", "")):
            try:
                refused.add(ipaddress.ip_address(host))
            except ValueError:
                continue  # a name: its addresses are in the ranges given
        sockets = [_bind(args.listen, "--listen", args.listen_pod_network)]
        if args.socks:
            sockets.append(_bind(args.socks, "--socks", args.listen_pod_network))
        metrics = (
            _bind(args.metrics, "--metrics", args.listen_pod_network) if args.metrics else None
        )
    except ValueError as exc:
        print(f"stockade gateway: {exc}", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    namespace = None if args.all_namespaces else (args.namespace or _own_namespace())
    if namespace is None and not args.all_namespaces:
        print(
            "stockade gateway: name the pods to serve: --namespace NS or --all-namespaces",
            file=sys.stderr,
        )
        return EXIT_STOCKADE_ERROR
    config = GatewayConfig(
        policies=args.policies,
        default_policy=args.default_policy,
        unclaimed=args.unclaimed,
        tokens=args.identity.endswith("tokenreview"),
        audience=args.audience,
        cluster=ClusterRanges(tuple(networks), frozenset(refused)),
        ca_dir=args.ca,
        secrets_dir=args.secrets,
    )
    gateway = Gateway(config, KubeClient(kube), namespace=namespace, cache_ttl=args.cache_ttl)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await gateway.start()  # a bad policy directory stops here, naming the file
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, gateway.close)
        print(f"stockade gateway: listening on {args.listen}", file=sys.stderr, flush=True)
        tasks = [loop.create_task(gateway.serve_socket(s)) for s in sockets]
        if metrics is not None:
            tasks.append(loop.create_task(gateway.serve_metrics(metrics)))
        await asyncio.gather(*tasks, return_exceptions=True)
        await gateway.wait_closed()

    asyncio.run(main())
    return 0


def _own_namespace() -> str | None:
    # The namespace the gateway itself runs in, as the service account mount says.
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
