"""The ``stockade`` command line: one module per verb, imported only when used.

Each verb module defines ``add_arguments(parser)`` and ``execute(args) -> int``. Verbs are
listed here with their one-line help so that ``stockade --help`` needs no verb module,
and ``stockade run`` imports only what running needs (the CLI has a start-up budget).
"""

from __future__ import annotations

import os
import sys

from stockade._exceptions import EXIT_STOCKADE_ERROR, StockadeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any, NoReturn

#: verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "run": ("stockade.cli.run", "run a command inside the sandbox"),
    "check": ("stockade.cli.check", "validate a policy and print the effective policy"),
    "doctor": ("stockade.cli.doctor", "report which layers this host can enforce, and fixes"),
    "proxy": ("stockade.cli.proxy", "run the egress proxy on its own"),
    "gateway": (
        "stockade.cli.gateway",
        "serve as the egress gateway of a Kubernetes cluster's sandbox pods",
    ),
    "explain": (
        "stockade.cli.explain",
        "what a policy still lets through, and its deliberate exceptions",
    ),
    "probe": (
        "stockade.cli.probe",
        "run attack scenarios under every layer subset; model vs reality",
    ),
    "import": ("stockade.cli.import_", "translate srt settings into a stockade policy"),
    "mcp": ("stockade.cli.mcp", "serve the sandbox to an MCP client (stdio); asks via elicitation"),
    "log": ("stockade.cli.log", "read, filter and follow the audit logs"),
    "init": ("stockade.cli.init", "write a commented starter stockade.toml for this workspace"),
    "server": ("stockade.cli.server", "keep a warm run server that makes 'run' start faster"),
    "approvals": ("stockade.cli.approvals", 'list or revoke the hosts answered "always"'),
    "trust": (
        "stockade.cli.trust",
        "let this workspace's stockade.toml widen your policy (pinned by its hash)",
    ),
    "changes": ("stockade.cli.changes", "list what an overlay run changed (or --list the layers)"),
    "diff": ("stockade.cli.diff", "show an overlay run's changes as a unified diff"),
    "apply": ("stockade.cli.apply", "write an overlay run's changes into the workspace"),
    "discard": ("stockade.cli.discard", "throw an overlay run's layer away"),
    "checkpoints": ("stockade.cli.checkpoints", "list an overlay layer's checkpoints"),
    "review": (
        "stockade.cli.review",
        "an overlay run's file changes beside its network decisions, in one place",
    ),
    "learn": (
        "stockade.cli.learn",
        "run a task in learning mode and record what it needs (files, hosts, requests)",
    ),
    "policy": (
        "stockade.cli.policy",
        "suggest a policy from learning runs, verify it, report drift",
    ),
    "export": (
        "stockade.cli.export",
        "write a policy as Kubernetes manifests (agent-sandbox, Pod, Deployment, gateway)",
    ),
}

PROG = "stockade"


def parser_class() -> type[argparse.ArgumentParser]:
    """argparse's parser, but a usage error exits 125 as every stockade error does.

    argparse's own 2 would collide with the commands' codes (pytest, grep and diff use 2),
    so a caller could not tell "stockade refused the command line" from "the tests
    failed". Sub-parsers (``gateway serve``) are made of the same class.
    """
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            self.print_usage(sys.stderr)
            self.exit(EXIT_STOCKADE_ERROR, f"{self.prog}: error: {message}\n")

    return Parser


def _top_parser() -> argparse.ArgumentParser:
    import argparse

    verbs = "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in VERBS.items())
    parser = parser_class()(
        prog=PROG,
        description="A sandbox and egress-control runtime for code that AI agents run.",
        epilog=f"commands:\n{verbs}\n\nRun '{PROG} COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{PROG} [--version] COMMAND [ARGS...]",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    return parser


def _parser(verb: str, help_: str, module: Any) -> argparse.ArgumentParser:
    parser = parser_class()(prog=f"{PROG} {verb}", description=help_)
    module.add_arguments(parser)
    return parser


def error(message: str) -> None:
    """Print a one-line error the way every verb does."""
    print(f"{PROG}: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``stockade`` console script; returns the exit code."""
    _default_sigchld()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        # Asked for, the help is the output; without a verb it is the error's message.
        _top_parser().print_help(sys.stdout if args else sys.stderr)
        return 0 if args else EXIT_STOCKADE_ERROR
    if args[0] == "--version":
        from stockade._version import __version__

        print(f"{PROG} {__version__}")
        return 0
    # A control channel is a descriptor of this process: the run stays here with it.
    control = any(a.startswith("--control-fd") for a in args)
    if args[0] == "run" and os.environ.get("STOCKADE_SERVER") != "0" and not control:
        # A warm run server of this user, when one runs and accepts this caller, saves
        # the start-up; otherwise (None) the run happens here, under the same policy.
        from stockade.cli import _client

        served = _client.run(args)
        if served is not None:
            return served
    return dispatch(args)


def _default_sigchld() -> None:
    """Undo a SIGCHLD ignore inherited from the caller (it survives exec).

    With it, the kernel reaps every child of stockade's at once: bubblewrap's exit status
    is lost and a run waits for it forever. The command does not inherit the ignore from
    a served run either (``_client.INHERITED_IGNORES`` leaves it out), so an in-process
    run now starts its command the same way.
    """
    if TYPE_CHECKING:
        import signal as _signal
    else:
        import _signal  # signal.py would import enum (~5 ms)

    if _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)


def dispatch(args: list[str]) -> int:
    """Run the verb ``args[0]`` in this process with the rest of ``args``; its exit code."""
    verb = args[0]
    if verb not in VERBS:
        error(f"unknown command {verb!r}; commands: {', '.join(VERBS)}")
        return EXIT_STOCKADE_ERROR
    module_name, help_ = VERBS[verb]
    import importlib

    module = importlib.import_module(module_name)
    try:
        # A verb on the hot path may parse the common case itself (argparse costs about
        # 15 ms to import); anything it does not understand goes to argparse, which
        # explains errors and prints help.
        fast = getattr(module, "fast_parse", None)
        ns = fast(args[1:]) if fast is not None else None
        if ns is None:
            ns = _parser(verb, help_, module).parse_args(args[1:])
        code: int = module.execute(ns)
    except StockadeError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_STOCKADE_ERROR
    except Exception as exc:
        # A bug in stockade, never a reason to run anything: one line, and the
        # traceback only when asked for.
        if os.environ.get("STOCKADE_DEBUG"):
            raise
        error(f"internal error: {type(exc).__name__}: {exc} (STOCKADE_DEBUG=1 shows the traceback)")
        return EXIT_STOCKADE_ERROR
    return code
