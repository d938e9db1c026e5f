"""``stockade import``: turn another sandbox's settings into a stockade policy.

``stockade import srt FILE [-o OUT]`` reads Anthropic sandbox-runtime settings
(``~/.srt-settings.json``) and writes a commented stockade v1 policy. A key that cannot be
mapped stops the import with an error naming it; nothing is silently dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from stockade._exceptions import EXIT_STOCKADE_ERROR

FORMATS = ("srt",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``import``."""
    parser.add_argument(
        "format", choices=FORMATS, help="the settings format: srt (Anthropic sandbox-runtime)"
    )
    parser.add_argument("file", type=Path, help="the settings file, e.g. ~/.srt-settings.json")
    parser.add_argument(
        "-o", "--output", type=Path, metavar="OUT", help="write the policy here (default: stdout)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    parser.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="write this workspace into the policy (default: where stockade runs, as with srt)",
    )


def execute(args: argparse.Namespace) -> int:
    """Translate the settings; exit 125 with a one-line error when a key cannot be mapped."""
    from stockade.policy._srt import read_srt_settings, srt_to_toml

    workspace = args.workspace.expanduser().resolve() if args.workspace is not None else None
    text = srt_to_toml(read_srt_settings(args.file), str(args.file), workspace)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out: Path = args.output
    flags = (
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if args.force
        else os.O_WRONLY | os.O_CREAT | os.O_EXCL
    )
    try:
        fd = os.open(out, flags, 0o644)
    except FileExistsError:
        print(f"stockade import: {out} exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    except OSError as exc:
        print(f"stockade import: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 125
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"stockade import: wrote {out}; check it with 'stockade check {out}'", file=sys.stderr)
    return 0
