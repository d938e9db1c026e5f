"""Compile stockade's small C programs once per source, into the user's cache.

Four programs are C: the inner launcher (``enforce/_launcher.c``, run inside every
sandbox), the network namespace helper (``egress/_netns_helper.c``, which makes the
proxy's listeners inside a sandbox's namespace), the gVisor entry
(``enforce/_gvisor_entry.c``, which makes runsc's namespaces and stays its parent) and
the front end of the ``stockade`` command (``cli/_frontend.c``). Each binary
is named after a digest of its source, so a changed source gets a fresh binary and a
stale one is never reused; a cached binary is reused only when nobody but this user
could have written it and its content is the one recorded when it was built
(:mod:`stockade._digests`); otherwise it is built again.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from pathlib import Path

from stockade import _digests, _roots
from stockade._exceptions import SandboxError, Unavailable
from stockade._hash import sha256_hex


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/stockade`` (``~/.cache/stockade`` when unset): the trust root
    :func:`stockade._roots.cache_dir` names, which every sandbox gets read-only. (A
    spelling of its own here took a relative ``XDG_CACHE_HOME`` as given, relative to
    the working directory, where the trust root ignores it as XDG says: programs run on
    the host were then built where no sandbox was kept from writing.)"""
    return _roots.cache_dir()


def compiler(what: str) -> str:
    """The C compiler to build ``what``; :class:`Unavailable` when there is none."""
    import shutil  # lazy: only a build needs it

    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise Unavailable(
        f"{what} (a C compiler to build it)",
        "install gcc: apt-get install gcc libc6-dev",
    )


def trusted(path: Path) -> bool:
    """True for a cached binary that only this user could have written.

    The launcher runs every layer; a copy someone else could replace would be a way
    around all of them, so anything else is rebuilt (and replaced) instead of reused.
    """
    try:
        st = path.lstat()
        parent = path.parent.stat()
    except (FileNotFoundError, PermissionError):
        return False
    uid = os.geteuid()
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == uid
        and parent.st_uid == uid
        and not (st.st_mode | parent.st_mode) & 0o022
        and os.access(path, os.X_OK)
    )


def build(source: bytes, source_name: str, target: Path, what: str) -> Path:
    """Compile ``source`` into ``target`` unless a trusted binary is there already.

    ``cc -O2 -Wall -Werror``, static when the toolchain can (no dynamic loader to run,
    no library lookups inside a sandbox), dynamic otherwise; into a temporary name in
    ``target``'s directory (mode 0700) and renamed, so that concurrent builds never
    expose a partial file. ``what`` names the program in errors.
    Raises :class:`Unavailable` without a compiler and :class:`SandboxError` when the
    compile fails.
    """
    # Owner and mode first (cheap, and another user's file is never ours), then the
    # content against the digest recorded when this was built: the sandbox runs as this
    # user, so a copy it wrote (the cache inside a granted directory) has the right owner.
    if trusted(target) and _digests.verify(target, first_use=True) is None:
        return target
    cache = target.parent
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        # mkdir's mode is masked by umask and ignored for an existing dir: enforce it.
        os.chmod(cache, 0o700)
    except OSError as exc:
        raise SandboxError(
            f"cannot build {what}: its cache {cache} is not usable ({exc.strerror}); "
            "set XDG_CACHE_HOME to a directory of your own"
        ) from None
    import tempfile  # lazy: only a first build needs it

    cc = compiler(what)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
        src = Path(tmp) / source_name
        src.write_bytes(source)
        out = Path(tmp) / "out"
        errors = ""
        for extra in (["-static"], []):
            proc = subprocess.run(
                [cc, "-O2", "-Wall", "-Werror", *extra, "-o", str(out), str(src)],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
                # The compiler runs on the host: stockade's environment, not the caller's.
                env={**_roots.host_environment(), "TMPDIR": tmp},
            )
            if proc.returncode == 0:
                break
            errors = proc.stderr.strip()
        else:
            raise SandboxError(
                f"compiling {what} with {cc} failed: {errors.splitlines()[-1:]}; "
                "install gcc and libc6-dev, or report a bug with the compiler output"
            )
        # Owner-only like its directory: the runtime and the sandbox run as one uid.
        os.chmod(out, 0o700)
        os.replace(out, target)
    try:
        _digests.record(target)
    except OSError as exc:
        raise SandboxError(
            f"cannot record the digest of {what} in stockade's state ({exc.strerror}); "
            "make $XDG_STATE_HOME (default ~/.local/state) writable"
        ) from None
    return target


@functools.cache
def shipped_source(source: Path) -> tuple[bytes, str]:
    """A C source shipped beside its module (package data; importlib.resources would cost
    ~15 ms to import), and the first 16 hex digits of its sha256. Read once per process:
    the source is fixed for it."""
    code = source.read_bytes()
    return code, sha256_hex(code)[:16]


def shipped_path(source: Path, prefix: str) -> Path:
    """Where the program built from ``source`` lives, built or not: ``<prefix>-<digest>``
    in :func:`cache_dir`, so a changed source gets a fresh binary and a stale one is never
    reused. The compiler is not part of the key (the binary is self-contained, and
    asking ``cc --version`` on every run would cost more than the program does). The
    cache directory is read from the environment on each call: a warm process may serve
    another environment."""
    return cache_dir() / f"{prefix}-{shipped_source(source)[1]}"


def build_shipped(source: Path, prefix: str, what: str) -> Path:
    """The executable built from ``source`` at :func:`shipped_path`, compiled on first use
    by :func:`build` (which see: static when possible, atomic, reused only when its
    content is the one recorded)."""
    return build(shipped_source(source)[0], source.name, shipped_path(source, prefix), what)
