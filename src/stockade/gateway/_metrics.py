"""Prometheus metrics in the text exposition format (0.0.4), written here.

A dozen lines of formatting do not justify a dependency (docs/dependencies.md): counters
and one histogram with labels, rendered on request. Label values are escaped as the
format requires; label sets are bounded by the policies and the fixed reason vocabulary.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

__all__ = ["Metrics"]

#: upper bounds (seconds) of the decision latency histogram
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Metrics:
    """The gateway's counters, gauges and latency histogram."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, dict[Labels, float]] = {}
        self._hist: dict[Labels, list[float]] = {}
        self._hist_sum: dict[Labels, float] = {}
        self._help: dict[str, tuple[str, str]] = {
            "stockade_gateway_connections_total": ("counter", "connections accepted"),
            "stockade_gateway_decisions_total": (
                "counter",
                "decisions (connections and requests) by policy, verdict and reason",
            ),
            "stockade_gateway_bytes_total": ("counter", "bytes relayed, by policy and direction"),
            "stockade_gateway_open_connections": ("gauge", "connections open now"),
            "stockade_gateway_policy_generation": ("gauge", "the policy generation in use"),
            "stockade_gateway_policy_reload_failures_total": (
                "counter",
                "policy reloads refused (the previous generation stays in use)",
            ),
            "stockade_gateway_pods": ("gauge", "pods in the watch cache"),
            "stockade_gateway_api_failures_total": (
                "counter",
                "failed list, watch or TokenReview calls to the API server",
            ),
        }

    def inc(self, name: str, labels: Labels = (), value: float = 1.0) -> None:
        """Add ``value`` to a counter."""
        with self._lock:
            series = self._counters.setdefault(name, {})
            series[labels] = series.get(labels, 0.0) + value

    def set(self, name: str, value: float, labels: Labels = ()) -> None:
        """Set a gauge."""
        with self._lock:
            self._gauges.setdefault(name, {})[labels] = value

    def observe(self, seconds: float, labels: Labels = ()) -> None:
        """Record one decision latency."""
        with self._lock:
            counts = self._hist.setdefault(labels, [0.0] * (len(LATENCY_BUCKETS) + 1))
            counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self._hist_sum[labels] = self._hist_sum.get(labels, 0.0) + seconds

    def value(self, name: str, labels: Labels = ()) -> float:
        """A counter's or gauge's current value (tests, health)."""
        with self._lock:
            for table in (self._counters, self._gauges):
                if name in table:
                    return table[name].get(labels, 0.0)
        return 0.0

    def render(self) -> str:
        """The exposition text."""
        lines: list[str] = []
        with self._lock:
            for table in (self._counters, self._gauges):
                for name in sorted(table):
                    lines += self._header(name)
                    for labels, value in sorted(table[name].items()):
                        lines.append(f"{name}{_labels(labels)} {_number(value)}")
            name = "stockade_gateway_decision_seconds"
            lines.append(f"# HELP {name} time from accept to the decision of a connection")
            lines.append(f"# TYPE {name} histogram")
            for labels, counts in sorted(self._hist.items()):
                running = 0.0
                for bound, count in zip((*LATENCY_BUCKETS, None), counts, strict=True):
                    running += count
                    le = 'le="' + ("+Inf" if bound is None else repr(bound)) + '"'
                    lines.append(f"{name}_bucket{_labels(labels, le)} {_number(running)}")
                lines.append(f"{name}_sum{_labels(labels)} {self._hist_sum[labels]!r}")
                lines.append(f"{name}_count{_labels(labels)} {_number(running)}")
        return "\n".join(lines) + "\n"

    def _header(self, name: str) -> Iterable[str]:
        kind, text = self._help.get(name, ("untyped", name))
        return (f"# HELP {name} {text}", f"# TYPE {name} {kind}")


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)
