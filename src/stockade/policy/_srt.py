"""Importing Anthropic sandbox-runtime (``srt``) settings as a stockade v1 policy.

srt reads ``~/.srt-settings.json`` (schema in its ``src/sandbox/sandbox-config.ts``). This
module turns such a document into stockade policy TOML, with a comment on every line
saying where it came from, and into a validated :class:`Policy`. It is pure: it takes
the parsed JSON, never touches the file system beyond :func:`policy_from_srt` reading the
one file it is given.

The rule for every srt key is one of three:

* **mapped**: it has a stockade equivalent (``network.allowedDomains`` -> ``network.allow``);
* **stricter**: stockade already refuses what the key would grant, and refusing it here
  changes nothing the key's author relied on for safety, so the import goes on and the
  generated file says so in a comment (srt's default read-everywhere, its always-writable
  scratch paths, ``ignoreViolations`` which only hides reports, macOS-only grants);
* **refused**: anything else, in particular every key that would widen the sandbox or
  that points at machinery stockade replaces (an external proxy, ``tlsTerminate``,
  ``credentials``, ``enableWeakerNestedSandbox = true``). The import fails with a
  :class:`PolicyError` naming the key: a policy is never silently partly ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from stockade._exceptions import PolicyError
from stockade._record import field, record, replace
from stockade.policy._load import _check_host_pattern, parse_policy_text
from stockade.policy._model import Policy
from stockade.policy._text import one_line, toml_string

_GLOB_CHARS = frozenset("*?[")

#: The header of every generated file: what differs from srt, once, for the reader.
HEADER = """\
# stockade policy imported from srt settings: {source}
#
# stockade is stricter than srt:
# - srt lets the sandbox read the whole file system except filesystem.denyRead;
#   stockade lets it read only the workspace, the system directories and
#   filesystem.read. Add the directories your tools need to [filesystem] read.
# - srt always adds its own writable scratch paths (/tmp/claude, ~/.npm/_logs,
#   ~/.claude/debug); stockade gives the sandbox a private /tmp and HOME instead.
# - every decision is recorded in the audit log; nothing is hidden from reports.
# - the environment is built from an allow-list ([env] pass), not inherited.
"""


@record(frozen=False)
class SrtTranslation:
    """The result of translating srt settings: stockade keys, their comments, notes."""

    #: section -> key -> value, in the v1 key names
    table: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (section, key) -> comment lines written above the key
    comments: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: remarks about keys that were accepted as stricter-by-stockade; also Policy.notes
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, key: str, value: Any, why: str) -> None:
        """Append ``value`` to list key ``section.key`` with a comment saying why."""
        bucket = self.table.setdefault(section, {}).setdefault(key, [])
        bucket.append(value)
        self.comments.setdefault((section, key), []).append(why)

    def set(self, section: str, key: str, value: Any, why: str) -> None:
        """Set scalar key ``section.key`` with a comment saying why."""
        self.table.setdefault(section, {})[key] = value
        self.comments.setdefault((section, key), []).append(why)


def _fail(source: str, key: str, value: object, problem: str) -> PolicyError:
    shown = one_line(json.dumps(value, ensure_ascii=False))
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return PolicyError(f"{source}: {one_line(key)}: {shown}: {problem}")


def _str_list(source: str, key: str, value: object) -> list[str]:
    """A list of strings, or of srt's ``{"path": ..., "literal": true}`` entries."""
    if not isinstance(value, list):
        raise _fail(source, key, value, "expected a list")
    out: list[str] = []
    for i, item in enumerate(value):
        if (
            isinstance(item, dict)
            and set(item) <= {"path", "literal"}
            and isinstance(item.get("path"), str)
        ):
            text = item["path"]
            if item.get("literal") and _GLOB_CHARS & set(text):
                # stockade reads these lists as globs; a literal "[" cannot be expressed.
                raise _fail(
                    source,
                    f"{key}[{i}]",
                    item,
                    "a literal path with glob characters cannot be imported; rename the path",
                )
        elif isinstance(item, str):
            text = item
        else:
            raise _fail(source, f"{key}[{i}]", item, "expected a string")
        if not text or "\x00" in text:
            raise _fail(source, f"{key}[{i}]", item, "empty or contains a NUL character")
        out.append(text)
    return out


def _is_glob(text: str) -> bool:
    return bool(_GLOB_CHARS & set(text))


def _flag(source: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(source, key, value, "expected true or false")
    return value


def _relpath(text: str) -> str | None:
    """``text`` as a clean path relative to the workspace, or None if it leaves it."""
    if text.startswith(("/", "~")):
        return None
    parts = [p for p in PurePosixPath(text).parts if p not in (".", "")]
    if ".." in parts:
        return None
    return "/".join(parts)


# --- network ---------------------------------------------------------------------------


def _network(net: Mapping[str, Any], t: SrtTranslation, source: str) -> None:
    allowed = _str_list(source, "network.allowedDomains", net.get("allowedDomains", []))
    denied = _str_list(source, "network.deniedDomains", net.get("deniedDomains", []))
    deny_everything = "*" in denied
    for i, host in enumerate(allowed):
        key = f"network.allowedDomains[{i}]"
        _check_host_pattern(host, key, source)
        if not deny_everything:
            t.add("network", "allow", host, key)
    if deny_everything:
        t.set(
            "network",
            "allow",
            [],
            'network.deniedDomains has "*": srt checks denies first, so no host is reachable',
        )
    for i, host in enumerate(denied):
        key = f"network.deniedDomains[{i}]"
        if host == "*":
            continue
        if host.startswith("*:"):
            raise _fail(
                source,
                key,
                host,
                "a port denied on every host has no stockade equivalent; allow only the "
                "host:port pairs that are needed in network.allowedDomains",
            )
        _check_host_pattern(host, key, source)
        t.add("network", "deny", host, key)
    for i, addr in enumerate(
        _str_list(source, "network.deniedResolvedAddresses", net.get("deniedResolvedAddresses", []))
    ):
        key = f"network.deniedResolvedAddresses[{i}]"
        _check_host_pattern(addr, key, source)
        t.add("network", "deny", addr, key)

    reasons = net.get("deniedDomainReasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(v, str) for v in reasons.values()):
        raise _fail(source, "network.deniedDomainReasons", reasons, "expected an object of strings")
    for host, text in reasons.items():
        t.notes.append(
            f"network.deniedDomainReasons.{host}: the audit log records the deny reason itself; "
            f"the text {toml_string(text)} is not imported"
        )

    if "strictAllowlist" in net and _flag(
        source, "network.strictAllowlist", net["strictAllowlist"]
    ):
        # srt then refuses an unlisted host without asking; so does stockade with
        # network.strict. false writes nothing: stockade's default (ask where it can).
        t.set("network", "strict", True, "network.strictAllowlist: never ask, refuse")
    if "allowUnixSockets" in net:
        sockets = _str_list(source, "network.allowUnixSockets", net["allowUnixSockets"])
        if sockets:
            # srt itself ignores this key on Linux (seccomp cannot see the path); a host
            # socket such as docker.sock would be a full escape, so stockade does not add it.
            t.notes.append(
                f"network.allowUnixSockets {sockets}: not imported; srt ignores it on Linux "
                "and stockade gives the sandbox no host sockets"
            )
    if "allowLocalBinding" in net and _flag(
        source, "network.allowLocalBinding", net["allowLocalBinding"]
    ):
        t.notes.append(
            "network.allowLocalBinding = true: the sandbox can always listen on its own "
            "loopback; the host's loopback services stay unreachable"
        )
    if "allowMachLookup" in net:
        services = _str_list(source, "network.allowMachLookup", net["allowMachLookup"])
        if services:
            t.notes.append(f"network.allowMachLookup {services}: macOS-only, not imported")
    if "allowAllUnixSockets" in net and _flag(
        source, "network.allowAllUnixSockets", net["allowAllUnixSockets"]
    ):
        raise _fail(
            source,
            "network.allowAllUnixSockets",
            True,
            "would open every unix socket (srt turns seccomp off for it); stockade cannot "
            "import it: remove the key",
        )
    for key in ("httpProxyPort", "socksProxyPort"):
        if key in net:
            raise _fail(
                source,
                f"network.{key}",
                net[key],
                "stockade's egress layer is its own proxy and cannot hand traffic to an "
                "external one; remove the key and list the hosts in network.allowedDomains",
            )
    for key, why in (
        ("mitmProxy", "stockade intercepts TLS itself (the inspect layer)"),
        ("parentProxy", "stockade dials allowed hosts directly"),
        ("tlsTerminate", "stockade's inspect layer is configured in its own policy"),
        ("filterRequest", "a callback cannot be expressed in a policy file"),
    ):
        if key in net:
            raise _fail(
                source, f"network.{key}", net[key], f"not importable: {why}; remove the key"
            )
    known = {
        "allowedDomains",
        "deniedDomains",
        "deniedResolvedAddresses",
        "deniedDomainReasons",
        "strictAllowlist",
        "allowUnixSockets",
        "allowLocalBinding",
        "allowMachLookup",
        "allowAllUnixSockets",
    }
    for key in net:
        if key not in known:
            raise _fail(
                source, f"network.{key}", net[key], "unknown or unsupported srt key; remove it"
            )


# --- filesystem ------------------------------------------------------------------------


def _filesystem(fs: Mapping[str, Any], t: SrtTranslation, source: str) -> None:
    deny_read = _str_list(source, "filesystem.denyRead", fs.get("denyRead", []))
    allow_read = _str_list(source, "filesystem.allowRead", fs.get("allowRead", []))
    allow_write = _str_list(source, "filesystem.allowWrite", fs.get("allowWrite", []))
    deny_write = _str_list(source, "filesystem.denyWrite", fs.get("denyWrite", []))

    for i, item in enumerate(deny_read):
        if item.rstrip("/") in ("", ".", "..", "~") or item == "/":
            # srt #79: denying "." or ".." hides the workspace; it cannot be what is meant.
            raise _fail(
                source,
                f"filesystem.denyRead[{i}]",
                item,
                "would hide the whole workspace or home; list the secret paths instead",
            )
        t.add("filesystem", "deny", item, f"filesystem.denyRead[{i}]")

    denied_roots = [d.rstrip("/") for d in deny_read if not _is_glob(d)]
    for i, item in enumerate(allow_read):
        key = f"filesystem.allowRead[{i}]"
        if _is_glob(item):
            raise _fail(
                source,
                key,
                item,
                "stockade grants reads by directory, not by glob; list the directory",
            )
        for root in denied_roots:
            if item.rstrip("/") == root or item.startswith(root + "/"):
                # srt's allowRead re-opens part of a denied area; in stockade a deny always wins.
                raise _fail(
                    source,
                    key,
                    item,
                    f"re-allows part of denyRead {toml_string(root)}; stockade's deny always wins, so "
                    "narrow the denyRead entry instead",
                )
        if _relpath(item) is not None:
            t.notes.append(f"{key}: {item} is inside the workspace, which is readable already")
            continue
        t.add("filesystem", "read", item, key)

    for i, item in enumerate(allow_write):
        key = f"filesystem.allowWrite[{i}]"
        path = item[:-3] if item.endswith("/**") else item  # srt strips a trailing /** too
        if _is_glob(path):
            raise _fail(
                source,
                key,
                item,
                "srt skips write globs on Linux; stockade refuses them: list the directories",
            )
        if _relpath(path) is not None:
            t.comments.setdefault(("filesystem", "workspace"), []).append(
                f"{key} {toml_string(item)}: inside the workspace, which is read-write already"
            )
            continue
        t.add("filesystem", "write", path, key)

    for i, item in enumerate(deny_write):
        key = f"filesystem.denyWrite[{i}]"
        rel = _relpath(item[:-3] if item.endswith("/**") else item)
        if rel:
            t.add("filesystem", "protect", rel, key)
            continue
        raise _fail(
            source,
            key,
            item,
            "stockade keeps paths read-only only inside the workspace (filesystem.protect); "
            "a path outside it is read-only unless filesystem.write grants it, so narrow "
            "allowWrite instead",
        )

    if "allowGitConfig" in fs and _flag(source, "filesystem.allowGitConfig", fs["allowGitConfig"]):
        raise _fail(
            source,
            "filesystem.allowGitConfig",
            True,
            "stockade always keeps .git/config read-only (it can run commands through "
            "core.fsmonitor and friends); remove the key",
        )
    if "disabled" in fs and _flag(source, "filesystem.disabled", fs["disabled"]):
        raise _fail(
            source,
            "filesystem.disabled",
            True,
            "stockade has no switch that removes the file-system policy; remove the key "
            "(or turn the files layer off explicitly in the stockade policy)",
        )
    known = {"denyRead", "allowRead", "allowWrite", "denyWrite", "allowGitConfig", "disabled"}
    for key in fs:
        if key not in known:
            raise _fail(
                source, f"filesystem.{key}", fs[key], "unknown or unsupported srt key; remove it"
            )


# --- top level -------------------------------------------------------------------------


def _false_only(why: str) -> Callable[[str, str, object, SrtTranslation], None]:
    """A key stockade accepts only when it asks for nothing (false)."""

    def check(source: str, key: str, value: object, _t: SrtTranslation) -> None:
        if _flag(source, key, value):
            raise _fail(source, key, value, f"{why}; remove the key")

    return check


def _ignore_violations(source: str, key: str, value: object, t: SrtTranslation) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(v, list) and all(isinstance(s, str) for s in v) for v in value.values()
    ):
        raise _fail(source, key, value, 'expected { "command": ["path", ...] }')
    if value:
        t.notes.append(
            "ignoreViolations: srt only hides these reports; stockade records every decision "
            "(filter them with 'stockade log')"
        )


def _search_depth(source: str, key: str, value: object, t: SrtTranslation) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10:
        raise _fail(source, key, value, "expected a whole number from 1 to 10")
    t.notes.append(f"{key}: stockade's workspace protection is not depth-limited")


def _refuse(why: str) -> Callable[[str, str, object, SrtTranslation], None]:
    def check(source: str, key: str, value: object, _t: SrtTranslation) -> None:
        raise _fail(source, key, value, f"not importable: {why}; remove the key")

    return check


_TOP: dict[str, Callable[[str, str, object, SrtTranslation], None]] = {
    "ignoreViolations": _ignore_violations,
    "enableWeakerNestedSandbox": _false_only("stockade never weakens /proc isolation"),
    "enableWeakerNetworkIsolation": _false_only("stockade never opens a channel around the proxy"),
    "allowAppleEvents": _false_only("macOS-only and removes code-execution isolation"),
    "allowPty": _false_only(
        "macOS-only; stockade gives an interactive command a pty of its own anyway"
    ),
    "mandatoryDenySearchDepth": _search_depth,
    "credentials": _refuse(
        "stockade binds credentials in its own policy, not srt's credentials block"
    ),
    "ripgrep": _refuse("stockade does not use ripgrep"),
    "seccomp": _refuse("stockade builds its own seccomp filter"),
    "bwrapPath": _refuse("stockade finds bubblewrap itself (see 'stockade doctor')"),
    "socatPath": _refuse("stockade needs no socat"),
    "javaAgentJarPath": _refuse("stockade sets JVM proxy variables itself"),
    "git": _refuse("stockade does not inject git configuration"),
    "windows": _refuse("stockade runs on Linux only"),
}


def translate(settings: Mapping[str, Any], source: str = "srt settings") -> SrtTranslation:
    """Translate parsed srt settings into stockade keys, comments and notes.

    Raises:
        PolicyError: a key cannot be mapped (the message names it and the fix).
    """
    if not isinstance(settings, Mapping):
        raise PolicyError(f"{source}: expected a JSON object at the top level")
    t = SrtTranslation()
    for key, value in settings.items():
        if key == "network":
            if not isinstance(value, dict):
                raise _fail(source, key, value, "expected an object")
            _network(value, t, source)
        elif key == "filesystem":
            if not isinstance(value, dict):
                raise _fail(source, key, value, "expected an object")
            _filesystem(value, t, source)
        elif key in _TOP:
            _TOP[key](source, key, value, t)
        else:
            raise _fail(source, key, value, "unknown or unsupported srt key; remove it")
    return t


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # JSON string escapes are a subset of TOML basic-string escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def render_toml(t: SrtTranslation, source: str, workspace: Path | None = None) -> str:
    """The translation as commented policy TOML (``version = 1`` first)."""
    lines = [HEADER.format(source=source), "version = 1", ""]
    if t.notes:
        lines[1:1] = ["# Accepted as stricter:", *(f"# - {note}" for note in t.notes), ""]
    sections = dict(t.table)
    if workspace is not None or ("filesystem", "workspace") in t.comments:
        sections.setdefault("filesystem", {})
    for section in ("filesystem", "network"):
        if section not in sections:
            continue
        lines.append(f"[{section}]")
        ws_notes = t.comments.get((section, "workspace"), [])
        if section == "filesystem" and (workspace is not None or ws_notes):
            lines += [f"# {c}" for c in ws_notes]
            if workspace is not None:
                lines.append(f"workspace = {_toml_value(str(workspace))}")
            else:
                lines.append("# the workspace is the directory stockade runs in, as srt's is")
        for key, value in sections[section].items():
            if isinstance(value, list) and value:
                # One element per line, each with the srt key it came from.
                why = t.comments.get((section, key), [])
                lines.append(f"{key} = [")
                for i, item in enumerate(value):
                    origin = why[i] if i < len(why) else ""
                    lines.append(f"    {_toml_value(item)},  # {origin}")
                lines.append("]")
            else:
                lines += [f"# {c}" for c in t.comments.get((section, key), [])]
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def srt_to_toml(
    settings: Mapping[str, Any], source: str = "srt settings", workspace: Path | None = None
) -> str:
    """srt settings as commented stockade policy TOML; validated before it is returned.

    Raises:
        PolicyError: a key cannot be mapped, or the result is not a valid policy.
    """
    text = render_toml(translate(settings, source), source, workspace)
    parse_policy_text(text, f"{source} (imported)", workspace=workspace)
    return text


def srt_to_policy(
    settings: Mapping[str, Any], source: str = "srt settings", workspace: Path | None = None
) -> Policy:
    """srt settings as a validated :class:`Policy`; accepted-as-stricter notes go to ``notes``."""
    t = translate(settings, source)
    policy = parse_policy_text(
        render_toml(t, source, workspace), f"{source} (imported)", workspace=workspace
    )
    return replace(policy, notes=policy.notes + tuple(f"srt: {n}" for n in t.notes))


def read_srt_settings(path: Path) -> dict[str, Any]:
    """Read an srt settings file as JSON.

    Raises:
        PolicyError: the file is missing, unreadable or not a JSON object.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read srt settings: {exc.strerror}") from exc
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise PolicyError(f"{path}: expected a JSON object at the top level")
    return value


def policy_from_srt(path: Path, workspace: Path | None = None) -> Policy:
    """Load an srt settings file as a stockade policy (``stockade run --srt-settings FILE``).

    The file is trusted as the user's own, like a file named with ``--policy``.

    Raises:
        PolicyError: the file cannot be read or a key cannot be mapped.
    """
    return srt_to_policy(read_srt_settings(path), str(path), workspace)
