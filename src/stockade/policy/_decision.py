"""Decisions as values.

Every allow or deny that stockade makes is a :class:`Decision`: a verdict, the layer
that made it, the rule that matched (if any) and a reason from a small fixed
vocabulary. The audit log writes each decision exactly once.
"""

from __future__ import annotations

import enum

from stockade._record import record


class Verdict(enum.StrEnum):
    """What happened to an action."""

    ALLOW = "allow"
    DENY = "deny"
    #: Let through, but logged as what would have been denied (for rolling out a policy).
    REPORT = "report"


class Reason(enum.StrEnum):
    """The fixed vocabulary of reasons. New reasons are added here, never made up inline."""

    # egress
    HOST_NOT_ALLOWED = "host-not-allowed"
    HOST_DENIED = "host-denied"
    PORT_NOT_ALLOWED = "port-not-allowed"
    ADDRESS_NOT_PUBLIC = "address-not-public"
    ADDRESS_METADATA = "address-metadata"
    ADDRESS_SELF = "address-self"
    ADDRESS_CLUSTER = "address-cluster"
    RESOLVE_FAILED = "resolve-failed"
    BAD_HOSTNAME = "bad-hostname"
    BAD_REQUEST = "bad-request"
    UNSUPPORTED_PROTOCOL = "unsupported-protocol"
    SNI_MISMATCH = "sni-mismatch"
    SNI_MISSING = "sni-missing"
    HANDSHAKE_TIMEOUT = "handshake-timeout"
    CONNECTION_LIMIT = "connection-limit"
    NOT_TLS = "not-tls"
    UPSTREAM_FAILED = "upstream-failed"
    # asking (egress/approval)
    USER_DENIED = "user-denied"
    APPROVAL_TIMEOUT = "approval-timeout"
    APPROVAL_UNAVAILABLE = "approval-unavailable"
    APPROVAL_ERROR = "approval-error"
    APPROVAL_LIMIT = "approval-limit"
    HOST_REVOKED = "host-revoked"
    #: the operator's upstream proxy answered the CONNECT (or request) with a refusal
    UPSTREAM_REFUSED = "upstream-refused"
    #: the operator's upstream proxy could not be reached; nothing was dialled directly
    UPSTREAM_UNREACHABLE = "upstream-unreachable"
    # gateway identity (who is connecting, before any egress rule)
    UNKNOWN_PEER = "unknown-peer"
    POD_NOT_RUNNING = "pod-not-running"
    POD_GONE = "pod-gone"
    #: an agent-sandbox warm-pool pod not yet claimed (``--unclaimed refuse``)
    POD_UNCLAIMED = "pod-unclaimed"
    IDENTITY_STALE = "identity-stale"
    CREDENTIAL_MISSING = "credential-missing"
    CREDENTIAL_INVALID = "credential-invalid"
    CREDENTIAL_MISMATCH = "credential-mismatch"
    POLICY_UNKNOWN = "policy-unknown"
    POLICY_NOT_PERMITTED = "policy-not-permitted"
    # inspect
    HOST_MISMATCH = "host-mismatch"
    AMBIGUOUS_PATH = "ambiguous-path"
    RULE_DENIED = "rule-denied"
    NO_RULE_MATCHED = "no-rule-matched"
    FOREIGN_CREDENTIAL = "foreign-credential"
    SECRET_WRONG_HOST = "secret-wrong-host"  # noqa: S105 - a reason, not a secret
    LABELLED_DATA = "labelled-data"
    CREDENTIAL_DETECTED = "credential-detected"
    BODY_TOO_LARGE = "body-too-large"
    UNSCANNABLE_BODY = "unscannable-body"
    CLIENT_REFUSED_CERT = "client-refused-cert"
    # files / container / syscalls / secrets / limits
    PATH_NOT_GRANTED = "path-not-granted"
    PATH_PROTECTED = "path-protected"
    PATH_DENIED = "path-denied"
    SYSCALL_BLOCKED = "syscall-blocked"
    ENV_NOT_PASSED = "env-not-passed"
    CREDENTIAL_ENV = "credential-env"
    PROCESS_CONTAINED = "process-contained"
    LIMIT_WALL_TIME = "limit-wall-time"
    LIMIT_MEMORY = "limit-memory"
    LIMIT_PIDS = "limit-pids"
    LIMIT_FILE_SIZE = "limit-file-size"
    LIMIT_CPU = "limit-cpu"
    # overlay: a write to an overlay workspace stays in the run's layer until applied
    NOT_APPLIED = "not-applied"
    # a decision that lets an action through
    ALLOWED = "allowed"


@record
class Decision:
    """One decision: ``verdict`` by ``layer`` because of ``reason`` (rule ``rule`` matched)."""

    verdict: Verdict
    layer: str
    reason: Reason
    rule: str = ""
    detail: str = ""

    @property
    def allowed(self) -> bool:
        """True when the action goes through (``allow`` or ``report``)."""
        return self.verdict is not Verdict.DENY

    @classmethod
    def allow(cls, layer: str, rule: str = "", detail: str = "") -> Decision:
        """An allow decision."""
        return cls(Verdict.ALLOW, layer, Reason.ALLOWED, rule, detail)

    @classmethod
    def deny(cls, layer: str, reason: Reason, rule: str = "", detail: str = "") -> Decision:
        """A deny decision."""
        return cls(Verdict.DENY, layer, reason, rule, detail)
