"""analysis/queries: strict templates, one query per signal per engine and window, metric names from the tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.analysis.queries import (
    GAUGE_MEAN,
    GROUP_LABELS,
    P99_FROM_HISTOGRAM,
    SELECTOR,
    TemplateError,
    promql_duration,
    queries_for,
    query_group,
    render,
)
from specdeploy.analysis.samples import QueryGroup, Signal
from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.api.units import parse_duration
from specdeploy.engines import metric_names

_METRIC_IN_QUERY = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


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

@pytest.mark.parametrize("engine", list(EngineKind))
def test_every_engine_answers_every_signal_with_one_grouped_query(engine: EngineKind) -> None:
    queries = queries_for(engine, 300)
    assert [q.signal for q in queries] == list(Signal)
    for query in queries:
        assert query.promql.count("(") == query.promql.count(")")
        assert GROUP_LABELS in query.promql
        assert query.promql.count("[5m]") == query.promql.count(SELECTOR) >= 1


@pytest.mark.parametrize("engine", list(EngineKind))
def test_queries_read_only_the_engines_own_metric_names(engine: EngineKind) -> None:
    names = set(metric_names(engine).names())
    for query in queries_for(engine, 60):
        used = {re.sub(r"_bucket$", "", m) for m in _METRIC_IN_QUERY.findall(query.promql)}
        assert used and used <= names, (query.signal, used - names)


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
    assert sum(len(queries_for(g.engine, g.window_seconds)) for g in groups) == len(Signal) * len(EngineKind)
