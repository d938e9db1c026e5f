"""The ``secrets`` layer: the child's environment, built from an allow-list.

Nothing is inherited wholesale. The child gets PATH, the locale, TERM, TZ, USER, SHELL,
the variables that name trust stores (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ...:
public certificates, which clients on networks with their own CA need), a HOME that is
the sandbox's own, and only what the policy passes or sets. A caller
variable that looks like a credential is never passed unless the policy entry says
``allow_secret = true``.

The environment reaches the child as bubblewrap's own environment (never on its argv),
so ``/proc/1/environ`` inside holds nothing the allow-list did not admit.

What it does NOT stop: secrets in files that other layers expose, and values the
policy passes on purpose.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from stockade._record import record
from stockade.policy import EnvPolicy
from stockade.policy._credentials import looks_like_credential
from stockade.policy._tables import BASE_ENV_NAMES, TRUST_DIR_NAMES, TRUST_ENV_NAMES

_LC = re.compile(r"^LC_[A-Z]+$")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


@record
class EnvironmentPlan:
    """The child's environment and the names that were kept out of it."""

    env: dict[str, str]
    #: caller variables that look like credentials and were not passed (names only)
    withheld_credentials: tuple[str, ...]


def build_environment(
    caller: Mapping[str, str],
    policy: EnvPolicy,
    *,
    home: str,
    enabled: bool = True,
    extra: Mapping[str, str] | None = None,
) -> EnvironmentPlan:
    """Build the child's environment from ``caller`` under ``policy``.

    ``extra`` (proxy variables, CA bundle paths) is applied last and wins over
    ``env.set``, so a policy cannot point clients around the proxy by accident.
    With ``enabled=False`` (the layer switched off) the caller's environment passes
    whole, and only HOME and ``extra`` are changed.
    """
    if not enabled:
        env = dict(caller)
        withheld: list[str] = []
    else:
        env = {}
        for name in (*BASE_ENV_NAMES, *TRUST_ENV_NAMES):
            if name in caller:
                env[name] = caller[name]
        for name, value in caller.items():
            if _LC.match(name):
                env[name] = value
        for entry in policy.pass_:
            if entry.name in caller:
                env[entry.name] = caller[entry.name]
        passed = {e.name for e in policy.pass_}
        withheld = sorted(n for n in caller if looks_like_credential(n) and n not in passed)
        env.update(policy.set)
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = home
    if extra:
        env.update(extra)
    return EnvironmentPlan(env, tuple(withheld))


def trust_paths(env: Mapping[str, str]) -> list[Path]:
    """The trust stores (files and directories) the variables in ``env`` name, that exist."""
    out: list[Path] = []
    for name in TRUST_ENV_NAMES:
        value = env.get(name)
        if not value or not os.path.isabs(value):
            continue
        path = Path(os.path.normpath(value))
        want_dir = name in TRUST_DIR_NAMES
        if (path.is_dir() if want_dir else path.is_file()) and path not in out:
            out.append(path)
    return out
