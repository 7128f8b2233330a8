"""The operator's own Prometheus metrics, in a registry of their own, exposed with prometheus_client.

    metrics = OperatorMetrics()
    metrics.rollback("prod", "llama", "AcceptanceBelowMinimum")
    metrics.speculation_active("prod", "llama", False)
    metrics.judged("prod", "llama", "Failing", "AcceptanceBelowMinimum", observe=False, floor=0.11,
                   inconclusive_samples=0)
    body = metrics.render()            # serve with Content-Type CONTENT_TYPE on the operator's /metrics

A registry of its own, not prometheus_client's global one: two operators in one test process (and the
unit tests) must not see each other's series, and the process/platform collectors are not ours to serve.
prometheus_client is thread-safe: the analysis loop writes while the HTTP server reads.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from specdeploy.api.status import ProbeCellStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST
QUERY_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Prometheus clients' default latency buckets: a query takes milliseconds, a timeout 10 s."""
SOURCE_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)
"""One source's queries go out at once: about one query's time, up to its share of the cycle (20 s)."""
RESYNC_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""A resync of a few SDs takes a fraction of a second; of a thousand, about a minute (docs/performance.md)."""
SPEEDUP_BOUNDS = ("estimate", "low", "high")
VARIANTS = ("speculative", "control")


class OperatorMetrics:
    """The metrics the operator serves on its own /metrics: rollbacks, activity, acceptance, speedup,
    verdicts, query and cycle time, each Prometheus' time, failures and bytes, reconcile passes, the periodic
    resync, and the last probe's cells."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rollbacks = Counter(
            "specdeploy_rollbacks", "Speculation rollbacks, by SpeculativeDeployment and reason.",
            ("namespace", "name", "reason"), registry=self.registry)
        self.would_rollbacks = Counter(
            "specdeploy_would_rollbacks",
            "Analysis samples that would have rolled speculation back but did not (spec.analysis.mode Observe, or "
            "the specdeploy.io/paused annotation), by SpeculativeDeployment and reason.",
            ("namespace", "name", "reason"), registry=self.registry)
        self.active = Gauge(
            "specdeploy_speculation_active", "1 while the SpeculativeDeployment's pods speculate, else 0.",
            ("namespace", "name"), registry=self.registry)
        self.acceptance = Gauge(
            "specdeploy_acceptance_rate", "Accepted / drafted tokens of the speculative pods in the last window.",
            ("namespace", "name"), registry=self.registry)
        self.speedup = Gauge(
            "specdeploy_speedup",
            "Baseline / speculative mean per-token latency in the last window (bound: estimate, low, high of its "
            "95% interval); above 1 speculation helps.", ("namespace", "name", "bound"), registry=self.registry)
        self.acceptance_floor = Gauge(
            "specdeploy_acceptance_floor",
            "The acceptance floor the judgment holds specdeploy_acceptance_rate against (minAcceptanceRate; Auto: "
            "from the cost model).", ("namespace", "name"), registry=self.registry)
        self.current_verdict = Gauge(
            "specdeploy_verdict",
            "1 for the SD's last verdict (Healthy, Failing, Inconclusive) and its reason (empty for Healthy); "
            "observe is \"true\" while the judgment may not act (spec.analysis.mode Observe, or paused).",
            ("namespace", "name", "verdict", "reason", "observe"), registry=self.registry)
        self._verdict_labels: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.inconclusive_samples = Gauge(
            "specdeploy_consecutive_inconclusive_samples",
            "Analysis samples in a row that were Inconclusive (status.analysis.consecutiveInconclusive).",
            ("namespace", "name"), registry=self.registry)
        self.k_in_use = Gauge(
            "specdeploy_k_in_use",
            "Draft tokens per step the speculative pods' schedule gives at their mean running batch (0 without "
            "speculation).", ("namespace", "name"), registry=self.registry)
        self.running_batch = Gauge(
            "specdeploy_running_batch",
            "Requests in one pod's batch, averaged over the analysis window, by variant (speculative, control).",
            ("namespace", "name", "variant"), registry=self.registry)
        self.verdicts = Counter(
            "specdeploy_analysis_verdicts", "Analysis verdicts (Healthy, Failing, Inconclusive).",
            ("verdict",), registry=self.registry)
        self.query_seconds = Histogram(
            "specdeploy_analysis_query_seconds", "Time one Prometheus query of the analysis loop took.",
            buckets=QUERY_SECONDS_BUCKETS, registry=self.registry)
        self.cycle_seconds = Histogram(
            "specdeploy_analysis_cycle_seconds", "Time one analysis cycle (all queries, verdicts) took.",
            buckets=QUERY_SECONDS_BUCKETS, registry=self.registry)
        self.source_seconds = Histogram(
            "specdeploy_prometheus_source_seconds",
            "Time all of one Prometheus' queries took in one analysis cycle, by source (URL without credentials, and "
            "where its headers come from).", ("source",), buckets=SOURCE_SECONDS_BUCKETS, registry=self.registry)
        self.source_failures = Counter(
            "specdeploy_prometheus_source_failures",
            "Analysis queries that got no usable answer, by source and kind (Unavailable, Refused, BadQuery, "
            "BadResponse).", ("source", "kind"), registry=self.registry)
        self.source_bytes = Counter(
            "specdeploy_prometheus_source_bytes", "Bytes of answers read from each source.", ("source",),
            registry=self.registry)
        self.resync_seconds = Histogram(
            "specdeploy_resync_seconds", "Time one periodic resync of every SpeculativeDeployment in scope took.",
            buckets=RESYNC_SECONDS_BUCKETS, registry=self.registry)
        self.passes = Counter(
            "specdeploy_reconcile_passes",
            "Reconcile passes begun, by trigger (spec, child, resync, sample).", ("trigger",), registry=self.registry)
        self.passes_coalesced = Counter(
            "specdeploy_reconcile_passes_coalesced",
            "Passes asked for by a watch event while one for the same SD was already waiting (done by that one).",
            ("trigger",), registry=self.registry)
        self.probe_acceptance = Gauge(
            "specdeploy_probe_acceptance_rate",
            "Accepted / drafted tokens per workload and temperature in the SD's last probe (status.probe).",
            ("namespace", "name", "workload", "temperature"), registry=self.registry)
        self.probe_speedup = Gauge(
            "specdeploy_probe_predicted_speedup",
            "The cost model's speedup at each probe cell's acceptance (below 1: speculation would not pay).",
            ("namespace", "name", "workload", "temperature"), registry=self.registry)
        self._probe_cells: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self.resync_failures = Counter(
            "specdeploy_resync_failures",
            "SpeculativeDeployments whose reconcile failed during a periodic resync (the others went on).",
            registry=self.registry)
        self.foreign_series = Counter(
            "specdeploy_foreign_series_ignored",
            "Analysis cycles' series labelled as this SpeculativeDeployment's from pods the operator did not observe "
            "as its own (a pod, job and variant counted once a cycle): ignored, the SD sampled from its own pods.",
            ("namespace", "name"), registry=self.registry)

    def rollback(self, namespace: str, name: str, reason: str) -> None:
        self.rollbacks.labels(namespace=namespace, name=name, reason=reason).inc()

    def would_roll_back(self, namespace: str, name: str, reason: str) -> None:
        self.would_rollbacks.labels(namespace=namespace, name=name, reason=reason).inc()

    def speculation_active(self, namespace: str, name: str, active: bool) -> None:
        self.active.labels(namespace=namespace, name=name).set(1.0 if active else 0.0)

    def acceptance_rate(self, namespace: str, name: str, value: float | None) -> None:
        """The last acceptance rate; None or NaN (nothing measured) removes the series rather than lie."""
        if value is None or not math.isfinite(value):
            _remove(self.acceptance, namespace, name)
        else:
            self.acceptance.labels(namespace=namespace, name=name).set(value)

    def speedup_interval(self, namespace: str, name: str, speedup: tuple[float, float, float] | None) -> None:
        """The last speedup (estimate, low, high); None (nothing compared) removes the series rather than lie."""
        for bound, value in zip(SPEEDUP_BOUNDS, speedup or (None, None, None), strict=True):
            if value is None:
                _remove(self.speedup, namespace, name, bound)
            else:
                self.speedup.labels(namespace=namespace, name=name, bound=bound).set(value)

    def judged(self, namespace: str, name: str, verdict: str, reason: str, observe: bool,
               floor: float | None, inconclusive_samples: int) -> None:
        """The verdict of the SD's last sample as the judgment gave it: its series replaces the previous one."""
        labels = (verdict, reason, "true" if observe else "false")
        previous = self._verdict_labels.pop((namespace, name), None)
        if previous is not None and previous != labels:
            _remove(self.current_verdict, namespace, name, *previous)
        self.current_verdict.labels(namespace, name, *labels).set(1.0)
        self._verdict_labels[(namespace, name)] = labels
        _set(self.acceptance_floor, floor, namespace, name)
        self.inconclusive_samples.labels(namespace=namespace, name=name).set(inconclusive_samples)

    def batch_and_k(self, namespace: str, name: str, batches: dict[str, float | None], k: int | None) -> None:
        """The running batch per variant and the k drafted at the speculative one; None removes the series."""
        for variant, batch in batches.items():
            _set(self.running_batch, batch, namespace, name, variant)
        _set(self.k_in_use, k, namespace, name)

    def probe(self, namespace: str, name: str, cells: Sequence[ProbeCellStatus]) -> None:
        """The last probe's cells (status.probe); cells it no longer has, and figures it did not measure, removed."""
        now = {(cell.workload, f"{cell.temperature:g}") for cell in cells}
        for gone in self._probe_cells.pop((namespace, name), set()) - now:
            _remove(self.probe_acceptance, namespace, name, *gone)
            _remove(self.probe_speedup, namespace, name, *gone)
        for cell in cells:
            key = (cell.workload, f"{cell.temperature:g}")
            for gauge, value in ((self.probe_acceptance, cell.acceptance_rate),
                                 (self.probe_speedup, cell.predicted_speedup)):
                if value is None or not math.isfinite(value):
                    _remove(gauge, namespace, name, *key)
                else:
                    gauge.labels(namespace, name, *key).set(value)
        if now:
            self._probe_cells[(namespace, name)] = now

    def verdict(self, kind: str) -> None:
        """Count one verdict: kind is "Healthy", "Failing" or "Inconclusive" (not the reason: bounded labels)."""
        self.verdicts.labels(verdict=kind).inc()

    def queries(self, seconds: Sequence[float]) -> None:
        for value in seconds:
            self.query_seconds.observe(value)

    def source(self, source: str, seconds: float, answer_bytes: int, failures: Sequence[str]) -> None:
        """One source's part of a cycle: how long its queries took, the bytes read, and the kinds of its failures."""
        self.source_seconds.labels(source=source).observe(seconds)
        self.source_bytes.labels(source=source).inc(answer_bytes)
        for kind in failures:
            self.source_failures.labels(source=source, kind=kind).inc()

    def foreign(self, namespace: str, name: str, series: int) -> None:
        self.foreign_series.labels(namespace=namespace, name=name).inc(series)

    def cycle(self, seconds: float) -> None:
        self.cycle_seconds.observe(seconds)

    def pass_begun(self, trigger: str) -> None:
        self.passes.labels(trigger=trigger).inc()

    def pass_coalesced(self, trigger: str) -> None:
        self.passes_coalesced.labels(trigger=trigger).inc()

    def resync(self, seconds: float, failed: int) -> None:
        self.resync_seconds.observe(seconds)
        self.resync_failures.inc(failed)

    def value(self, sample: str, **labels: str) -> float | None:
        """One sample as it would be exposed (e.g. "specdeploy_rollbacks_total"); None when there is none."""
        return self.registry.get_sample_value(sample, labels)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the gauges of a deleted SD (counters stay: a rate() over them must not see a reset)."""
        _remove(self.active, namespace, name)
        _remove(self.acceptance, namespace, name)
        _remove(self.acceptance_floor, namespace, name)
        _remove(self.inconclusive_samples, namespace, name)
        _remove(self.k_in_use, namespace, name)
        for variant in VARIANTS:
            _remove(self.running_batch, namespace, name, variant)
        verdict = self._verdict_labels.pop((namespace, name), None)
        if verdict is not None:
            _remove(self.current_verdict, namespace, name, *verdict)
        self.speedup_interval(namespace, name, None)
        self.probe(namespace, name, ())

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def _set(gauge: Gauge, value: float | None, *label_values: str) -> None:
    """Set one series, or drop it when there is no finite value: a missing series, not a made-up number."""
    if value is None or not math.isfinite(value):
        _remove(gauge, *label_values)
    else:
        gauge.labels(*label_values).set(value)


def _remove(gauge: Gauge, *label_values: str) -> None:
    """Drop one series; prometheus_client raises KeyError for one that was never set."""
    with contextlib.suppress(KeyError):
        gauge.remove(*label_values)
