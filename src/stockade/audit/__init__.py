"""Audit log: typed events written as JSON Lines, one object per event."""

from stockade.audit._log import AuditLog as AuditLog
from stockade.audit._log import read_events as read_events

__all__ = ["AuditLog", "read_events"]
