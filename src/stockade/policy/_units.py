"""Parsing of sizes ("4GiB") and durations used by the limits section."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_FACTORS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1000,
    "KIB": 1024,
    "KI": 1024,  # "4Gi", as Kubernetes writes it; the pattern above accepts it
    "M": 1024**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "MI": 1024**2,  # "4Gi", as Kubernetes writes it; the pattern above accepts it
    "G": 1024**3,
    "GB": 1000**3,
    "GIB": 1024**3,
    "GI": 1024**3,  # "4Gi", as Kubernetes writes it; the pattern above accepts it
    "T": 1024**4,
    "TB": 1000**4,
    "TIB": 1024**4,
    "TI": 1024**4,  # "4Gi", as Kubernetes writes it; the pattern above accepts it
}


def parse_size(value: int | str) -> int:
    """Return a size in bytes from an integer or a string such as ``"512MiB"``.

    >>> parse_size("4GiB")
    4294967296
    >>> parse_size(0)
    0

    Raises ValueError with a message suitable for a policy error.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as 4GiB or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE.match(value)
    if not match:
        raise ValueError("expected a size such as 512MiB, 4GiB or a number of bytes")
    number, unit = match.groups()
    factor = _FACTORS[(unit or "").upper()]
    size = float(number) * factor
    if size >= 2**63:
        # Also catches inf: float("9" * 400) does not raise, int() of it would.
        raise ValueError("too large; a size is less than 8EiB")
    return int(size)


def format_size(size: int) -> str:
    """The shortest exact binary spelling of ``size``: ``4GiB``, ``512MiB``, ``1000``."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
