"""The v1 policy schema, declared once.

Every key is declared here with its kind, default and help text. The loader validates
against these declarations and the policy reference in ``docs/policy.md`` is generated
from them (``python -m stockade.policy._schema`` prints it), so the two cannot drift.
The key names are a contract: tools outside the project write such files.
"""

from __future__ import annotations

from stockade._record import record


@record
class Key:
    """One policy key: its kind (how it is validated), default (as TOML) and help."""

    kind: str
    default: str
    help: str


SCHEMA: dict[str, dict[str, Key]] = {
    "filesystem": {
        "workspace": Key(
            "path",
            '"."',
            "read-write root; relative to the current directory. "
            '{ path = ".", mode = "overlay" } keeps the run\'s writes in a layer to review '
            "and apply (stockade changes/diff/apply, see docs/overlay.md)",
        ),
        "read": Key("paths", "[]", "extra read-only paths"),
        "write": Key("paths", "[]", "extra read-write paths; never / or your home directory"),
        "deny": Key(
            "globs",
            "[]",
            "never readable, even inside read/write areas; globs allowed "
            '("**/.env", "~/.aws"); relative globs are matched in the workspace',
        ),
        "protect": Key(
            "relpaths",
            "[]",
            "paths inside the workspace that stay read-only, added to the built-in list "
            "(.git/hooks, .git/config, .claude/, .vscode/, ...)",
        ),
    },
    "env": {
        "pass": Key(
            "env_pass",
            "[]",
            "names passed through from the caller; a credential-like name needs "
            '{ name = "X", allow_secret = true }',
        ),
        "set": Key(
            "str_map",
            "{}",
            "names set to fixed values, for the command inside only (never a host-side process); a workspace file may repeat the user policy's values, never add or change one (stockade trust lets a pinned file)",
        ),
    },
    "network": {
        "allow": Key(
            "strs", "[]", 'hosts the proxy may reach: "host", "*.suffix", "host:port", IPs, CIDRs'
        ),
        "deny": Key("strs", "[]", "hosts never reached; wins over allow"),
        "hosts": Key("str_map", "{}", 'pin a name to an address: "name.test" = "127.0.0.1"'),
        "tls_ports": Key(
            "ports", "[443]", "ports on which a tunnel must carry TLS whose SNI matches"
        ),
        "transparent": Key(
            "bool",
            "true",
            "stockade's resolver inside the sandbox, and capture of connections to the "
            "addresses it hands out (ports 80, 443, tls_ports and ports named in allow), "
            "for clients that ignore proxy variables",
        ),
        "strict": Key(
            "bool",
            "false",
            "never ask about a host that is not allowed (stockade run --ask, the API's ask=): "
            "deny it as host-not-allowed; a workspace policy may set it, never unset it",
        ),
        "grace_until": Key(
            "date",
            "none",
            "the last day (UTC) of a learnt policy's grace period, e.g. 2026-12-31, at most "
            "90 days ahead: until then a host or request this policy does not admit is let "
            "through and reported (verdict report, rule grace; `stockade run` prints them), "
            "after it refused; deny entries, deny rules and address checks stay enforced; "
            "user policy or --policy only, never a workspace file (docs/learn.md)",
        ),
        # --- inspect ---
        "rules": Key(
            "rules",
            "[]",
            "[[network.rules]] host, methods, paths (globs on the normalised path), "
            "action = allow | deny | report; first match in file order wins; a host with "
            "rules denies requests matching none",
        ),
        "tls": Key("tls", "{}", "{ upstream_ca = PATH }: verify upstream TLS against this CA file"),
        # --- end inspect ---
        "upstream": Key(
            "upstream",
            "{}",
            "[network.upstream] the operator's proxy every allowed connection is chained "
            'through, after stockade decided it: proxy = "http://host:port" or "env" '
            "(HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY of stockade's environment); "
            "no_proxy = hosts, *.suffix, IPs, CIDRs (with :port) sent direct (loopback "
            "always is); auth_file = PATH holding user:password, readable by you only; "
            'connect_by = "address" (CONNECT the vetted IP) or "name"; user policy, '
            "--policy or --upstream-proxy only, never a workspace file",
        ),
    },
    "limits": {
        "pids": Key("count", "512", "most processes and threads at once"),
        "memory": Key("size", '"4GiB"', "memory cap (address space per process without a cgroup)"),
        "file_size": Key("size", '"4GiB"', "largest file the sandbox may write"),
        "cpu_seconds": Key("count", "0", "CPU time cap per process; 0 = unlimited"),
        "wall_seconds": Key("seconds", "0", "wall-time cap for the whole run; 0 = unlimited"),
    },
    # --- inspect: [secrets.NAME] tables take these keys; [labels] ---
    "secrets": {
        "from": Key(
            "secret_source",
            '"env:NAME"',
            '[secrets.NAME] where the value is read: "env:VAR" or "file:PATH"',
        ),
        "hosts": Key(
            "strs", "[]", "[secrets.NAME] the only hosts the value is sent to (in network.allow)"
        ),
        "header": Key(
            "header", '"authorization"', '[secrets.NAME] "x-api-key", or "authorization" (Bearer)'
        ),
    },
    "labels": {
        "secret_files": Key(
            "globs", "[]", "files whose values never leave (KEY=VALUE lines: VALUE)"
        ),
        "secret_env": Key("strs", "[]", "variables of the caller whose values never leave"),
        "canaries": Key("strs", "[]", "canary tokens that never leave"),
    },
    "inspect": {
        "detectors": Key(
            "detector_actions",
            "{}",
            '{ NAME = "deny" | "report" | "off" }: credential detectors on inspected hosts '
            "(every one denies unless set; names and false-positive stances in "
            "docs/inspect.md); a workspace file may only strengthen one",
        ),
        "decode": Key(
            "bool",
            "true",
            "also search decoded views (base64 any alignment, hex, nested percent, escapes, "
            "quoted-printable, gzip) for labels and detectors",
        ),
        "decode_limit": Key("size", '"16MiB"', "request-body bytes decoded per request"),
        "past_limit": Key(
            "past_limit",
            '"scan-raw"',
            'past decode_limit: "scan-raw" (search the raw bytes only) or "refuse" (413)',
        ),
        "names": Key(
            "name_limits",
            "[]",
            '[{ host = "*.suffix", max_label = N, max_labels = N }]: names under an allowed '
            "wildcard with a longer label or more labels below it are refused before any "
            "lookup (0: no limit); a workspace file may add limits",
        ),
        "http2": Key(
            "bool",
            "true",
            "offer HTTP/2 (ALPN h2) to clients of an inspected host whose server speaks it; "
            "each stream is checked as an HTTP/1.1 request is (docs/inspect.md)",
        ),
    },
    # --- end inspect ---
    "kubernetes": {
        "namespaces": Key(
            "k8s_names",
            "[]",
            "namespaces whose pods `stockade gateway serve` may apply this policy to "
            '(named by their stockade.dev/policy annotation); ["*"] for all; empty: none',
        ),
        "service_accounts": Key(
            "k8s_names",
            "[]",
            'and only pods running as one of these service accounts ("name" or '
            '"namespace/name"); empty: any',
        ),
    },
    "layers": {
        name: Key("bool", "true", help_)
        for name, help_ in (
            ("files", "Landlock: only the workspace, system and listed paths are reachable"),
            ("container", "bubblewrap namespaces: no host processes, sockets or files"),
            ("syscalls", "seccomp: no new namespaces, mount API, keyctl, bpf, io_uring, ptrace"),
            ("secrets", "the environment is built from an allow-list"),
            ("egress", "no network but the stockade proxy, which allows listed hosts only"),
            ("inspect", "TLS interception, request rules, credential binding, data labels"),
            ("limits", "pids, memory, file size, CPU and wall time"),
            (
                "overlay",
                'a workspace in mode = "overlay" keeps the run\'s writes for review; '
                "off, that workspace is read-write",
            ),
        )
    },
    # Toolchain presets (policy/_presets.py): expanded into network.allow, request rules,
    # filesystem.read and env.pass by the loader.
    "presets": {
        "use": Key(
            "presets",
            "[]",
            'toolchains whose hosts and rules to add: "python" (PyPI), "node" (npm), '
            '"git" (GitHub over https); in a workspace policy only if the user policy '
            "already allows their hosts",
        ),
        "allow_push": Key("bool", "false", 'let the "git" preset push (git-receive-pack)'),
    },
    # The runtime boundary the container layer is built on (enforce/bubblewrap.py or
    # enforce/gvisor.py): both take the same mount plan.
    "container": {
        "backend": Key(
            "backend",
            '"bubblewrap"',
            '"bubblewrap" (namespaces on the host kernel) or "gvisor" (runsc: a kernel of '
            "its own in user space; slower, see docs/gvisor.md); a workspace file may choose "
            '"gvisor", never go back to "bubblewrap"; "landlock": no namespaces, for hosts '
            "that refuse user namespaces, confined by Landlock and seccomp alone (what it "
            'loses: docs/security-model.md, stockade doctor); "auto": bubblewrap where user '
            "namespaces work, else landlock only with allow_degraded",
        ),
        "allow_degraded": Key(
            "bool",
            "false",
            'let backend = "auto" fall back to "landlock" where user namespaces are refused; '
            "user policy or --policy only",
        ),
    },
    # The MCP server (stockade mcp): how it may ask the user through the MCP client.
    "mcp": {
        "allow_always": Key(
            "bool",
            "false",
            'offer "always allow" (written to approved.toml) when stockade mcp asks through '
            "the client (MCP elicitation); off by default because an MCP client may answer "
            "by a hook or a model rather than a person; user policy or --policy only: a "
            "workspace file may set it false, never true",
        ),
    },
}

#: sections made of named tables (``[secrets.NAME]``), each taking the section's keys
NAMED_TABLES: frozenset[str] = frozenset({"secrets"})

TOP_LEVEL: dict[str, Key] = {
    "version": Key("version", "1", "schema version; must be 1"),
}


def reference_markdown() -> str:
    """The policy reference as Markdown, generated from :data:`SCHEMA`."""
    lines = [
        "# Policy reference (v1)",
        "",
        "Generated from `src/stockade/policy/_schema.py`; "
        "`python -m stockade.policy._schema > docs/policy.md` regenerates it.",
        "",
        "```toml",
        "version = 1",
    ]
    for section, keys in SCHEMA.items():
        lines.append(f"[{section}]")
        for name, key in keys.items():
            lines.append(f"{name} = {key.default:<8} # {key.help}")
    lines += [
        "```",
        "",
        "## Versions and errors",
        "",
        "`version = 1` is the only schema version. A file without the key is read as "
        "version 1, and `stockade check` and `stockade run` print one note on stderr naming "
        "the file and the line to add (`version = 1`); a later version will require it. Any "
        "other value is an error.",
        "",
        "An error names the file and, when it can find it, the line "
        "(`policy.toml:3: layers.firewall: false: unknown key; ...`), then the key path, "
        "the value once as TOML writes it, and the fix. stockade exits 125.",
        "",
    ]
    for section, keys in SCHEMA.items():
        lines += [
            f"## `[{section}]`",
            "",
            "| key | kind | default | meaning |",
            "|---|---|---|---|",
        ]
        for name, key in keys.items():
            lines.append(f"| `{name}` | {key.kind} | `{key.default}` | {key.help} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
