"""The exceptions stockade raises, as one tree.

::

    StockadeError                 everything stockade raises derives from this
    ├── PolicyError               the policy is wrong: a key, a value, a file (exit 125)
    ├── Unavailable               the host lacks a feature a layer needs (exit 125)
    ├── Denied                    a decision, not a crash: something was refused
    └── SandboxError              the runtime itself failed (exit 125)
        └── SandboxTimeout        the wall-time limit expired (exit 124)

A command that merely exits non-zero is not an exception: its exit code passes through.
"""

from __future__ import annotations

#: Exit code for an error of stockade itself (bad policy, missing feature, runtime failure).
EXIT_STOCKADE_ERROR = 125
#: Exit code when the wall-time limit killed the command.
EXIT_TIMEOUT = 124
#: Exit code when the command exists but cannot be executed.
EXIT_NOT_EXECUTABLE = 126
#: Exit code when the command is not found.
EXIT_NOT_FOUND = 127


class StockadeError(Exception):
    """Root of every exception stockade raises."""

    exit_code: int = EXIT_STOCKADE_ERROR


class PolicyError(StockadeError):
    """The policy is invalid: the message names the file, the key, the value and the fix."""


class Unavailable(StockadeError):
    """A layer the policy asks for cannot be applied on this host.

    stockade refuses to run rather than run with less isolation than asked for; the
    message names the missing feature and how to provide it (or which layer to disable).
    """

    def __init__(self, feature: str, fix: str) -> None:
        self.feature = feature
        self.fix = fix
        super().__init__(f"{feature} is unavailable: {fix}")


class Denied(StockadeError):
    """Something was refused by a layer; carries the layer and the reason."""

    def __init__(self, layer: str, reason: str, detail: str = "") -> None:
        self.layer = layer
        self.reason = reason
        self.detail = detail
        text = f"denied by {layer}: {reason}"
        super().__init__(f"{text} ({detail})" if detail else text)


class SandboxError(StockadeError):
    """The runtime failed to set up, run or tear down the sandbox."""


class SandboxTimeout(SandboxError):
    """The command ran past its wall-time limit and was killed with its whole tree."""

    exit_code = EXIT_TIMEOUT
