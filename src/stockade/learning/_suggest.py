"""The smallest policy admitting what learning runs observed (pure: observations in, TOML out).

The rules, each stated once here and in docs/learn.md:

* **hosts**: every name a learning run connected to (or sent a request to) with the
  verdict ``allow``, as ``host:port``, exactly. Only when more than
  :data:`WILDCARD_SIBLINGS` distinct names under one parent domain were seen on one port
  does the parent become ``*.parent:port``, and the line says it is a widening and which
  names it stands for. A name ``network.hosts`` pinned in the learning run keeps its pin.
* **request rules**: for each host with observed requests over TLS the proxy inspected
  (a ruled host is refused plain HTTP, so plain-HTTP hosts get none), one
  ``[[network.rules]]`` per method seen, with the paths seen with it; the paths of one
  directory become ``dir/*`` when more than :data:`PATH_SIBLINGS` distinct ones were seen
  there (a widening, named).
* **TLS**: the learning policy's ``tls_ports`` and ``network.tls.upstream_ca`` are kept
  (the hosts reached through them need them).
* **files**: a file read outside the workspace and outside what every run already sees
  (the system paths; the sandbox's own HOME, /tmp, /proc, /dev are never observations)
  becomes a ``read``
  entry; a file written there, a ``write`` entry (its directory when the file did not
  exist when suggesting, named as a widening); more than :data:`FILE_SIBLINGS` files of
  one directory become that directory (a widening, named). A path that does not exist
  when suggesting was only looked for (a search path) and is left out, in a comment.
* **env**: the base policy's ``env.pass`` names that were present; credential-like names
  withheld in learning are listed in a comment, never passed.

Every allow line carries ``# needs:`` with the observations that justify it; nothing
observed as refused in learning (a metadata or private address) is ever suggested.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stockade.policy._hosts import normalize_host
from stockade.policy._tables import SYSTEM_PATHS
from stockade.policy._text import one_line, toml_string

__all__ = [
    "FILE_SIBLINGS",
    "PATH_SIBLINGS",
    "WILDCARD_SIBLINGS",
    "Line",
    "Suggestion",
    "suggest",
]

#: more than this many sibling names under one parent, on one port: ``*.parent``
WILDCARD_SIBLINGS = 5
#: more than this many distinct request paths in one directory: ``dir/*``
PATH_SIBLINGS = 4
#: more than this many files read (or written) in one directory: the directory
FILE_SIBLINGS = 8

#: what every run already sees: never suggested (the sandbox's own /tmp, HOME, /proc and
#: /dev are left out when learning, :data:`stockade.learning._observe.PRIVATE`)
_ALWAYS = SYSTEM_PATHS


@dataclass(frozen=True)
class Line:
    """One allow line of a suggestion: ``section``, the ``value`` it adds, why (the
    observations, as short texts) and whether it is a widening (then ``widening`` says
    what it stands for)."""

    section: str
    value: str
    needs: tuple[str, ...]
    widening: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Suggestion:
    """A suggested policy: its lines, and what was observed but not suggested."""

    workspace: str
    lines: list[Line] = field(default_factory=list)
    #: kept from the learning policy (ports where a tunnel must carry TLS; the CA the
    #: proxy verifies upstream TLS against), when it had them
    tls_ports: tuple[int, ...] = ()
    upstream_ca: str = ""
    refused: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: the last day (ISO) of the grace period the policy states; "" for none
    grace_until: str = ""

    def section(self, name: str) -> list[Line]:
        """The lines of one section (``allow``, ``hosts``, ``rules``, ``read``, ...)."""
        return [line for line in self.lines if line.section == name]

    def to_toml(self) -> str:
        """The suggestion as a commented policy file (``stockade policy suggest``)."""
        return _render(self)


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _parent_domain(host: str) -> str | None:
    head, _, rest = host.partition(".")
    return rest if head and "." in rest else None


def _glob_paths(paths: Sequence[str]) -> list[tuple[str, tuple[str, ...], str]]:
    """(glob, the paths it stands for, widening text) by the PATH_SIBLINGS rule."""
    by_dir: dict[str, list[str]] = defaultdict(list)
    for p in sorted(set(paths)):
        by_dir[p.rsplit("/", 1)[0] if p.count("/") > 1 else ""].append(p)
    out = []
    for parent, members in sorted(by_dir.items()):
        if len(members) > PATH_SIBLINGS:
            out.append(
                (
                    f"{parent}/*",
                    tuple(members),
                    f"{len(members)} paths seen under {parent or '/'}/ (more than {PATH_SIBLINGS})",
                )
            )
        else:
            out += [(p, (p,), "") for p in members]
    return out


def suggest(
    observations: Iterable[Mapping[str, Any]],
    summaries: Sequence[Mapping[str, Any]] = (),
    *,
    env_pass: Sequence[str] = (),
    exists: Any = os.path.exists,
    isdir: Any = os.path.isdir,
) -> Suggestion:
    """The smallest policy admitting ``observations`` (module docstring for the rules).

    ``summaries``: the ``learn.json`` of each run directory (the workspace, the learning
    run's ``network.hosts`` pins). ``env_pass``: the base policy's ``env.pass`` names.
    ``exists``/``isdir``: how paths are looked up (the host's file system by default).
    """
    runs = [run for s in summaries for run in s.get("runs", [])]
    workspace = str(runs[-1]["workspace"]) if runs else ""
    pins: dict[str, str] = {}
    for run in runs:
        for name, address in dict(run.get("hosts", {})).items():
            pins[normalize_host(name)] = address
    out = Suggestion(workspace)
    ports = sorted({int(p) for run in runs for p in run.get("tls_ports", [])})
    if ports and ports != [443]:
        out.tls_ports = tuple(ports)
    cas = [str(run["upstream_ca"]) for run in runs if run.get("upstream_ca")]
    out.upstream_ca = cas[-1] if cas else ""
    hosts: dict[tuple[str, int], list[str]] = defaultdict(list)
    requests: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
    reads: dict[str, list[str]] = defaultdict(list)
    writes: dict[str, list[str]] = defaultdict(list)
    #: write targets that stand for more than was written, and why
    widen: dict[str, str] = {}
    env_seen: set[str] = set()
    withheld: set[str] = set()
    plain: set[str] = set()
    #: the observation texts of each (host, port, method, path) requested over TLS
    texts: dict[tuple[str, int, str, str], list[str]] = defaultdict(list)
    for obs in observations:
        kind = obs.get("kind")
        run = obs.get("run", "?")
        if kind in ("connect", "request"):
            host, port = str(obs.get("host", "")), int(obs.get("port", 0))
            if not host or not port:
                continue
            scheme = "http" if obs.get("protocol") == "http" else "https"
            what = (
                f"run {run}: {obs.get('method')} {scheme}://{host}:{port}{obs.get('path')}"
                if kind == "request"
                else f"run {run}: connect {host}:{port}"
            )
            if obs.get("verdict") != "allow":
                out.refused.append(f"{what} ({obs.get('reason')})")
                continue
            hosts[(host, port)].append(what)
            if kind == "request" and obs.get("protocol") == "http":
                # the proxy refuses a plain-HTTP request to a ruled (inspected) host:
                # rules are for TLS it intercepts, so plain HTTP gets the host alone
                plain.add(f"{host}:{port}")
            elif kind == "request":
                method, path = str(obs.get("method")), str(obs.get("path"))
                requests[(host, port)].append((method, path))
                texts[(host, port, method, path)].append(what)
        elif kind in ("read", "exec", "write"):
            path = str(obs.get("path", ""))
            if not path.startswith("/"):
                continue
            if workspace and _under(path, [workspace]):
                continue
            change = obs.get("change") if kind == "write" else None
            # removing a name, or a directory removed and made again, is a right on the
            # directory that holds it (Landlock's REMOVE_FILE, REMOVE_DIR, MAKE_DIR)
            deleted = change in ("deleted", "replaced")
            verb = {"deleted": "delete", "replaced": "replace"}.get(str(change), kind)
            what = f"run {run}: {verb} {path}"
            if _under(path, _ALWAYS):
                if kind == "write":
                    out.skipped.append(f"{what} (a system path: no write is ever suggested there)")
                continue
            if deleted:
                parent = os.path.dirname(path)
                writes[parent].append(what)
                widen.setdefault(parent, f"to {verb} {path} needs its directory")
            elif kind == "write":
                writes[path].append(what)
            elif not exists(path):
                out.skipped.append(f"{what} (does not exist: looked for, not needed)")
            elif isdir(path):
                out.skipped.append(f"{what} (a directory listed: its files are granted one by one)")
            else:
                reads[path].append(what)
        elif kind == "env":
            env_seen.add(str(obs.get("name")))
        elif kind == "env-withheld":
            withheld.add(str(obs.get("name")))
        elif kind == "limit":
            out.skipped.append(f"run {run}: limit reached: {obs.get('reason')} {obs.get('detail')}")

    _hosts(out, hosts, pins)
    for where in sorted(plain):
        out.skipped.append(f"{where}: plain HTTP, so no request rules (they need TLS there)")
    for (host, port), seen in sorted(requests.items()):
        # one rule per method, with that method's paths: a POST seen on one path does
        # not admit POST on the paths only read
        for method in sorted({m for m, _ in seen}):
            paths = [p for m, p in seen if m == method]
            for glob, members, widening in _glob_paths(paths):
                needs = tuple(w for p in members for w in texts[(host, port, method, p)])
                out.lines.append(
                    Line(
                        "rules",
                        glob,
                        needs,
                        widening,
                        {"host": f"{host}:{port}", "methods": (method,)},
                    )
                )
    _files(out, "read", reads, isdir)
    _files(out, "write", writes, isdir, exists=exists, widen=widen)
    for name in sorted(env_seen & set(env_pass)):
        out.lines.append(Line("env", name, (f"passed in learning: {name}",)))
    for name in sorted(withheld):
        out.skipped.append(
            f"env {name}: a credential withheld in learning (bind it with [secrets])"
        )
    return out


def _hosts(
    out: Suggestion, hosts: Mapping[tuple[str, int], list[str]], pins: Mapping[str, str]
) -> None:
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for host, port in hosts:
        parent = _parent_domain(host)
        if parent is not None and host not in pins:
            groups[(parent, port)].append(host)
    widened: set[tuple[str, int]] = set()
    for (parent, port), names in sorted(groups.items()):
        if len(names) > WILDCARD_SIBLINGS:
            needs = tuple(w for n in sorted(names) for w in hosts[(n, port)])
            out.lines.append(
                Line(
                    "allow",
                    f"*.{parent}:{port}",
                    needs,
                    f"{len(names)} names under {parent} (more than {WILDCARD_SIBLINGS}): "
                    + ", ".join(sorted(names)),
                )
            )
            widened.update((n, port) for n in names)
    for (host, port), seen in sorted(hosts.items()):
        if (host, port) not in widened:
            out.lines.append(Line("allow", f"{host}:{port}", tuple(seen)))
        if host in pins and not any(line.value == host for line in out.section("hosts")):
            out.lines.append(
                Line(
                    "hosts",
                    host,
                    (f"pinned in learning: {host} = {pins[host]}",),
                    extra={"address": pins[host]},
                )
            )


def _files(
    out: Suggestion,
    section: str,
    seen: Mapping[str, list[str]],
    isdir: Any,
    *,
    exists: Any = None,
    widen: Mapping[str, str] | None = None,
) -> None:
    start = len(out.lines)
    _file_lines(out, section, seen, isdir, exists=exists, widen=widen or {})
    # one line per value, and a line inside a directory another line grants adds
    # nothing: its observations go to the outermost such line
    merged: dict[str, Line] = {}
    for line in out.lines[start:]:
        if line.value in merged:
            m = merged[line.value]
            line = Line(m.section, m.value, m.needs + line.needs, m.widening or line.widening)
        merged[line.value] = line
    dirs = [v for v, line in merged.items() if line.widening or isdir(v)]
    kept: dict[str, Line] = {}
    folded: dict[str, list[str]] = defaultdict(list)
    for value, line in merged.items():
        cover = [d for d in dirs if d != value and _under(value, [d])]
        if cover:
            folded[min(cover, key=len)] += line.needs
        else:
            kept[value] = line
    out.lines[start:] = [
        Line(line.section, line.value, line.needs + tuple(folded[v]), line.widening)
        for v, line in sorted(kept.items())
    ]


def _file_lines(
    out: Suggestion,
    section: str,
    seen: Mapping[str, list[str]],
    isdir: Any,
    *,
    exists: Any,
    widen: Mapping[str, str],
) -> None:
    by_dir: dict[str, list[str]] = defaultdict(list)
    for path in seen:
        by_dir[os.path.dirname(path)].append(path)
    for directory, members in sorted(by_dir.items()):
        if len(members) > FILE_SIBLINGS:
            needs = tuple(w for m in sorted(members) for w in seen[m])
            widening = f"{len(members)} files in {directory} (more than {FILE_SIBLINGS})"
            out.lines.append(Line(section, directory, needs, widening))
            continue
        for path in sorted(members):
            if exists is not None and not exists(path):
                # written but gone (or never there, or made in a learning run's throwaway
                # view): the nearest directory that exists, where it can be made
                parent = directory
                while parent not in ("/", "") and not exists(parent):
                    parent = os.path.dirname(parent)
                out.lines.append(
                    Line(
                        section,
                        parent,
                        tuple(seen[path]),
                        f"{path} does not exist now: its directory"
                        + ("" if parent == directory else f" {parent}, the nearest that does"),
                    )
                )
            else:
                out.lines.append(Line(section, path, tuple(seen[path]), widen.get(path, "")))


# What learning observed is what the sandbox chose: a path, a request path, a method. It
# reaches the suggested policy, a file the user then trusts, only as a TOML string
# (toml_string escapes every control character) or inside a comment that stays one line
# (one_line escapes line breaks): a name with a line break in it must not become a line
# of the policy ("[layers]" then "egress = false").
_q = toml_string


def _why(line: Line) -> list[str]:
    lines = []
    if line.widening:
        lines.append(f"    # WIDENING: {one_line(line.widening)}")
    shown = line.needs[:3]
    for need in shown:
        lines.append(f"    # needs: {one_line(need)}")
    if len(line.needs) > len(shown):
        lines.append(f"    # needs: ... and {len(line.needs) - len(shown)} more observations")
    return lines


def _render(s: Suggestion) -> str:
    out = [
        "# stockade policy suggested by `stockade policy suggest` from learning runs.",
        "# Each allow line says which observation needs it; a WIDENING line admits more",
        "# than was seen (the rule is in docs/learn.md). Review it, then",
        "# `stockade policy verify` it against the task and the attack scenario.",
        "",
        "[network]",
        "allow = [",
    ]
    for line in s.section("allow"):
        out += _why(line)
        out.append(f"    {_q(line.value)},")
    out.append("]")
    if s.grace_until:
        out += [
            "# GRACE PERIOD: until this day (UTC) a host or request this policy does not",
            "# admit is let through and reported on every run (`stockade run` prints it,",
            "# the audit log has it as verdict report, rule grace), never added here: extend",
            "# this file on purpose. After it, everything above is enforced as written.",
            "# Delete the line to enforce it now.",
            f"grace_until = {s.grace_until}",
        ]
    if s.tls_ports:
        out.append("# kept from the learning policy: ports whose tunnels must carry TLS")
        out.append("tls_ports = [" + ", ".join(str(p) for p in s.tls_ports) + "]")
    if s.upstream_ca:
        out += [
            "",
            "[network.tls]",
            "# kept from the learning policy",
            f"upstream_ca = {_q(s.upstream_ca)}",
        ]
    if s.section("hosts"):
        out += ["", "[network.hosts]"]
        for line in s.section("hosts"):
            out.append(f"# needs: {one_line(line.needs[0])}")
            out.append(f"{_q(line.value)} = {_q(str(line.extra['address']))}")
    rules: dict[tuple[str, tuple[str, ...]], list[Line]] = defaultdict(list)
    for line in s.section("rules"):
        rules[(str(line.extra["host"]), tuple(line.extra["methods"]))].append(line)
    for (host, methods), lines in sorted(rules.items()):
        out += ["", "[[network.rules]]", f"host = {_q(host)}"]
        out.append("methods = [" + ", ".join(_q(m) for m in methods) + "]")
        out.append("paths = [")
        for line in lines:
            out += _why(line)
            out.append(f"    {_q(line.value)},")
        out.append("]")
    out += ["", "[filesystem]"]
    for section in ("read", "write"):
        out.append(f"{section} = [")
        for line in s.section(section):
            out += _why(line)
            out.append(f"    {_q(line.value)},")
        out.append("]")
    if s.section("env"):
        out += ["", "[env]", "pass = ["]
        for line in s.section("env"):
            out += _why(line)
            out.append(f"    {_q(line.value)},")
        out.append("]")
    if s.refused or s.skipped:
        out += ["", "# Observed and not suggested:"]
        out += [f"#   refused even in learning: {one_line(r)}" for r in s.refused]
        out += [f"#   {one_line(r)}" for r in s.skipped[:200]]
        if len(s.skipped) > 200:
            out.append(f"#   ... and {len(s.skipped) - 200} more")
    return "\n".join(out) + "\n"
