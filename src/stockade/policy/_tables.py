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

#: Paths inside the workspace that run code later on the host, so they stay read-only
#: even though the workspace is writable (DESIGN §4 rule 9; attacks WRT-02/03/05/06).
DEFAULT_PROTECTED: tuple[str, ...] = (
    ".git/hooks",
    ".git/config",
    ".git/config.worktree",
    ".git/commondir",
    ".git/modules/*/hooks",
    ".git/modules/*/config",
    ".git/worktrees/*/gitdir",
    ".git/worktrees/*/commondir",
    ".git/worktrees/*/config.worktree",
    ".gitmodules",
    ".claude",
    ".mcp.json",
    ".cursor",
    ".vscode",
    ".idea",
    ".husky",
    ".envrc",
    ".devcontainer",
    "stockade.toml",
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
}


def risky_host(entry: str) -> str | None:
    """What makes the allow-list ``entry`` an open channel, or None."""
    host = entry.strip().lower().removeprefix("*.").rsplit(":", 1)[0].rstrip(".")
    for name, what in RISKY_HOSTS.items():
        if host == name or host.endswith("." + name) or name.endswith("." + host):
            return what
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
    return None
