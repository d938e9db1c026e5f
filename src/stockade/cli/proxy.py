"""``stockade proxy``: the egress proxy on its own (provided by the egress layer)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``proxy``."""
    parser.add_argument("--listen", required=True, help="unix:PATH or tcp:127.0.0.1:PORT")


def execute(args: argparse.Namespace) -> int:
    """Refuse clearly until the egress layer lands."""
    print("stockade proxy: the egress proxy is not part of this build", file=sys.stderr)
    return 125
