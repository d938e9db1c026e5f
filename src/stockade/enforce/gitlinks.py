"""Repositories the sandbox nested into the workspace's repository: a check after the run.

The protected paths keep git's redirect files of every git directory that exists when a
run starts read-only. A repository the sandbox *creates* below the top is its own,
config and all, and mounts cannot stop a ``.git`` from appearing anywhere. Alone it is
inert until someone runs git inside it; but the workspace's index must stay writable (for
commits), and a gitlink added there (``git update-index --cacheinfo 160000,...,sub``)
makes the user's next ``git status`` at the top run git in ``sub``, under ``sub``'s own
configuration (``core.fsmonitor``, hooks): code of the sandbox's choosing, on the host.

This module finds that case cheaply after a run: only when the index changed during the
run, it reads the gitlinks out of the index and reports each whose repository (its
``.git``, the configuration or the hooks there) was made or changed during the run and is
not a submodule's git directory under the protected ``.git/modules``. It is a tripwire
(the runtime warns and audits); it changes nothing on disk.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

__all__ = ["gitlinks", "nested_repositories"]

_GITLINK = 0o160000
_EXTENDED = 0x4000
#: Entries read at most: beyond this an index is left unread (the report says so).
_MAX_ENTRIES = 2_000_000


def _hash_size(gitdir: Path) -> int:
    try:
        config = (gitdir / "config").read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        return 20
    compact = config.replace(" ", "").replace("\t", "")
    return 32 if "objectformat=sha256" in compact else 20


def gitlinks(index: Path, hash_size: int = 20) -> tuple[list[str], bool]:
    """The paths of the gitlink entries (mode 160000) of a git index file, and whether
    the whole index was read (False for an unknown version or a damaged file)."""
    try:
        data = index.read_bytes()
    except OSError:
        return [], False
    if len(data) < 12 or data[:4] != b"DIRC":
        return [], False
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4) or count > _MAX_ENTRIES:
        return [], False
    found: list[str] = []
    pos = 12
    previous = b""
    flags_at = 40 + hash_size
    for _ in range(count):
        if pos + flags_at + 2 > len(data):
            return found, False
        (mode,) = struct.unpack_from(">I", data, pos + 24)
        (flags,) = struct.unpack_from(">H", data, pos + flags_at)
        cursor = pos + flags_at + 2
        if flags & _EXTENDED:
            if version < 3:
                return found, False
            cursor += 2
        if version == 4:
            # The path is the previous one less N bytes (a varint), then a suffix.
            strip = 0
            while True:
                if cursor >= len(data):
                    return found, False
                byte = data[cursor]
                cursor += 1
                strip = (strip << 7) | (byte & 0x7F)
                if not byte & 0x80:
                    break
                strip += 1
            end = data.find(b"\0", cursor)
            if end < 0 or strip > len(previous):
                return found, False
            path = previous[: len(previous) - strip] + data[cursor:end]
            pos = end + 1
        else:
            end = data.find(b"\0", cursor)
            if end < 0:
                return found, False
            path = data[cursor:end]
            # Entries are padded with 1 to 8 NULs to a multiple of 8 bytes.
            size = (end - pos + 8) & ~7
            pos += size
        previous = path
        if mode == _GITLINK:
            found.append(path.decode("utf-8", "replace"))
    return found, True


def _changed_since(path: Path, since: float) -> bool:
    for candidate in (path, path / "config", path / "hooks"):
        try:
            if os.lstat(candidate).st_ctime >= since:
                return True
        except OSError:
            continue
    return False


def nested_repositories(workspace: Path, since: float) -> list[Path]:
    """Gitlinked repositories in ``workspace`` that were made or changed after ``since``
    (a wall-clock time), when the workspace's index changed after it too."""
    gitdir = workspace / ".git"
    if not gitdir.is_dir():
        return []
    index = gitdir / "index"
    try:
        if index.stat().st_mtime < since:
            return []
    except OSError:
        return []
    links, _complete = gitlinks(index, _hash_size(gitdir))
    modules = (gitdir / "modules").resolve()
    out: list[Path] = []
    for link in links:
        checkout = workspace / link
        dotgit = checkout / ".git"
        try:
            if dotgit.is_symlink() or dotgit.is_file():
                text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
                target = (checkout / text.removeprefix("gitdir:").strip()).resolve()
                if target.is_relative_to(modules):
                    continue  # a submodule's git directory: protected from the start
                repository = target
            elif dotgit.is_dir():
                repository = dotgit
            else:
                continue
        except (OSError, ValueError):
            continue
        if _changed_since(repository, since) or _changed_since(dotgit, since):
            out.append(checkout)
    return out
