"""Executables stockade runs from its cache, checked by content (DESIGN §6).

The inner launcher and runsc live in ``$XDG_CACHE_HOME/stockade``. Owner and mode say
nothing there: the sandbox runs as the same user, so a copy it wrote has the right owner.
When stockade builds or fetches one, it records the file's SHA-256 in its state
(``$XDG_STATE_HOME/stockade/executables/``), which no sandbox can write
(``stockade._roots``); before it runs one, it checks the file against that record.

Hashing a 60 MB runsc costs some 150 ms, so the record also keeps the file's identity
(device, inode, size, mtime and ctime): while those are unchanged the content is too
(ctime cannot be set from user space; any write, chmod or rename changes it), and only
a changed identity costs a hash. ``scripts/get-runsc`` writes the record without the
identity; the first verification adds it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from stockade import _roots
from stockade._fs import replace_file
from stockade._hash import sha256_hex


def _record_path(path: Path) -> Path:
    key = sha256_hex(os.fsencode(str(path)))[:32]
    return _roots.state_dir() / "executables" / f"{key}.json"


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _sha256(fd: int) -> str:
    # hashlib (OpenSSL, fast on a 60 MB runsc) only when a file is hashed: a run whose
    # executables match their identity never is.
    import hashlib

    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def record(path: Path) -> str:
    """Record the content of the executable at ``path`` (just built or fetched by
    stockade); return its SHA-256."""
    real = Path(os.path.realpath(path))
    fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        sha = _sha256(fd)
        ident = _identity(os.fstat(fd))
    finally:
        os.close(fd)
    _write(real, {"path": str(real), "sha256": sha, "identity": ident})
    return sha


def _write(real: Path, entry: dict[str, object]) -> None:
    target = _record_path(real)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(target, json.dumps(entry).encode())


def verify(path: Path, *, first_use: bool = False) -> str | None:
    """Why the executable at ``path`` may not be run (None: it matches its record).

    ``first_use``: a file this state has no record of is recorded now and accepted (the
    launcher: its name carries its source's digest, so a copy planted before it was ever
    built would have to guess a future source; a state directory that never saw this
    cache, as in a fresh test world, then costs one hash, not a compile). Without it (a
    runsc, whose name is any version the sandbox likes) a missing record refuses.
    """
    real = Path(os.path.realpath(path))
    try:
        entry = json.loads(_record_path(real).read_text())
    except FileNotFoundError:
        if first_use:
            try:
                record(real)
            except OSError as exc:
                return f"{real} cannot be recorded ({exc.strerror})"
            return None
        return f"{real} has no recorded digest (stockade did not build or fetch it)"
    except (OSError, ValueError):
        return f"{real}: its digest record cannot be read"
    if not isinstance(entry, dict) or entry.get("path") != str(real):
        return f"{real}: its digest record is not stockade's"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        return f"{real} cannot be opened ({exc.strerror})"
    try:
        ident = _identity(os.fstat(fd))
        if entry.get("identity") == ident:
            return None
        sha = _sha256(fd)
    finally:
        os.close(fd)
    if sha != entry.get("sha256"):
        return f"{real} is not the file stockade recorded (its content changed)"
    # The same content under a new identity (copied, touched): remember the new one.
    with contextlib.suppress(OSError):
        _write(real, {**entry, "identity": ident})
    return None
