"""``stockade trust``: let a workspace ``stockade.toml`` widen the user policy.

Untrusted, a workspace policy may only tighten (the sandbox can write it, and a cloned
repository brings one). ``stockade trust`` pins the file's SHA-256 in stockade's state,
out of every sandbox's reach; from then on that file, byte for byte, is read as the
user's own policy. Any change to it lapses the pin (``stockade check`` says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``trust``."""
    parser.add_argument(
        "file",
        nargs="?",
        type=Path,
        help="the workspace policy to pin (default: stockade.toml in the current directory)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the pinned policies")
    what.add_argument("--revoke", action="store_true", help="unpin FILE: it may only tighten again")


def execute(args: argparse.Namespace) -> int:
    """Pin, list or unpin; exit 125 on a file that is missing or not a valid policy."""
    from stockade._exceptions import PolicyError
    from stockade.policy._load import WORKSPACE_POLICY, parse_policy_text
    from stockade.policy._trust import TrustStore

    store = TrustStore()
    if args.list:
        if args.file is not None:
            raise PolicyError("trust --list takes no FILE")
        for pinned, entry in sorted(store.entries().items()):
            try:
                state = store.status(Path(pinned), Path(pinned).read_bytes())
            except OSError:
                state = "missing"
            note = {"trusted": "", "changed": "  (CHANGED since pinned: may only tighten)"}
            print(
                f"{pinned}  {entry['digest'][:19]}  {entry.get('added', '')}"
                f"{note.get(state, '  (' + state + ')')}"
            )
        return 0
    path = (args.file or Path(WORKSPACE_POLICY)).absolute()
    if args.revoke:
        if store.remove(path):
            print(f"stockade: {path} is no longer trusted: it may only tighten your policy")
        else:
            print(f"stockade: {path} was not trusted")
        return 0
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(
            f"{path}: cannot read: {exc.strerror}; name the stockade.toml to trust"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not UTF-8 text; save the policy as UTF-8") from None
    # Validated as it will be read: the user's own policy, with its workspace.
    trusted = parse_policy_text(text, str(path), workspace=path.parent)
    from stockade.policy import load_policy
    from stockade.policy._load import user_policy_path
    from stockade.policy._trust import widenings

    # Against the user's own policy (which a trusted file replaces), so the person sees
    # what pinning opens: the file may come from a cloned repository, or from a sandbox
    # that wrote it in a subdirectory it could write.
    user = user_policy_path()
    if user.is_file():
        now = load_policy(user, workspace=path.parent)
    else:
        now = parse_policy_text("", "built-in", workspace=path.parent)
    digest = store.add(path, data)
    print(
        f"stockade: trusted {path} ({digest[:19]}): runs in {path.parent} now read it as "
        "your own policy; any change to the file lapses this (stockade check shows it)"
    )
    opened = widenings(now, trusted)
    if opened:
        print("stockade: compared with your own policy, it:")
        for line in opened:
            print(f"  {line}")
    return 0
