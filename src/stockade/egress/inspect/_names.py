"""Host names checked before any lookup: data carried in the labels of a name.

With ``*.example.com`` allowed, ``<data>.example.com`` is a channel: the name is looked
up (by the proxy, the operator's upstream proxy, or a resolver further on) before any
request is made, so the data leaves in the DNS query even when the connection is later
refused. :class:`NameCheck` searches a name for labelled values, bound secrets and
credential detectors *before* stockade's resolver answers it or the proxy resolves or
dials it; a match is a refusal (``dns_query`` / ``net_connect`` deny) and no lookup
happens anywhere.

What is searched, all in lower case (names are case-insensitive):

* the name as it is, each label, and the labels joined without dots (data chunked over
  labels: ``ghp-xxxx.yyyy.zzzz``), also with ``-`` read as ``_`` (a name has no ``_``
  in most resolvers) and upper-cased (AWS key ids);
* the joined labels decoded: hex (and the other :mod:`._decode` views), and base32
  (RFC 4648, at each of its eight character offsets), the encoding names suit best;
* labels and secrets as raw values and as lower-case hex.

Base64 does not survive a lower-casing resolver and is not decoded here. Optional
per-pattern limits (``[inspect.names]``) refuse names with a label longer than
``max_label`` or more labels than ``max_labels`` below the pattern: the blunt guard
against encodings nobody decodes, at the cost of names that long being unreachable.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

from stockade.egress.inspect._decode import views
from stockade.egress.inspect._detectors import DetectorSet
from stockade.egress.inspect._secrets import Pattern, PatternSet
from stockade.policy import Reason

#: names remembered with their verdicts (then forgotten all at once)
_CACHE = 4096
_B32 = set(b"abcdefghijklmnopqrstuvwxyz234567")


@dataclass(frozen=True, slots=True)
class NameLimit:
    """Under ``suffix`` (a ``*.suffix`` pattern's suffix): at most ``max_labels`` labels
    below it, each at most ``max_label`` characters (0: no limit)."""

    suffix: str
    max_label: int = 0
    max_labels: int = 0


@dataclass(frozen=True, slots=True)
class NameFinding:
    """Why a name is refused (never the value)."""

    reason: Reason
    #: the label, detector or limit, for the event
    what: str
    #: which form of the name: "name", "joined labels (base32)"...
    where: str

    @property
    def detail(self) -> str:
        """One line for the event."""
        return f"{self.what} in the host name ({self.where})"


def _base32(text: bytes) -> list[bytes]:
    run = bytes(c for c in text if c in _B32)
    out: list[bytes] = []
    for start in range(8):
        part = run[start:].upper()
        part = part[: len(part) // 8 * 8]
        if len(part) < 16:
            break
        try:
            out.append(base64.b32decode(part))
        except (binascii.Error, ValueError):
            continue
    return out


class NameCheck:
    """Labels, secrets and detectors on host names (see the module docstring)."""

    def __init__(
        self,
        patterns: Sequence[Pattern],
        detectors: DetectorSet,
        limits: Sequence[NameLimit] = (),
    ) -> None:
        lowered: list[Pattern] = []
        for p in patterns:
            if p.encoding != "raw":
                continue
            lowered.append(Pattern(p.value.lower(), p.label, p.kind))
            lowered.append(Pattern(p.value.hex().encode(), p.label, p.kind, "hex"))
        self.patterns = PatternSet(lowered, percent=False)
        # The exact values too, for decoded views (a base32 view keeps case).
        self.exact = PatternSet([p for p in patterns if p.encoding == "raw"], percent=False)
        self.detectors = detectors
        self.limits = tuple(limits)
        self._cache: dict[str, NameFinding | None] = {}

    def __bool__(self) -> bool:
        return bool(self.patterns or self.detectors or self.limits)

    def check(self, host: str) -> NameFinding | None:
        """Why ``host`` (normalised, lower case) must not be looked up, or None."""
        if host in self._cache:
            return self._cache[host]
        found = self._check(host)
        if len(self._cache) >= _CACHE:
            self._cache.clear()
        self._cache[host] = found
        return found

    def _check(self, host: str) -> NameFinding | None:
        limit = self._limit(host)
        if limit is not None:
            return limit
        name = host.encode("ascii", "replace").lower()
        labels = name.split(b".")
        joined = b"".join(labels)
        forms: list[tuple[str, bytes]] = [("name", name), ("joined labels", joined)]
        if b"-" in joined:
            forms.append(("joined labels, - as _", joined.replace(b"-", b"_")))
        for where, data in forms:
            found = self.patterns.search(data)
            if found is not None:
                return NameFinding(found.reason, found.label, where)
        for where, data in [*forms, *((w + ", upper case", d.upper()) for w, d in forms)]:
            hit = self.detectors.search(data) if self.detectors else None
            if hit is not None and hit.action == "deny":
                return NameFinding(Reason.CREDENTIAL_DETECTED, f"credential {hit.detector}", where)
        decoded = [(f"joined labels ({c})", v) for c, v in views(joined)]
        decoded += [("joined labels (base32)", v) for v in _base32(joined)]
        for where, data in decoded:
            found = self.exact.search(data) or self.patterns.search(data.lower())
            if found is not None:
                return NameFinding(found.reason, found.label, where)
            hit = self.detectors.search(data) if self.detectors else None
            if hit is not None and hit.action == "deny":
                return NameFinding(Reason.CREDENTIAL_DETECTED, f"credential {hit.detector}", where)
        return None

    def _limit(self, host: str) -> NameFinding | None:
        for limit in self.limits:
            if not host.endswith("." + limit.suffix):
                continue
            below = host[: -len(limit.suffix) - 1].split(".")
            if limit.max_labels and len(below) > limit.max_labels:
                return NameFinding(
                    Reason.HOST_DENIED,
                    f"{len(below)} labels under *.{limit.suffix} (max_labels {limit.max_labels})",
                    "name",
                )
            longest = max(len(label) for label in below)
            if limit.max_label and longest > limit.max_label:
                return NameFinding(
                    Reason.HOST_DENIED,
                    f"a {longest}-character label under *.{limit.suffix} "
                    f"(max_label {limit.max_label})",
                    "name",
                )
        return None
