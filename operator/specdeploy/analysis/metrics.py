"""The operator's own Prometheus metrics, in a registry of their own, rendered as the text exposition format.

    metrics = OperatorMetrics()
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.speculation_active("prod", "llama", False)
    body = metrics.render()            # serve with Content-Type CONTENT_TYPE on the operator's /metrics

Written here rather than with prometheus-client (not a dependency): counters, gauges and one histogram
with labels are all the operator needs, and the text format 0.0.4 is small
(prometheus.io/docs/instrumenting/exposition_formats). Thread-safe: the analysis loop writes while the
HTTP server thread reads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUERY_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Prometheus clients' default latency buckets: a query takes milliseconds, a timeout 10 s."""


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


SPEEDUP_BOUNDS = ("estimate", "low", "high")

class _Family:
    kind = ""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"metric {self.name} takes labels {list(self.label_names)}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Family):
    """Only goes up; `name` must end in _total (the exposed name)."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"a counter's name must end in _total, got {name!r}")
        super().__init__(name, help_text, label_names)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up; got an increment of {amount}")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_value(v)}" for k, v in items]


class Gauge(_Family):
    """Goes up and down; `remove` drops a series (an SD that was deleted)."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def remove(self, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values.pop(key, None)

    def value(self, **labels: str) -> float | None:
        with self._lock:
            return self._values.get(self._key(labels))

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_value(v)}" for k, v in items]


class Histogram(_Family):
    """Cumulative buckets, a sum and a count per label set (no labels here)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError(f"histogram buckets must be a sorted, non-empty list, got {list(buckets)}")
        self.buckets = tuple(float(b) for b in buckets)
        self._counts: dict[tuple[str, ...], list[int]] = {}
        self._sums: dict[tuple[str, ...], float] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1   # +Inf
            self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, **labels: str) -> int:
        with self._lock:
            counts = self._counts.get(self._key(labels))
            return counts[-1] if counts else 0

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(c), self._sums[k]) for k, c in self._counts.items())
        out = []
        for key, counts, total in items:
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                le = f'le="{_value(bound)}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {_value(n)}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_value(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {_value(counts[-1])}")
        return out


F = TypeVar("F", bound=_Family)


class Registry:
    """The metric families one /metrics endpoint shows, in registration order."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def register(self, family: F) -> F:
        if family.name in self._families:
            raise ValueError(f"metric {family.name} is already registered")
        self._families[family.name] = family
        return family

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families.values():
            lines += family.header() + family.lines()
        return "\n".join(lines) + "\n"


class OperatorMetrics:
    """The metrics the operator serves on its own /metrics (issue 5: rollbacks, activity, acceptance,
    verdicts, query time)."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.rollbacks = self.registry.register(Counter(
            "specdeploy_rollbacks_total", "Speculation rollbacks, by SpeculativeDeployment and reason.",
            ("namespace", "name", "reason")))
        self.active = self.registry.register(Gauge(
            "specdeploy_speculation_active", "1 while the SpeculativeDeployment's pods speculate, else 0.",
            ("namespace", "name")))
        self.acceptance = self.registry.register(Gauge(
            "specdeploy_acceptance_rate", "Accepted / drafted tokens of the speculative pods in the last window.",
            ("namespace", "name")))
        self.speedup = self.registry.register(Gauge(
            "specdeploy_speedup",
            "Baseline / speculative mean per-token latency in the last window (bound: estimate, low, high of its "
            "95% interval); above 1 speculation helps.", ("namespace", "name", "bound")))
        self.verdicts = self.registry.register(Counter(
            "specdeploy_analysis_verdicts_total", "Analysis verdicts (Healthy, Failing, Inconclusive).",
            ("verdict",)))
        self.query_seconds = self.registry.register(Histogram(
            "specdeploy_analysis_query_seconds", "Time one Prometheus query of the analysis loop took.",
            QUERY_SECONDS_BUCKETS))
        self.cycle_seconds = self.registry.register(Histogram(
            "specdeploy_analysis_cycle_seconds", "Time one analysis cycle (all queries, verdicts) took.",
            QUERY_SECONDS_BUCKETS))

    def rollback(self, namespace: str, name: str, reason: str) -> None:
        self.rollbacks.inc(namespace=namespace, name=name, reason=reason)

    def speculation_active(self, namespace: str, name: str, active: bool) -> None:
        self.active.set(1.0 if active else 0.0, namespace=namespace, name=name)

    def acceptance_rate(self, namespace: str, name: str, value: float | None) -> None:
        """The last acceptance rate; None or NaN (nothing measured) removes the series rather than lie."""
        if value is None or not math.isfinite(value):
            self.acceptance.remove(namespace=namespace, name=name)
        else:
            self.acceptance.set(value, namespace=namespace, name=name)

    def speedup_interval(self, namespace: str, name: str, speedup: tuple[float, float, float] | None) -> None:
        """The last speedup (estimate, low, high); None (nothing compared) removes the series rather than lie."""
        for bound, value in zip(SPEEDUP_BOUNDS, speedup or (None, None, None), strict=True):
            if value is None:
                self.speedup.remove(namespace=namespace, name=name, bound=bound)
            else:
                self.speedup.set(value, namespace=namespace, name=name, bound=bound)

    def verdict(self, kind: str) -> None:
        """Count one verdict: kind is "Healthy", "Failing" or "Inconclusive" (not the reason: bounded labels)."""
        self.verdicts.inc(verdict=kind)

    def queries(self, seconds: Sequence[float]) -> None:
        for value in seconds:
            self.query_seconds.observe(value)

    def cycle(self, seconds: float) -> None:
        self.cycle_seconds.observe(seconds)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the gauges of a deleted SD (counters stay: a rate() over them must not see a reset)."""
        self.active.remove(namespace=namespace, name=name)
        self.acceptance.remove(namespace=namespace, name=name)
        self.speedup_interval(namespace, name, None)

    def render(self) -> str:
        return self.registry.render()
