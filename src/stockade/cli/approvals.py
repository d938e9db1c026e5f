"""``stockade approvals``: list or revoke the hosts answered "always".

They live in ``approved.toml`` beside the user policy (machine-written; see
docs/approval.md). ``revoke`` removes an entry there; a running sandbox keeps its own
grants until it ends (``Sandbox.revoke`` or the control channel change a running one).
"""

from __future__ import annotations

import sys

from stockade._exceptions import EXIT_STOCKADE_ERROR

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``list`` and ``revoke HOST``."""
    parser.usage = "stockade approvals list [--json] | stockade approvals revoke HOST..."
    parser.add_argument("action", choices=("list", "revoke"), help="what to do")
    parser.add_argument("hosts", nargs="*", metavar="HOST", help="for revoke: host or host:port")
    parser.add_argument("--json", action="store_true", help="list as JSON lines")


def execute(args: argparse.Namespace) -> int:
    """List or revoke; 0 on success, 1 when nothing matched, 125 on a usage error."""
    from stockade.egress.approval._store import ApprovedStore

    store = ApprovedStore()
    if args.action == "list":
        if args.hosts:
            print("stockade approvals: list takes no host", file=sys.stderr)
            return EXIT_STOCKADE_ERROR
        entries = store.entries()
        if args.json:
            import json

            for entry in entries:
                print(json.dumps(entry, default=str))
            return 0
        if not entries:
            print(f"no approvals in {store.path}")
            return 0
        for entry in entries:
            by = f"  by {entry['answered_by']}" if entry.get("answered_by") else ""
            print(f"{entry['action']:<5} {entry['pattern']:<40} {entry.get('added', '')}{by}")
        return 0
    if not args.hosts:
        print("stockade approvals: revoke needs a HOST (or host:port)", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    gone = store.remove(args.hosts)
    for pattern in gone:
        print(f"revoked {pattern}")
    if not gone:
        print(
            f"stockade approvals: no entry for {', '.join(args.hosts)} in {store.path}",
            file=sys.stderr,
        )
        return 1
    return 0
