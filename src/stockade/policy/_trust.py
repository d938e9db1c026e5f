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
from collections.abc import Iterator
from pathlib import Path

from stockade import _roots
from stockade._exceptions import PolicyError

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
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            with open(tmp, "w") as fh:
                json.dump(entries, fh, indent=1, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        finally:
            os.close(lock)
