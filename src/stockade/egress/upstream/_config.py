"""The upstream proxy in force: the policy's ``[network.upstream]`` resolved once at start.

Resolution reads what the policy points at and nothing else: ``HTTPS_PROXY`` and its
neighbours from stockade's own environment when ``proxy = "env"`` (never the sandbox's:
it has none of its own to give), and the credentials from ``auth_file``. Every problem
is a :class:`~stockade.PolicyError` naming the key, so a present but unusable setting
refuses the run (exit 125) instead of surfacing as failed connections.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stockade._exceptions import PolicyError
from stockade.egress._addr import IPAddress
from stockade.policy._model import UpstreamPolicy
from stockade.policy._upstream import NoProxy, parse_no_proxy, parse_proxy_url, redact_url

#: the variables ``proxy = "env"`` reads, first set wins (HTTPS first: most traffic is TLS)
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")
#: largest auth file read (one ``user:password`` line)
_MAX_AUTH = 4096


@dataclass(frozen=True, slots=True)
class Upstream:
    """The operator's proxy: where it is, what goes direct, how to authenticate.

    ``url`` never carries credentials; it is what audit events and ``doctor`` show.
    """

    host: str
    port: int
    no_proxy: tuple[NoProxy, ...] = ()
    connect_by: str = "address"
    #: the ``Proxy-Authorization`` value (``Basic ...``), or None
    authorization: bytes | None = field(default=None, repr=False)
    #: where the setting came from, for messages (``network.upstream.proxy``, ``HTTPS_PROXY``)
    source: str = "network.upstream.proxy"
    #: the auth file the credentials were read from (shown, never its content)
    auth_file: Path | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 in brackets), without credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def direct(self, host: str, port: int, address: IPAddress) -> bool:
        """True when ``host:port`` (vetted to ``address``) is dialled directly.

        Loopback always is: the upstream's loopback is not this host's.
        """
        if address.is_loopback or (
            isinstance(address, ipaddress.IPv6Address)
            and address.ipv4_mapped is not None
            and address.ipv4_mapped.is_loopback
        ):
            return True
        return any(entry.matches(host, port, address) for entry in self.no_proxy)

    def authority(self, host: str, port: int, address: IPAddress | str) -> str:
        """What the upstream is asked to connect to: the vetted address (``connect_by =
        "address"``, so the tunnel stays bound to what passed the checks) or the name."""
        by_name = self.connect_by == "name" or str(address) == host
        target = host if by_name else str(address)
        if ":" in target:
            target = f"[{target}]"
        return f"{target}:{port}"


def resolve_upstream(
    policy: UpstreamPolicy | None, environ: Mapping[str, str] | None = None
) -> Upstream | None:
    """The upstream for ``policy`` (None: no upstream; dial directly).

    ``environ`` is stockade's own environment (``os.environ`` when omitted), read here
    once; ``proxy = "env"`` with none of :data:`PROXY_VARIABLES` set means no upstream.
    Raises :class:`~stockade.PolicyError` naming the key and the fix.
    """
    if policy is None:
        return None
    env = os.environ if environ is None else environ
    key = "network.upstream.proxy"
    no_proxy: list[NoProxy] = []
    for i, text in enumerate(policy.no_proxy):
        try:
            no_proxy.append(parse_no_proxy(text))
        except ValueError as exc:  # validated at load; a hand-built policy may not be
            raise PolicyError(f"network.upstream.no_proxy[{i}]: {exc}") from None
    if policy.proxy == "env":
        found = next(((name, env[name]) for name in PROXY_VARIABLES if env.get(name)), None)
        if found is None:
            return None
        source, value = found
        if "://" not in value:
            value = "http://" + value  # curl's reading of "proxy.corp:8080"
        no_proxy += _env_no_proxy(env)
        where = f'{key} = "env": {source}="{redact_url(value)}"'
    else:
        source, value = key, policy.proxy
        where = f'{key}: "{redact_url(value)}"'
    try:
        host, port = parse_proxy_url(value)
    except ValueError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    if any(entry.everything for entry in no_proxy):
        return None  # NO_PROXY=* : the operator sends everything direct
    authorization = None
    if policy.auth_file is not None:
        authorization = read_auth_file(policy.auth_file)
    return Upstream(
        host,
        port,
        tuple(no_proxy),
        policy.connect_by,
        authorization,
        source,
        policy.auth_file,
    )


def _env_no_proxy(env: Mapping[str, str]) -> list[NoProxy]:
    name = next((n for n in NO_PROXY_VARIABLES if env.get(n)), None)
    if name is None:
        return []
    out = []
    for text in env[name].replace(" ", ",").split(","):
        if not text:
            continue
        try:
            out.append(parse_no_proxy(text, convention=True))
        except ValueError as exc:
            raise PolicyError(
                f'network.upstream.proxy = "env": {name}: {exc}; fix or remove that entry'
            ) from None
    return out


def read_auth_file(path: Path) -> bytes:
    """The ``Proxy-Authorization`` value for the ``user:password`` in ``path``.

    The file must be a regular file owned by this user and readable by nobody else: a
    file others can read is a credential already leaked, and refusing it says so.
    """
    key = "network.upstream.auth_file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise PolicyError(f"{key}: {path}: cannot open: {exc.strerror}") from None
    try:
        # Checked on the open descriptor: what is read is what was checked.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(f"{key}: {path}: not a regular file")
        if info.st_uid != os.geteuid():
            raise PolicyError(
                f"{key}: {path}: owned by uid {info.st_uid}, not by you (uid {os.geteuid()}); "
                "keep your own copy, readable by you only"
            )
        if info.st_mode & 0o077:
            raise PolicyError(
                f"{key}: {path}: readable by others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"it holds a password: chmod 600 {path}"
            )
        data = os.read(fd, _MAX_AUTH + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_AUTH:
        raise PolicyError(f"{key}: {path}: too large; it holds one line, user:password")
    lines = [line for line in data.splitlines() if line.strip()]
    line = lines[0] if len(lines) == 1 else b""
    user, sep, _ = line.partition(b":")
    if not sep or not user or any(b < 0x20 or b == 0x7F for b in line):
        # The content is never repeated: it is a credential, whatever its shape.
        raise PolicyError(f"{key}: {path}: expected one line, user:password")
    return b"Basic " + base64.b64encode(line)
