"""What the host trusts later, and the environment of what stockade starts on the host.

DESIGN §6 and ``docs/security-model.md``'s first rule: every file, directory, descriptor
or variable that stockade or the user's host tools later trust is out of the sandbox's
reach, whatever the policy grants; and everything stockade starts on the host starts from
an environment stockade built. This module names both halves once:

* :func:`trust_roots`: stockade's own directories (configuration, state, cache, data)
  and its installed package. The runtime binds each one that lies where the sandbox could
  write it read-only, with its parents pinned (``enforce/paths.py``), in every sandbox
  and on both backends; ``stockade check`` and the audit log say which grant was
  narrowed (:func:`narrowed`). The interception CA's directory is masked wherever the
  sandbox could see it (it holds a private key).
* :func:`sandbox_writable`: whether a sandbox could write a path the host keeps and
  trusts later (``approved.toml``, an audit log, the run records): the one answer to "can
  the sandbox write here", for every such check.
* :func:`host_environment`: the environment of bwrap, runsc, the compiler that builds the
  launcher, and any other helper stockade execs outside the sandbox. Nothing of the
  caller's environment and nothing of the policy's ``env`` reaches it: bwrap and runsc run
  unconfined before any namespace exists, so an ``LD_PRELOAD`` (or ``LD_AUDIT``,
  ``GCONV_PATH``, ``BASH_ENV``, ...) there would run outside every layer. What the
  sandboxed command should see is handed to it inside, after the boundary exists.

Standard library only: it is on the path of every ``stockade run``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from stockade._record import record

#: The search path of host-side helpers: system locations only.
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_environment() -> dict[str, str]:
    """A fresh environment for a process stockade starts on the host (bwrap, runsc, cc).

    Built from scratch, never filtered from the caller's: a deny-list of loader variables
    always misses one (``LD_AUDIT``, ``GCONV_PATH``, ``GLIBC_TUNABLES``, ...).
    """
    return {"PATH": HOST_PATH, "LC_ALL": "C"}


#: (variable, its value, HOME) -> the directory: a run asks for these some twenty times
_xdg_known: dict[tuple[str, str | None, str | None], Path] = {}


def _xdg(name: str, fallback: str, env: Mapping[str, str]) -> Path:
    value, home = env.get(name), env.get("HOME")
    # Keyed on what it is made of: a warm process (a Sandbox, the run server's
    # workers) may serve other environments. Without HOME, the password database's
    # home of this uid is the fallback, which does not change under a process.
    key = (name, value, home)
    known = _xdg_known.get(key)
    if known is not None:
        return known
    base = value
    if not base or not os.path.isabs(base):
        # The XDG spec: a relative value is invalid and is ignored.
        base = os.path.join(home or os.path.expanduser("~"), fallback)
    if len(_xdg_known) > 64:
        _xdg_known.clear()
    found = _xdg_known[key] = Path(base) / "stockade"
    return found


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/stockade``: the user policy and ``approved.toml``."""
    return _xdg("XDG_CONFIG_HOME", ".config", os.environ if env is None else env)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/stockade``: run records and audit logs, placeholders, the run
    server's socket, trusted workspace policies and executable digests."""
    return _xdg("XDG_STATE_HOME", ".local/state", os.environ if env is None else env)


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/stockade``: the inner launcher, runsc."""
    return _xdg("XDG_CACHE_HOME", ".cache", os.environ if env is None else env)


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/stockade``: the interception CA (``ca/``)."""
    return _xdg("XDG_DATA_HOME", ".local/share", os.environ if env is None else env)


@record
class TrustRoot:
    """A directory the host side trusts later, and how the sandbox may see it."""

    path: Path
    #: what it holds, for messages ("stockade's configuration")
    what: str
    #: "ro": read-only where the sandbox could write it; "mask": invisible wherever the
    #: sandbox could see it (it holds a private key)
    mode: str = "ro"


def trust_roots(env: Mapping[str, str] | None = None) -> tuple[TrustRoot, ...]:
    """stockade's own trust roots for this process's environment, resolved."""
    env = os.environ if env is None else env
    package = Path(__file__).resolve().parent
    data = data_dir(env)
    out = [
        TrustRoot(config_dir(env), "stockade's configuration (policy.toml, approved.toml)"),
        TrustRoot(state_dir(env), "stockade's state (run records, approvals, trust, server)"),
        TrustRoot(cache_dir(env), "stockade's cache (the launcher, the network helper, runsc)"),
        TrustRoot(data, "stockade's data"),
        TrustRoot(data / "ca", "stockade's interception CA (private key)", "mask"),
        TrustRoot(package, "stockade's own code"),
    ]
    return tuple(TrustRoot(_real(r.path), r.what, r.mode) for r in out)


def _real(path: Path) -> Path:
    # realpath of the part that exists, the rest appended: a root that does not exist yet
    # still has to be placed (the sandbox must not create it either).
    return Path(os.path.realpath(path))


def within(path: str | Path, root: str | Path) -> bool:
    """Whether ``path`` is ``root`` or lies below it (both as given: resolve first)."""
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def writable_root(path: Path, writable: Iterable[Path]) -> Path | None:
    """The first of ``writable`` (the workspace, ``filesystem.write`` grants) that holds
    ``path``, symlinks resolved on both sides; None when the sandbox cannot write it."""
    real = _real(path)
    for root in writable:
        if within(real, _real(root)):
            return root
    return None


@record
class Narrowed:
    """A grant that covers a trust root: the root stays read-only (or masked) inside."""

    root: TrustRoot
    grant: Path

    def describe(self) -> str:
        """One line for ``stockade check`` and the audit log."""
        how = "masked" if self.root.mode == "mask" else "read-only"
        return f"{self.grant} covers {self.root.what} at {self.root.path}: {how} inside the sandbox"


def narrowed(
    writable: Iterable[Path],
    visible: Iterable[Path] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[Narrowed, ...]:
    """The trust roots that ``writable`` (or, for masked roots, ``visible``) would expose."""
    writable = tuple(writable)
    visible = tuple(visible)
    # Each grant resolved once (the roots come resolved): writable_root per root resolved
    # every grant again, some hundred lstat calls a run.
    real = {grant: _real(grant) for grant in (*writable, *visible)}
    out: list[Narrowed] = []
    for root in trust_roots(env):
        grants = (*writable, *visible) if root.mode == "mask" else writable
        hit = next((grant for grant in grants if within(root.path, real[grant])), None)
        if hit is not None:
            out.append(Narrowed(root, hit))
    return tuple(out)


def scratch_base() -> Path:
    """Where runs make their scratch directories: ``$TMPDIR``, else ``/tmp``."""
    return Path(os.environ.get("TMPDIR") or "/tmp")


def is_scratch_name(name: str) -> bool:
    """Whether ``name`` is a run's scratch directory name, ``stockade-<pid>-<token>``."""
    parts = name.split("-")
    return len(parts) == 3 and parts[0] == "stockade" and parts[1].isdigit() and bool(parts[2])


def _scratch_dir(path: Path, bases: Iterable[Path]) -> Path | None:
    """The run scratch directory ``path`` lies in (under one of ``bases``), if any."""
    for base in bases:
        if base in path.parents:
            top = base / path.relative_to(base).parts[0]
            if is_scratch_name(top.name):
                return top
    return None


def sandbox_writable(
    path: Path,
    writable: Iterable[Path],
    *,
    scratch: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """Why a sandbox whose writable roots are ``writable`` (the workspace first, then
    each ``filesystem.write`` path) could write ``path``, a file the host trusts later;
    ``None`` when it cannot.

    ``path`` is looked at as spelt (a symlink inside the workspace can be pointed
    elsewhere by the sandbox before the host opens the path again) and with its symlinks
    resolved (a link outside that leads inside). Inside one of :func:`trust_roots` it is
    out of reach whatever the grant: every sandbox gets those read-only or masked (a run
    that cannot keep them so is refused). A run's scratch directory
    (``<scratch>/stockade-<pid>-<token>``, default :func:`scratch_base`) is writable by
    that run's sandbox: with the container layer off its HOME and TMPDIR are there.
    """
    candidates = (Path(os.path.abspath(path)), _real(path))
    tops = [(root, {Path(os.path.abspath(root)), _real(root)}) for root in writable]
    hits = [
        root for c in candidates for root, spellings in tops if any(within(c, t) for t in spellings)
    ]
    if hits:
        # Only now the trust roots (a dozen realpath calls): most paths hit no grant.
        protected = tuple(root.path for root in trust_roots(env))
        for candidate in candidates:
            if any(within(candidate, root) for root in protected):
                continue
            for root, spellings in tops:
                if any(within(candidate, top) for top in spellings):
                    return f"{path} lies inside {root}, which the sandbox can write"
    base = scratch if scratch is not None else scratch_base()
    bases = {Path(os.path.abspath(base)), _real(base)}
    for candidate in candidates:
        found = _scratch_dir(candidate, bases)
        if found is not None:
            return f"{path} lies inside {found}, a run's scratch directory, which its sandbox can write"
    return None
