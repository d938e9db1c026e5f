"""Credential detectors: well-known credential formats, found without being told the value.

Labels (:mod:`._secrets`) catch values stockade was told about. Detectors catch the
credentials an agent holds that nobody listed: an AWS key pair, a GitHub token, a JWT, a
private key block... in any part of an inspected request (method, path, query, headers,
body, and in the decoded views :mod:`._decode` makes of each).

Each :class:`Detector` has a name (what the policy's ``[inspect.detectors]`` table and the
audit event use), a regular expression over bytes, an optional check of the matched
bytes, and a *false-positive stance* (``stance``, listed in ``docs/inspect.md``). The
common stance: a detector matches a vendor's documented token *shape* (its fixed prefix
and length), so a vendor's ``EXAMPLE`` key is still a key and is reported — a key-shaped
string on its way out is what the detector is for. What is never a finding: UUIDs, hex
digests, commit ids, base64 image data, public keys and certificates, publishable keys
(``pk_live_``), a stockade placeholder (``stockade-ph-...``), and a bound credential sent
to its own host (the sandbox holds only the placeholder; the proxy injects the real value
after the checks).

The search is two-step for speed: every detector names *anchors*, short literals any
match must contain (``AKIA``, ``ghp_``, ``eyJ``...); a piece of data is searched with its
regular expressions only when an anchor is in it (``bytes.find`` per anchor, run in C
through ``map``), so the common case — no anchor — costs a few microseconds per request
head. Matches are bounded (:data:`MAX_MATCH` bytes), so a stream is searched with a
bounded held-back tail (:attr:`DetectorSet.span`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

#: longest raw match any detector can make (a JWT's header segment bounds it)
MAX_MATCH = 400
#: what a detector may be set to in the policy
ACTIONS = ("deny", "report", "off")

_B64URL = rb"A-Za-z0-9_\-"


@dataclass(frozen=True, slots=True)
class Detector:
    """One credential format: its name, pattern, anchors and false-positive stance."""

    name: str
    #: what it finds, for people (docs, ``--help``)
    title: str
    regex: re.Pattern[bytes]
    #: literals every match contains (lower-case when ``folded``)
    anchors: tuple[bytes, ...]
    #: why a look-alike does not match, and which look-alikes still do
    stance: str
    #: anchors searched in lower-cased data (case-insensitive formats)
    folded: bool = False
    #: a further check of the matched bytes (True: a finding)
    check: Callable[[re.Match[bytes]], bool] | None = None

    def find(self, data: bytes) -> re.Match[bytes] | None:
        """The first match in ``data`` that passes the check, or None."""
        for m in self.regex.finditer(data):
            if self.check is None or self.check(m):
                return m
        return None


def _jwt_header(m: re.Match[bytes]) -> bool:
    # A JWT's first segment is base64url JSON naming its algorithm: "eyJ" alone is any
    # JSON object in base64url, the decoded header is what makes it a token.
    seg = m.group(1)
    try:
        header = json.loads(base64.urlsafe_b64decode(seg + b"=" * (-len(seg) % 4)))
    except (ValueError, binascii.Error):
        return False
    return isinstance(header, dict) and "alg" in header


def _basic_pair(m: re.Match[bytes]) -> bool:
    # "Basic" carries base64 of user:password; an ordinary word after "Basic" is not it.
    token = m.group(1)
    try:
        decoded = base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (ValueError, binascii.Error):
        return False
    return b":" in decoded and len(decoded) >= 3


def _bearer_token(m: re.Match[bytes]) -> bool:
    token = m.group(1)
    # A stockade placeholder is the bound credential's stand-in, not a credential.
    if token.startswith(b"stockade-ph-"):
        return False
    # At least one digit or mixed case: "Bearer authentication" in prose is not a token.
    return any(c in b"0123456789" for c in token) or (
        token.lower() != token and token.upper() != token
    )


def _aws_secret(m: re.Match[bytes]) -> bool:
    # A real secret access key mixes cases and digits; 40 of one class is a filler.
    return _classes(m.group(1)) >= 3


def _classes(value: bytes) -> int:
    lower = any(97 <= c <= 122 for c in value)
    upper = any(65 <= c <= 90 for c in value)
    digit = any(48 <= c <= 57 for c in value)
    other = any(c in b"+/" for c in value)
    return lower + upper + digit + other


def _rx(pattern: bytes, flags: int = 0) -> re.Pattern[bytes]:
    return re.compile(pattern, flags)


#: the curated set, in the order they are tried (a match names the first detector)
DETECTORS: tuple[Detector, ...] = (
    Detector(
        "private_key",
        "PEM or OpenSSH private key block",
        _rx(rb"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED |PGP )?PRIVATE KEY(?: BLOCK)?-----"),
        (b"-----begin ",),
        "the BEGIN line of a private key; public keys, certificates and CSRs are not matched",
        folded=True,
    ),
    Detector(
        "aws_access_key",
        "AWS access key id (AKIA/ASIA...)",
        _rx(rb"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])"),
        (b"AKIA", b"ASIA", b"ABIA", b"ACCA", b"A3T"),
        "20 upper-case characters with AWS's prefixes, standing alone; AWS's documented "
        "AKIAIOSFODNN7EXAMPLE is a key and is found",
    ),
    Detector(
        "aws_secret_key",
        "AWS secret access key named as such",
        _rx(
            rb"(?i)(?:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)"
            rb"[\"']?\s{0,4}[:=]\s{0,4}[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
        ),
        (b"secret_access_key", b"secretaccesskey", b"aws_secret", b"awssecret"),
        "40 base64 characters after an aws_secret_access_key-style name (env, INI, JSON, "
        "YAML): an unnamed 40-character string is not matched (it could be a SHA-1)",
        folded=True,
        check=_aws_secret,
    ),
    Detector(
        "github_token",
        "GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
        _rx(
            rb"(?<![A-Za-z0-9_])(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,251}"
            rb"|github_pat_[A-Za-z0-9_]{50,251})(?![A-Za-z0-9_])"
        ),
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
        "GitHub's prefixes and lengths; a commit id or a hash has no prefix",
    ),
    Detector(
        "gitlab_token",
        "GitLab token (glpat-, glrt-, gldt-, ...)",
        _rx(
            rb"(?<![A-Za-z0-9_])gl(?:pat|rt|dt|ptt|cbt|ft|imt|oas|soat|ffct|agent)-"
            rb"[A-Za-z0-9_\-.]{20,200}(?![A-Za-z0-9_])"
        ),
        (
            b"glpat-",
            b"glrt-",
            b"gldt-",
            b"glptt-",
            b"glcbt-",
            b"glft-",
            b"glimt-",
            b"gloas-",
            b"glsoat-",
            b"glffct-",
            b"glagent-",
        ),
        "GitLab's documented prefixes followed by at least 20 token characters",
    ),
    Detector(
        "slack_token",
        "Slack token or webhook (xoxb-, xoxp-, hooks.slack.com)",
        _rx(
            rb"(?<![A-Za-z0-9])(?:xox[abposre]-[0-9]{6,20}-[A-Za-z0-9\-]{8,200}"
            rb"|xapp-[0-9]-[A-Z0-9]{6,20}-[0-9]{6,20}-[a-f0-9]{16,100}"
            rb"|hooks\.slack\.com/services/T[A-Z0-9]{6,20}/B[A-Z0-9]{6,20}/[A-Za-z0-9]{16,64})"
        ),
        (
            b"xoxa-",
            b"xoxb-",
            b"xoxp-",
            b"xoxo-",
            b"xoxs-",
            b"xoxr-",
            b"xoxe-",
            b"xapp-",
            b"hooks.slack.com/services/",
        ),
        "Slack's prefixes with their numeric team/user segments",
    ),
    Detector(
        "stripe_key",
        "Stripe secret or restricted key, webhook secret",
        _rx(
            rb"(?<![A-Za-z0-9])(?:(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,247}|whsec_[A-Za-z0-9]{24,100})"
        ),
        (b"sk_live_", b"sk_test_", b"rk_live_", b"rk_test_", b"whsec_"),
        "secret (sk_), restricted (rk_) and webhook (whsec_) keys; publishable keys "
        "(pk_live_, pk_test_) are public by design and not matched; test keys are keys",
    ),
    Detector(
        "anthropic_key",
        "Anthropic API key (sk-ant-)",
        _rx(rb"(?<![A-Za-z0-9])sk-ant-[a-z]{2,8}[0-9]{2}-[A-Za-z0-9_\-]{32,200}"),
        (b"sk-ant-",),
        "sk-ant- with the key-kind segment (api03, admin01) and the key",
    ),
    Detector(
        "openai_key",
        "OpenAI API key (sk-proj-, sk-...T3BlbkFJ)",
        _rx(
            rb"(?<![A-Za-z0-9])sk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{40,250}"
            rb"|[A-Za-z0-9_\-]{16,100}T3BlbkFJ[A-Za-z0-9_\-]{16,100})"
        ),
        (b"sk-proj-", b"sk-svcacct-", b"sk-admin-", b"T3BlbkFJ"),
        "project, service-account and admin keys by prefix, legacy keys by their "
        "T3BlbkFJ marker; a bare sk-... is not matched (too many other formats use it)",
    ),
    Detector(
        "google_api_key",
        "Google API key, OAuth client secret or access token",
        _rx(
            rb"(?<![A-Za-z0-9_\-])(?:AIza[0-9A-Za-z_\-]{35}|GOCSPX-[0-9A-Za-z_\-]{28}"
            rb"|ya29\.[0-9A-Za-z_\-]{20,300})(?![A-Za-z0-9_\-])"
        ),
        (b"AIza", b"GOCSPX-", b"ya29."),
        "AIza + 35 characters standing alone, GOCSPX- client secrets, ya29. tokens; inside "
        "a longer base64 run (image data) the boundaries do not hold",
    ),
    Detector(
        "npm_token",
        "npm access token (npm_)",
        _rx(rb"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"),
        (b"npm_",),
        "npm_ and exactly 36 characters",
    ),
    Detector(
        "pypi_token",
        "PyPI API token (pypi-AgEIcHlwaS5vcmc...)",
        _rx(rb"pypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_\-]{40,300}"),
        (b"pypi-AgE",),
        "pypi- and the macaroon naming pypi.org or test.pypi.org",
    ),
    Detector(
        "jwt",
        "JSON Web Token",
        _rx(rb"(?<![A-Za-z0-9_\-])(eyJ[" + _B64URL + rb"]{8,300})\.eyJ[" + _B64URL + rb"]{8}"),
        (b"eyJ",),
        "two base64url segments whose first decodes to a JSON header naming its alg; any "
        "other base64 starting eyJ is not matched",
        check=_jwt_header,
    ),
    Detector(
        "authorization",
        "Bearer, token or Basic credential (in a header or a dump of one)",
        _rx(
            rb"(?i)(?<![a-z0-9-])(?:proxy-)?authorization[\"']?\s{0,4}[:=]\s{0,4}[\"']?"
            rb"(?:bearer|token)\s+([A-Za-z0-9._~+/=\-]{12,300})"
        ),
        (b"authorization",),
        "a Bearer/token credential in an Authorization header (sent, or written in a body) "
        "to a host it is not bound to; a stockade placeholder and prose are not",
        folded=True,
        check=_bearer_token,
    ),
    Detector(
        "basic_auth",
        "HTTP Basic credential",
        _rx(
            rb"(?i)(?<![a-z0-9-])(?:proxy-)?authorization[\"']?\s{0,4}[:=]\s{0,4}[\"']?"
            rb"basic\s+([A-Za-z0-9+/]{4,300}={0,2})"
        ),
        (b"authorization",),
        "Basic and base64 of user:password; other words after Basic are not",
        folded=True,
        check=_basic_pair,
    ),
)

BY_NAME: dict[str, Detector] = {d.name: d for d in DETECTORS}

#: shorter literals, one of which each of a detector's anchors contains: the first,
#: cheap test (about 20 ``find`` calls per piece of data instead of 50)
_HINTS: dict[str, tuple[bytes, ...]] = {
    "aws_access_key": (b"IA", b"ACCA", b"A3T"),
    "aws_secret_key": (b"secret",),
    "github_token": (b"gh",),
    "gitlab_token": (b"gl",),
    "slack_token": (b"xox", b"xapp-", b"hooks.slack.com/"),
    "stripe_key": (b"k_", b"whsec_"),
    "anthropic_key": (b"sk-",),
    "openai_key": (b"sk-", b"T3BlbkFJ"),
    "basic_auth": (b"authorization",),
}


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector matched: its name and action (never the matched value)."""

    detector: str
    action: str
    #: the match's end in the searched data (a stream keeps searching past a report)
    end: int = 0


class DetectorSet:
    """The detectors on for one policy, with their actions, ready for many searches."""

    __slots__ = ("_by_hint", "_folded", "_plain", "actions", "detectors", "span")

    def __init__(self, actions: Mapping[str, str] | None = None) -> None:
        """``actions`` maps a detector's name to ``deny``, ``report`` or ``off``;
        detectors not named are ``deny``."""
        given = dict(actions or {})
        self.actions = {d.name: given.get(d.name, "deny") for d in DETECTORS}
        self.detectors = tuple(d for d in DETECTORS if self.actions[d.name] != "off")
        self._plain = _unique(h for d in self.detectors if not d.folded for h in _hints(d))
        self._folded = _unique(h for d in self.detectors if d.folded for h in _hints(d))
        #: hint -> the detectors it stands for
        self._by_hint: dict[bytes, list[str]] = {}
        for d in self.detectors:
            for h in _hints(d):
                self._by_hint.setdefault(h, []).append(d.name)
        #: longest raw match (a stream holds back this less one)
        self.span = MAX_MATCH if self.detectors else 0

    def __bool__(self) -> bool:
        return bool(self.detectors)

    def _anchored(self, data: bytes) -> list[tuple[Detector, list[int]]]:
        """The detectors with an anchor in ``data``, and where their anchors are."""
        plain = bool(self._plain) and max(map(data.find, self._plain)) >= 0
        lowered = data.lower() if self._folded else b""
        folded = bool(self._folded) and max(map(lowered.find, self._folded)) >= 0
        if not plain and not folded:
            return []
        hinted: set[str] = set()
        if plain:
            for h in self._plain:
                if h in data:
                    hinted.update(self._by_hint[h])
        if folded:
            for h in self._folded:
                if h in lowered:
                    hinted.update(self._by_hint[h])
        out: list[tuple[Detector, list[int]]] = []
        for d in self.detectors:
            if d.name not in hinted:
                continue
            hay = lowered if d.folded else data
            spots: list[int] = []
            for anchor in d.anchors:
                at = hay.find(anchor)
                while at >= 0 and len(spots) < _MAX_SPOTS:
                    spots.append(at)
                    at = hay.find(anchor, at + 1)
            if spots:
                out.append((d, sorted(spots)))
        return out

    def search(self, data: bytes, *, open_end: bool = False) -> Finding | None:
        """The first finding in ``data`` (deny findings before report ones), or None.

        ``open_end``: ``data`` is a stream's window that more bytes will follow; a match
        ending at its very end is left for the next window (which holds it again), since
        the bytes after it may make it no match (a boundary) or a longer one.

        Each detector's expression runs only around its anchors (``re`` finds no literal
        prefix behind a look-behind, so a search of the whole data would step through
        it at a few MB/s).
        """
        report: Finding | None = None
        for d, spots in self._anchored(data):
            done = -1
            for at in spots:
                start = max(at - _BEFORE_ANCHOR, done, 0)
                end = min(at + MAX_MATCH, len(data))
                m = _first_valid(d, data, start, end, open_end=open_end)
                done = max(done, at)
                if m is None:
                    continue
                action = self.actions[d.name]
                if action == "deny":
                    return Finding(d.name, action, m.end())
                if report is None:
                    report = Finding(d.name, action, m.end())
                break
        return report


#: how far before an anchor a match may start (the key name before an AWS secret, the
#: part of a legacy OpenAI key before its marker)
_BEFORE_ANCHOR = 128
#: most anchor positions looked at per detector and search (a body full of "eyJ" costs
#: a bounded number of regex runs; past that the first ones are what is searched)
_MAX_SPOTS = 256


def _hints(d: Detector) -> tuple[bytes, ...]:
    return _HINTS.get(d.name, d.anchors)


def _unique(items: Iterable[bytes]) -> tuple[bytes, ...]:
    return tuple(dict.fromkeys(items))


#: checks already made, by detector and matched bytes (a session cookie that looks like
#: a JWT is checked once, not on every request); cleared when full
_CHECKED: dict[tuple[str, bytes], bool] = {}
_MAX_CHECKED = 4096


def _valid(d: Detector, m: re.Match[bytes]) -> bool:
    if d.check is None:
        return True
    key = (d.name, m.group(0))
    known = _CHECKED.get(key)
    if known is None:
        if len(_CHECKED) >= _MAX_CHECKED:
            _CHECKED.clear()
        known = _CHECKED[key] = d.check(m)
    return known


def _first_valid(
    d: Detector, data: bytes, start: int, end: int, *, open_end: bool
) -> re.Match[bytes] | None:
    for m in d.regex.finditer(data, start, end):
        if open_end and m.end() >= len(data):
            continue
        if _valid(d, m):
            return m
    return None


def reference_rows() -> list[tuple[str, str, str]]:
    """``(name, title, stance)`` of each detector (for the docs)."""
    return [(d.name, d.title, d.stance) for d in DETECTORS]
