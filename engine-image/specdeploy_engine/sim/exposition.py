"""The simulator's Prometheus metrics, written and read by prometheus_client: counters, gauges and
histograms with labels, in the text exposition format (version 0.0.4).

    registry = Registry()
    drafts = registry.counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.",
                              ("model_name", "engine"))
    drafts.inc(("llama", "0"))
    text = registry.render()
    parse(text)["vllm:spec_decode_num_drafts_total"].value(model_name="llama")

The registry is a custom collector rather than a set of prometheus_client metrics: the simulator keeps its
own state (plain dicts the engine core updates, one registry per simulated engine), and SGLang's inter-token
histogram counts a step's tokens at once (`observe(labels, value, weight=tokens, total=interval)`), which
prometheus_client's Histogram cannot. `render` turns that state into prometheus_client's metric families and
writes them with `generate_latest`, so names, label order (sorted), number formatting and the `_created`
series of counters and histograms are what a real engine's prometheus_client writes. Counters are
registered under their exposed name, with `_total`.

`parse` is a strict reader for tests and tools over prometheus_client's parser: families by their exposed
name (a counter's with `_total`, each `_created` family a gauge of its own), every sample inside its
family's `# TYPE` block, histograms cumulative with a +Inf bucket equal to `_count`.

Exceptions:

    ValueError
     └── ExpositionError   text that is not valid exposition format (raised by `parse`)
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

# The type prometheus_client's own handlers send with `generate_latest`'s text (exposition.choose_encoder);
# CONTENT_TYPE_LATEST says version=1.0.0, which they send only to a scraper that asks for it.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
Labels = tuple[str, ...]


@dataclass
class Gauge:
    """One value per label set."""

    name: str
    help: str
    labelnames: Labels
    values: dict[Labels, float] = field(default_factory=dict)

    def touch(self, labels: Labels) -> None:
        """Create the series at 0, as engines do for series they pre-register."""
        self.values.setdefault(labels, 0.0)

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value

    def metric_family(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.name, self.help, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


@dataclass
class Counter:
    """One non-decreasing value per label set, and when the series was created."""

    name: str
    help: str
    labelnames: Labels
    values: dict[Labels, float] = field(default_factory=dict)
    created: dict[Labels, float] = field(default_factory=dict)    # wall-clock seconds

    def touch(self, labels: Labels) -> None:
        """Create the series at 0, as engines do for series they pre-register."""
        if labels not in self.values:
            self.values[labels] = 0.0
            self.created[labels] = time.time()

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name} cannot decrease (by {amount})")
        self.touch(labels)
        self.values[labels] += amount

    def metric_family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.help, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(labels, value, created=self.created[labels])
        return family


@dataclass
class HistogramSeries:
    """The observations of one label set: a count per bucket (+Inf last, not cumulative) and their sum."""

    counts: list[float]
    sum: float
    created: float                # wall-clock seconds


@dataclass
class Histogram:
    """Buckets per label set, with _sum, _count and _created."""

    name: str
    help: str
    labelnames: Labels
    bounds: tuple[float, ...]
    series: dict[Labels, HistogramSeries] = field(default_factory=dict)

    def touch(self, labels: Labels) -> HistogramSeries:
        """The series of `labels`, created empty if it is new."""
        found = self.series.get(labels)
        if found is None:
            found = self.series[labels] = HistogramSeries([0.0] * (len(self.bounds) + 1), 0.0, time.time())
        return found

    def observe(self, labels: Labels, value: float, weight: float = 1.0, total: float | None = None) -> None:
        """Count `value` `weight` times and add `total` (default value × weight) to the sum; the weighted
        form is SGLang's, which counts a step's tokens at the per-token interval."""
        series = self.touch(labels)
        series.counts[bisect_left(self.bounds, value)] += weight
        series.sum += value * weight if total is None else total

    def metric_family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.help, labels=self.labelnames)
        les = [floatToGoString(bound) for bound in (*self.bounds, math.inf)]
        for labels, series in self.series.items():
            cumulative, buckets = 0.0, []
            for le, count in zip(les, series.counts, strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(labels, buckets, series.sum)
            family.add_sample(self.name + "_created", dict(zip(self.labelnames, labels, strict=True)), series.created)
        return family


class Registry:
    """The families of one simulated engine, a prometheus_client collector rendered in registration order."""

    def __init__(self) -> None:
        self.families: list[Gauge | Counter | Histogram] = []
        self.collectors = CollectorRegistry()
        self.collectors.register(self)

    def counter(self, name: str, help: str, labelnames: Labels) -> Counter:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must be named with its exposed `_total` suffix")
        counter = Counter(name, help, labelnames)
        self._add(counter)
        return counter

    def gauge(self, name: str, help: str, labelnames: Labels) -> Gauge:
        gauge = Gauge(name, help, labelnames)
        self._add(gauge)
        return gauge

    def histogram(self, name: str, help: str, labelnames: Labels, bounds: Sequence[float]) -> Histogram:
        histogram = Histogram(name, help, labelnames, tuple(bounds))
        self._add(histogram)
        return histogram

    def _add(self, family: Gauge | Counter | Histogram) -> None:
        if any(existing.name == family.name for existing in self.families):
            raise ValueError(f"metric {family.name} is registered twice")
        self.families.append(family)

    def collect(self) -> Iterator[Metric]:
        """The families as prometheus_client's (the collector protocol)."""
        for family in self.families:
            yield family.metric_family()

    def render(self) -> str:
        return generate_latest(self.collectors).decode()


# --- reading ----------------------------------------------------------------------------------------------

class ExpositionError(ValueError):
    """Text that is not valid Prometheus exposition format; the message says what is wrong."""


LabelPairs = tuple[tuple[str, str], ...]     # sorted by label name


@dataclass
class ParsedFamily:
    name: str
    kind: str
    help: str
    samples: dict[tuple[str, LabelPairs], float] = field(default_factory=dict)

    def value(self, sample: str | None = None, **labels: str) -> float:
        """The value of the sample `sample` (default: the family name) whose labels include `labels`;
        the sum over every match when several do."""
        wanted = sample or self.name
        found = [value for (name, pairs), value in self.samples.items()
                 if name == wanted and set(labels.items()) <= set(pairs)]
        if not found:
            raise KeyError(f"no sample {wanted}{labels} in {self.name}")
        return sum(found)


def parse(text: str) -> dict[str, ParsedFamily]:
    """Families by exposed name; every sample must follow its family's # TYPE line, histograms must be
    cumulative and end with +Inf equal to _count."""
    try:
        metrics = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ExpositionError(f"not Prometheus text format: {exc}") from exc
    families: dict[str, ParsedFamily] = {}
    for metric in metrics:
        # prometheus_client's parser drops a counter's `_total` from the family name; its samples keep it.
        name = metric.name + "_total" if metric.type == "counter" else metric.name
        if metric.type == "unknown":      # the parser's type for samples without a # TYPE line
            raise ExpositionError(f"samples of {name} outside a # TYPE block")
        if name in families:
            raise ExpositionError(f"family {name} declared twice")
        family = families[name] = ParsedFamily(name, metric.type, metric.documentation)
        for sample in metric.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in family.samples:
                raise ExpositionError(f"sample {sample.name}{sample.labels} given twice")
            family.samples[key] = float(sample.value)
        if family.kind == "histogram":
            _check_histogram(family)
    return families


def _check_histogram(family: ParsedFamily) -> None:
    by_series: dict[LabelPairs, list[tuple[float, float]]] = {}
    for (sample, pairs), value in family.samples.items():
        if sample.endswith("_bucket"):
            le = dict(pairs).get("le")
            try:
                bound = float(le or "")
            except ValueError:
                raise ExpositionError(f"{family.name}: a bucket with le={le!r}, not a number") from None
            rest = tuple(pair for pair in pairs if pair[0] != "le")
            by_series.setdefault(rest, []).append((bound, value))
    for rest, buckets in by_series.items():
        buckets.sort()
        counts = [count for _, count in buckets]
        if counts != sorted(counts):
            raise ExpositionError(f"{family.name}{dict(rest)}: buckets are not cumulative")
        if buckets[-1][0] != math.inf:
            raise ExpositionError(f"{family.name}{dict(rest)}: no +Inf bucket")
        if family.samples.get((family.name + "_count", rest)) != buckets[-1][1]:
            raise ExpositionError(f"{family.name}{dict(rest)}: _count differs from the +Inf bucket")
