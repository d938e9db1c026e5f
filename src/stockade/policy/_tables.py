"""Tables that enforcement and the model share, so that they cannot drift apart.

The container binds :data:`SYSTEM_PATHS` and masks :data:`SYSTEM_SECRETS`; the files layer
grants the same system paths; the protected paths stay read-only inside the workspace;
the secrets layer always passes :data:`BASE_ENV_NAMES`. The model (``stockade.model``)
judges actions against the very same values.
"""

from __future__ import annotations

#: Directories bound read-only as "the system". Everything else on the host is invisible.
SYSTEM_PATHS: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    # glibc's get_nprocs() and nproc read these; nothing else of /sys is exposed.
    "/sys/devices/system/cpu",
)

#: Where a symlink an overlay run made may lead out of the workspace and still be applied:
#: the system's programs and libraries (a virtualenv's ``bin/python`` ->
#: ``/usr/bin/python3``). Not ``/etc``, not a home directory, not /tmp: a host tool that
#: later writes through such a link would write there. ``stockade apply`` refuses any
#: other; the model's overlay layer reads the same table.
LINK_TARGETS_OUTSIDE: tuple[str, ...] = tuple(
    p for p in SYSTEM_PATHS if p.startswith(("/usr", "/bin", "/sbin", "/lib", "/opt"))
)

#: System files that hold secrets of the host (readable by root outside): masked inside.
SYSTEM_SECRETS: tuple[str, ...] = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssl/private",
)

#: Entries of a git directory through which git, run on the host in this repository or
#: in any of its worktrees or submodules, picks another directory, a configuration or a
#: hook (gitrepository-layout(5), git-worktree(1)). Every git directory stockade finds
#: writable inside the sandbox (the workspace's ``.git``, each submodule's under
#: ``modules/``, the directory a ``.git`` file points to and its common directory) keeps
#: them read-only, with a placeholder ("d" a directory, "f" a file) where one is missing,
#: so that none can be created either (``enforce/paths.py``):
#:
#: * ``config``, ``config.worktree``: ``core.hooksPath``, ``core.fsmonitor``, filters,
#:   ``diff.external``, ``core.worktree``, ``include.path`` (attacks WRT-03);
#: * ``commondir``: moves the common directory, and with it config, hooks and objects;
#: * ``hooks/``: scripts git runs (WRT-02);
#: * ``worktrees/``: one administrative directory per linked worktree, whose ``commondir``,
#:   ``gitdir`` and ``config.worktree`` steer git in that worktree. The whole directory is
#:   protected, not only the files of the worktrees that exist at the start: a worktree the
#:   host adds during the run, or a directory the sandbox makes there, would otherwise be
#:   writable (so ``git worktree add`` fails inside; ``list`` works);
#: * ``objects/info/alternates``: object stores git reads besides its own.
#:
#: Left writable, because git reads them as data, not as a place to look for code, and
#: commits, branches and fetches write them: ``HEAD`` (a symref into ``refs/``; see
#: :data:`DEFAULT_PROTECTED` for the one way it matters), ``refs/``, ``packed-refs``,
#: ``logs/``, ``index``, ``objects/`` (content addressed), ``shallow``, ``info/``
#: (``exclude`` and ``attributes`` have the power of a worktree's ``.gitignore`` and
#: ``.gitattributes``: attributes pick only drivers the protected config defines),
#: ``remotes/`` and ``branches/`` (URLs of remotes the config does not name), ``modules/``
#: itself (fetching a submodule writes there; each submodule's git directory is protected
#: as above), ``rebase-merge/`` and ``sequencer/`` (state of an operation in progress).
GIT_DIR_PROTECTED: tuple[tuple[str, str], ...] = (
    ("config", "f"),
    ("config.worktree", "f"),
    ("commondir", "f"),
    ("hooks", "d"),
    ("worktrees", "d"),
    ("objects/info/alternates", "f"),
)

#: Paths inside the workspace that run code later on the host, so they stay read-only
#: even though the workspace is writable (DESIGN §4 rule 9; attacks WRT-02/03/05/06).
#: ``HEAD`` at the top: git that finds no valid repository in ``.git`` (the sandbox can
#: break ``.git/HEAD``) takes the directory itself for a bare repository when it holds
#: ``HEAD``, ``objects/`` and ``refs/``, and then obeys a ``config`` there; an empty,
#: read-only ``HEAD`` keeps that from happening.
DEFAULT_PROTECTED: tuple[str, ...] = (
    *(f".git/{name}" for name, _ in GIT_DIR_PROTECTED),
    *(f".git/modules/*/{name}" for name, _ in GIT_DIR_PROTECTED),
    "HEAD",
    ".gitmodules",
    ".claude",
    ".mcp.json",
    ".cursor",
    ".vscode",
    ".idea",
    ".husky",
    ".envrc",
    ".devcontainer",
    ".gemini",
    ".mise",
    "mise.toml",
    ".mise.toml",
    "stockade.toml",
)

#: Git hook managers: a marker their installed hook holds, and the files of the worktree
#: whose commands that hook runs. Protected (with placeholders) in a repository whose
#: hooks hold the marker (:func:`stockade.enforce.paths._hook_manager_configs`).
HOOK_MANAGERS: tuple[tuple[bytes, tuple[str, ...]], ...] = (
    (b"pre-commit", (".pre-commit-config.yaml",)),
    (
        b"lefthook",
        tuple(
            f"{dot}lefthook{local}.{ext}"
            for dot in ("", ".")
            for local in ("", "-local")
            for ext in ("yml", "yaml", "toml", "json")
        ),
    ),
    (b"overcommit", (".overcommit.yml",)),
)

#: Environment variables always taken from the caller when set.
BASE_ENV_NAMES: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "COLORTERM",
)

#: Environment variables that name trust stores (CA bundles and directories): public
#: certificates, not secrets. Passed from the caller by default, never reported as
#: credentials; the runtime keeps the files they name readable inside the sandbox, and
#: with inspection on points every one of them at one bundle of the caller's trust plus
#: the run's CA.
TRUST_ENV_NAMES: tuple[str, ...] = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "DENO_CERT",
    "HTTPLIB2_CA_CERTS",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "NIX_SSL_CERT_FILE",
    "BUNDLE_SSL_CA_CERT",
    "npm_config_cafile",
    "NPM_CONFIG_CAFILE",
)

#: Of :data:`TRUST_ENV_NAMES`, those that name a directory of certificates, not a file.
TRUST_DIR_NAMES: frozenset[str] = frozenset({"SSL_CERT_DIR", "GIT_SSL_CAPATH"})

#: Hosts that make an allow-list entry an open channel: DNS-over-HTTPS resolvers (names
#: resolved, and data sent, around the proxy's DNS), tunnels to anywhere, paste and
#: webhook services (attacks NET-07, NET-23). An entry naming one gets a warning.
RISKY_HOSTS: dict[str, str] = {
    "dns.google": "a DNS-over-HTTPS resolver",
    "cloudflare-dns.com": "a DNS-over-HTTPS resolver",
    "one.one.one.one": "a DNS-over-HTTPS resolver",
    "dns.quad9.net": "a DNS-over-HTTPS resolver",
    "doh.opendns.com": "a DNS-over-HTTPS resolver",
    "dns.nextdns.io": "a DNS-over-HTTPS resolver",
    "ngrok-free.app": "a tunnel service",
    "ngrok.io": "a tunnel service",
    "ngrok.app": "a tunnel service",
    "trycloudflare.com": "a tunnel service",
    "loca.lt": "a tunnel service",
    "serveo.net": "a tunnel service",
    "localhost.run": "a tunnel service",
    "webhook.site": "a webhook collector",
    "requestbin.com": "a webhook collector",
    "pipedream.net": "a webhook collector",
    "pastebin.com": "a paste service",
    "paste.ee": "a paste service",
    "transfer.sh": "a file drop",
    "file.io": "a file drop",
    "filev2.getsession.org": "a file drop used for exfiltration",
    "1.1.1.1": "a DNS-over-HTTPS resolver",
    "8.8.8.8": "a DNS-over-HTTPS resolver",
    "requestbin.net": "a webhook collector",
    "hastebin.com": "a paste service",
    "interact.sh": "an out-of-band interaction collector",
    "oast.fun": "an out-of-band interaction collector",
    "oast.pro": "an out-of-band interaction collector",
    "oast.live": "an out-of-band interaction collector",
    "oast.site": "an out-of-band interaction collector",
    "oast.online": "an out-of-band interaction collector",
    "oast.me": "an out-of-band interaction collector",
    "oastify.com": "an out-of-band interaction collector",
    "burpcollaborator.net": "an out-of-band interaction collector",
}

#: Broad or dual-use destinations (``stockade explain``): anyone can publish there, so an
#: allow is a way out even though the host is an ordinary one.
BROAD_HOSTS: tuple[tuple[str, str], ...] = (
    ("github.com", "anyone can push to a repository or open a gist/issue there"),
    ("*.github.com", "anyone can push to a repository or open a gist/issue there"),
    ("githubusercontent.com", "serves content any user uploads"),
    ("*.amazonaws.com", "every customer's buckets and APIs, including an attacker's"),
    ("*.googleapis.com", "every customer's storage and APIs, including an attacker's"),
    ("*.blob.core.windows.net", "every customer's storage, including an attacker's"),
    ("*.cloudfront.net", "any customer's distribution"),
    ("*.herokuapp.com", "any customer's app"),
    ("*.vercel.app", "any customer's app"),
)


def risky_host(entry: str) -> str | None:
    """What makes the allow-list ``entry`` an open channel, or None."""
    host = entry.strip().lower().removeprefix("*.").rsplit(":", 1)[0].rstrip(".")
    for name, what in RISKY_HOSTS.items():
        if host == name or host.endswith("." + name) or name.endswith("." + host):
            return what
    return None
