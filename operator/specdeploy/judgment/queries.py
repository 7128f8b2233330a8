"""The PromQL the analysis sends: one query per signal per engine and window, for every SD at once.

    for query in queries_for(EngineKind.VLLM, 300.0):
        query.signal, query.promql
    # acceptance_rate  sum by (namespace, specdeploy_io_name, specdeploy_io_variant)
    #                  (rate(vllm:spec_decode_num_accepted_tokens_total{specdeploy_io_name!=""}[5m])) / sum by (…) (…)

Every query groups by `namespace, specdeploy_io_name, specdeploy_io_variant` — the labels the operator's
PodMonitor (podTargetLabels) puts on engine series — so the number of queries per cycle depends on the
engines and windows in use, never on the number of SDs. Templates are rendered strictly (as Flagger's
`missingkey=error`): a variable the template names but the caller does not give, or one the caller gives
that the template does not use, raises TemplateError; values are checked to be metric names or
durations, so nothing else can be spliced into a query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from string import Template

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.engines import MetricNames, metric_names
from specdeploy.judgment.samples import QueryGroup, Signal

GROUP_LABELS = "namespace, specdeploy_io_name, specdeploy_io_variant"
SELECTOR = '{specdeploy_io_name!=""}'    # only series scraped from an SD's pods

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_DURATION = re.compile(r"[0-9]+(ms|s|m|h)")


class TemplateError(ValueError):
    """A query template and its variables do not match, or a value is not what the variable holds."""


# Counters (vLLM, TensorRT-LLM): acceptance rate = rate(accepted) / rate(draft tokens), FACTS.md "vLLM
# metrics"; vllm/v1/spec_decode/metrics.py logs the same ratio as "Avg Draft acceptance rate".
ACCEPTANCE_RATE_FROM_COUNTERS = (
    "sum by ($by) (rate(${accepted}${selector}[$window]))"
    " / sum by ($by) (rate(${draft_tokens}${selector}[$window]))"
)
# Mean acceptance length = 1 + rate(accepted) / rate(drafts): each draft step emits its accepted tokens
# plus the one the target samples itself (vLLM's "Mean acceptance length").
MEAN_ACCEPTANCE_LENGTH_FROM_COUNTERS = (
    "1 + sum by ($by) (rate(${accepted}${selector}[$window]))"
    " / sum by ($by) (rate(${drafts}${selector}[$window]))"
)
# Gauges (SGLang's sglang:spec_accept_rate / sglang:spec_accept_length, TensorRT-LLM's acceptance length):
# the engine already averages; the window averages over time, then over pods (and tensor-parallel ranks).
GAUGE_MEAN = "avg by ($by) (avg_over_time(${gauge}${selector}[$window]))"
# Running / waiting requests: the SD's total, averaged over the window.
GAUGE_TOTAL = "sum by ($by) (avg_over_time(${gauge}${selector}[$window]))"
# P99 of a Prometheus histogram, merged over pods: NaN when nothing was observed in the window.
P99_FROM_HISTOGRAM = "histogram_quantile(0.99, sum by (le, $by) (rate(${histogram}_bucket${selector}[$window])))"
# Mean of a histogram from its `_sum` and `_count` (exact: no buckets), merged over pods. vLLM's per-token
# histograms start at 10 ms (FACTS.md "vLLM histogram buckets"), so below that only the mean resolves.
MEAN_FROM_HISTOGRAM = (
    "sum by ($by) (rate(${histogram}_sum${selector}[$window]))"
    " / sum by ($by) (rate(${histogram}_count${selector}[$window]))"
)
# A cumulative counter per pod, at SLICES + 1 evenly spaced instants over the window (a subquery of an instant
# vector: each point is the last scrape before it, whatever the scrape interval). Per pod, because a restarted
# pod's counter starts again at 0: the differences are taken pod by pod, resets counted as Prometheus counts
# them, and only then summed (judgment/comparison.py merge_counters) into the slices of the paired comparison.
CUMULATIVE_SERIES = "sum by ($by, pod) (${counter}${selector})[$range:$step]"
# Pods reporting the running gauge now: running requests per pod is the load a step time depends on.
PODS_FROM_GAUGE = "count by ($by) (${gauge}${selector})"
# A counter's increase in the window, summed over pods (extrapolated by increase(), so not always a whole
# number): finished requests, and drafts (vLLM's drafts counter, the denominator of a position's acceptance).
COUNT_FROM_COUNTER = "sum by ($by) (increase(${counter}${selector}[$window]))"
# A per-position counter's increase in the window, one series per position, summed over pods: counts, not rates,
# so that the calibration can state each position's binomial uncertainty (judgment/calibration.py).
PER_POSITION_FROM_COUNTER = "sum by ($by, $position) (increase(${counter}${selector}[$window]))"
# Output tokens per second of a variant, summed over its pods (÷ pods ÷ GPUs per pod: tokens per GPU).
OUTPUT_RATE_FROM_COUNTER = "sum by ($by) (rate(${counter}${selector}[$window]))"

_FIXED = {"by": GROUP_LABELS, "selector": SELECTOR}
_DURATIONS = ("window", "range", "step")
_LABELS = ("position",)

SLICES = 10
"""Slices per window for the paired comparison: 5m → 30 s slices, 1m → 6 s. Ten gives 9 degrees of freedom
(a t quantile of 2.26, against 1.96 for infinitely many) while a slice still spans several scrapes at the
usual 2–15 s scrape intervals."""


def render(template: str, **variables: str) -> str:
    """`template` with `$name` / `${name}` replaced; raises TemplateError on any mismatch.

    `by` and `selector` are filled in by this module; `window`, `range` and `step` must be PromQL durations,
    `position` a label name and every other variable a metric name.
    """
    if not Template(template).is_valid():
        raise TemplateError(f"query template {template!r} has a `$` that is not a variable")
    names = set(Template(template).get_identifiers())
    given = {**_FIXED, **variables}
    missing = sorted(names - set(given))
    unused = sorted(set(variables) - names)
    if missing or unused:
        raise TemplateError(
            f"query template {template!r} and its variables do not match: "
            f"missing {missing or 'none'}, not used {unused or 'none'}; given {sorted(variables)}"
        )
    for key, value in variables.items():
        pattern = _DURATION if key in _DURATIONS else _LABEL_NAME if key in _LABELS else _METRIC_NAME
        if not pattern.fullmatch(value):
            what = ("a PromQL duration such as 5m" if key in _DURATIONS else "a Prometheus label name"
                    if key in _LABELS else "a Prometheus metric name")
            raise TemplateError(f"query variable {key!r} must be {what}, got {value!r}")
    return Template(template).substitute(given)


def promql_duration(seconds: float) -> str:
    """A window in seconds as a one-unit PromQL duration: 300 → "5m", 3600 → "1h", 90 → "90s", 1.5 → "1500ms"."""
    if seconds <= 0:
        raise ValueError(f"a query window must be longer than 0 seconds, got {seconds!r}")
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    whole = millis // 1000
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


@dataclass(frozen=True)
class Query:
    """One PromQL query: the signal it measures for every SD of `engine` over `window_seconds`.

    position_label: for a per-position signal, the label whose value (from 0) is the draft position."""

    signal: Signal
    engine: EngineKind
    window_seconds: float
    promql: str
    position_label: str | None = None
    selector: str = ""


def _acceptance_rate(names: MetricNames, window: str) -> str | None:
    if names.accepted_tokens_total and names.draft_tokens_total:
        return render(ACCEPTANCE_RATE_FROM_COUNTERS, accepted=names.accepted_tokens_total,
                      draft_tokens=names.draft_tokens_total, window=window)
    if names.acceptance_rate_gauge:
        return render(GAUGE_MEAN, gauge=names.acceptance_rate_gauge, window=window)
    return None


def _mean_acceptance_length(names: MetricNames, window: str) -> str | None:
    if names.accepted_tokens_total and names.drafts_total:
        return render(MEAN_ACCEPTANCE_LENGTH_FROM_COUNTERS, accepted=names.accepted_tokens_total,
                      drafts=names.drafts_total, window=window)
    if names.acceptance_length_gauge:
        return render(GAUGE_MEAN, gauge=names.acceptance_length_gauge, window=window)
    return None


def slice_seconds(window_seconds: float) -> float:
    """The length of one slice of the paired comparison, whole milliseconds."""
    return round(window_seconds * 1000 / SLICES) / 1000


def latest_seconds(window_seconds: float) -> float:
    """The span of the `LATEST_*` signals: the window's last slice (5m → 30 s, the default analysis interval), the
    newest evidence a sample adds. Shorter than two scrapes, increase() finds nothing there and the window alone
    is used."""
    return slice_seconds(window_seconds)


def _series(histogram: str, part: str, window_seconds: float) -> str:
    step = slice_seconds(window_seconds)
    return render(CUMULATIVE_SERIES, counter=f"{histogram}_{part}", range=promql_duration(window_seconds + step),
                  step=promql_duration(step))


def _part(signal: Signal) -> str:
    return "sum" if signal.value.endswith("_sum") else "count"


def promql(signal: Signal, engine: EngineKind, window_seconds: float, selector: str = "") -> str | None:
    """The query for `signal` on `engine`'s metric names; None when the engine exports nothing for it.
    `selector`: "" for every SD's series (SELECTOR), or one SD's own pods (`pinned_selector`)."""
    text = _promql(signal, engine, window_seconds)
    return text.replace(SELECTOR, selector) if text is not None and selector else text


def _promql(signal: Signal, engine: EngineKind, window_seconds: float) -> str | None:
    names = metric_names(engine)
    window, latest = promql_duration(window_seconds), promql_duration(latest_seconds(window_seconds))
    match signal:
        case Signal.ACCEPTANCE_RATE:
            return _acceptance_rate(names, window)
        case Signal.MEAN_ACCEPTANCE_LENGTH:
            return _mean_acceptance_length(names, window)
        case Signal.P99_INTER_TOKEN_LATENCY:
            # Per token, per request (MetricNames.time_per_output_token): vLLM's own ITL histogram is per step.
            return render(P99_FROM_HISTOGRAM, histogram=names.time_per_output_token, window=window)
        case Signal.P99_E2E_LATENCY:
            return render(P99_FROM_HISTOGRAM, histogram=names.e2e_request_latency, window=window)
        case Signal.P99_TIME_TO_FIRST_TOKEN:
            return render(P99_FROM_HISTOGRAM, histogram=names.time_to_first_token, window=window)
        case Signal.MEAN_INTER_TOKEN_LATENCY:
            return render(MEAN_FROM_HISTOGRAM, histogram=names.time_per_output_token, window=window)
        case Signal.MEAN_E2E_LATENCY:
            return render(MEAN_FROM_HISTOGRAM, histogram=names.e2e_request_latency, window=window)
        case Signal.MEAN_TIME_TO_FIRST_TOKEN:
            return render(MEAN_FROM_HISTOGRAM, histogram=names.time_to_first_token, window=window)
        case Signal.MEAN_QUEUE_TIME:
            if names.request_queue_time is None:
                return None
            return render(MEAN_FROM_HISTOGRAM, histogram=names.request_queue_time, window=window)
        case Signal.INTER_TOKEN_LATENCY_SUM_SERIES:
            return _series(names.time_per_output_token, "sum", window_seconds)
        case Signal.INTER_TOKEN_LATENCY_COUNT_SERIES:
            return _series(names.time_per_output_token, "count", window_seconds)
        case Signal.E2E_LATENCY_SUM_SERIES:
            return _series(names.e2e_request_latency, "sum", window_seconds)
        case Signal.E2E_LATENCY_COUNT_SERIES:
            return _series(names.e2e_request_latency, "count", window_seconds)
        case Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES:
            return _series(names.time_to_first_token, "sum", window_seconds)
        case Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES:
            return _series(names.time_to_first_token, "count", window_seconds)
        case Signal.PREFILL_TIME_SUM_SERIES | Signal.PREFILL_TIME_COUNT_SERIES:
            if names.request_prefill_time is None:
                return None     # judged on TTFT − queue time (judgment/verdict.py)
            return _series(names.request_prefill_time, _part(signal), window_seconds)
        case Signal.INFERENCE_TIME_SUM_SERIES | Signal.INFERENCE_TIME_COUNT_SERIES:
            if names.request_inference_time is None:
                return None     # judged on end-to-end − queue time
            return _series(names.request_inference_time, _part(signal), window_seconds)
        case Signal.QUEUE_TIME_SUM_SERIES | Signal.QUEUE_TIME_COUNT_SERIES:
            if names.request_queue_time is None:
                return None
            return _series(names.request_queue_time, _part(signal), window_seconds)
        case Signal.OUTPUT_TOKENS_SERIES:
            if names.generation_tokens_total is None:
                return None
            step = slice_seconds(window_seconds)
            return render(CUMULATIVE_SERIES, counter=names.generation_tokens_total,
                          range=promql_duration(window_seconds + step), step=promql_duration(step))
        case Signal.OUTPUT_TOKENS_PER_SECOND:
            if names.generation_tokens_total is None:
                return None
            return render(OUTPUT_RATE_FROM_COUNTER, counter=names.generation_tokens_total, window=window)
        case Signal.PODS:
            return render(PODS_FROM_GAUGE, gauge=names.requests_running)
        case Signal.REQUESTS:
            return render(COUNT_FROM_COUNTER, counter=names.request_success_total, window=window)
        case Signal.RUNNING:
            return render(GAUGE_TOTAL, gauge=names.requests_running, window=window)
        case Signal.WAITING:
            return render(GAUGE_TOTAL, gauge=names.requests_waiting, window=window)
        case Signal.DRAFTS:
            if names.drafts_total is None:
                return None     # TensorRT-LLM: the drafts that proposed position 1; SGLang: none
            return render(COUNT_FROM_COUNTER, counter=names.drafts_total, window=window)
        case Signal.ACCEPTED_PER_POSITION:
            return _per_position(names.accepted_tokens_per_pos_total, names.position_label, window)
        case Signal.DRAFTED_PER_POSITION:
            return _per_position(names.drafted_tokens_per_pos_total, names.position_label, window)
        case Signal.LATEST_DRAFTS:
            if names.drafts_total is None:
                return None
            return render(COUNT_FROM_COUNTER, counter=names.drafts_total, window=latest)
        case Signal.LATEST_ACCEPTED_PER_POSITION:
            return _per_position(names.accepted_tokens_per_pos_total, names.position_label, latest)
        case Signal.LATEST_DRAFTED_PER_POSITION:
            return _per_position(names.drafted_tokens_per_pos_total, names.position_label, latest)


def _per_position(counter: str | None, position_label: str | None, window: str) -> str | None:
    if counter is None or position_label is None:
        return None     # SGLang reports an accept length only
    return render(PER_POSITION_FROM_COUNTER, counter=counter, position=position_label, window=window)


def queries_for(engine: EngineKind, window_seconds: float, selector: str = "") -> list[Query]:
    """Every query of one engine and window, one per signal the engine can answer; `selector` as in `promql`."""
    result = []
    position_label = metric_names(engine).position_label
    for signal in Signal:
        text = promql(signal, engine, window_seconds, selector)
        if text is not None:
            result.append(Query(signal, engine, window_seconds, text,
                                position_label if signal.is_per_position else None, selector))
    return result


# The pods whose series an analysis query reads, per SD and variant, at each slice's instant over the window: the
# series of every metric the queries read, grouped with the pod and the scrape job that wrote them. Checked
# against the pods the operator observed as each SD's (controller/own_pods.py): a series labelled as one SD's from
# a pod that is not its own is ignored. One query per engine and window, as the others; its answer has a series
# per pod, not per bucket.
SERIES_PODS = 'group by ($by, pod, job) ({__name__=~"$names",$matcher})[$range:$step]'
_SELECTED_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)" + re.escape(SELECTOR))
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def series_pods_query(engine: EngineKind, window_seconds: float) -> str:
    """The query of SERIES_PODS for `engine` over `window_seconds`: the metric names are those its queries select."""
    names = sorted({name for query in queries_for(engine, window_seconds)
                    for name in _SELECTED_METRIC.findall(query.promql)})
    step = slice_seconds(window_seconds)
    return Template(SERIES_PODS).substitute(
        by=GROUP_LABELS, names="|".join(names), matcher=SELECTOR.strip("{}"),
        range=promql_duration(window_seconds + step), step=promql_duration(step))


def pinned_selector(namespace: str, name: str, pods: Iterable[str]) -> str:
    """The selector of SD `namespace/name`'s series from `pods` only (names the apiserver gave: DNS names, checked,
    so that nothing else reaches the query). No pods: a regex that matches none."""
    for value in (namespace, name, *pods):
        if not _DNS_NAME.fullmatch(value):
            raise TemplateError(f"{value!r} is not a Kubernetes object name")
    alternatives = "|".join(sorted(pod.replace(".", "\\\\.") for pod in pods)) or "$^"
    return f'{{namespace="{namespace}",specdeploy_io_name="{name}",pod=~"{alternatives}"}}'


def query_group(spec: SpeculativeDeploymentSpec) -> QueryGroup:
    """The queries an SD's sample comes from: its engine's metric names over its window."""
    return QueryGroup(spec.engine.kind, spec.analysis.window)
