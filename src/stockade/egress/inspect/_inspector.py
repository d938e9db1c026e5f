"""The sans-IO core: what to do with one inspected request, given only values.

:meth:`Inspector.head` takes the tunnel's host and port, the SNI, the method, target and
headers of a request and applies, in order: agreement (authority = SNI = Host), framing,
the target check, the rules, the credential binding, the label and wrong-host scan of
URL and headers. It returns a :class:`RequestPlan` (what to forward, what to scan the
body for, what to redact in the response) or raises :class:`~._http.Refusal`.
The asyncio shell (:mod:`._tunnel`) only moves bytes according to the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stockade.egress.inspect._content import ContentCheck, ContentScanner, Hit
from stockade.egress.inspect._detectors import DetectorSet
from stockade.egress.inspect._http import (
    Headers,
    Refusal,
    Target,
    authority_agrees,
    check_framing,
    end_to_end,
    header_values,
    normalise_target,
)
from stockade.egress.inspect._names import NameCheck, NameLimit
from stockade.egress.inspect._rules import RuleSet
from stockade.egress.inspect._secrets import (
    CREDENTIAL_HEADERS,
    Pattern,
    PatternSet,
    SecretStore,
    bind_credentials,
    dedupe,
    label_patterns,
    with_encodings,
)
from stockade.policy import Decision, InspectPolicy, Policy, Reason, Verdict
from stockade.policy._hosts import sni_disagreement
from stockade.policy._inspect import REFUSED_METHODS as REFUSED_METHODS
from stockade.policy._inspect import InspectScope, echo_refusal


@dataclass(slots=True)
class RequestRecord:
    """What is known about a request so far; becomes its ``net_request`` event."""

    method: str = ""
    host: str = ""
    port: int = 0
    path: str = ""
    rule: str = ""
    sni: str | None = None
    status: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    secrets: list[str] = field(default_factory=list)
    label: str = ""
    detail: str = ""
    #: the operator's upstream proxy the request went through (its URL, no credentials)
    upstream: str = ""
    #: that proxy's answer to the tunnel the request travelled in (0: none)
    upstream_status: int = 0
    #: the credential detector that matched, and where ("query (base64)"); never the value
    detector: str = ""
    found_in: str = ""

    def fields(self) -> dict[str, object]:
        """The event fields (never a secret or label value)."""
        out: dict[str, object] = {
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "status": self.status,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }
        if self.sni is not None:
            out["sni"] = self.sni
        if self.secrets:
            out["secrets"] = list(self.secrets)
        if self.label:
            out["label"] = self.label
        if self.detector:
            out["detector"] = self.detector
        if self.found_in:
            out["found_in"] = self.found_in
        if self.upstream:
            out["upstream"] = self.upstream
            out["upstream_status"] = self.upstream_status
        return out


@dataclass(frozen=True, slots=True)
class HostScans:
    """What requests to one host are scanned for, grouped as the checks use them."""

    #: secrets not bound to the host (searched first: their reason is the stronger one)
    secrets: PatternSet
    #: labelled values
    labels: PatternSet
    #: both, for the body
    body: PatternSet
    #: credential detectors, and labels and secrets in decoded views
    content: ContentCheck


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """How to forward a request that passed the checks on its head."""

    decision: Decision
    target: Target
    headers: list[tuple[bytes, bytes]]
    #: patterns the body is scanned for (labels, foreign secrets, their encodings)
    scan: PatternSet
    #: real value -> placeholder, applied to the response
    redact: Mapping[bytes, bytes]
    #: "gzip" or "deflate" when the body must be decoded to be scanned
    encoding: str | None
    chunked: bool
    #: detectors and decoded views for the body (None: nothing beyond ``scan``)
    content: ContentCheck | None = None
    #: a WebSocket upgrade the rules allowed: relay frames after the 101
    websocket: bool = False


class Inspector:
    """Rules, bound secrets and labels of one policy, applied to request heads."""

    def __init__(
        self,
        rules: RuleSet | None = None,
        secrets: SecretStore | None = None,
        labels: Sequence[Pattern] = (),
        *,
        labels_configured: bool | None = None,
        encodings: bool = True,
        inspect: InspectPolicy | None = None,
    ) -> None:
        """``encodings`` False searches exact bytes only (the URL also percent-decoded),
        as stockade did before encodings were searched: only for measuring their cost.
        ``inspect``: detector actions and decoding (``[inspect]``; the defaults: every
        detector denies, decoding on)."""
        self.rules = rules or RuleSet(())
        self.secrets = secrets or SecretStore()
        self.labels = tuple(labels)
        self.labels_configured = bool(labels) if labels_configured is None else labels_configured
        self.encodings = encodings
        #: which hosts are intercepted: the one answer the model gives too
        self.scope = InspectScope(
            self.rules.hosts,
            tuple(h for s in self.secrets.secrets for h in s.hosts),
            self.labels_configured,
        )
        self.inspect_policy = inspect or InspectPolicy()
        self.detectors = DetectorSet(self.inspect_policy.actions())
        self._names: NameCheck | None = None
        self._patterns: dict[tuple[str, int], tuple[Pattern, ...]] = {}
        self._scans: dict[tuple[str, int], HostScans] = {}

    @classmethod
    def from_policy(
        cls,
        policy: Policy,
        environ: Mapping[str, str] | None = None,
        *,
        secrets: SecretStore | None = None,
        encodings: bool = True,
    ) -> Inspector:
        """Build from a policy, reading secret values and labelled data (host side).

        Pass ``secrets`` when the store was resolved earlier (its placeholders are
        already in the sandbox's environment); ``encodings`` as for :class:`Inspector`.
        """
        store = secrets if secrets is not None else SecretStore.resolve(policy.secrets, environ)
        labels = label_patterns(policy.labels, Path(policy.filesystem.workspace), environ)
        from stockade.policy._network import grace_in_force

        return cls(
            RuleSet(policy.network.rules, grace=grace_in_force(policy.network)),
            store,
            labels,
            labels_configured=policy.labels.configured,
            encodings=encodings,
            inspect=policy.inspect,
        )

    def inspects(self, host: str, port: int) -> bool:
        """True when a TLS tunnel to ``host:port`` is intercepted rather than relayed.

        A host is inspected when a rule names it, a secret is bound to it, or labels are
        configured (then every TLS host is, since labelled data may go anywhere).
        """
        return self.scope.inspected(host, port)

    def patterns(self, host: str, port: int) -> tuple[Pattern, ...]:
        """What requests to ``host:port`` are scanned for."""
        key = (host, port)
        cached = self._patterns.get(key)
        if cached is None:
            cached = tuple(dedupe([*self.secrets.foreign_patterns(host, port), *self.labels]))
            self._patterns[key] = cached
        return cached

    def scans(self, host: str, port: int) -> HostScans:
        """The pattern sets requests to ``host:port`` are searched with (built once).

        Secrets get the encodings too: a real value echoed encoded by its own host (the
        response redaction replaces exact bytes only) must not leave for another host.
        """
        key = (host, port)
        cached = self._scans.get(key)
        if cached is None:
            given = self.patterns(host, port)
            every = with_encodings(given) if self.encodings else list(given)
            secrets = PatternSet([p for p in every if p.kind == "secret"], percent=self.encodings)
            labels = PatternSet([p for p in every if p.kind == "label"], percent=self.encodings)
            # Decoded views are searched for the raw values (a view is already decoded).
            content = ContentCheck(
                PatternSet([p for p in given if p.kind == "secret"], percent=False),
                PatternSet([p for p in given if p.kind == "label"], percent=False),
                self.detectors,
                decode=self.inspect_policy.decode,
            )
            cached = HostScans(secrets, labels, PatternSet(every, percent=self.encodings), content)
            self._scans[key] = cached
        return cached

    @property
    def names(self) -> NameCheck:
        """The check of host names before lookup: every label and every secret (bound
        or not: no name should hold one), and the detectors."""
        if self._names is None:
            every = [*self.labels]
            for s in self.secrets.secrets:
                every.append(Pattern(s.placeholder, f"secret:{s.name}", "secret"))
                every.append(Pattern(s.value, f"secret:{s.name}", "secret"))
            limits = [NameLimit(*n) for n in self.inspect_policy.names]
            self._names = NameCheck(dedupe(every), self.detectors, limits)
        return self._names

    def body_scanner(self, plan: RequestPlan) -> ContentScanner:
        """The rolling search for the body of a request planned by :meth:`head`."""
        empty = ContentCheck(PatternSet(), PatternSet(), DetectorSet({}), decode=False)
        return ContentScanner(plan.scan, plan.content or empty, self.inspect_policy)

    def head(
        self,
        record: RequestRecord,
        sni: str | None,
        target: bytes,
        headers: Headers,
    ) -> RequestPlan:
        """Check a request head (``record`` has method, host, port) and plan it.

        ``record`` is filled in as checks pass (normalised path, rule, secrets, label),
        so the event of a refused request says as much as was learnt.
        """
        host, port, method = record.host, record.port, record.method
        # 0. the method is part of the request too (and of its event): scanned first, so
        # that no later refusal writes a value carried there into the audit log
        self._scan_method(record)
        # 1. agreement: CONNECT authority = SNI = Host
        # The same question, asked of the same function, as the opaque tunnel's check of
        # the ClientHello it peeked at: one verdict and one reason per ClientHello.
        disagreement = sni_disagreement([] if sni is None else [sni], host)
        if disagreement is not None:
            raise Refusal(421, *disagreement)
        check_framing(headers)
        host_header = header_values(headers, b"host")[0].decode("latin-1")
        if not authority_agrees(host_header, host, port):
            raise Refusal(421, Reason.HOST_MISMATCH, f"Host {host_header[:80]!r} is not {host}")
        # 2. the target, normalised once
        norm = normalise_target(target, host, port)
        record.path = norm.path
        if method in REFUSED_METHODS:
            raise Refusal(405, Reason.BAD_REQUEST, f"{method} is not forwarded")
        echo = echo_refusal(method, (n for n, _ in headers))
        if echo is not None:
            raise Refusal(405, Reason.BAD_REQUEST, echo)
        # 3. rules (a WebSocket upgrade is decided as the method WEBSOCKET)
        websocket = is_websocket_upgrade(method, headers)
        if websocket:
            method = WEBSOCKET
        decision = self.rules.decide(host, port, method, norm.path)
        decoded = norm.slash_decoded
        if decoded is not None:
            other = self.rules.decide(host, port, method, decoded)
            if (other.allowed, other.rule) != (decision.allowed, decision.rule):
                raise Refusal(
                    400,
                    Reason.AMBIGUOUS_PATH,
                    "an encoded slash (%2F) would change which rule applies",
                )
        record.rule = decision.rule
        if not decision.allowed:
            if websocket:
                # Never downgraded to a plain GET: refused, and the client is told why.
                raise Refusal(403, decision.reason, f"WebSocket not allowed: {decision.detail}")
            raise Refusal(403, decision.reason, decision.detail)
        # 4. secrets: none headed to the wrong host; only bound placeholders on bound hosts
        scans = self.scans(host, port)
        blob = b"\n".join(n + b": " + v for n, v in headers) if scans.body else b""
        for patterns in (scans.secrets, scans.labels):
            if not patterns:
                continue
            # The target is always searched percent-decoded too: servers decode it. When
            # the headers are as well, one search over both costs half as much.
            if patterns.percent:
                found = patterns.search(target + b"\n" + blob)
            else:
                found = patterns.search(target, percent=True) or patterns.search(blob)
            if found is not None:
                record.label = found.label
                path = norm.path.encode()
                in_target = patterns.search(target, percent=True)
                if in_target and (
                    patterns.search(path) or not patterns.search(norm.query.encode())
                ):
                    # The event's path would carry the value (the normalised path holds it
                    # decoded): the event names the label, never the value.
                    record.path = f"[withheld: {found.reason}]"
                raise Refusal(403, found.reason, f"{found.where} in the request head")
        bound = self.secrets.bound(host, port)
        out = list(headers)
        redact: dict[bytes, bytes] = {}
        if bound:
            out, injected = bind_credentials(out, norm.query, bound)
            record.secrets = injected
            redact = self.secrets.redactions(host, port)
        # 4b. credential detectors, and labels in decoded views (docs/inspect.md)
        if scans.content:
            carriers = CREDENTIAL_HEADERS | {s.header for s in bound} if bound else frozenset()
            _check_content(record, scans.content, method, target, headers, carriers)
        # 5. body framing and encoding (labels in the body are scanned while streaming)
        chunked = bool(header_values(headers, b"transfer-encoding"))
        encoding = _content_encoding(headers, needed=bool(scans.body) or bool(scans.content))
        forwarded = end_to_end(out, drop=(b"host",))
        forwarded.insert(0, (b"host", header_values(headers, b"host")[0]))
        if chunked:
            forwarded.append((b"transfer-encoding", b"chunked"))
        if websocket:
            forwarded += [(b"connection", b"Upgrade"), (b"upgrade", b"websocket")]
        if redact:
            # An echoed credential must be readable to be redacted: ask for no compression.
            forwarded = [(n, v) for n, v in forwarded if n != b"accept-encoding"]
            forwarded.append((b"accept-encoding", b"identity"))
        return RequestPlan(
            decision,
            norm,
            forwarded,
            scans.body,
            redact,
            encoding,
            chunked,
            scans.content if scans.content else None,
            websocket,
        )

    def _scan_method(self, record: RequestRecord) -> None:
        """Refuse a request whose method carries a foreign secret or a labelled value."""
        scans = self.scans(record.host, record.port)
        method = record.method.encode("latin-1", "replace")
        for patterns in (scans.secrets, scans.labels):
            found = patterns.search(method) if patterns else None
            if found is not None:
                record.method = f"[withheld: {found.reason}]"
                record.label = found.label
                raise Refusal(403, found.reason, f"{found.where} in the request method")

    def trailers(self, record: RequestRecord, fields: Headers) -> list[tuple[bytes, bytes]]:
        """Check a chunked request's trailer fields as its head's headers are checked, and
        return those to forward.

        Scanned for foreign secrets and labelled values like the headers, then by the
        credential detectors (raw and decoded, as the headers are). On a host with
        a bound secret a trailer never carries a credential (the real value is injected
        in the head only, so a credential there is the sandbox's own): refused
        ``foreign-credential``. Hop-by-hop and framing fields are not forwarded.
        """
        if not fields:
            return []
        host, port = record.host, record.port
        scans = self.scans(host, port)
        blob = b"\n".join(n + b": " + v for n, v in fields)
        for patterns in (scans.secrets, scans.labels):
            found = patterns.search(blob) if patterns else None
            if found is not None:
                record.label = found.label
                raise Refusal(403, found.reason, f"{found.where} in a request trailer")
        bound = self.secrets.bound(host, port)
        if bound:
            carriers = CREDENTIAL_HEADERS | {s.header for s in bound}
            for name, _ in fields:
                if name in carriers:
                    raise Refusal(
                        403,
                        Reason.FOREIGN_CREDENTIAL,
                        f"trailer {name.decode('latin-1')[:40]} carries a credential; on a "
                        "host with a bound secret only its header may carry one",
                    )
        if scans.content:
            # The detectors (and labels in decoded views), as on the head's headers.
            parts = [(f"trailer {n.decode('latin-1')}", n + b": " + v) for n, v in fields]
            hit = scans.content.search_head(parts)
            if hit is not None:
                note_hit(record, hit)
                if hit.action == "deny":
                    raise hit.refusal()
        return end_to_end(fields, drop=(b"host", b"content-length", b"content-encoding"))


def _content_encoding(headers: Headers, *, needed: bool) -> str | None:
    values = [
        t.strip().lower()
        for v in header_values(headers, b"content-encoding")
        for t in v.split(b",")
        if t.strip()
    ]
    values = [v for v in values if v != b"identity"]
    if not values:
        return None
    if not needed:
        return None
    if len(values) == 1 and values[0] in (b"gzip", b"x-gzip"):
        return "gzip"
    if len(values) == 1 and values[0] == b"deflate":
        return "deflate"
    raise Refusal(
        415,
        Reason.UNSCANNABLE_BODY,
        f"Content-Encoding {b', '.join(values).decode('latin-1')[:60]} cannot be scanned; "
        "send the body as identity, gzip or deflate",
    )


#: the method a WebSocket upgrade is decided as by the rules (methods = ["WEBSOCKET"])
WEBSOCKET = "WEBSOCKET"


def is_websocket_upgrade(method: str, headers: Headers) -> bool:
    """True for a GET asking ``Upgrade: websocket`` with ``Connection: upgrade``."""
    if method != "GET":
        return False
    upgrade = {v.strip().lower() for h in header_values(headers, b"upgrade") for v in h.split(b",")}
    connection = {
        v.strip().lower() for h in header_values(headers, b"connection") for v in h.split(b",")
    }
    return b"websocket" in upgrade and b"upgrade" in connection


def _check_content(
    record: RequestRecord,
    content: ContentCheck,
    method: str,
    target: bytes,
    headers: Headers,
    carriers: frozenset[bytes],
) -> None:
    """Detectors (raw and decoded) and labels (decoded) on each part of a request head.

    ``carriers``: on a host with bound secrets, the credential headers, which
    :func:`~._secrets.bind_credentials` has checked hold only placeholders (the bound
    credential to its own host is not a finding).
    """
    raw_path, sep, query = target.partition(b"?")
    parts: list[tuple[str, bytes]] = [("method", method.encode()), ("path", raw_path)]
    if sep:
        parts.append(("query", query))
    parts += [
        (f"header {name.decode('latin-1')}", name + b": " + value)
        for name, value in headers
        if name not in carriers
    ]
    hit = content.search_head(parts)
    if hit is None:
        return
    note_hit(record, hit)
    if hit.action == "deny":
        if hit.where.startswith("path"):
            # The event's path would carry the value: name the finding, never the value.
            record.path = f"[withheld: {hit.reason}]"
        raise hit.refusal()


def note_hit(record: RequestRecord, hit: Hit) -> None:
    """Put what was found (never the value) in the request's event."""
    if hit.kind == "detector":
        if not record.detector:
            record.detector, record.found_in = hit.name, hit.where
    else:
        record.label = hit.name
        record.found_in = hit.where


def reported(decision: Decision, record: RequestRecord) -> Decision:
    """The event's decision: a request let through with a detector on ``report`` that
    matched gets verdict ``report`` (reason ``credential-detected``)."""
    if record.detector and decision.verdict is Verdict.ALLOW:
        return Decision(
            Verdict.REPORT,
            decision.layer,
            Reason.CREDENTIAL_DETECTED,
            decision.rule,
            f"report only: credential {record.detector} in the {record.found_in}",
        )
    return decision
