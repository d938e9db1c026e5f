"""``stockade init``: write a commented starter ``stockade.toml`` for a workspace.

It looks at what the workspace holds (``pyproject.toml`` or ``requirements*.txt`` means
Python, ``package.json`` means Node, a git remote means git and that remote's host) and
writes a policy that names the matching presets, with a comment on each line saying why
it is there. It never overwrites a file without ``--force``; ``--print`` writes to stdout.
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from stockade._exceptions import EXIT_STOCKADE_ERROR
from stockade.policy._load import WORKSPACE_POLICY


@dataclass
class Findings:
    """What ``init`` found in a workspace, each with the evidence that named it."""

    presets: dict[str, str] = field(default_factory=dict)
    #: extra host -> why (a git remote that is not GitHub)
    hosts: dict[str, str] = field(default_factory=dict)
    remarks: list[str] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``init``."""
    parser.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="the workspace (default: the current directory)",
    )
    parser.add_argument(
        "--force", action="store_true", help=f"overwrite an existing {WORKSPACE_POLICY}"
    )
    parser.add_argument(
        "--print", action="store_true", dest="print_", help="print the policy instead of writing it"
    )
    parser.add_argument(
        "--no-trust",
        action="store_true",
        help="do not pin the written file with stockade trust (it may then only tighten)",
    )


def _git_dir(workspace: Path) -> Path | None:
    git = workspace / ".git"
    if git.is_dir():
        return git
    if git.is_file():
        # A worktree or submodule: ".git" is a file naming the real git directory.
        text = git.read_text(encoding="utf-8", errors="replace").strip()
        if text.startswith("gitdir:"):
            target = Path(text[len("gitdir:") :].strip())
            target = target if target.is_absolute() else (workspace / target)
            common = target / "commondir"
            if common.is_file():
                target = target / common.read_text().strip()
            return target.resolve()
    return None


_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!/)")


def remote_host(url: str) -> tuple[str, bool] | None:
    """``(host, is_https)`` of a git remote URL, or None for a local path."""
    url = url.strip()
    m = re.match(r"^([a-z][a-z0-9+.-]*)://(?:[^@/]*@)?(\[[^\]]+\]|[^:/]+)", url, re.IGNORECASE)
    if m:
        return m.group(2).lower(), m.group(1).lower() == "https"
    m = _SCP_LIKE.match(url)
    if m:
        return m.group(1).lower(), False
    return None


def _remotes(git_dir: Path) -> dict[str, str]:
    config = configparser.RawConfigParser(strict=False)
    try:
        config.read(git_dir / "config", encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for section in config.sections():
        m = re.match(r'^remote "(.+)"$', section)
        if m and config.has_option(section, "url"):
            out[m.group(1)] = config.get(section, "url")
    return out


def inspect_workspace(workspace: Path) -> Findings:
    """What the workspace holds that a policy should know about."""
    found = Findings()
    python = [
        name
        for name in ("pyproject.toml", "setup.py", "setup.cfg", "Pipfile", "uv.lock")
        if (workspace / name).is_file()
    ] + sorted(p.name for p in workspace.glob("requirements*.txt"))
    if python:
        found.presets["python"] = f"found {', '.join(python)}"
    if (workspace / "package.json").is_file():
        found.presets["node"] = "found package.json"
    git_dir = _git_dir(workspace)
    if git_dir is not None:
        for name, url in _remotes(git_dir).items():
            parsed = remote_host(url)
            if parsed is None:
                continue
            host, https = parsed
            if not https:
                found.remarks.append(
                    f'remote "{name}" ({url}) is not https: only HTTP(S) goes through the '
                    "stockade proxy, so git over ssh cannot reach it from the sandbox; an "
                    "https remote URL works"
                )
            if host == "github.com":
                found.presets.setdefault("git", f'found remote "{name}" {url}')
            elif https:
                found.hosts.setdefault(host, f'remote "{name}" {url}')
    return found


def starter_policy(workspace: Path) -> str:
    """The commented starter policy for ``workspace``, as TOML text."""
    from stockade.policy._presets import PRESETS

    found = inspect_workspace(workspace)
    lines = [
        f"# stockade policy for {workspace}, written by 'stockade init'.",
        "#",
        "# How stockade finds its policy: --policy FILE; else this file (stockade.toml in the",
        "# workspace) on top of your user policy ~/.config/stockade/policy.toml; else the",
        "# built-in default (workspace read-write, system read-only, no network).",
        "#",
        "# A workspace policy can only TIGHTEN the user policy: the sandbox can write the",
        "# workspace, and a cloned repository brings its own file, so nothing written here",
        "# is trusted to widen what the user allows until you pin it. 'stockade init'",
        "# pinned this file for you (stockade trust: by its SHA-256, in stockade's state).",
        "# Any change to it lapses the pin: review it, then run 'stockade trust' again.",
        "# (Or use it explicitly:   stockade run --policy stockade.toml -- CMD.)",
        "# 'stockade check' prints the effective policy and whether this file is trusted;",
        "# docs/policy.md lists every key.",
        "",
        "version = 1  # the policy schema version",
        "",
        "[presets]",
    ]
    if found.presets:
        for name, why in found.presets.items():
            lines.append(f"# {name}: {why} -> {PRESETS[name]}")
    else:
        lines.append("# no Python, Node or GitHub project found; available presets:")
        lines += [f"#   {name}: {text}" for name, text in PRESETS.items()]
    names = ", ".join(f'"{n}"' for n in found.presets)
    lines.append(f"use = [{names}]")
    if "git" in found.presets:
        lines.append(
            "# allow_push = true  # let git push to GitHub (git-receive-pack); off by default"
        )
    lines += [
        "",
        "[network]",
        "# hosts the sandbox may reach through the stockade proxy, besides the presets';",
        '# "host", "*.example.com" (subdomains only), "host:port", IPs and CIDRs',
    ]
    if found.hosts:
        lines.append("allow = [")
        lines += [f'    "{host}",  # {why}' for host, why in found.hosts.items()]
        lines.append("]")
    else:
        lines.append("allow = []")
    for remark in found.remarks:
        lines.append(f"# note: {remark}")
    lines += [
        "",
        "[filesystem]",
        "# the workspace is the directory stockade runs in (or --workspace): read-write;",
        "# system directories are read-only; everything else (your home, ~/.ssh) is invisible",
        "# read = []        # extra read-only directories, e.g. a shared data set",
        "# write = []       # extra read-write directories; never / or your home",
        '# deny = ["**/.env"]   # never readable, even inside the workspace',
        "",
        "[env]",
        "# the environment is built from an allow-list; credentials are withheld",
        '# pass = ["CI"]    # a credential needs { name = "X", allow_secret = true }',
        "",
        "[limits]",
        "# wall_seconds = 600  # kill the whole sandbox after ten minutes",
        "",
    ]
    return "\n".join(lines)


def execute(args: argparse.Namespace) -> int:
    """Write (or print) the starter policy; 125 if it exists and ``--force`` is not given."""
    from stockade.policy import parse_policy_text

    workspace = (args.workspace or Path.cwd()).expanduser().resolve()
    if not workspace.is_dir():
        print(f"stockade init: {workspace}: not a directory", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    text = starter_policy(workspace)
    # What init writes must load: validate it as the trusted file it is meant to be.
    parse_policy_text(text, "stockade init", workspace=workspace)
    if args.print_:
        sys.stdout.write(text)
        return 0
    target = workspace / WORKSPACE_POLICY
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.force else os.O_EXCL)
    try:
        fd = os.open(target, flags | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        print(f"stockade init: {target} exists; pass --force to overwrite it", file=sys.stderr)
        return EXIT_STOCKADE_ERROR
    except OSError as exc:
        print(f"stockade init: cannot write {target}: {exc.strerror}", file=sys.stderr)
        return 125
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    if args.no_trust:
        print(
            f"stockade init: wrote {target} (not trusted: it may only tighten your policy); "
            f"review it, then 'stockade trust {target}' lets plain 'stockade run' use it",
            file=sys.stderr,
        )
        return 0
    # The person ran init and stockade wrote these bytes on the host: pinning them is
    # what makes the file work in the plain 'stockade run -- CMD' that follows.
    from stockade.policy._trust import TrustStore

    TrustStore().add(target, text.encode("utf-8"))
    print(
        f"stockade init: wrote {target} and trusted it (stockade trust): 'stockade run -- CMD' "
        f"in {workspace} now uses it; 'stockade check' shows the effective policy; any "
        "change to the file lapses the trust until you run 'stockade trust' again",
        file=sys.stderr,
    )
    return 0
