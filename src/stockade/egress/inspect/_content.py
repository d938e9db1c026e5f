"""What one inspected request is searched for beyond exact labels: credential detectors
(:mod:`._detectors`) and the decoded views (:mod:`._decode`) that labels and detectors
are also searched in.

:class:`ContentCheck` searches one piece of data (a request head's parts, a window of a
body stream) and names the part and the decoding that gave the match.
:class:`ContentScanner` is the body's rolling search: the label scanner's held-back tail,
widened so a decoded spelling is seen whole across chunk boundaries, with the decoding
budget of ``[inspect] decode_limit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stockade.egress.inspect._decode import EXPANSION, views
from stockade.egress.inspect._detectors import DetectorSet
from stockade.egress.inspect._http import Refusal
from stockade.egress.inspect._secrets import Found, PatternSet
from stockade.policy import InspectPolicy, Reason


@dataclass(frozen=True, slots=True)
class Hit:
    """Something found: a detector, or a label/secret in a decoded view (never the value)."""

    #: "detector", "label" or "secret"
    kind: str
    #: the detector's name, or the label ("file:/w/.env", "secret:NAME")
    name: str
    #: "deny" or "report"
    action: str
    #: the part it was in, and the decoding: "query (base64>hex)"
    where: str

    @property
    def reason(self) -> Reason:
        """The refusal reason (or, for a report, the reason its event carries)."""
        if self.kind == "detector":
            return Reason.CREDENTIAL_DETECTED
        return Reason.LABELLED_DATA if self.kind == "label" else Reason.SECRET_WRONG_HOST

    @property
    def detail(self) -> str:
        """One line for the event and the refusal body."""
        what = f"credential {self.name}" if self.kind == "detector" else self.name
        return f"{what} in the {self.where}"

    def refusal(self) -> Refusal:
        """The answer to a request refused for this hit."""
        return Refusal(403, self.reason, self.detail)


class Detected(Exception):
    """A deny hit in a stream (exact labels and secrets raise :class:`~._secrets.Found`)."""

    def __init__(self, hit: Hit) -> None:
        super().__init__(hit.detail)
        self.hit = hit


#: head parts remembered clean per host, and the longest remembered
_MAX_CLEAN = 4096
_CLEAN_PART = 2048


def _where(part: str, chain: str) -> str:
    return f"{part} ({chain})" if chain else part


class ContentCheck:
    """Detectors on raw and decoded data, labels and secrets on decoded data, for one host.

    (Labels and secrets on the raw data are the head check's and the stream scanner's:
    :class:`~._secrets.PatternSet` already searches their encodings.)
    """

    __slots__ = ("_clean", "decode", "detectors", "labels", "secrets")

    def __init__(
        self, secrets: PatternSet, labels: PatternSet, detectors: DetectorSet, *, decode: bool
    ) -> None:
        self.secrets = secrets
        self.labels = labels
        self.detectors = detectors
        self.decode = decode
        #: head parts already searched and found clean (a keep-alive client repeats its
        #: user agent, accept headers and cookies on every request); bounded
        self._clean: set[bytes] = set()

    def __bool__(self) -> bool:
        return bool(self.detectors) or (self.decode and bool(self.secrets or self.labels))

    @property
    def span(self) -> int:
        """How many raw bytes a match (decoded or not) can take, at most."""
        if not self.decode:
            return self.detectors.span
        values = (*self.secrets.patterns, *self.labels.patterns)
        widest = max([self.detectors.span, *(len(p.value) for p in values)])
        return widest * EXPANSION

    def search(
        self, data: bytes, part: str, *, open_end: bool = False, decode: bool | None = None
    ) -> Hit | None:
        """The first deny hit in ``data`` (or a report hit when no deny), or None.

        ``open_end`` as for :meth:`~._detectors.DetectorSet.search` (raw data only: a
        decoded view's end is not the window's). ``decode`` overrides :attr:`decode`.
        """
        report: Hit | None = None
        if self.detectors:
            finding = self.detectors.search(data, open_end=open_end)
            if finding is not None:
                report = Hit("detector", finding.detector, finding.action, part)
                if finding.action == "deny":
                    return report
        if not (self.decode if decode is None else decode):
            return report
        decoded = views(data)
        if not decoded:
            return report
        # One search of every view joined (no match spans the newlines between them: a
        # value is a line, a detector's match holds no newline), then, on a match, each
        # view alone to name the decoding.
        joined = b"\n".join(v for _, v in decoded)
        if self._one(joined, part, "") is None:
            return report
        for chain, view in decoded:
            hit = self._one(view, part, chain)
            if hit is not None and hit.action == "deny":
                return hit
            report = report or hit
        return report

    def _one(self, view: bytes, part: str, chain: str) -> Hit | None:
        where = _where(part, chain) if chain else f"{part} (decoded)"
        for patterns in (self.secrets, self.labels):
            found = patterns.search(view) if patterns else None
            if found is not None:
                return Hit(found.kind, found.label, "deny", where)
        if self.detectors:
            finding = self.detectors.search(view)
            if finding is not None:
                return Hit("detector", finding.detector, finding.action, where)
        return None

    def search_head(self, parts: Sequence[tuple[str, bytes]]) -> Hit | None:
        """Search a request head's parts (``("query", b"...")``...): one search of all of
        them joined (the common case finds nothing), then each part to name where."""
        if not self:
            return None
        parts = [(part, data) for part, data in parts if data not in self._clean]
        if not parts:
            return None
        joined = b"\n".join(data for _, data in parts)
        found = self.search(joined, "request head")
        if found is None:
            if len(self._clean) > _MAX_CLEAN:
                self._clean.clear()
            self._clean.update(data for _, data in parts if len(data) <= _CLEAN_PART)
            return None
        report: Hit | None = None
        for part, data in parts:
            hit = self.search(data, part)
            if hit is not None and hit.action == "deny":
                return hit
            report = report or hit
        return report or found


class ContentScanner:
    """The rolling search of a request body: labels and secrets (raw, as
    :class:`~._secrets.StreamScanner`), detectors, and both on decoded views.

    Each chunk is searched with the last :attr:`keep` bytes before it, which are held
    back until the next chunk shows they start no match. Decoding stops after
    ``decode_limit`` bytes: then the raw search goes on (``scan-raw``) or the body is
    refused (``refuse``, 413).
    """

    def __init__(self, patterns: PatternSet, check: ContentCheck, policy: InspectPolicy) -> None:
        self.patterns = patterns
        self.check = check
        self.decode = check.decode
        self.limit = policy.decode_limit
        self.past_limit = policy.past_limit
        self.keep = max(patterns.span, check.span if check else 0, 1) - 1
        self.decoded = 0
        self.reports: list[Hit] = []
        self.max_buffered = 0
        self._tail = b""

    def _search(self, window: bytes, *, open_end: bool) -> None:
        found = self.patterns.search(window) if self.patterns else None
        if found is not None:
            # Exact labels and secrets as the stream scanner always reported them.
            self._tail = b""
            raise Found(found)
        if not self.check:
            return
        decode = self.decode
        if decode:
            self.decoded += len(window)
            if self.decoded > self.limit + self.keep:
                if self.past_limit == "refuse":
                    raise Refusal(
                        413,
                        Reason.BODY_TOO_LARGE,
                        f"body over the decode limit ({self.limit} bytes) cannot be scanned "
                        'decoded ([inspect] past_limit = "refuse")',
                    )
                self.decode = decode = False
        hit = self.check.search(window, "body", open_end=open_end, decode=decode)
        if hit is None:
            return
        if hit.action == "deny":
            self._tail = b""
            raise Detected(hit)
        if not any(r.name == hit.name for r in self.reports):
            self.reports.append(hit)

    def feed(self, data: bytes) -> bytes:
        """Search ``data``; return the bytes now known clean. Raises :class:`Detected`."""
        if not self.patterns and not self.check:
            return data
        window = self._tail + data
        self.max_buffered = max(self.max_buffered, len(window))
        self._search(window, open_end=True)
        cut = max(len(window) - self.keep, 0)
        self._tail = window[cut:]
        return window[:cut]

    def finish(self) -> bytes:
        """The held-back bytes, searched once more as the end of the stream."""
        tail, self._tail = self._tail, b""
        if tail and self.check:
            hit = self.check.search(tail, "body", decode=self.decode)
            if hit is not None and hit.action == "deny":
                raise Detected(hit)
            if hit is not None and not any(r.name == hit.name for r in self.reports):
                self.reports.append(hit)
        return tail
