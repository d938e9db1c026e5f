"""``stockade-sh``: a shell whose every command runs inside the sandbox.

Two calling conventions:

* ``stockade-sh -c CMD [ARG0 [ARGS...]]`` behaves like ``sh -c``: for programs that run
  commands through ``$SHELL`` (Aider: ``SHELL=stockade-sh aider``).
* ``stockade-sh STRING`` (one argument) is Claude Code's ``CLAUDE_CODE_SHELL_PREFIX``
  convention: STRING is a whole shell command line, run with ``bash -c``. Claude Code's
  Bash tool ends its line with ``pwd -P >| /tmp/claude-<hex>-cwd``; /tmp inside the sandbox
  is private, so that target is rewritten to a file in the workspace and, after the run,
  a validated directory is copied to the host path Claude Code reads.

Each command is one ``stockade run``, through a warm ``stockade server`` when one runs
(docs/server.md). The policy comes from ``STOCKADE_POLICY`` (else the usual search
order), the workspace from ``STOCKADE_WORKSPACE``, else ``CLAUDE_PROJECT_DIR``, else the
current directory. Exit status: the command's; stockade's own failures exit 125.

A line that is not a Bash-tool line (hooks, MCP server launches) runs in the sandbox too:
failing closed. ``STOCKADE_SH_HOST=1`` runs those on the host instead, for hooks that
need it (the Bash tool's lines stay sandboxed whatever it says).

This module is on the path of every command an agent runs: it imports only what the
``stockade run`` front end does.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

#: The end of a Claude Code Bash-tool line: where it records the shell's last directory.
CWD_FILE = re.compile(r"pwd -P >\| (/tmp/claude-[0-9A-Za-z]+-cwd)\s*$")

USAGE = "usage: stockade-sh -c COMMAND [ARG0 [ARGS...]]  |  stockade-sh 'COMMAND LINE'"


def _workspace() -> str:
    for name in ("STOCKADE_WORKSPACE", "CLAUDE_PROJECT_DIR"):
        value = os.environ.get(name)
        if value:
            return os.path.abspath(os.path.expanduser(value))
    return os.getcwd()


def _run(command: list[str], workspace: str) -> int:
    """``stockade run`` of ``command`` in ``workspace`` (warm server first); its status."""
    from stockade import cli

    args = ["run", "--workspace", workspace]
    policy = os.environ.get("STOCKADE_POLICY")
    if policy:
        args += ["--policy", policy]
    return cli.main([*args, "--", *command])


def _copy_cwd(scratch: str, target: str, workspace: str) -> None:
    """Give Claude Code the directory the command ended in, if it is a real one.

    The file was written inside the sandbox: it is read without following a link, and
    only an absolute path of an existing directory goes on (else the workspace, where
    the next command starts anyway).
    """
    try:
        fd = os.open(scratch, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        _unlink(scratch)
        return  # the command failed before pwd: Claude Code keeps its directory
    try:
        data = os.read(fd, 4097)
    except OSError:
        data = b""
    finally:
        os.close(fd)
        _unlink(scratch)
    path = data.decode(errors="replace").strip()
    if len(data) > 4096 or not os.path.isabs(path) or "\n" in path or not os.path.isdir(path):
        path = workspace
    # Claude Code made the name (mktemp-like, in the host's /tmp); replace, never follow.
    from stockade._fs import replace_file

    replace_file(target, path.encode() + b"\n")


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def claude_line(line: str) -> int:
    """Run one ``CLAUDE_CODE_SHELL_PREFIX`` line; its exit status."""
    workspace = _workspace()
    found = CWD_FILE.search(line)
    if found is None:
        if os.environ.get("STOCKADE_SH_HOST") == "1":
            # The user's opt-out for their own hooks: the line is theirs, not the model's.
            os.execv("/bin/sh", ["/bin/sh", "-c", line])  # noqa: S606
        return _run(["bash", "-c", line], workspace)
    target = found.group(1)
    scratch = os.path.join(workspace, f".stockade-sh-{os.getpid()}-{os.urandom(4).hex()}.cwd")
    inner = f"{line[: found.start(1)]}{_quote(scratch)}{line[found.end(1) :]}"
    try:
        return _run(["bash", "-c", inner], workspace)
    finally:
        _copy_cwd(scratch, target, workspace)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stockade-sh`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "-c":
        if len(args) < 2:
            print(f"stockade-sh: -c needs a command\n{USAGE}", file=sys.stderr)
            return 2
        # sh -c CMD ARG0 ARGS...: ARG0 becomes $0, the rest $1...
        return _run(["sh", "-c", *args[1:]], _workspace())
    if len(args) == 1 and not args[0].startswith("-"):
        return claude_line(args[0])
    print(f"stockade-sh: unsupported arguments {args[:2]!r}\n{USAGE}", file=sys.stderr)
    return 2
