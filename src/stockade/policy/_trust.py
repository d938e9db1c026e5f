"""Trusted workspace policies: ``stockade trust``, hash-pinned like ``direnv allow``.

A ``stockade.toml`` found in a workspace is untrusted: the sandbox can write the
workspace (and a cloned repository brings one), so the loader composes it on the user
policy and it may only tighten (``_load._tighten``). A person who has read the file can
pin it with ``stockade trust``: its absolute path and the SHA-256 of its bytes go into
``$XDG_STATE_HOME/stockade/trusted.json``, which lies outside every sandbox's reach
(``stockade._roots``). A pinned file is then read as the user's own policy (as with
``--policy``). The pin lapses as soon as one byte of the file changes: the next run
composes it tighten-only again, and ``stockade check`` says so.

Writes take ``fcntl.flock`` on ``trusted.json.lock`` and replace the file atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from stockade import _roots
from stockade._exceptions import PolicyError
from stockade._fs import replace_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from stockade.policy._model import Policy

__all__ = ["TrustStore", "file_digest"]


def file_digest(data: bytes) -> str:
    """``sha256:<hex>`` of a policy file's bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class TrustStore:
    """The pinned workspace policies of this user (``trusted.json`` in stockade's state)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else _roots.state_dir() / "trusted.json"

    def entries(self) -> dict[str, dict[str, str]]:
        """``{absolute path: {"digest": ..., "added": ...}}``; empty when there is none.

        Raises:
            PolicyError: the file is not what stockade writes (it is never guessed at).
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise PolicyError(f"{self.path}: cannot be read ({exc.strerror})") from None
        try:
            raw = json.loads(text)
        except ValueError:
            raise PolicyError(
                f"{self.path}: not JSON; remove it and pin again with stockade trust"
            ) from None
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("digest"), str)
            for k, v in raw.items()
        ):
            raise PolicyError(
                f"{self.path}: unexpected content; remove it and pin again with stockade trust"
            )
        return raw

    def pinned(self, path: Path, data: bytes) -> bool:
        """Whether ``path`` (resolved) is pinned with exactly these bytes."""
        entry = self.entries().get(str(Path(os.path.realpath(path))))
        return entry is not None and entry["digest"] == file_digest(data)

    def status(self, path: Path, data: bytes) -> str:
        """``"trusted"``, ``"changed"`` (pinned, but not these bytes) or ``"untrusted"``."""
        entry = self.entries().get(str(Path(os.path.realpath(path))))
        if entry is None:
            return "untrusted"
        return "trusted" if entry["digest"] == file_digest(data) else "changed"

    def add(self, path: Path, data: bytes) -> str:
        """Pin ``path`` with the digest of ``data``; return the digest."""
        digest = file_digest(data)
        key = str(Path(os.path.realpath(path)))
        with self._locked() as entries:
            entries[key] = {
                "digest": digest,
                "added": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        return digest

    def remove(self, path: Path) -> bool:
        """Unpin ``path``; whether it was pinned."""
        key = str(Path(os.path.realpath(path)))
        with self._locked() as entries:
            return entries.pop(key, None) is not None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, str]]]:
        import fcntl

        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self.entries()
            yield entries
            text = json.dumps(entries, indent=1, sort_keys=True) + "\n"
            replace_file(self.path, text.encode(), sync=True)
        finally:
            os.close(lock)


def widenings(now: Policy, trusted: Policy) -> list[str]:
    """What ``trusted`` (a workspace file read as the user's own) grants that ``now``
    (the policy runs there get today) does not, one line each, for the person about to
    pin it: ``stockade trust`` prints them, since a file the sandbox or a cloned
    repository wrote could ask for any of these."""
    from stockade._record import fields
    from stockade.policy._text import one_line

    out: list[str] = []

    def more(what: str, before: Sequence[object], after: Sequence[object]) -> None:
        extra = [x for x in after if x not in before]
        if extra:
            out.append(f"{what}: {', '.join(one_line(str(x)) for x in extra)}")

    more("network.allow adds", now.network.allow, trusted.network.allow)
    gone = [d for d in now.network.deny if d not in trusted.network.deny]
    if gone:
        out.append(f"network.deny loses: {', '.join(one_line(d) for d in gone)}")
    more(
        "network.hosts pins",
        [f"{k} = {v}" for k, v in now.network.hosts.items()],
        [f"{k} = {v}" for k, v in trusted.network.hosts.items()],
    )

    def rules(p: Policy) -> list[str]:
        # by what a rule says, not where it stands (its index)
        return [
            f"{r.host} {','.join(r.methods) or '*'} {','.join(r.paths)}"
            for r in p.network.rules
            if r.action != "deny"
        ]

    more("network.rules allow", rules(now), rules(trusted))
    if trusted.network.upstream is not None and trusted.network.upstream != now.network.upstream:
        out.append(f"network.upstream: {one_line(trusted.network.upstream.proxy)}")
    if trusted.filesystem.workspace != now.filesystem.workspace:
        out.append(f"filesystem.workspace: {trusted.filesystem.workspace}")
    more("filesystem.read adds", now.filesystem.read, trusted.filesystem.read)
    more("filesystem.write adds", now.filesystem.write, trusted.filesystem.write)
    gone = [d for d in now.filesystem.deny if d not in trusted.filesystem.deny]
    if gone:
        out.append(f"filesystem.deny loses: {', '.join(one_line(d) for d in gone)}")
    more(
        "env.pass adds",
        [e.name + (" (secret)" if e.allow_secret else "") for e in now.env.pass_],
        [e.name + (" (secret)" if e.allow_secret else "") for e in trusted.env.pass_],
    )
    more(
        "env.set sets",
        [f"{k}={v}" for k, v in now.env.set.items()],
        [f"{k}={v}" for k, v in trusted.env.set.items()],
    )
    more(
        "secrets binds",
        [f"{s.name} to {', '.join(s.hosts)}" for s in now.secrets],
        [f"{s.name} to {', '.join(s.hosts)}" for s in trusted.secrets],
    )
    off = [
        name
        for name in fields(now.layers)
        if getattr(now.layers, name) is True and getattr(trusted.layers, name) is False
    ]
    if off:
        out.append(f"layers switched off: {', '.join(off)}")
    if trusted.container.backend != now.container.backend:
        out.append(f"container.backend: {trusted.container.backend}")
    if trusted.container.allow_degraded and not now.container.allow_degraded:
        out.append("container.allow_degraded: true")
    raised = [
        name
        for name in ("pids", "memory", "file_size", "cpu_seconds", "wall_seconds")
        if _looser(getattr(now.limits, name), getattr(trusted.limits, name))
    ]
    if raised:
        out.append(f"limits raised: {', '.join(raised)}")
    if trusted.mcp.allow_always and not now.mcp.allow_always:
        out.append("mcp.allow_always: true")
    grace = trusted.network.grace_until
    if grace is not None and (now.network.grace_until is None or grace > now.network.grace_until):
        # report mode: until that day what the allow-list lacks is let through
        out.append(
            f"network.grace_until: {grace.isoformat()} (hosts and requests the policy "
            "does not admit are let through, reported, until then)"
        )
    return out


def _looser(before: float, after: float) -> bool:
    # 0 is "no limit" for cpu and wall time
    if before == after:
        return False
    return after == 0 or (before != 0 and after > before)
