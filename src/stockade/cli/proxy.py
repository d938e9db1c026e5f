"""``stockade proxy``: the egress proxy on its own, until SIGINT or SIGTERM.

The proxy serves HTTP (forward and CONNECT) and SOCKS5 on one listener, allows only the
hosts of the policy's ``[network]`` section plus ``--allow-host``, and writes one audit
event per connection and per forwarded request. With ``[network.upstream]`` or
``--upstream-proxy`` every allowed connection is chained through the operator's proxy,
as in ``stockade run``. A policy with ``[[network.rules]]``, ``[secrets.*]`` or
``[labels]`` is enforced with the inspect layer when ``--ca DIR`` gives the interception
CA (``ca-cert.pem``/``ca-key.pem``, or ``tls.crt``/``tls.key``; clients must trust its
certificate); without ``--ca`` such a policy is refused at start (exit 125), never
served with its request checks left out.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import signal
import sys
import uuid
from pathlib import Path

from stockade._exceptions import EXIT_STOCKADE_ERROR, SandboxError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``proxy``."""
    parser.add_argument(
        "--listen", required=True, metavar="ADDR", help="unix:PATH or tcp:127.0.0.1:PORT"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="allow this host (pattern: host, *.domain, IP, CIDR, each with optional "
        ":port); repeat for more hosts",
    )
    parser.add_argument("--policy", type=Path, metavar="FILE", help="policy file ([network])")
    parser.add_argument(
        "--upstream-proxy",
        metavar="URL",
        help='chain every allowed connection through this proxy ("http://host:port", or '
        '"env" for HTTPS_PROXY/NO_PROXY); replaces network.upstream.proxy',
    )
    parser.add_argument(
        "--ca",
        type=Path,
        metavar="DIR",
        help="interception CA (ca-cert.pem and ca-key.pem, or tls.crt and tls.key): "
        "needed to enforce network.rules, secrets and labels",
    )
    parser.add_argument("--audit", type=Path, metavar="FILE", help="append JSONL events here")
    parser.add_argument("--quiet", action="store_true", help="do not print events to stderr")


def _raise_fd_limit() -> None:
    # Each tunnel holds two descriptors; the default soft limit (1024) caps concurrency.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def execute(args: argparse.Namespace) -> int:
    """Run the proxy until SIGINT/SIGTERM; 0 on a clean stop, 2 on a bad listen address."""
    from stockade.audit._log import AuditLog
    from stockade.egress import bind_listener
    from stockade.egress._assemble import build_proxy
    from stockade.egress.upstream import Transport, resolve_upstream
    from stockade.policy import load_policy
    from stockade.policy._inspect import wants_inspection
    from stockade.policy._load import with_upstream_proxy

    policy = load_policy(args.policy, workspace=Path.cwd())
    if args.upstream_proxy is not None:
        policy = with_upstream_proxy(policy, args.upstream_proxy)
    # Read once, before listening: a bad setting stops here (exit 125), naming the key.
    upstream = resolve_upstream(policy.network.upstream)
    ca = None
    if args.ca is not None and wants_inspection(policy):
        from stockade.egress.inspect import load_ca

        ca = load_ca(args.ca)
    audit = AuditLog(f"proxy-{uuid.uuid4().hex[:12]}", args.audit)
    try:
        # Assembled before listening: a policy this proxy cannot serve whole stops here.
        proxy = build_proxy(
            policy,
            audit,
            caller="stockade proxy",
            ca_fix="pass --ca DIR",
            extra_allow=tuple(args.allow_host),
            ca=ca,
            transport=Transport(upstream),
        )
    except BaseException:
        audit.close()
        raise
    try:
        sock, path = bind_listener(args.listen)
    except ValueError as exc:
        print(f"stockade proxy: --listen {exc}", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    except OSError as exc:
        raise SandboxError(f"cannot listen on {args.listen}: {exc.strerror}") from None
    # The first event seeds the log's hash chain with the policy it enforces.
    audit.emit(
        "proxy_start",
        policy_hash=policy.digest(),
        allow_host=list(args.allow_host),
        listen=args.listen,
        upstream=upstream.url if upstream is not None else None,
        inspect=proxy.inspect is not None,
    )
    if not args.quiet:
        audit.subscribe(_print_event)
    _raise_fd_limit()
    print(f"stockade proxy: listening on {args.listen}", file=sys.stderr, flush=True)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, proxy.close)
        await proxy.serve_socket(sock)

    try:
        asyncio.run(main())
    finally:
        if path is not None:
            path.unlink(missing_ok=True)
        audit.emit("proxy_stop", end=True)
        audit.close()
    return 0


def _print_event(event: dict[str, object]) -> None:
    if event.get("event") == "proxy_stop":
        return  # the log's own bookkeeping, not a connection
    print(
        f"{event.get('event')} {event.get('verdict')} {event.get('reason')} "
        f"{event.get('protocol')} {event.get('host')}:{event.get('port')} "
        f"{event.get('address') or '-'} up={event.get('bytes_up')} down={event.get('bytes_down')}",
        file=sys.stderr,
        flush=True,
    )
