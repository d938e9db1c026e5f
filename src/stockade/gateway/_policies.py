"""The gateway's policies: a directory of TOML files, one per named policy, reloaded whole.

A ConfigMap volume swaps its ``..data`` symlink atomically when the ConfigMap changes, so
the directory is polled (no inotify needed, and it sees the swap): when any file's
identity (inode, size, mtime) or the symlink's target changes, every file is read and
validated again, and only if all of them load is the new generation swapped in at once.
A directory that fails to load keeps the previous generation serving (a typo must not
turn every sandbox's egress off, nor partly apply), and the failure is reported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade._exceptions import PolicyError
from stockade.policy import Policy, parse_policy_text

__all__ = ["Generation", "PolicyDirectory"]

#: a policy's name is its file's stem: a DNS-1123 label, as the annotation value is
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class Generation:
    """One load of the directory: each policy, its digest, and what serves it."""

    number: int
    policies: dict[str, Policy]
    digests: dict[str, str]
    #: per policy, the built serving objects (an EgressProxy): made by the gateway
    serving: dict[str, Any] = field(default_factory=dict)


def _signature(directory: Path, suffix: str = ".toml") -> tuple[Any, ...]:
    out: list[Any] = []
    try:
        data = directory / "..data"
        out.append(os.readlink(data) if data.is_symlink() else "")
    except OSError:
        out.append("")
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        return ("unreadable", str(exc))
    for name in entries:
        if name.startswith(".") or not name.endswith(suffix):
            continue
        try:
            st = os.stat(directory / name)  # follows the ConfigMap's symlinks
        except OSError:
            out.append((name, None))
            continue
        out.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class PolicyDirectory:
    """Loads the policies of ``directory``; :meth:`poll` reloads when it changed.

    ``build`` turns a loaded generation's policies into their serving objects; it runs
    before the swap, so an error there (a policy whose secret is missing) keeps the old
    generation too. A change to any file of ``watch`` (the mounted credentials and CA:
    Secret volumes, updated by the same ``..data`` swap) makes a new generation too, so
    that rotated values are built in.
    """

    def __init__(
        self,
        directory: Path,
        build: Callable[[Mapping[str, Policy]], dict[str, Any]],
        watch: Sequence[Path] = (),
    ) -> None:
        self.directory = directory
        self.build = build
        self.watch = tuple(watch)
        self.current: Generation | None = None
        self._signature: tuple[Any, ...] | None = None
        self.last_error = ""

    def load(self) -> Generation:
        """Read every ``NAME.toml`` and make the next generation (not yet current).

        Raises PolicyError naming the file and key for the first problem.
        """
        if not self.directory.is_dir():
            raise PolicyError(f"{self.directory}: no such directory; check --policies")
        policies: dict[str, Policy] = {}
        for name in sorted(os.listdir(self.directory)):
            if name.startswith(".") or not name.endswith(".toml"):
                continue
            stem = name[: -len(".toml")]
            path = self.directory / name
            if not _NAME.match(stem):
                raise PolicyError(
                    f"{path}: a policy's file name is its name, and {stem!r} is not a "
                    "DNS-1123 label (lower case, digits, '-'); rename the file"
                )
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PolicyError(f"{path}: cannot read: {exc}") from None
            # The workspace is irrelevant to a gateway (no files are granted to anyone);
            # the directory itself is a valid one.
            policies[stem] = parse_policy_text(text, str(path), workspace=self.directory)
        if not policies:
            raise PolicyError(f"{self.directory}: no *.toml policies; add one file per policy")
        number = 1 if self.current is None else self.current.number + 1
        generation = Generation(number, policies, {k: p.digest() for k, p in policies.items()})
        generation.serving = self.build(policies)
        return generation

    def poll(self) -> Generation | None:
        """The new generation when the directory changed and loads; else None (the
        reason of a failed load is in :attr:`last_error`, and it is retried only once
        the directory changes again)."""
        signature = (
            _signature(self.directory),
            *(_signature(d, "") if d.is_dir() else () for d in self.watch),
        )
        if signature == self._signature and self.current is not None:
            return None
        self._signature = signature
        try:
            generation = self.load()
        except Exception as exc:
            self.last_error = str(exc)
            if self.current is None:
                raise
            return None
        self.last_error = ""
        self.current = generation
        return generation
