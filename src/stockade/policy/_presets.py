"""Toolchain presets: ``[presets] use = ["python", "node", "git"]``.

A preset names the hosts, request rules, read-only paths and environment names that a
toolchain needs, so that a policy does not have to spell out registry hosts by hand and
cannot get them subtly wrong. The grant is data; the loader merges it into the policy
(see the presets block in ``_load._build``).

Request rules have the shape the inspect layer reads from ``[[network.rules]]``:
``{"host": ..., "methods": [...], "paths": [...], "action": "allow" | "deny"}``, first
match wins, and a host that has rules refuses a request no rule matches. The presets
therefore allow what installing and fetching needs (GET/HEAD, git's fetch endpoint) and
leave uploads (``npm publish`` is a PUT, ``git push`` a POST to ``git-receive-pack``)
to that default deny. ``git push`` is allowed only with ``allow_push = true``.
"""

from __future__ import annotations

from collections.abc import Iterable

from stockade._record import record

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Rule = dict[str, Any]

#: A request rule as plain data (see the module docstring).

_READ_ONLY = ["GET", "HEAD"]


@record
class PresetGrant:
    """What a set of presets adds to a policy."""

    #: entries for ``network.allow``
    hosts: tuple[str, ...] = ()
    #: request rules for the inspect layer, in order (first match wins)
    rules: tuple[Rule, ...] = ()
    #: entries for ``filesystem.read`` (``~`` is expanded by the loader)
    read: tuple[str, ...] = ()
    #: names for ``env.pass`` (none of them looks like a credential)
    env: tuple[str, ...] = ()


def _read_only(host: str) -> Rule:
    return {"host": host, "methods": list(_READ_ONLY), "paths": ["/**"], "action": "allow"}


def _python() -> PresetGrant:
    # pip and uv resolve on pypi.org (the simple index) and download from
    # files.pythonhosted.org; uploads go to upload.pypi.org, which is not granted.
    hosts = ("pypi.org", "files.pythonhosted.org")
    return PresetGrant(
        hosts=hosts,
        rules=tuple(_read_only(h) for h in hosts),
        env=("VIRTUAL_ENV", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT"),
    )


def _node() -> PresetGrant:
    host = "registry.npmjs.org"
    return PresetGrant(
        hosts=(host,),
        rules=(
            _read_only(host),
            # `npm install` posts the dependency tree to the audit endpoint; refusing it
            # only produces a warning, but every install would log a denial.
            {
                "host": host,
                "methods": ["POST"],
                "paths": ["/-/npm/v1/security/**"],
                "action": "allow",
            },
        ),
        env=("NODE_ENV", "npm_config_audit", "npm_config_fund"),
    )


def _git(allow_push: bool) -> PresetGrant:
    # git's smart HTTP: a fetch is GET .../info/refs then POST .../git-upload-pack;
    # a push is POST .../git-receive-pack. codeload serves archives, and
    # objects.githubusercontent.com release assets and LFS objects.
    receive = {
        "host": "github.com",
        "methods": ["POST"],
        "paths": ["/**/git-receive-pack"],
        "action": "allow" if allow_push else "deny",
    }
    return PresetGrant(
        hosts=("github.com", "codeload.github.com", "objects.githubusercontent.com"),
        rules=(
            receive,
            {
                "host": "github.com",
                "methods": list(_READ_ONLY),
                "paths": ["/**"],
                "action": "allow",
            },
            {
                "host": "github.com",
                "methods": ["POST"],
                "paths": ["/**/git-upload-pack"],
                "action": "allow",
            },
            _read_only("codeload.github.com"),
            _read_only("objects.githubusercontent.com"),
        ),
    )


#: preset name -> one-line description (shown by ``stockade init`` and in the docs)
PRESETS: dict[str, str] = {
    "python": "PyPI: pypi.org and files.pythonhosted.org, read-only (pip, uv)",
    "node": "npm: registry.npmjs.org, read-only (npm publish is refused)",
    "git": "GitHub over https: github.com, codeload, objects; fetch only unless allow_push",
}


def expand_presets(names: Iterable[str], *, allow_push: bool = False) -> PresetGrant:
    """The combined grant of the named presets, each entry once, in a stable order.

    Raises:
        ValueError: a name is not a preset (the message lists the known ones).
    """
    grants: list[PresetGrant] = []
    for name in names:
        if name == "python":
            grants.append(_python())
        elif name == "node":
            grants.append(_node())
        elif name == "git":
            grants.append(_git(allow_push))
        else:
            raise ValueError(f"unknown preset; the presets are {', '.join(PRESETS)}")

    def merged(items: Iterable[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(items))

    rules: list[Rule] = []
    for grant in grants:
        rules += [r for r in grant.rules if r not in rules]
    return PresetGrant(
        hosts=merged(h for g in grants for h in g.hosts),
        rules=tuple(rules),
        read=merged(p for g in grants for p in g.read),
        env=merged(e for g in grants for e in g.env),
    )
