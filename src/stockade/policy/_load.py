"""Finding, reading, validating and composing policy files.

Search order: ``--policy FILE``; else ``stockade.toml`` in the workspace; else the
user's ``$XDG_CONFIG_HOME/stockade/policy.toml``; else the built-in default (workspace
read-write, system read-only, no network). A workspace file is composed on top of the
user policy (or the default) and may only tighten it: the sandbox can write the
workspace, so a file there is not trusted to widen anything. A file named explicitly
with ``--policy`` is trusted as the user's own.

Every error names the file, the key path, the value and the fix.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path

from stockade import _roots
from stockade._exceptions import PolicyError
from stockade._record import replace
from stockade.policy import _model
from stockade.policy._credentials import looks_like_credential
from stockade.policy._model import (
    BACKEND_CHOICES,
    DETECTOR_ACTIONS,
    DETECTOR_NAMES,
    LAYERS,
    BoundSecret,
    ContainerPolicy,
    EnvPass,
    EnvPolicy,
    FilesystemPolicy,
    InspectPolicy,
    KubernetesPolicy,
    Labels,
    LayersPolicy,
    LimitsPolicy,
    NetworkPolicy,
    Policy,
    RequestRule,
    UpstreamPolicy,
)
from stockade.policy._presets import PRESETS, expand_presets
from stockade.policy._schema import NAMED_TABLES, SCHEMA, TOP_LEVEL
from stockade.policy._tables import risky_host
from stockade.policy._text import locate, one_line, shown, toml_string
from stockade.policy._units import parse_size

# typing costs ~5 ms to import; it is only needed by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

WORKSPACE_POLICY = "stockade.toml"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def user_policy_path() -> Path:
    """``$XDG_CONFIG_HOME/stockade/policy.toml`` (``~/.config`` when unset)."""
    return _roots.config_dir() / "policy.toml"


def approved_path() -> Path:
    """``approved.toml`` beside the user policy: the answers given as "always"."""
    return user_policy_path().with_name("approved.toml")


def read_approved(path: Path) -> list[dict[str, Any]]:
    """The entries of an approvals file (``[[allow]]``/``[[deny]]`` tables), validated;
    ``[]`` when there is none. Raises :class:`PolicyError` naming a bad entry."""
    raw = _read_if_present(path)
    if raw is None:
        return []
    out: list[dict[str, Any]] = []
    for action in ("allow", "deny"):
        tables = raw.get(action, [])
        if not isinstance(tables, list):
            raise PolicyError(f"{path}: {action}: expected [[{action}]] tables")
        for i, table in enumerate(tables):
            pattern = table.get("pattern") if isinstance(table, dict) else None
            if not isinstance(pattern, str):
                raise PolicyError(f'{path}: {action}[{i}]: an entry needs pattern = "HOST"')
            _check_host_pattern(pattern, f"{action}[{i}]", str(path))
            entry = {k: (str(v) if k == "added" else v) for k, v in table.items()}
            out.append({**entry, "action": action})
    unknown = set(raw) - {"allow", "deny"}
    if unknown:
        raise PolicyError(
            f"{path}: unknown table [[{one_line(sorted(unknown)[0])}]]; only [[allow]] and [[deny]]"
        )
    return out


def _with_approved(policy: Policy) -> Policy:
    """The user level with ``approved.toml`` merged in (its allow and deny entries)."""
    path = approved_path()
    entries = read_approved(path)
    if not entries:
        return policy
    allow = tuple(e["pattern"] for e in entries if e["action"] == "allow")
    deny = tuple(e["pattern"] for e in entries if e["action"] == "deny")
    net = policy.network
    network = replace(
        net,
        allow=net.allow + tuple(a for a in allow if a not in net.allow),
        deny=net.deny + tuple(d for d in deny if d not in net.deny),
    )
    return replace(policy, network=network, sources=(*policy.sources, str(path)))


def load_policy(
    path: Path | None = None,
    *,
    workspace: Path | None = None,
    extra_allow: tuple[str, ...] = (),
    workspace_name: str = "--workspace",
) -> Policy:
    """Find, read, validate and compose the policy for a run.

    Args:
        path: an explicit policy file (``--policy``); trusted as the user's own.
        workspace: overrides ``filesystem.workspace`` (``--workspace``).
        extra_allow: hosts added to ``network.allow`` (``--allow-host``).
        workspace_name: how the caller spells ``workspace`` in an error about it (the
            flag ``--workspace``, the API's ``workspace=``): such an error names that
            and the value, never the file the rest of the policy came from.

    Raises:
        PolicyError: the file is missing, not TOML, or a key or value is wrong.
    """
    cwd = Path.cwd()
    ws_override = _resolve_arg(workspace, cwd, workspace_name) if workspace is not None else None
    if path is not None:
        if not _is_file(path):
            raise PolicyError(f"{path}: no such policy file; check the --policy argument")
        raw, text = _read_text(path)
        policy = _build(
            raw,
            str(path),
            base=None,
            cwd=cwd,
            ws_override=ws_override,
            text=text,
            ws_name=workspace_name,
        )
    else:
        user = user_policy_path()
        if _is_file(user):
            raw, text = _read_text(user)
            base = _build(
                raw,
                str(user),
                base=None,
                cwd=cwd,
                ws_override=ws_override,
                text=text,
                ws_name=workspace_name,
            )
        else:
            base = _build(
                {}, "built-in", base=None, cwd=cwd, ws_override=ws_override, ws_name=workspace_name
            )
        # The answers given as "always": the user's level, before a workspace file (which
        # can only tighten, and never add approvals). Never with --policy (reproducible).
        base = _with_approved(base)
        ws_file = base.filesystem.workspace / WORKSPACE_POLICY
        ws_data = _read_bytes_if_present(ws_file)
        if ws_data is None:
            policy = base
        elif ws_data.strip() and _trusted(ws_file, ws_data):
            # Pinned by the person with `stockade trust` (these very bytes): read as
            # the user's own policy, as --policy would; approvals still apply.
            raw = _parse(ws_data, ws_file)
            source = f"{ws_file} (trusted)"
            policy = _with_approved(
                _build(
                    raw,
                    source,
                    base=None,
                    cwd=cwd,
                    ws_override=base.filesystem.workspace,
                    text=ws_data.decode("utf-8"),
                )
            )
        else:
            policy = _build(
                _parse(ws_data, ws_file),
                str(ws_file),
                base=base,
                cwd=cwd,
                ws_override=base.filesystem.workspace,
                text=ws_data.decode("utf-8"),
            )
    return add_allowed_hosts(policy, extra_allow)


def _trusted(path: Path, data: bytes) -> bool:
    from stockade.policy._trust import TrustStore

    return TrustStore().pinned(path, data)


def add_allowed_hosts(policy: Policy, hosts: tuple[str, ...]) -> Policy:
    """``policy`` with ``hosts`` (``--allow-host``) added to ``network.allow``, validated."""
    for i, host in enumerate(hosts):
        _check_host_pattern(host, f"--allow-host[{i}]", "command line")
    if not hosts:
        return policy
    allow = policy.network.allow + hosts
    return replace(policy, network=replace(policy.network, allow=allow), warnings=_warnings(allow))


def parse_policy_text(
    text: str, source: str = "<string>", *, workspace: Path | None = None
) -> Policy:
    """Validate a policy given as TOML text (no composition); used by tools and tests."""
    import tomllib

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from exc
    cwd = Path.cwd()
    return _build(
        raw,
        source,
        base=None,
        cwd=cwd,
        ws_override=_resolve_arg(workspace, cwd, "workspace") if workspace else None,
        text=text,
    )


def _is_file(path: Path) -> bool:
    """``path.is_file()``, but a file we may not even look at is an error, not "absent"."""
    try:
        return path.is_file()
    except PermissionError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}; fix its permissions") from exc
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from exc


def _read_if_present(path: Path) -> dict[str, Any] | None:
    """The workspace policy, or None when there is none (also when it vanishes between
    the look and the read: a concurrent run's placeholder may come and go)."""
    if not _is_file(path):
        return None
    try:
        return _read(path)
    except PolicyError:
        if not path.exists():
            return None
        raise


def _read_bytes_if_present(path: Path) -> bytes | None:
    """The workspace policy's bytes, or None when there is none (also when it vanishes
    between the look and the read, as for :func:`_read_if_present`)."""
    if not _is_file(path):
        return None
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from exc


def _read(path: Path) -> dict[str, Any]:
    return _read_text(path)[0]


def _read_text(path: Path) -> tuple[dict[str, Any], str]:
    """The parsed file and its text (the text gives an error its line)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror}") from exc
    return _parse(data, path), data.decode("utf-8")


def _parse(data: bytes, path: Path) -> dict[str, Any]:
    import tomllib  # only when a policy file exists: the default needs no parser

    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8 text; save the policy as UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML: {exc}") from exc


def _spelled(path: Path | str, base: Path) -> Path:
    """``path`` made absolute and ``..``-free by spelling alone, without following symlinks."""
    p = Path(os.path.expanduser(str(path)))
    return Path(os.path.normpath(p if p.is_absolute() else base / p))


def _resolve(path: Path | str, base: Path) -> Path:
    """Absolute, ``~``-expanded, symlink- and ``..``-free form of ``path``.

    Raises ValueError (with the reason) for a path the system cannot even look up: a NUL
    character, a name too long, a symlink loop.
    """
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute():
        p = base / p
    try:
        return p.resolve()
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _resolve_arg(path: Path | str, base: Path, name: str) -> Path:
    """:func:`_resolve` for a command-line or API argument: a PolicyError naming it."""
    try:
        return _resolve(path, base)
    except ValueError as exc:
        raise PolicyError(f"{name}: {shown(str(path))}: not a usable path ({exc})") from None


class _Validator:
    """Checks one file's raw TOML against the schema and converts values."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, value: object, problem: str) -> PolicyError:
        # The value once, as TOML spells it (policy/_text.py); the problem after it
        # never repeats it.
        return PolicyError(f"{self.source}: {one_line(key)}: {shown(value)}: {problem}")

    def check_shape(self, raw: Mapping[str, Any]) -> None:
        for name, value in raw.items():
            if name in TOP_LEVEL:
                continue
            if name not in SCHEMA:
                known = ", ".join([*TOP_LEVEL, *SCHEMA])
                raise self.fail(name, value, f"unknown key; the top-level keys are {known}")
            if not isinstance(value, dict):
                raise self.fail(name, value, f"expected a table; write [{name}]")
            for key, sub in value.items():
                if name in NAMED_TABLES:
                    continue  # [secrets.NAME]: each table is checked by its own validator
                if key not in SCHEMA[name]:
                    known = ", ".join(SCHEMA[name])
                    raise self.fail(f"{name}.{key}", sub, f"unknown key; [{name}] takes {known}")
        version = raw.get("version", 1)
        if version != 1 or isinstance(version, bool):
            raise self.fail(
                "version", version, "unsupported schema version; this stockade reads version = 1"
            )

    def strs(self, key: str, value: object) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(key, value, 'expected a list of strings, e.g. ["a", "b"]')
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", item, "expected a string")
            if not item or "\x00" in item or any(ord(c) < 0x20 for c in item):
                raise self.fail(f"{key}[{i}]", item, "empty or contains control characters")
            out.append(item)
        return tuple(out)

    def str_map(self, key: str, value: object) -> dict[str, str]:
        if not isinstance(value, dict):
            raise self.fail(key, value, 'expected a table of strings, e.g. { NAME = "value" }')
        for name, item in value.items():
            if not isinstance(item, str):
                raise self.fail(f"{key}.{name}", item, "expected a string value")
            if "\x00" in item:
                raise self.fail(f"{key}.{name}", item, "contains a NUL character")
        return dict(value)

    def integer(self, key: str, value: object, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, value, "expected a whole number")
        if value < minimum:
            raise self.fail(key, value, f"must be at least {minimum}")
        return value

    def seconds(self, key: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, value, "expected a number of seconds (0 = unlimited)")
        if value < 0 or value != value or value == float("inf"):
            raise self.fail(key, value, "must be a finite number >= 0 (0 = unlimited)")
        return float(value)

    def size(self, key: str, value: object) -> int:
        if not isinstance(value, int | str) or isinstance(value, bool):
            raise self.fail(key, value, 'expected a size such as "4GiB" or a number of bytes')
        try:
            size = parse_size(value)
        except ValueError as exc:
            raise self.fail(key, value, str(exc)) from None
        if size == 0:
            raise self.fail(
                key, value, "a size of 0 would stop everything; turn the limits layer off instead"
            )
        return size

    def path(self, key: str, value: str, base: Path) -> Path:
        """``value`` resolved against ``base``; a path the system refuses is a policy error."""
        try:
            return _resolve(value, base)
        except ValueError as exc:
            raise self.fail(key, value, f"not a usable path ({exc})") from None

    def boolean(self, key: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "expected true or false")
        return value


def _check_host_pattern(text: str, key: str, source: str) -> None:
    """Validate a network.allow/deny entry with the same parser the proxy uses."""
    from stockade.policy._hosts import parse_pattern

    try:
        parse_pattern(text)
    except ValueError as exc:
        # parse_pattern's message starts with the entry, quoted: it is not quoted again.
        raise PolicyError(f"{source}: {one_line(key)}: {exc}") from None


def _build(
    raw: Mapping[str, Any],
    source: str,
    *,
    base: Policy | None,
    cwd: Path,
    ws_override: Path | None,
    text: str | None = None,
    ws_name: str | None = None,
) -> Policy:
    """:func:`_build_checked`, with the line of the key an error names (``FILE:LINE:``)
    when the file's ``text`` is known, and the note for a file without ``version``."""
    try:
        policy = _build_checked(
            raw, source, base=base, cwd=cwd, ws_override=ws_override, ws_name=ws_name
        )
    except PolicyError as exc:
        raise _located(exc, source, text) from None
    if text is not None and text.strip() and "version" not in raw:
        # A file without the key is read as version 1 (the only version), so nothing
        # breaks; the note asks for the line that keeps it readable when a version 2
        # exists (docs/policy.md, "Versions"). An empty file says nothing to version,
        # and is what a live run of the workspace holds a missing stockade.toml with
        # (its placeholder): no note, or every concurrent run would print one.
        path = source.removesuffix(" (trusted)")
        hint = (
            f"{path}: no version key; read as version 1. Add the line `version = 1` at the "
            "top of the file"
        )
        policy = replace(policy, hints=(*policy.hints, hint))
    return policy


def _located(exc: PolicyError, source: str, text: str | None) -> PolicyError:
    """``exc`` with ``FILE:LINE:`` in place of ``FILE:`` when the line of its key is found."""
    message = str(exc)
    prefix = source + ": "
    if text is None or not message.startswith(prefix):
        return exc
    key = message[len(prefix) :].split(": ", 1)[0]
    line = locate(text, key)
    if line is None:
        return exc
    path = source.removesuffix(" (trusted)")
    suffix = source[len(path) :]
    return PolicyError(f"{path}:{line}{suffix}: {message[len(prefix) :]}")


def _build_checked(
    raw: Mapping[str, Any],
    source: str,
    *,
    base: Policy | None,
    cwd: Path,
    ws_override: Path | None,
    ws_name: str | None = None,
) -> Policy:
    v = _Validator(source)
    v.check_shape(raw)
    fs = raw.get("filesystem", {})
    env = raw.get("env", {})
    net = raw.get("network", {})
    lim = raw.get("limits", {})
    lay = raw.get("layers", {})
    notes: list[str] = []

    # --- presets (policy/_presets.py): merged into the raw tables read below --------
    pre = raw.get("presets", {})
    if pre:
        names = v.strs("presets.use", pre.get("use", []))
        push = v.boolean("presets.allow_push", pre.get("allow_push", False))
        try:
            grant = expand_presets(names, allow_push=push)
        except ValueError as exc:
            bad = next(i for i, n in enumerate(names) if n not in PRESETS)
            raise v.fail(f"presets.use[{bad}]", names[bad], str(exc)) from None
        if base is not None:
            # A workspace file cannot widen: it may name a preset only when the user
            # policy already allows every host of it; its paths and names are dropped.
            missing = [h for h in grant.hosts if h not in base.network.allow]
            if missing:
                raise v.fail(
                    "presets.use", list(names), f"needs {', '.join(missing)}; {_WIDEN_FIX}"
                )
            grant = replace(grant, read=(), env=())

        def extend(table: Mapping[str, Any], key: str, items: tuple[Any, ...]) -> dict[str, Any]:
            have = table.get(key, [])
            if not isinstance(have, list):
                return dict(table)  # left for the validator below to reject with its message
            names_ = [e.get("name") if isinstance(e, dict) else e for e in have]
            return {**table, key: [*have, *(i for i in items if i not in names_)]}

        net = extend(net, "allow", grant.hosts)
        fs = extend(fs, "read", grant.read)
        env = extend(env, "pass", grant.env)
        if "rules" in SCHEMA["network"]:
            if isinstance(net.get("rules", []), list):
                net = {**net, "rules": [*net.get("rules", []), *grant.rules]}
            # else: left for the validator below to reject with its message
        elif grant.rules:
            notes.append(
                "presets: request rules (such as refusing git push) need network.rules of "
                "the inspect layer, which this build lacks; the preset hosts are allowed"
            )

    # --- filesystem -------------------------------------------------------------
    home = Path.home().resolve()
    overlay = False
    if isinstance(fs.get("workspace"), dict):
        # { path = ".", mode = "overlay" | "read-write" }
        table = fs["workspace"]
        for key in table:
            if key not in ("path", "mode"):
                raise v.fail(
                    f"filesystem.workspace.{key}", table[key], "unknown key; it takes path and mode"
                )
        mode = table.get("mode", "read-write")
        if mode not in WORKSPACE_MODES:
            raise v.fail(
                "filesystem.workspace.mode", mode, f"expected one of {', '.join(WORKSPACE_MODES)}"
            )
        overlay = mode == "overlay"
        fs = {**fs, "workspace": table.get("path", ".")}
        if "path" not in table:
            fs = {k: val for k, val in fs.items() if k != "workspace"}
    if "workspace" in fs and not isinstance(fs["workspace"], str):
        raise v.fail("filesystem.workspace", fs["workspace"], "expected a path string")
    given: str | None = None  # how the person gave the workspace, when they did

    def ws_fail(value: str, problem: str) -> PolicyError:
        if given is None:
            return v.fail("filesystem.workspace", value, problem)
        # They gave the workspace (--workspace DIR, workspace=): an error about it names
        # what they gave, not the file (or "built-in") the rest of the policy came from.
        if given == "cwd":
            return PolicyError(
                f"the workspace is the current directory, {one_line(value)}, by default: "
                f"{problem} (cd into it, or give --workspace DIR)"
            )
        if given.startswith("--"):
            return PolicyError(f"{given} {one_line(value)}: {problem}")
        return PolicyError(f"{given}={toml_string(value)}: {problem}")

    if ws_override is not None and (base is None or "workspace" not in fs):
        workspace = ws_override
        given = ws_name
    else:
        spelled = fs.get("workspace", ".")
        ws_base = base.filesystem.workspace if base is not None else cwd
        if "workspace" not in fs and base is None:
            given = "cwd"  # no file names it: the default, the current directory
        workspace = v.path("filesystem.workspace", spelled, ws_base)
        if _spelled(spelled, ws_base) != workspace:
            notes.append(f"filesystem.workspace: {spelled} resolves to {workspace}")
    if not os.path.isdir(workspace):
        raise ws_fail(str(workspace), "not a directory; create it or fix the path")
    if workspace == Path("/"):
        raise ws_fail(
            str(workspace), "the workspace would be the whole system; choose a project directory"
        )
    if workspace == home:
        raise ws_fail(
            str(workspace),
            "the workspace would be your whole home directory; choose a project directory",
        )

    def paths(key: str) -> tuple[Path, ...]:
        out: list[Path] = []
        for i, item in enumerate(v.strs(f"filesystem.{key}", fs.get(key, []))):
            resolved = v.path(f"filesystem.{key}[{i}]", item, workspace)
            if _spelled(item, workspace) != resolved:
                where = " (inside your home directory)" if home in resolved.parents else ""
                notes.append(f"filesystem.{key}[{i}]: {item} resolves to {resolved}{where}")
            if key == "write" and resolved in (Path("/"), home):
                raise v.fail(
                    f"filesystem.{key}[{i}]",
                    item,
                    f"grants write to {'/' if resolved == Path('/') else 'your home directory'}"
                    f" (resolves to {resolved}); list the directories that need it",
                )
            if key == "read" and resolved == Path("/"):
                raise v.fail(
                    f"filesystem.{key}[{i}]",
                    item,
                    "grants read of the whole system; list the directories that need it",
                )
            out.append(resolved)
        return tuple(out)

    read = paths("read")
    write = paths("write")
    deny = tuple(os.path.expanduser(g) for g in v.strs("filesystem.deny", fs.get("deny", [])))
    protect = v.strs("filesystem.protect", fs.get("protect", []))
    for i, item in enumerate(protect):
        if Path(item).is_absolute() or ".." in Path(item).parts:
            raise v.fail(
                f"filesystem.protect[{i}]",
                item,
                "must be a path inside the workspace, relative to it",
            )

    # --- env --------------------------------------------------------------------
    passes: list[EnvPass] = []
    raw_pass = env.get("pass", [])
    if not isinstance(raw_pass, list):
        raise v.fail("env.pass", raw_pass, 'expected a list of names, e.g. ["CI", "NODE_ENV"]')
    for i, item in enumerate(raw_pass):
        key = f"env.pass[{i}]"
        if isinstance(item, str):
            entry = EnvPass(item)
        elif isinstance(item, dict):
            extra = set(item) - {"name", "allow_secret"}
            if extra:
                raise v.fail(
                    key,
                    item,
                    f"unknown key {toml_string(sorted(extra)[0])}; an entry takes name and allow_secret",
                )
            name = item.get("name")
            if not isinstance(name, str):
                raise v.fail(key, item, 'expected { name = "X", allow_secret = true }')
            entry = EnvPass(name, v.boolean(f"{key}.allow_secret", item.get("allow_secret", False)))
        else:
            raise v.fail(key, item, "expected a variable name")
        if not _ENV_NAME.match(entry.name):
            raise v.fail(key, entry.name, "not a valid environment variable name")
        if looks_like_credential(entry.name) and not entry.allow_secret:
            raise v.fail(
                key,
                entry.name,
                "looks like a credential and would be readable by everything in the sandbox; "
                f'write {{ name = "{entry.name}", allow_secret = true }} if that is intended',
            )
        passes.append(entry)
    env_set = v.str_map("env.set", env.get("set", {}))
    for name in env_set:
        if not _ENV_NAME.match(name):
            raise v.fail(f"env.set.{name}", name, "not a valid environment variable name")

    # --- network ----------------------------------------------------------------
    allow = v.strs("network.allow", net.get("allow", []))
    ndeny = v.strs("network.deny", net.get("deny", []))
    for key, items in (("network.allow", allow), ("network.deny", ndeny)):
        for i, item in enumerate(items):
            _check_host_pattern(item, f"{key}[{i}]", source)
    hosts = v.str_map("network.hosts", net.get("hosts", {}))
    for name, addr in hosts.items():
        from stockade.policy._hosts import normalize_host  # idna: only when hosts are pinned

        try:
            # The proxy looks pins up by the canonical spelling: a name it cannot
            # normalise would be refused only when a run starts.
            normalize_host(name)
        except ValueError as exc:
            raise v.fail(f"network.hosts.{name}", name, f"not a host name: {exc}") from None
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            raise v.fail(f"network.hosts.{name}", addr, "expected an IP address literal") from None
    raw_ports = net.get("tls_ports", [443])
    if not isinstance(raw_ports, list):
        raise v.fail("network.tls_ports", raw_ports, "expected a list of port numbers, e.g. [443]")
    tls_ports = tuple(
        v.integer(f"network.tls_ports[{i}]", p, minimum=1) for i, p in enumerate(raw_ports)
    )
    for i, port in enumerate(tls_ports):
        if port > 65535:
            raise v.fail(f"network.tls_ports[{i}]", port, "a port is at most 65535")
    transparent = v.boolean("network.transparent", net.get("transparent", True))
    strict = v.boolean("network.strict", net.get("strict", False))
    if base is not None and "grace_until" in net:
        # Report mode lets through what the allow-list does not name: only the user may
        # choose it, never a file the sandbox can write (workspace files only tighten).
        raise v.fail("network.grace_until", net["grace_until"], _WIDEN_FIX)
    grace_until = _grace_until(net.get("grace_until"), v)
    mcp_raw = raw.get("mcp", {})
    allow_always = v.boolean("mcp.allow_always", mcp_raw.get("allow_always", False))
    if base is not None and "upstream" in net:
        # Refused before it is validated (an auth_file of the sandbox's choosing is not
        # even looked at); _tighten says why.
        raise v.fail("network.upstream", net["upstream"], _WIDEN_FIX)
    upstream = _upstream_block(net, v, cwd, workspace)

    # --- inspect: rules, upstream CA, secrets, labels (see _inspect_block) ----------
    # A workspace file is checked against the allow-list it will be composed with.
    effective_allow = allow if base is None or "allow" in net else base.network.allow
    # The network table as merged with the presets, so that their request rules count.
    rules, upstream_ca, secrets, labels = _inspect_block(
        {**raw, "network": net}, v, effective_allow, cwd
    )

    kubernetes = _kubernetes_block(raw.get("kubernetes", {}), v)

    # --- limits -----------------------------------------------------------------
    d = LimitsPolicy()
    limits = LimitsPolicy(
        pids=v.integer("limits.pids", lim.get("pids", d.pids), minimum=1),
        memory=v.size("limits.memory", lim.get("memory", d.memory)),
        file_size=v.size("limits.file_size", lim.get("file_size", d.file_size)),
        cpu_seconds=v.integer("limits.cpu_seconds", lim.get("cpu_seconds", d.cpu_seconds)),
        wall_seconds=v.seconds("limits.wall_seconds", lim.get("wall_seconds", d.wall_seconds)),
    )

    # --- layers -----------------------------------------------------------------
    layers = LayersPolicy(
        **{name: v.boolean(f"layers.{name}", lay.get(name, True)) for name in LAYERS}
    )

    policy = Policy(
        # The overlay layer switched off leaves a workspace in mode "overlay" read-write.
        filesystem=FilesystemPolicy(
            workspace, read, write, deny, protect, overlay and layers.overlay
        ),
        env=EnvPolicy(tuple(passes), env_set),
        network=NetworkPolicy(
            allow, ndeny, hosts, tls_ports, rules, upstream_ca, transparent, upstream
        ),
        limits=limits,
        layers=layers,
        secrets=secrets,
        labels=labels,
        kubernetes=kubernetes,
        sources=(source,),
        notes=tuple(notes),
        warnings=_warnings(allow),
    )
    if strict:
        policy = replace(policy, network=replace(policy.network, strict=True))
    if grace_until is not None:
        policy = replace(policy, network=replace(policy.network, grace_until=grace_until))
    if allow_always:
        policy = replace(policy, mcp=replace(policy.mcp, allow_always=True))
    inspect_table = raw.get("inspect", {})
    inspect = _inspect_table(inspect_table, v)
    if not inspect.default:
        policy = replace(policy, inspect=inspect)
    container_raw = raw.get("container", {})
    backend = container_raw.get("backend", "bubblewrap")
    if backend not in BACKEND_CHOICES:
        raise v.fail(
            "container.backend",
            backend,
            'expected "bubblewrap", "gvisor" (docs/gvisor.md), "landlock" or "auto" '
            "(docs/security-model.md)",
        )
    degraded = v.boolean("container.allow_degraded", container_raw.get("allow_degraded", False))
    if backend != "bubblewrap" or degraded:
        policy = replace(
            policy, container=ContainerPolicy(backend=backend, allow_degraded=degraded)
        )
    if base is None:
        return policy
    return _tighten(base, policy, raw, v)


def _warnings(allow: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for i, entry in enumerate(allow):
        what = risky_host(entry)
        if what:
            out.append(
                f'network.allow[{i}]: "{entry}" is {what}: anything in the sandbox can send '
                "data through it; allow it only if the task needs it"
            )
    return tuple(out)


def _covered(path: Path, grants: tuple[Path, ...]) -> bool:
    return any(path == g or g in path.parents for g in grants)


def _min_limit(a: float, b: float) -> float:
    """The tighter of two limits where 0 means unlimited."""
    if a == 0:
        return b
    if b == 0:
        return a
    return min(a, b)


#: ``filesystem.workspace.mode`` values
WORKSPACE_MODES = ("read-write", "overlay")


def _tighten(base: Policy, ws: Policy, raw: Mapping[str, Any], v: _Validator) -> Policy:
    """Compose an untrusted workspace policy on ``base``: it may only take away, never add.

    The one place that says what a workspace file may do (the sandbox can write it, and
    a cloned repository brings one; ``stockade trust`` is how a person lets one widen):

    * filesystem: narrow the workspace to a directory inside it; read and write only
      what ``base`` grants (a subset); add deny globs and protected paths;
    * env: pass a subset of ``base``'s names (never a secret ``base`` does not pass as
      one); ``set`` nothing ``base`` does not set to the same value (a variable of the
      sandbox's choosing is code: ``LD_PRELOAD``, ``PYTHONPATH``, ``NODE_OPTIONS``);
    * network: a subset of ``base``'s allow-list and pins; more deny entries; more TLS
      ports; capture and asking may be turned off, never on; no upstream, no secrets,
      no CA, no allow rules (``_tighten_inspect``);
    * limits: lower only; layers: switch on only; backend: gVisor may be asked for,
      never taken away; ``mcp.allow_always`` may only be turned off;
    * presets: only those whose hosts ``base`` already allows (their paths and names
      are dropped: see ``_build``); kubernetes: never (the base's table stands);
    * inspect: a detector only strengthened (off → report → deny), decoding only on,
      ``refuse`` past the limit, more name limits (``_tighten_inspect_table``).
    """
    fs = raw.get("filesystem", {})
    workspace = base.filesystem.workspace
    if "workspace" in fs and not _covered(ws.filesystem.workspace, (workspace,)):
        raise v.fail(
            "filesystem.workspace",
            fs["workspace"],
            "a workspace policy can only narrow the workspace to a directory inside it",
        )
    for p in ws.filesystem.read:
        if not _covered(p, base.filesystem.read + base.filesystem.write + (workspace,)):
            raise v.fail("filesystem.read", str(p), _WIDEN_FIX)
    for p in ws.filesystem.write:
        if not _covered(p, (*base.filesystem.write, workspace)):
            raise v.fail("filesystem.write", str(p), _WIDEN_FIX)
    base_pass = {e.name: e for e in base.env.pass_}
    for e in ws.env.pass_:
        if e.name not in base_pass or (e.allow_secret and not base_pass[e.name].allow_secret):
            raise v.fail("env.pass", e.name, _WIDEN_FIX)
    for name, value in ws.env.set.items():
        if base.env.set.get(name) != value:
            raise v.fail(f"env.set.{name}", value, _WIDEN_FIX)
    if ws.mcp.allow_always:
        # Whether an MCP client's answer may be written to approved.toml is the user's
        # call: the sandbox can write a workspace file, so it may only turn this off.
        raise v.fail("mcp.allow_always", True, _WIDEN_FIX)
    for host in ws.network.allow:
        if host not in base.network.allow:
            raise v.fail("network.allow", host, _WIDEN_FIX)
    for name, addr in ws.network.hosts.items():
        if base.network.hosts.get(name) != addr:
            raise v.fail(f"network.hosts.{name}", addr, _WIDEN_FIX)
    for layer in LAYERS:
        if getattr(base.layers, layer) and not getattr(ws.layers, layer):
            raise v.fail(f"layers.{layer}", False, _WIDEN_FIX)
    rules, labels = _tighten_inspect(base, ws, raw, v)
    lb, lw = base.limits, ws.limits
    raw_limits = raw.get("limits", {})
    limits = LimitsPolicy(
        pids=min(lb.pids, lw.pids) if "pids" in raw_limits else lb.pids,
        memory=min(lb.memory, lw.memory) if "memory" in raw_limits else lb.memory,
        file_size=min(lb.file_size, lw.file_size) if "file_size" in raw_limits else lb.file_size,
        cpu_seconds=int(_min_limit(lb.cpu_seconds, lw.cpu_seconds)),
        wall_seconds=_min_limit(lb.wall_seconds, lw.wall_seconds),
    )
    mcp_raw = raw.get("mcp", {})
    mcp = base.mcp
    if base.mcp.allow_always and "allow_always" in mcp_raw:
        mcp = replace(mcp, allow_always=False)
    container = base.container
    if ws.container.allow_degraded and not base.container.allow_degraded:
        # A fallback to fewer boundaries is the user's choice alone.
        raise v.fail("container.allow_degraded", True, _WIDEN_FIX)
    if base.container.backend == "gvisor" or ws.container.backend == "gvisor":
        # A kernel of its own only adds a boundary: a workspace file may ask for it, and
        # may not take it away.
        if (
            base.container.backend == "gvisor"
            and ws.container.backend != "gvisor"
            and "backend" in raw.get("container", {})
        ):
            raise v.fail("container.backend", ws.container.backend, _WIDEN_FIX)
        container = ContainerPolicy(backend="gvisor")
    elif ws.container.backend != base.container.backend:
        # Any other backend is another set of boundaries, not an added one.
        raise v.fail("container.backend", ws.container.backend, _WIDEN_FIX)
    merged = Policy(
        filesystem=FilesystemPolicy(
            workspace=ws.filesystem.workspace,
            read=ws.filesystem.read if "read" in fs else base.filesystem.read,
            write=ws.filesystem.write if "write" in fs else base.filesystem.write,
            deny=base.filesystem.deny + ws.filesystem.deny,
            protect=base.filesystem.protect + ws.filesystem.protect,
            # A workspace file may ask for an overlay (it only takes away), never drop one.
            overlay=base.filesystem.overlay or ws.filesystem.overlay,
        ),
        env=EnvPolicy(
            pass_=ws.env.pass_ if "pass" in raw.get("env", {}) else base.env.pass_,
            set={**base.env.set, **ws.env.set},
        ),
        network=NetworkPolicy(
            allow=ws.network.allow if "allow" in raw.get("network", {}) else base.network.allow,
            deny=base.network.deny + ws.network.deny,
            hosts=ws.network.hosts if "hosts" in raw.get("network", {}) else base.network.hosts,
            tls_ports=tuple(sorted(set(base.network.tls_ports) | set(ws.network.tls_ports))),
            rules=rules,
            upstream_ca=base.network.upstream_ca,
            # A workspace file may switch capture off, never back on.
            transparent=base.network.transparent and ws.network.transparent,
            upstream=base.network.upstream,
            # the user's grace period stands (a workspace file cannot name one: refused
            # before this); what it lets through is reported on every run
            grace_until=base.network.grace_until,
        ),
        limits=limits,
        layers=LayersPolicy(
            **{name: getattr(base.layers, name) or getattr(ws.layers, name) for name in LAYERS}
        ),
        secrets=base.secrets,
        labels=labels,
        # Where the gateway may apply a policy is the operator's to say, never a
        # workspace file's: the base's table stands.
        kubernetes=base.kubernetes,
        sources=base.sources + ws.sources,
        notes=base.notes + ws.notes,
        hints=base.hints,
        warnings=_warnings(
            ws.network.allow if "allow" in raw.get("network", {}) else base.network.allow
        ),
        mcp=mcp,
        container=container,
        inspect=_tighten_inspect_table(base.inspect, ws.inspect, raw.get("inspect", {}), v),
    )
    if base.network.strict or ws.network.strict:
        # A workspace file may turn asking off (that only tightens), never back on.
        merged = replace(merged, network=replace(merged.network, strict=True))
    return merged


#: the longest grace period a policy may state, from the day it is loaded: a grace
#: period is a short step towards a policy a person extends on purpose, not a standing
#: report mode (an allow-list nobody enforces)
GRACE_MAX_DAYS = 90


def _grace_until(value: object, v: _Validator) -> datetime.date | None:
    """``network.grace_until``: a TOML date or a "YYYY-MM-DD" string, at most
    :data:`GRACE_MAX_DAYS` after today (UTC); a date already past is accepted (the
    policy is then simply enforced: ``stockade check`` says the period ended)."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        raise v.fail("network.grace_until", value, "expected a day, e.g. 2026-12-31 (no time)")
    if isinstance(value, datetime.date):
        day = value
    elif isinstance(value, str):
        try:
            day = datetime.date.fromisoformat(value)
        except ValueError:
            raise v.fail("network.grace_until", value, "expected a day, e.g. 2026-12-31") from None
    else:
        raise v.fail("network.grace_until", value, "expected a day, e.g. 2026-12-31")
    today = datetime.datetime.now(datetime.UTC).date()
    if (day - today).days > GRACE_MAX_DAYS:
        raise v.fail(
            "network.grace_until",
            day.isoformat(),
            f"a grace period ends at most {GRACE_MAX_DAYS} days from today; allow what the "
            "runs need in network.allow instead (stockade policy diff lists it)",
        )
    return day


_WIDEN_FIX = (
    "a policy inside the workspace can only tighten the user policy (the sandbox can write "
    "it); add this to ~/.config/stockade/policy.toml, pass the file with --policy, or pin "
    "this file with stockade trust once you have read it"
)


# --- [kubernetes] ------------------------------------------------------------------------

#: a DNS-1123 label: namespace and service account names
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _kubernetes_block(table: Mapping[str, Any], v: _Validator) -> KubernetesPolicy:
    """Validate ``[kubernetes]``: names that cannot exist in a cluster are refused here,
    so that a typo does not silently leave a policy usable by nobody (or everybody)."""
    namespaces = v.strs("kubernetes.namespaces", table.get("namespaces", []))
    for i, name in enumerate(namespaces):
        if name != "*" and not _DNS_LABEL.match(name):
            raise v.fail(
                f"kubernetes.namespaces[{i}]",
                name,
                'not a namespace name (DNS-1123 label: lower case, digits, "-", at most '
                '63 characters); write "*" for every namespace',
            )
    if "*" in namespaces and len(namespaces) > 1:
        raise v.fail("kubernetes.namespaces", list(namespaces), '"*" already names every namespace')
    accounts = v.strs("kubernetes.service_accounts", table.get("service_accounts", []))
    for i, entry in enumerate(accounts):
        parts = entry.split("/")
        if len(parts) > 2 or not all(_DNS_LABEL.match(p) for p in parts):
            raise v.fail(
                f"kubernetes.service_accounts[{i}]",
                entry,
                'write a service account as "name" or "namespace/name" (DNS-1123 labels)',
            )
    if accounts and not namespaces:
        raise v.fail(
            "kubernetes.service_accounts",
            list(accounts),
            "applies only within kubernetes.namespaces, which is empty; list the namespaces",
        )
    return KubernetesPolicy(namespaces, accounts)


# --- [network.upstream] -----------------------------------------------------------------

_UPSTREAM_KEYS = ("proxy", "no_proxy", "auth_file", "connect_by")


def _upstream_block(
    net: Mapping[str, Any], v: _Validator, cwd: Path, workspace: Path
) -> UpstreamPolicy | None:
    """Validate ``[network.upstream]``: every value is checked here, at load, so that a
    present but wrong setting refuses every run instead of surfacing at the first dial."""
    from stockade.policy._upstream import CONNECT_BY, parse_no_proxy

    if "upstream" not in net:
        return None
    table = net["upstream"]
    if not isinstance(table, dict):
        raise v.fail(
            "network.upstream", table, 'expected a table, e.g. { proxy = "http://proxy:3128" }'
        )
    for name in table:
        if name not in _UPSTREAM_KEYS:
            raise v.fail(
                f"network.upstream.{name}",
                table[name],
                f"unknown key; [network.upstream] takes {', '.join(_UPSTREAM_KEYS)}",
            )
    if "proxy" not in table:
        raise v.fail(
            "network.upstream",
            table,
            'no proxy; write proxy = "http://host:port" (or "env"), or remove the table',
        )
    proxy = _check_proxy_url(table["proxy"], "network.upstream.proxy", v)
    no_proxy = v.strs("network.upstream.no_proxy", table.get("no_proxy", []))
    for i, entry in enumerate(no_proxy):
        try:
            parse_no_proxy(entry)
        except ValueError as exc:
            # the message starts with the entry, quoted (parse_pattern's convention)
            raise PolicyError(f"{v.source}: network.upstream.no_proxy[{i}]: {exc}") from None
    auth_file: Path | None = None
    if "auth_file" in table:
        raw_path = table["auth_file"]
        if not isinstance(raw_path, str) or not raw_path:
            raise v.fail(
                "network.upstream.auth_file", raw_path, "expected the path of a user:password file"
            )
        auth_file = v.path("network.upstream.auth_file", raw_path, cwd)
        if not os.path.isfile(auth_file):
            raise v.fail(
                "network.upstream.auth_file",
                raw_path,
                "no such file; write user:password into it and chmod 600 it",
            )
        if _covered(auth_file, (workspace,)):
            raise v.fail(
                "network.upstream.auth_file",
                raw_path,
                "inside the workspace, which the sandbox can read; keep it outside, "
                "e.g. ~/.config/stockade/proxy-auth",
            )
    connect_by = table.get("connect_by", "address")
    if connect_by not in CONNECT_BY:
        raise v.fail(
            "network.upstream.connect_by",
            connect_by,
            'expected "address" (CONNECT the vetted IP) or "name" (for proxies that filter '
            "by host name)",
        )
    return UpstreamPolicy(proxy, no_proxy, auth_file, connect_by)


def _check_proxy_url(value: object, key: str, v: _Validator) -> str:
    from stockade.policy._upstream import parse_proxy_url, redact_url

    if not isinstance(value, str) or not value:
        raise v.fail(key, value, 'expected "http://host:port" or "env"')
    if value == "env":
        return value
    try:
        parse_proxy_url(value)
    except ValueError as exc:
        raise v.fail(key, redact_url(value), str(exc)) from None
    return value.strip()


def with_upstream_proxy(policy: Policy, url: str) -> Policy:
    """``policy`` whose upstream proxy is ``url`` (``--upstream-proxy``), validated; the
    policy's no_proxy, auth_file and connect_by stay as they are."""
    proxy = _check_proxy_url(url, "--upstream-proxy", _Validator("command line"))
    current = policy.network.upstream
    upstream = replace(current, proxy=proxy) if current is not None else UpstreamPolicy(proxy)
    return replace(policy, network=replace(policy.network, upstream=upstream))


# --- inspect: [[network.rules]], network.tls, [secrets.NAME], [labels] -----------------

_RULE_KEYS = ("host", "methods", "paths", "action")
_RULE_ACTIONS = ("allow", "deny", "report")
_METHOD = re.compile(r"^[A-Z][A-Z0-9-]{0,31}$")
_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
# Headers that frame or route a request; a credential placed there would break it.
_NOT_CREDENTIAL_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "te",
        "upgrade",
        "expect",
        "proxy-authorization",
        "cookie",
        "content-type",
        "content-encoding",
    }
)


def _host_covered(pattern: str, allow: tuple[str, ...]) -> bool:
    """True when every host ``pattern`` names is reachable under some ``network.allow`` entry.

    Both sides are read by the allow-list's own parser (:func:`parse_pattern`), so a rule
    on ``straße.test`` is covered by exactly the entries that admit ``xn--strae-oqa.test``.
    """
    from stockade.policy._hosts import PatternKind, parse_pattern

    try:
        rule = parse_pattern(pattern)
    except ValueError:
        return False
    for entry in allow:
        try:
            a = parse_pattern(entry)
        except ValueError:
            continue
        if a.port is not None and rule.port != a.port:
            continue
        if rule.kind is PatternKind.SUFFIX:
            # every subdomain of rule.host must be under a.host's subdomains
            if a.kind is PatternKind.SUFFIX and (
                rule.host == a.host or rule.host.endswith("." + a.host)
            ):
                return True
            continue
        if rule.kind is PatternKind.NETWORK:
            inner, outer = rule.network, a.network
            if (
                inner is not None
                and outer is not None
                and inner.version == outer.version
                and inner.subnet_of(outer)  # type: ignore[arg-type]
            ):
                return True
            continue
        if a.matches(rule.host, rule.port or a.port or 0):
            return True
    return False


def _check_path_glob(glob: str) -> str | None:
    """Why ``glob`` is not a usable path glob, or None when it is."""
    if not glob.startswith("/"):
        return 'a path glob starts with "/", e.g. "/v1/messages" or "/**"'
    if "***" in glob:
        return 'use "*" (within one segment) or "**" (any segments), not "***"'
    if any(c in glob for c in "?#\\%") or any(ord(c) <= 0x20 or ord(c) > 0x7E for c in glob):
        return "a path glob holds a plain normalised path: no ?, #, backslash, % or spaces"
    if any(seg in (".", "..") for seg in glob.split("/")):
        return "dot segments never match: requests with them are refused before the rules"
    return None


def _inspect_block(
    raw: Mapping[str, Any], v: _Validator, allow: tuple[str, ...], cwd: Path
) -> tuple[tuple[RequestRule, ...], Path | None, tuple[BoundSecret, ...], Labels]:
    """Validate ``network.rules``, ``network.tls``, ``[secrets.NAME]`` and ``[labels]``."""
    net = raw.get("network", {})
    not_allowed = "network.allow does not allow this host; add it there or fix the rule"

    raw_rules = net.get("rules", [])
    if not isinstance(raw_rules, list):
        raise v.fail("network.rules", raw_rules, "expected [[network.rules]] tables")
    rules: list[RequestRule] = []
    for i, item in enumerate(raw_rules):
        key = f"network.rules[{i}]"
        if not isinstance(item, dict):
            raise v.fail(key, item, "expected a table with host, methods, paths, action")
        extra = sorted(set(item) - set(_RULE_KEYS))
        if extra:
            raise v.fail(
                f"{key}.{extra[0]}",
                item[extra[0]],
                f"unknown key; a rule takes {', '.join(_RULE_KEYS)}",
            )
        host = item.get("host")
        if not isinstance(host, str) or not host:
            raise v.fail(
                f"{key}.host",
                host,
                'expected a host pattern as in network.allow, e.g. "registry.npmjs.org"',
            )
        _check_host_pattern(host, f"{key}.host", v.source)
        if not _host_covered(host, allow):
            raise v.fail(f"{key}.host", host, not_allowed)
        methods = tuple(m.upper() for m in v.strs(f"{key}.methods", item.get("methods", [])))
        for j, m in enumerate(methods):
            if not _METHOD.match(m):
                raise v.fail(f"{key}.methods[{j}]", m, 'expected an HTTP method such as "GET"')
        paths = v.strs(f"{key}.paths", item.get("paths", ["/**"]))
        if not paths:
            raise v.fail(
                f"{key}.paths", [], 'an empty list matches nothing; write ["/**"] for every path'
            )
        for j, glob in enumerate(paths):
            problem = _check_path_glob(glob)
            if problem:
                raise v.fail(f"{key}.paths[{j}]", glob, problem)
        action = item.get("action", "allow")
        if action not in _RULE_ACTIONS:
            raise v.fail(f"{key}.action", action, "expected allow, deny or report")
        rules.append(RequestRule(host, methods, paths, action, i))

    tls = net.get("tls", {})
    if not isinstance(tls, dict):
        raise v.fail("network.tls", tls, 'expected a table, e.g. { upstream_ca = "ca.pem" }')
    for name in tls:
        if name != "upstream_ca":
            raise v.fail(
                f"network.tls.{name}", tls[name], "unknown key; network.tls takes upstream_ca"
            )
    upstream_ca: Path | None = None
    if "upstream_ca" in tls:
        if not isinstance(tls["upstream_ca"], str):
            raise v.fail(
                "network.tls.upstream_ca", tls["upstream_ca"], "expected a path to a PEM file"
            )
        upstream_ca = v.path("network.tls.upstream_ca", tls["upstream_ca"], cwd)
        if not os.path.isfile(upstream_ca):
            raise v.fail(
                "network.tls.upstream_ca", tls["upstream_ca"], "no such file; give a PEM CA file"
            )

    secrets: list[BoundSecret] = []
    for name, table in raw.get("secrets", {}).items():
        key = f"secrets.{name}"
        if not _ENV_NAME.match(name):
            raise v.fail(
                key, name, "a secret is named like the variable the sandbox sees; use A-Z, 0-9, _"
            )
        if not isinstance(table, dict):
            raise v.fail(key, table, f"expected a table: [{key}] with from, hosts, header")
        extra = sorted(set(table) - set(SCHEMA["secrets"]))
        if extra:
            raise v.fail(
                f"{key}.{extra[0]}",
                table[extra[0]],
                "unknown key; a secret takes from, hosts, header",
            )
        source = table.get("from")
        if not isinstance(source, str) or not source.startswith(("env:", "file:")):
            raise v.fail(f"{key}.from", source, 'expected "env:VARIABLE" or "file:PATH"')
        kind, _, ref = source.partition(":")
        if kind == "env" and not _ENV_NAME.match(ref):
            raise v.fail(f"{key}.from", source, "not a valid environment variable name after env:")
        if kind == "file":
            if not ref.startswith(("/", "~")):
                raise v.fail(
                    f"{key}.from", source, 'give an absolute or ~ path, e.g. "file:~/.config/key"'
                )
            source = "file:" + str(v.path(f"{key}.from", ref, cwd))
        hosts = v.strs(f"{key}.hosts", table.get("hosts", []))
        if not hosts:
            raise v.fail(f"{key}.hosts", [], "list the hosts the secret may be sent to")
        for j, host in enumerate(hosts):
            _check_host_pattern(host, f"{key}.hosts[{j}]", v.source)
            if not _host_covered(host, allow):
                raise v.fail(f"{key}.hosts[{j}]", host, not_allowed)
        header = table.get("header", "authorization")
        if not isinstance(header, str) or not _HEADER_NAME.match(header.lower()):
            raise v.fail(f"{key}.header", header, 'expected a header name such as "x-api-key"')
        if header.lower() in _NOT_CREDENTIAL_HEADERS:
            raise v.fail(
                f"{key}.header",
                header,
                'cannot carry a credential; use "authorization" or "x-api-key"',
            )
        secrets.append(BoundSecret(name, source, hosts, header.lower()))

    lab = raw.get("labels", {})
    secret_files = tuple(
        os.path.expanduser(g) for g in v.strs("labels.secret_files", lab.get("secret_files", []))
    )
    secret_env = v.strs("labels.secret_env", lab.get("secret_env", []))
    for i, name in enumerate(secret_env):
        if not _ENV_NAME.match(name):
            raise v.fail(f"labels.secret_env[{i}]", name, "not a valid environment variable name")
    canaries = v.strs("labels.canaries", lab.get("canaries", []))
    for i, token in enumerate(canaries):
        if len(token) < 8:
            raise v.fail(
                f"labels.canaries[{i}]",
                token,
                "shorter than 8 characters: it would match ordinary text",
            )
    return tuple(rules), upstream_ca, tuple(secrets), Labels(secret_files, secret_env, canaries)


def _tighten_inspect(
    base: Policy, ws: Policy, raw: Mapping[str, Any], v: _Validator
) -> tuple[tuple[RequestRule, ...], Labels]:
    """A workspace policy may add deny rules and labels; never secrets, a CA or allow rules."""
    if ws.secrets:
        raise v.fail(
            "secrets",
            ws.secrets[0].name,
            "a workspace policy cannot bind secrets (it could send your credential where it "
            "likes); " + _WIDEN_FIX,
        )
    if "tls" in raw.get("network", {}):
        raise v.fail("network.tls", raw["network"]["tls"], _WIDEN_FIX)
    widening = [r for r in ws.network.rules if r.action != "deny"]
    if base.network.rules and widening:
        # Appended after the user's rules, an allow could match what the user's rules
        # left unmatched (denied); only deny rules are safe to add.
        raise v.fail(f"network.rules[{widening[0].index}].action", widening[0].action, _WIDEN_FIX)
    ordered = [r for r in ws.network.rules if r.action == "deny"] + list(base.network.rules)
    ordered += [r for r in ws.network.rules if r.action != "deny"]
    rules = tuple(replace(r, index=i) for i, r in enumerate(ordered))
    b, w = base.labels, ws.labels
    labels = Labels(
        b.secret_files + w.secret_files, b.secret_env + w.secret_env, b.canaries + w.canaries
    )
    return rules, labels


_PAST_LIMIT = ("scan-raw", "refuse")


def _inspect_table(table: Mapping[str, Any], v: _Validator) -> InspectPolicy:
    """Validate ``[inspect]``: detector actions and decoding (docs/inspect.md)."""
    d = InspectPolicy()
    raw_detectors = table.get("detectors", {})
    if not isinstance(raw_detectors, dict):
        raise v.fail(
            "inspect.detectors", raw_detectors, 'expected a table, e.g. { jwt = "report" }'
        )
    detectors: list[tuple[str, str]] = []
    for name, action in raw_detectors.items():
        if name not in DETECTOR_NAMES:
            raise v.fail(
                f"inspect.detectors.{name}",
                action,
                f"unknown detector; the detectors are {', '.join(DETECTOR_NAMES)}",
            )
        if action not in DETECTOR_ACTIONS:
            raise v.fail(f"inspect.detectors.{name}", action, 'expected "deny", "report" or "off"')
        detectors.append((name, action))
    names = _name_limits(table.get("names", []), v)
    past = table.get("past_limit", d.past_limit)
    if past not in _PAST_LIMIT:
        raise v.fail("inspect.past_limit", past, 'expected "scan-raw" or "refuse"')
    return InspectPolicy(
        detectors=tuple(sorted(detectors)),
        decode=v.boolean("inspect.decode", table.get("decode", d.decode)),
        decode_limit=v.size("inspect.decode_limit", table.get("decode_limit", d.decode_limit)),
        past_limit=past,
        names=names,
        http2=v.boolean("inspect.http2", table.get("http2", d.http2)),
    )


def _name_limits(raw: object, v: _Validator) -> tuple[tuple[str, int, int], ...]:
    if not isinstance(raw, list):
        raise v.fail("inspect.names", raw, 'expected [{ host = "*.example.com", max_label = 24 }]')
    out: list[tuple[str, int, int]] = []
    for i, item in enumerate(raw):
        key = f"inspect.names[{i}]"
        if not isinstance(item, dict):
            raise v.fail(key, item, "expected a table with host, max_label, max_labels")
        extra = sorted(set(item) - {"host", "max_label", "max_labels"})
        if extra:
            raise v.fail(
                f"{key}.{extra[0]}",
                item[extra[0]],
                "unknown key; a limit takes host, max_label, max_labels",
            )
        host = item.get("host")
        if not isinstance(host, str) or not host.startswith("*.") or len(host) < 4:
            raise v.fail(f"{key}.host", host, 'expected a wildcard pattern, e.g. "*.example.com"')
        limits = [v.integer(f"{key}.{k}", item.get(k, 0)) for k in ("max_label", "max_labels")]
        if not any(limits):
            raise v.fail(key, item, "set max_label, max_labels or both")
        out.append((host[2:].lower().rstrip("."), limits[0], limits[1]))
    return tuple(out)


def _tighten_inspect_table(
    base: InspectPolicy, ws: InspectPolicy, table: Mapping[str, Any], v: _Validator
) -> InspectPolicy:
    """A workspace ``[inspect]`` may only search more: a detector from off to report or
    deny (never back), decoding on, ``refuse`` past the limit, a larger limit."""
    strength = {a: i for i, a in enumerate(reversed(DETECTOR_ACTIONS))}
    ours, theirs = base.actions(), ws.actions()
    given = dict(ws.detectors)
    merged: dict[str, str] = {}
    for name in DETECTOR_NAMES:
        action = ours[name]
        if name in given:
            if strength[theirs[name]] < strength[action]:
                raise v.fail(f"inspect.detectors.{name}", theirs[name], _WIDEN_FIX)
            action = theirs[name]
        if action != "deny":
            merged[name] = action
    if base.decode and "decode" in table and not ws.decode:
        raise v.fail("inspect.decode", False, _WIDEN_FIX)
    if not base.http2 and "http2" in table and ws.http2:
        raise v.fail("inspect.http2", True, _WIDEN_FIX)
    if base.past_limit == "refuse" and "past_limit" in table and ws.past_limit != "refuse":
        raise v.fail("inspect.past_limit", ws.past_limit, _WIDEN_FIX)
    return InspectPolicy(
        detectors=tuple(sorted(merged.items())),
        decode=base.decode or ("decode" in table and ws.decode),
        decode_limit=(
            max(base.decode_limit, ws.decode_limit)
            if "decode_limit" in table
            else base.decode_limit
        ),
        past_limit="refuse" if "refuse" in (base.past_limit, ws.past_limit) else "scan-raw",
        # Limits only refuse names: the workspace's are added to the user's.
        names=base.names + tuple(n for n in ws.names if n not in base.names),
        # Every HTTP/2 stream gets the HTTP/1.1 checks, so this is not a loosening; a
        # workspace may still turn it off, never on against the user's policy.
        http2=base.http2 and ("http2" not in table or ws.http2),
    )


# --- end inspect ------------------------------------------------------------------------


# Policy.load reads files through this module; _model, which it builds on, does not import it.
_model._loader = load_policy
