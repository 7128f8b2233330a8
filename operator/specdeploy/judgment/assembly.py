"""From the answers to one cycle's queries to the Samples the judgment reads: a pure step, so that what the
operator makes of Prometheus' answers is tested without Prometheus (clients/prometheus.py asks, this assembles).

    samples = assemble([Answer(query, [Sample({"namespace": "prod", ...}, 0.71)], None, 0.012),
                        Answer(other, None, QueryError(other.signal, QueryErrorKind.UNAVAILABLE, "…"), 10.0)])
    samples.for_deployment("prod", "llama", EngineKind.VLLM, 300.0)

Each answer's series are keyed by the labels the operator's PodMonitor puts on them (namespace, SD, variant); a
series without them is not an SD's and is left out. A failed query is recorded per signal, never raised: the
verdict decides what it means. Slice series (one per pod) lose the instants where a scrape read NaN or ±Inf
(samples.finite_instants, counted in GroupSamples.dropped) and are then differenced pod by pod and summed
(comparison.merge_counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdeploy.judgment.comparison import merge_counters
from specdeploy.judgment.queries import Query
from specdeploy.judgment.samples import (
    GroupSamples,
    Points,
    QueryError,
    QueryGroup,
    Samples,
    SeriesKey,
    Signal,
    SignalValues,
    finite_instants,
)


@dataclass(frozen=True)
class Sample:
    """One series of an answer: its labels and its value at the query time (an instant vector), or its
    points over a range (a range vector: `value` is the last point's)."""

    labels: Mapping[str, str]
    value: float
    points: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Answer:
    """What one query got: its series, or the error that stands for them; and how long it took."""

    query: Query
    series: Sequence[Sample] | None
    error: QueryError | None
    seconds: float


def series_key(labels: Mapping[str, str]) -> SeriesKey | None:
    """The SD and variant a series is labelled with; None when it is not an SD's."""
    namespace = labels.get("namespace")
    name = labels.get("specdeploy_io_name")
    variant = labels.get("specdeploy_io_variant")
    if not namespace or not name or not variant:
        return None
    return SeriesKey(namespace, name, variant)


def _position(labels: Mapping[str, str], label: str | None) -> int | None:
    """The draft position (from 1) of a per-position series, whose engine labels the first drafted token 0."""
    text = labels.get(label) if label is not None else None
    if text is None or not text.isdigit():
        return None
    return int(text) + 1


def assemble(answers: Sequence[Answer]) -> Samples:
    """Every SD's signal values, per query group (engine, window, selector), from the answers of one cycle."""
    values: dict[QueryGroup, dict[SeriesKey, SignalValues]] = {}
    errors: dict[QueryGroup, dict[Signal, QueryError]] = {}
    per_pod: dict[tuple[QueryGroup, str, str], dict[tuple[str, Signal], list[Points]]] = {}
    for answer in answers:
        query = answer.query
        group = QueryGroup(query.engine, query.window_seconds, query.selector)
        series = values.setdefault(group, {})
        errors.setdefault(group, {})
        if answer.error is not None:
            errors[group][query.signal] = answer.error
            continue
        for sample in answer.series or ():
            key = series_key(sample.labels)
            if key is None:
                continue
            signal = query.signal
            if signal.is_series:
                of_sd = per_pod.setdefault((group, key.namespace, key.name), {})
                of_sd.setdefault((key.variant, signal), []).append(sample.points)
                series.setdefault(key, SignalValues())
            elif signal.is_per_position:
                position = _position(sample.labels, query.position_label)
                if position is not None:
                    series[key] = series.get(key, SignalValues()).with_position(signal, position, sample.value)
            else:
                series[key] = series.get(key, SignalValues()).with_value(signal, sample.value)
    dropped: dict[QueryGroup, dict[tuple[str, str], int]] = {}
    for (group, namespace, name), series_of_sd in per_pod.items():
        kept, left_out = finite_instants(series_of_sd)
        if left_out:
            dropped.setdefault(group, {})[(namespace, name)] = left_out
        for (variant, signal), pods in kept.items():
            key = SeriesKey(namespace, name, variant)
            values[group][key] = values[group][key].with_points(signal, merge_counters(pods))
    return Samples(
        groups={g: GroupSamples(values[g], errors[g], dropped.get(g, {})) for g in values},
        query_seconds=tuple(a.seconds for a in answers),
    )
