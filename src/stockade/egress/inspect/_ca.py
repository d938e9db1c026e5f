"""The interception CA: per user (on disk, outside any workspace) or per run (in memory).

The CA is EC P-256 with ``BasicConstraints(ca=True, path_length=0)`` (it can sign leaves,
never another CA) and a short validity. Leaf certificates are minted on demand for the
host a tunnel was opened to, all with one shared P-256 key (generating a key per leaf
would cost more than the signature; the key never leaves the proxy), and kept in an
LRU cache so that a host's second connection costs nothing here.

Only the CA *certificate* enters the sandbox, through the trust bundle written by
:func:`write_trust_bundle` and the variables of :func:`trust_environment`. The CA key
stays in ``$XDG_DATA_HOME/stockade/ca/`` (0700 directory, 0600 key) or in memory.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stockade._exceptions import SandboxError, Unavailable
from stockade._fs import replace_file
from stockade.policy._tables import TRUST_DIR_NAMES, TRUST_ENV_NAMES

#: how long a per-run CA is valid; a run longer than this needs a per-user CA
RUN_CA_VALIDITY = datetime.timedelta(days=2)
#: how long a per-user CA is valid before it is replaced by a new one
USER_CA_VALIDITY = datetime.timedelta(days=30)
#: a per-user CA closer than this to its end is replaced when loaded
USER_CA_RENEW_BEFORE = datetime.timedelta(days=3)
#: validity of a leaf certificate
LEAF_VALIDITY = datetime.timedelta(hours=24)
#: clocks inside and outside the sandbox may differ a little
_BACKDATE = datetime.timedelta(minutes=5)
#: leaves kept in memory
LEAF_CACHE_SIZE = 256

_CA_CERT = "ca-cert.pem"
_CA_KEY = "ca-key.pem"

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)

#: variables that point common clients at a CA bundle (every trust-store variable that
#: names a file; those naming a directory keep the caller's value)
TRUST_VARIABLES: tuple[str, ...] = tuple(n for n in TRUST_ENV_NAMES if n not in TRUST_DIR_NAMES)


@dataclass(frozen=True, slots=True)
class Leaf:
    """A leaf certificate for one host, as PEM (the leaf, then the CA)."""

    host: str
    chain_pem: bytes
    not_after: datetime.datetime


def user_ca_dir() -> Path:
    """``$XDG_DATA_HOME/stockade/ca`` (``~/.local/share/stockade/ca`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stockade" / "ca"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """An interception CA that mints leaf certificates for hosts.

    Build one with :meth:`ephemeral` (per run, in memory) or :meth:`for_user` (kept on
    disk outside any workspace, reused across runs so a user can trust it once).
    """

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        # One key for every leaf: P-256 signing is the whole per-leaf cost this way.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self.leaf_key_pem = _key_pem(self._leaf_key)
        self._leaves: OrderedDict[str, Leaf] = OrderedDict()
        self._lock = threading.Lock()

    # -- construction ---------------------------------------------------------------

    @classmethod
    def create(
        cls, validity: datetime.timedelta = RUN_CA_VALIDITY, name: str = "stockade run CA"
    ) -> CertificateAuthority:
        """Mint a new CA (EC P-256, path length 0, valid for ``validity``)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "stockade"),
                x509.NameAttribute(NameOID.COMMON_NAME, name),
            ]
        )
        now = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def ephemeral(cls) -> CertificateAuthority:
        """A per-run CA that exists only in memory."""
        return cls.create(RUN_CA_VALIDITY)

    @classmethod
    def for_user(cls, directory: Path | None = None) -> CertificateAuthority:
        """Load the per-user CA from ``directory`` (default :func:`user_ca_dir`), or make one.

        The directory is created 0700 and the key written 0600; a CA near the end of its
        validity is replaced. A directory or key readable by others is refused.
        """
        directory = directory or user_ca_dir()
        cert_path, key_path = directory / _CA_CERT, directory / _CA_KEY
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            mode = directory.stat().st_mode & 0o777
            if mode & 0o077:
                raise SandboxError(
                    f"CA directory {directory} is mode {mode:o}: other users could read "
                    f"the interception key; run chmod 700 {directory}"
                )
            if cert_path.is_file() and key_path.is_file():
                if key_path.stat().st_mode & 0o077:
                    raise SandboxError(
                        f"CA key {key_path} is readable by others; run chmod 600 {key_path}"
                    )
                cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
                if (
                    isinstance(key, ec.EllipticCurvePrivateKey)
                    and cert.not_valid_after_utc - _now() > USER_CA_RENEW_BEFORE
                ):
                    return cls(key, cert)
            ca = cls.create(USER_CA_VALIDITY, "stockade user CA")
            # Mode 0600 from the start: the key is never readable by anyone else.
            replace_file(key_path, _key_pem(ca._key))
            replace_file(cert_path, ca.cert_pem)
            return ca
        except (OSError, ValueError) as exc:
            raise SandboxError(
                f"cannot load or create the interception CA in {directory}: {exc}; "
                "check the directory or remove it to start over"
            ) from exc

    # -- leaves -----------------------------------------------------------------------

    def leaf(self, host: str) -> Leaf:
        """The leaf certificate for ``host`` (a normalised name or IP literal), cached."""
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached.not_after - _now() > datetime.timedelta(hours=1):
                self._leaves.move_to_end(host)
                return cached
        leaf = self._mint(host)
        with self._lock:
            self._leaves[host] = leaf
            self._leaves.move_to_end(host)
            while len(self._leaves) > LEAF_CACHE_SIZE:
                self._leaves.popitem(last=False)
        return leaf

    def _mint(self, host: str) -> Leaf:
        now = _now()
        not_after = min(now + LEAF_VALIDITY, self.cert.not_valid_after_utc)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return Leaf(host, cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem, not_after)


def load_ca(directory: Path) -> CertificateAuthority:
    """The interception CA kept in ``directory``: ``ca-cert.pem``/``ca-key.pem`` (as
    ``stockade`` writes them) or ``tls.crt``/``tls.key`` (a Kubernetes TLS Secret).

    Used by ``stockade proxy --ca DIR`` and the gateway's ``--ca DIR``. Raises
    :class:`~stockade.Unavailable` when none is there or it cannot be read.
    """
    for cert_name, key_name in (("ca-cert.pem", "ca-key.pem"), ("tls.crt", "tls.key")):
        cert_path, key_path = directory / cert_name, directory / key_name
        if cert_path.is_file() and key_path.is_file():
            try:
                cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            except (OSError, ValueError) as exc:
                raise Unavailable(f"the interception CA in {directory}", str(exc)) from None
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise Unavailable(
                    f"the interception CA in {directory}", "its key must be EC (P-256)"
                )
            return CertificateAuthority(key, cert)
    raise Unavailable(
        f"the interception CA in {directory}",
        "give a directory holding ca-cert.pem and ca-key.pem (or tls.crt and tls.key)",
    )


def system_roots_path() -> Path | None:
    """The system CA bundle: Debian's file, else what OpenSSL was built to use."""
    debian = Path("/etc/ssl/certs/ca-certificates.crt")
    if debian.is_file():
        return debian
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def write_trust_bundle(
    ca: CertificateAuthority, path: Path, caller_trust: Sequence[Path] = ()
) -> Path:
    """Write the system roots, the caller's own trust and the CA to ``path`` (mode 0644).

    ``caller_trust`` are the bundles the caller's trust-store variables name (a company
    CA, say): every client in the sandbox then trusts the same set, whichever variable it
    reads. The runtime binds this file read-only into the sandbox and points
    :func:`trust_environment` at it. Clients keep trusting real servers (an opaque
    tunnel still works) and trust the proxy's leaves for inspected hosts.
    """
    roots = system_roots_path()
    data = roots.read_bytes() if roots is not None else b""
    seen = {roots.resolve()} if roots is not None else set()
    for extra in caller_trust:
        real = extra.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            more = extra.read_bytes()
        except OSError:
            continue  # named but unreadable: the client would not have trusted it either
        # Certificates only: a key kept in the same file by mistake never goes inside.
        certs = _PEM_CERT.findall(more)
        if not certs:
            continue
        if data and not data.endswith(b"\n"):
            data += b"\n"
        data += f"# from {extra}\n".encode() + b"\n".join(certs) + b"\n"
    if data and not data.endswith(b"\n"):
        data += b"\n"
    data += b"# stockade interception CA\n" + ca.cert_pem
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, data, 0o644)
    return path


def trust_environment(bundle_path: str | Path) -> dict[str, str]:
    """The variables that make common clients trust ``bundle_path`` (a path in the sandbox)."""
    return dict.fromkeys(TRUST_VARIABLES, str(bundle_path))
