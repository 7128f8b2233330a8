"""judgment/queries: strict templates, one query per signal per engine and window, metric names from the tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.api.units import parse_duration
from specdeploy.engines import metric_names
from specdeploy.judgment.queries import (
    CUMULATIVE_SERIES,
    GAUGE_MEAN,
    GROUP_LABELS,
    MEAN_FROM_HISTOGRAM,
    P99_FROM_HISTOGRAM,
    PER_POSITION_FROM_COUNTER,
    SELECTOR,
    SLICES,
    TemplateError,
    promql,
    promql_duration,
    queries_for,
    query_group,
    render,
    slice_seconds,
)
from specdeploy.judgment.samples import QueryGroup, Signal

_METRIC_IN_QUERY = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
_SUBQUERY = re.compile(r"\)\[([0-9]+(?:ms|s|m|h)):([0-9]+(?:ms|s|m|h))\]$")


def _spec(engine: str, window: str, name: str = "meta-llama/Llama-3.1-8B-Instruct") -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "engine": {"kind": engine},
        "model": {"name": name},
        "speculation": {"method": "ngram"},
        "analysis": {"window": window, "interval": "30s", "baseline": {"mode": "None"}},
    })


# -- strict rendering ------------------------------------------------------------------------------

def test_render_fills_every_variable() -> None:
    text = render(GAUGE_MEAN, gauge="sglang:spec_accept_rate", window="5m")
    assert text == ('avg by (namespace, specdeploy_io_name, specdeploy_io_variant) '
                    '(avg_over_time(sglang:spec_accept_rate{specdeploy_io_name!=""}[5m]))')


@pytest.mark.parametrize(("variables", "complaint"), [
    ({"window": "5m"}, "missing ['gauge']"),
    ({"gauge": "x", "window": "5m", "typo": "y"}, "not used ['typo']"),
    ({"gauge": "x", "window": "five minutes"}, "must be a PromQL duration"),
    ({"gauge": 'x{a="b"} or vector(1)', "window": "5m"}, "must be a Prometheus metric name"),
    ({"gauge": "x", "window": "5m]) or vector(1"}, "must be a PromQL duration"),
])
def test_render_refuses_mismatched_or_unsafe_variables(variables: dict[str, str], complaint: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(complaint)):
        render(GAUGE_MEAN, **variables)


def test_render_refuses_a_stray_dollar() -> None:
    with pytest.raises(TemplateError, match="not a variable"):
        render("sum($) + $gauge", gauge="x")


# -- durations ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (300, "5m"), (3600, "1h"), (5400, "90m"), (90, "90s"), (30, "30s"), (1.5, "1500ms"), (86400, "24h"),
])
def test_promql_duration_uses_one_unit(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10**9))
def test_promql_duration_says_the_same_time(millis: int) -> None:
    assert parse_duration(promql_duration(millis / 1000)) == pytest.approx(millis / 1000)


@pytest.mark.parametrize("seconds", [0, -5])
def test_promql_duration_refuses_empty_windows(seconds: float) -> None:
    with pytest.raises(ValueError, match="longer than 0"):
        promql_duration(seconds)


# -- the queries ----------------------------------------------------------------------------------

ENGINE_TIME = {Signal.PREFILL_TIME_SUM_SERIES, Signal.PREFILL_TIME_COUNT_SERIES, Signal.INFERENCE_TIME_SUM_SERIES,
               Signal.INFERENCE_TIME_COUNT_SERIES}
"""vLLM's own histograms of the time without the queue; SGLang and TensorRT-LLM are judged on TTFT (E2E) − queue."""

PER_POSITION = {
    EngineKind.VLLM: {Signal.DRAFTS, Signal.ACCEPTED_PER_POSITION, Signal.LATEST_DRAFTS,
                      Signal.LATEST_ACCEPTED_PER_POSITION},
    EngineKind.TRTLLM: {Signal.ACCEPTED_PER_POSITION, Signal.DRAFTED_PER_POSITION, Signal.LATEST_ACCEPTED_PER_POSITION,
                        Signal.LATEST_DRAFTED_PER_POSITION},
    EngineKind.SGLANG: set(),
}
"""The calibration's evidence per engine, over the window and its latest slice: vLLM counts drafts as a whole,
TensorRT-LLM per position, SGLang not at all."""
CALIBRATION = {Signal.DRAFTS, Signal.ACCEPTED_PER_POSITION, Signal.DRAFTED_PER_POSITION, Signal.LATEST_DRAFTS,
               Signal.LATEST_ACCEPTED_PER_POSITION, Signal.LATEST_DRAFTED_PER_POSITION}
LATEST = {Signal.LATEST_DRAFTS, Signal.LATEST_ACCEPTED_PER_POSITION, Signal.LATEST_DRAFTED_PER_POSITION}


def _answered(engine: EngineKind) -> list[Signal]:
    return [s for s in Signal if (engine == EngineKind.VLLM or s not in ENGINE_TIME)
            and (s not in CALIBRATION or s in PER_POSITION[engine])]


@pytest.mark.parametrize("engine", list(EngineKind))
def test_every_engine_answers_every_signal_with_one_grouped_query(engine: EngineKind) -> None:
    queries = queries_for(engine, 300)
    assert [q.signal for q in queries] == _answered(engine)
    for query in queries:
        assert query.promql.count("(") == query.promql.count(")")
        assert GROUP_LABELS in query.promql
        if query.signal.is_series:        # a cumulative counter at instants over the window: no range of its own
            assert query.promql.endswith(")[330s:30s]") and "[5m]" not in query.promql
            assert query.promql.count(SELECTOR) == 1
        elif query.signal == Signal.PODS:   # the pods reporting now
            assert "[" not in query.promql and query.promql.count(SELECTOR) == 1
        elif query.signal in LATEST:        # the window's latest slice
            assert query.promql.count("[30s]") == query.promql.count(SELECTOR) == 1
        else:
            assert query.promql.count("[5m]") == query.promql.count(SELECTOR) >= 1


def _base_name(metric: str, names: set[str]) -> str:
    """A histogram's series (`_bucket`, `_sum`, `_count`) as the histogram's name in the engine's table."""
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric.removesuffix(suffix) in names:
            return metric.removesuffix(suffix)
    return metric


@pytest.mark.parametrize("engine", list(EngineKind))
def test_queries_read_only_the_engines_own_metric_names(engine: EngineKind) -> None:
    names = set(metric_names(engine).names())
    for query in queries_for(engine, 60):
        used = {_base_name(m, names) for m in _METRIC_IN_QUERY.findall(query.promql)}
        assert used and used <= names, (query.signal, used - names)


@pytest.mark.parametrize("engine", list(EngineKind))
def test_histogram_series_are_the_ones_prometheus_has(engine: EngineKind) -> None:
    """A histogram exposes `<name>_bucket`, `_sum` and `_count`, never the bare name."""
    names = metric_names(engine)
    histograms = {names.time_per_output_token, names.e2e_request_latency, names.time_to_first_token,
                  names.request_queue_time} - {None}
    for query in queries_for(engine, 300):
        for metric in _METRIC_IN_QUERY.findall(query.promql):
            assert metric not in histograms, (query.signal, metric)


@pytest.mark.parametrize(("signal", "histogram"), [
    (Signal.MEAN_INTER_TOKEN_LATENCY, "vllm:request_time_per_output_token_seconds"),
    (Signal.MEAN_E2E_LATENCY, "vllm:e2e_request_latency_seconds"),
    (Signal.MEAN_TIME_TO_FIRST_TOKEN, "vllm:time_to_first_token_seconds"),
    (Signal.MEAN_QUEUE_TIME, "vllm:request_queue_time_seconds"),
])
def test_means_are_sum_over_count_of_the_histogram_not_its_buckets(signal: Signal, histogram: str) -> None:
    text = promql(signal, EngineKind.VLLM, 300)
    assert text == render(MEAN_FROM_HISTOGRAM, histogram=histogram, window="5m")
    assert text == (f"sum by ({GROUP_LABELS}) (rate({histogram}_sum{SELECTOR}[5m]))"
                    f" / sum by ({GROUP_LABELS}) (rate({histogram}_count{SELECTOR}[5m]))")
    assert "_bucket" not in text and "histogram_quantile" not in text


@pytest.mark.parametrize(("signal", "series"), [
    (Signal.INTER_TOKEN_LATENCY_SUM_SERIES, "vllm:request_time_per_output_token_seconds_sum"),
    (Signal.INTER_TOKEN_LATENCY_COUNT_SERIES, "vllm:request_time_per_output_token_seconds_count"),
    (Signal.E2E_LATENCY_SUM_SERIES, "vllm:e2e_request_latency_seconds_sum"),
    (Signal.E2E_LATENCY_COUNT_SERIES, "vllm:e2e_request_latency_seconds_count"),
    (Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES, "vllm:time_to_first_token_seconds_sum"),
    (Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES, "vllm:time_to_first_token_seconds_count"),
])
def test_slice_series_are_each_pods_cumulative_counter_at_instants(signal: Signal, series: str) -> None:
    """No rate(): per pod (a restart resets one pod's counter), the differences of consecutive points are the
    slices; the operator sums them over pods afterwards."""
    assert signal.is_series
    text = promql(signal, EngineKind.VLLM, 300)
    assert text == f"sum by ({GROUP_LABELS}, pod) ({series}{SELECTOR})[330s:30s]"
    assert text == render(CUMULATIVE_SERIES, counter=series, range="330s", step="30s")
    assert "rate(" not in text and "increase(" not in text


@pytest.mark.parametrize(("window", "step", "subquery"), [
    (300, 30.0, "[330s:30s]"), (60, 6.0, "[66s:6s]"), (90, 9.0, "[99s:9s]"), (3600, 360.0, "[66m:6m]"),
    (1, 0.1, "[1100ms:100ms]"), (45, 4.5, "[49500ms:4500ms]"),
])
def test_a_window_is_cut_into_slices_points_one_step_apart(window: float, step: float, subquery: str) -> None:
    assert slice_seconds(window) == step
    [query] = [q for q in queries_for(EngineKind.SGLANG, window) if q.signal == Signal.E2E_LATENCY_COUNT_SERIES]
    assert query.promql.endswith(subquery)


def _span_and_step(window: float) -> tuple[float, float]:
    [query] = [q for q in queries_for(EngineKind.VLLM, window) if q.signal == Signal.INTER_TOKEN_LATENCY_SUM_SERIES]
    match = _SUBQUERY.search(query.promql)
    assert match is not None, query.promql
    return parse_duration(match.group(1)), parse_duration(match.group(2))


@given(st.integers(min_value=1, max_value=86_400))
def test_the_subquery_spans_the_window_plus_one_step_so_it_holds_slices_plus_one_points(seconds: int) -> None:
    span, step = _span_and_step(seconds)
    assert step == pytest.approx(seconds / SLICES) and step > 0
    assert span == pytest.approx(seconds + step)
    assert span / step == pytest.approx(SLICES + 1)


@given(st.integers(min_value=1000, max_value=86_400_000))
def test_a_window_of_any_milliseconds_still_gets_about_slices_steps(millis: int) -> None:
    """The step is whole milliseconds (PromQL has no finer unit), so the points are SLICES + 1 within rounding."""
    window = millis / 1000
    span, step = _span_and_step(window)
    assert step == pytest.approx(slice_seconds(window)) and abs(step - window / SLICES) <= 0.0005 + 1e-9
    assert span == pytest.approx(window + step)
    assert span / step == pytest.approx(SLICES + 1, rel=0.01)


@pytest.mark.parametrize("signal", [s for s in Signal if not s.is_series])
def test_only_the_slice_series_are_answered_by_a_range(signal: Signal) -> None:
    text = promql(signal, EngineKind.TRTLLM, 300) or promql(signal, EngineKind.VLLM, 300)
    assert text is not None and _SUBQUERY.search(text) is None


@pytest.mark.parametrize(("engine", "signal", "text"), [
    (EngineKind.VLLM, Signal.DRAFTS,
     f"sum by ({GROUP_LABELS}) (increase(vllm:spec_decode_num_drafts_total{SELECTOR}[5m]))"),
    (EngineKind.VLLM, Signal.ACCEPTED_PER_POSITION,
     f"sum by ({GROUP_LABELS}, position) "
     f"(increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{SELECTOR}[5m]))"),
    (EngineKind.TRTLLM, Signal.ACCEPTED_PER_POSITION,
     f"sum by ({GROUP_LABELS}, token_position) (increase(trtllm_spec_decode_accepted_tokens_total{SELECTOR}[5m]))"),
    (EngineKind.TRTLLM, Signal.DRAFTED_PER_POSITION,
     f"sum by ({GROUP_LABELS}, token_position) (increase(trtllm_spec_decode_drafted_tokens_total{SELECTOR}[5m]))"),
    (EngineKind.VLLM, Signal.LATEST_DRAFTS,
     f"sum by ({GROUP_LABELS}) (increase(vllm:spec_decode_num_drafts_total{SELECTOR}[30s]))"),
    (EngineKind.TRTLLM, Signal.LATEST_DRAFTED_PER_POSITION,
     f"sum by ({GROUP_LABELS}, token_position) (increase(trtllm_spec_decode_drafted_tokens_total{SELECTOR}[30s]))"),
])
def test_the_calibration_reads_counts_per_position_over_the_window(engine: EngineKind, signal: Signal,
                                                                     text: str) -> None:
    """Counts (increase), not rates: the calibration states each position's binomial uncertainty from them."""
    assert promql(signal, engine, 300) == text
    [query] = [q for q in queries_for(engine, 300) if q.signal == signal]
    assert query.position_label == (metric_names(engine).position_label if signal.is_per_position else None)


def test_sglang_has_no_counts_per_position() -> None:
    assert {s for s in CALIBRATION if promql(s, EngineKind.SGLANG, 300) is not None} == set()


def test_a_position_label_is_checked_to_be_a_label_name() -> None:
    with pytest.raises(TemplateError, match="must be a Prometheus label name"):
        render(PER_POSITION_FROM_COUNTER, counter="x", position="vllm:position", window="5m")


def test_pods_count_the_series_of_the_running_gauge() -> None:
    assert promql(Signal.PODS, EngineKind.VLLM, 300) == (
        f"count by ({GROUP_LABELS}) (vllm:num_requests_running{SELECTOR})")


@pytest.mark.parametrize(("variables", "complaint"), [
    ({"counter": "x", "range": "330s", "step": "30 s"}, "'step' must be a PromQL duration"),
    ({"counter": "x", "range": "5m:1s]) or vector(1", "step": "30s"}, "'range' must be a PromQL duration"),
    ({"counter": "x", "range": "330s"}, "missing ['step']"),
])
def test_subquery_durations_are_checked_like_the_window(variables: dict[str, str], complaint: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(complaint)):
        render(CUMULATIVE_SERIES, **variables)


@pytest.mark.parametrize(("engine", "fragment"), [
    (EngineKind.VLLM, "rate(vllm:spec_decode_num_accepted_tokens_total"),     # counters
    (EngineKind.TRTLLM, "rate(trtllm_spec_decode_num_accepted_tokens_total"),
    (EngineKind.SGLANG, "avg_over_time(sglang:spec_accept_rate"),             # SGLang only has a gauge
])
def test_acceptance_rate_uses_counters_where_the_engine_has_them(engine: EngineKind, fragment: str) -> None:
    [query] = [q for q in queries_for(engine, 300) if q.signal == Signal.ACCEPTANCE_RATE]
    assert fragment in query.promql


def test_mean_acceptance_length_is_one_plus_accepted_per_draft_on_vllm() -> None:
    [query] = [q for q in queries_for(EngineKind.VLLM, 300) if q.signal == Signal.MEAN_ACCEPTANCE_LENGTH]
    assert query.promql.startswith("1 + ")
    assert "vllm:spec_decode_num_drafts_total" in query.promql


def test_trtllm_inter_token_latency_is_time_per_output_token() -> None:
    [query] = [q for q in queries_for(EngineKind.TRTLLM, 300) if q.signal == Signal.P99_INTER_TOKEN_LATENCY]
    assert query.promql == render(P99_FROM_HISTOGRAM, histogram="trtllm_time_per_output_token_seconds", window="5m")


def test_the_number_of_queries_does_not_grow_with_the_number_of_sds() -> None:
    specs = [_spec(engine, window) for engine in ("vllm", "sglang", "trtllm") for window in ("5m", "300s")] * 400
    groups = {query_group(spec) for spec in specs}
    assert groups == {QueryGroup(EngineKind.VLLM, 300.0), QueryGroup(EngineKind.SGLANG, 300.0),
                      QueryGroup(EngineKind.TRTLLM, 300.0)}
    assert sum(len(queries_for(g.engine, g.window_seconds)) for g in groups) == (
        (len(Signal) - len(CALIBRATION)) * len(EngineKind) - len(ENGINE_TIME) * 2
        + sum(len(signals) for signals in PER_POSITION.values()))
