"""SHA-256 without the cost of :mod:`hashlib`.

``import hashlib`` initialises OpenSSL (about 5 ms), which every ``stockade run`` would
pay for three small digests (the policy hash, the launcher's cache key, a workspace key).
CPython 3.11 ships the same digest as the built-in module ``_sha256`` (``_sha2`` from
3.12); hashlib is the fallback.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def _impl() -> Callable[[bytes], Any]:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found]  # 3.12+
        except ImportError:
            from hashlib import sha256
    return sha256  # type: ignore[no-any-return]


_SHA256 = _impl()


def sha256_hex(data: bytes) -> str:
    """The SHA-256 digest of ``data``, in hex."""
    digest: str = _SHA256(data).hexdigest()
    return digest
