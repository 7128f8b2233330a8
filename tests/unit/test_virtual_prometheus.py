"""benchmarks/virtual_prometheus.py: PromQL with Prometheus' semantics on hand-made series with known answers,
and the operator's own queries over a scraped simulator."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from benchmark_modules import load_virtual_prometheus

from specdeploy.api.spec import EngineKind
from specdeploy.clients.prometheus import PrometheusBadQuery, PrometheusBadResponse, query_all
from specdeploy.judgment.queries import queries_for
from specdeploy.judgment.samples import QueryGroup, Signal

vp = load_virtual_prometheus()
T0 = 1_749_999_600.0   # a multiple of an hour, so step alignment is easy to read


def prometheus(**options: Any) -> Any:
    return vp.VirtualPrometheus(**options)


def add(p: Any, labels: dict[str, str], points: list[tuple[float, float | None]]) -> None:
    for at, value in points:
        p.storage.add(labels, T0 + at, value)


def query(p: Any, promql: str, at: float) -> list[Any]:
    return asyncio.run(p.query(promql, T0 + at))


def one(p: Any, promql: str, at: float) -> float:
    result = query(p, promql, at)
    assert len(result) == 1, result
    value: float = result[0].value
    return value


# --- rate and increase: promql/functions.go extrapolatedRate ------------------------------------------------

def test_increase_extrapolates_to_the_window_edges_when_samples_are_near_them() -> None:
    p = prometheus()
    add(p, {"__name__": "x_total"}, [(5 + 10 * i, 100 + 10 * i) for i in range(6)])   # 5..55 s: 100..150
    # 50 s sampled, 5 s to each edge (< 1.1 × the 10 s spacing): ×60/50.
    assert one(p, "increase(x_total[1m])", 60) == pytest.approx(60.0)
    assert one(p, "rate(x_total[1m])", 60) == pytest.approx(1.0)


def test_a_counter_is_not_extrapolated_below_zero() -> None:
    p = prometheus()
    add(p, {"__name__": "x_total"}, [(5 + 10 * i, 10 * i) for i in range(6)])          # 0..50: starts at 0
    # The zero point is at the first sample, so only the end is extrapolated: 50 × 55/50.
    assert one(p, "increase(x_total[1m])", 60) == pytest.approx(55.0)


def test_a_series_that_starts_inside_the_window_is_extrapolated_by_half_a_spacing() -> None:
    p = prometheus()
    add(p, {"__name__": "x_total"}, [(35, 100), (45, 110), (55, 120)])
    # 35 s to the start is more than 1.1 × 10 s: 5 s (half a spacing) at the start, 5 s to the end.
    assert one(p, "increase(x_total[1m])", 60) == pytest.approx(20 * 30 / 20)


def test_counter_resets_add_the_value_before_the_reset() -> None:
    p = prometheus()
    add(p, {"__name__": "x_total"}, [(25, 100), (35, 110), (45, 5), (55, 15)])
    # 15 − 100 + 110 = 25 over 30 s; 5 s extrapolated at each end.
    assert one(p, "increase(x_total[1m])", 60) == pytest.approx(25 * 40 / 30)


def test_rate_needs_two_samples_in_the_window() -> None:
    p = prometheus()
    add(p, {"__name__": "x_total"}, [(5, 1), (55, 2)])
    assert query(p, "rate(x_total[30s])", 60) == []
    assert len(query(p, "rate(x_total[1m])", 60)) == 1


def test_ranges_are_left_open_in_prometheus_3_and_closed_in_2() -> None:
    add(p3 := prometheus(), {"__name__": "g"}, [(0, 1), (30, 2), (60, 3)])
    add(p2 := prometheus(version=2), {"__name__": "g"}, [(0, 1), (30, 2), (60, 3)])
    assert one(p3, "avg_over_time(g[1m])", 60) == pytest.approx(2.5)    # (0, 60]
    assert one(p2, "avg_over_time(g[1m])", 60) == pytest.approx(2.0)    # [0, 60]


def test_prometheus_2_cuts_at_the_zero_point_before_the_threshold_and_3_after() -> None:
    # 16 over 20 s sampled; 40 s to the range start (over 1.1 × the 10 s spacing); the zero point 10 s before the
    # first sample. v2: min(40, 10) = 10 is under the threshold: 10 s. v3: 40 s is over it: 5 s, then min(5, 10).
    for version, expected in ((2, 16 * 30 / 20), (3, 16 * 25 / 20)):
        add(p := prometheus(version=version), {"__name__": "x_total"}, [(40, 8.0), (50, 16.0), (60, 24.0)])
        assert one(p, "increase(x_total[1m])", 60) == pytest.approx(expected)


# --- histogram_quantile: promql/quantile.go bucketQuantile ---------------------------------------------------

def histogram(p: Any, counts: dict[str, list[float]], labels: dict[str, str] | None = None) -> None:
    """Cumulative bucket counters at 0, 10, 20 … s."""
    for le, values in counts.items():
        add(p, {"__name__": "h_bucket", "le": le, **(labels or {})}, [(10 * i, v) for i, v in enumerate(values)])


def test_a_quantile_in_the_first_bucket_interpolates_from_zero() -> None:
    p = prometheus()
    histogram(p, {"0.01": [0, 100, 200], "0.025": [0, 100, 200], "+Inf": [0, 100, 200]})
    q = "histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))"
    assert one(p, q, 25) == pytest.approx(0.0099)    # 0 + 0.01 × 0.99


def test_a_quantile_in_the_inf_bucket_is_the_last_finite_bound() -> None:
    p = prometheus()
    histogram(p, {"0.01": [0, 0, 0], "0.025": [0, 1, 2], "+Inf": [0, 100, 200]})
    assert one(p, "histogram_quantile(0.5, sum by (le) (rate(h_bucket[1m])))", 25) == pytest.approx(0.025)


def test_a_quantile_interpolates_inside_its_bucket() -> None:
    p = prometheus()
    histogram(p, {"0.1": [0, 50], "0.2": [0, 90], "+Inf": [0, 100]})
    # rank 0.75 × 100 = 75: 25 of the 40 in (0.1, 0.2].
    assert one(p, "histogram_quantile(0.75, rate(h_bucket[1m]))", 15) == pytest.approx(0.1 + 0.1 * 25 / 40)


def test_a_histogram_without_observations_is_nan() -> None:
    p = prometheus()
    histogram(p, {"0.01": [5, 5, 5], "+Inf": [7, 7, 7]})
    assert math.isnan(one(p, "histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))", 25))


def test_histogram_quantile_groups_by_every_label_but_le() -> None:
    p = prometheus()
    histogram(p, {"1": [0, 10], "+Inf": [0, 10]}, {"variant": "a"})
    histogram(p, {"1": [0, 0], "+Inf": [0, 10]}, {"variant": "b"})
    result = query(p, "histogram_quantile(0.5, sum by (le, variant) (rate(h_bucket[1m])))", 15)
    by_variant = {s.labels["variant"]: s.value for s in result}
    assert by_variant == {"a": pytest.approx(0.5), "b": 1.0}


# --- subqueries: steps at absolute multiples of the step ------------------------------------------------------

def test_subquery_steps_are_aligned_to_multiples_of_the_step() -> None:
    p = prometheus()
    add(p, {"__name__": "c"}, [(2 + 5 * i, 2 + 5 * i) for i in range(40)])   # every 5 s from 2 s, value = time
    result = query(p, "c[60s:30s]", 100)       # range (40, 100]: steps at 60 and 90
    assert len(result) == 1
    points = result[0].points
    assert [t - T0 for t, _ in points] == [60, 90]
    assert [v for _, v in points] == [57, 87]   # the newest sample at or before each step
    assert result[0].value == 87


def test_a_step_on_the_range_start_is_outside_in_prometheus_3_and_inside_in_2() -> None:
    for options, expected in (({}, [90, 120]), ({"version": 2}, [60, 90, 120])):
        p = prometheus(**options)
        add(p, {"__name__": "c"}, [(2 + 5 * i, 1.0) for i in range(40)])
        points = query(p, "c[60s:30s]", 120)[0].points
        assert [t - T0 for t, _ in points] == expected


def test_the_operators_cumulative_series_have_slices_plus_one_points() -> None:
    p = prometheus()
    add(p, {"__name__": "x_sum", "specdeploy_io_name": "sd", "namespace": "n", "specdeploy_io_variant": "speculative"},
        [(3 + 5 * i, float(i)) for i in range(100)])
    series = next(q for q in queries_for(EngineKind.VLLM, 300.0) if q.signal == Signal.E2E_LATENCY_COUNT_SERIES)
    promql = series.promql.replace("vllm:e2e_request_latency_seconds_count", "x_sum")
    for at, count in ((450.0, 11), (451.0, 11)):
        assert len(query(p, promql, at)[0].points) == count


# --- vectors, matching, NaN ----------------------------------------------------------------------------------

def test_zero_over_zero_is_nan_and_a_ratio_matches_on_all_labels_but_the_name() -> None:
    p = prometheus()
    for variant, moving in (("speculative", True), ("control", False)):
        labels = {"variant": variant}
        add(p, {"__name__": "accepted_total", **labels}, [(10 * i, 5.0 * i if moving else 0.0) for i in range(7)])
        add(p, {"__name__": "drafted_total", **labels}, [(10 * i, 10.0 * i if moving else 0.0) for i in range(7)])
    q = ("sum by (variant) (rate(accepted_total[1m])) / sum by (variant) (rate(drafted_total[1m]))")
    result = {s.labels["variant"]: s.value for s in query(p, q, 60)}
    assert result["speculative"] == pytest.approx(0.5)
    assert math.isnan(result["control"])
    lengths = query(p, "1 + sum by (variant) (rate(accepted_total[1m])) / sum by (variant) (rate(drafted_total[1m]))", 60)
    assert {s.labels["variant"]: round(s.value, 6) for s in lengths if not math.isnan(s.value)} == {"speculative": 1.5}


def test_division_by_zero_and_name_dropping() -> None:
    p = prometheus()
    add(p, {"__name__": "a", "k": "1"}, [(0, 3.0)])
    add(p, {"__name__": "b", "k": "1"}, [(0, 0.0)])
    result = query(p, "a / b", 10)
    assert result[0].value == math.inf and "__name__" not in result[0].labels
    assert query(p, "a", 10)[0].labels["__name__"] == "a"
    assert one(p, "1 + a / a", 10) == 2.0                 # `/` binds tighter than `+`
    assert query(p, "1 + b / b", 10)[0].labels == {"k": "1"} and math.isnan(one(p, "1 + b / b", 10))


def test_parse_errors_and_scalar_answers_are_the_clients_errors() -> None:
    p = prometheus()
    with pytest.raises(PrometheusBadQuery, match="400"):
        query(p, "sum by (a (x)", 0)
    with pytest.raises(PrometheusBadQuery, match="422"):
        query(p, "rate(x_total)", 0)
    with pytest.raises(PrometheusBadResponse, match="scalar"):
        query(p, "1 + 1", 0)


def test_aggregations_and_matchers() -> None:
    p = prometheus()
    for pod, value in (("a", 1.0), ("b", 2.0), ("c", 6.0)):
        add(p, {"__name__": "g", "pod": pod, "sd": "x"}, [(0, value)])
    add(p, {"__name__": "h", "pod": "a", "sd": ""}, [(0, 5.0)])
    assert one(p, "sum by (sd) (g)", 10) == 9.0
    assert query(p, "sum by (sd) (g)", 10)[0].labels == {"sd": "x"}
    assert one(p, "count by (sd) (g)", 10) == 3.0
    assert one(p, "avg by (sd) (g)", 10) == 3.0
    assert one(p, 'sum by (sd) (g{pod=~"a|b"})', 10) == 3.0
    assert one(p, 'sum by (sd) (g{pod!="a"})', 10) == 8.0
    pods = query(p, 'group by (sd, pod) ({__name__=~"g|h",sd!=""})', 10)
    assert sorted((s.labels["pod"], s.value) for s in pods) == [("a", 1.0), ("b", 1.0), ("c", 1.0)]


# --- scraping and staleness ---------------------------------------------------------------------------------

EXPOSITION = """# HELP t_total A counter.
# TYPE t_total counter
t_total{model_name="m",namespace="exposed"} 3
# TYPE h histogram
h_bucket{le="0.5"} 1
h_bucket{le="+Inf"} 2
h_sum 0.7
h_count 2
"""


def test_scrapes_add_target_labels_and_keep_colliding_ones_as_exported() -> None:
    p = prometheus()
    target = p.add_target({"namespace": "n", "pod": "p1"}, lambda: EXPOSITION)
    p.scrape(target, T0 + 5)
    sample = query(p, "t_total", 10)[0]
    assert sample.labels == {"__name__": "t_total", "model_name": "m", "namespace": "n",
                             "exported_namespace": "exposed", "pod": "p1"}
    assert one(p, 'h_bucket{le="+Inf"}', 10) == 2.0
    assert one(p, "up", 10) == 1.0


def test_series_go_stale_when_their_target_is_removed_and_after_the_lookback() -> None:
    p = prometheus()
    target = p.add_target({"pod": "p1"}, lambda: EXPOSITION)
    for at in (0, 5, 10):
        p.scrape(target, T0 + at)
    assert len(query(p, "t_total", 12)) == 1
    assert len(query(p, "t_total", 10 + 299)) == 1          # within the 5m lookback
    assert query(p, "t_total", 10 + 300) == []              # (t − 5m, t]: gone
    p.remove_target(target, T0 + 15)
    assert query(p, "t_total", 16) == []                    # stale marker
    assert len(query(p, "t_total", 14)) == 1
    assert len(query(p, "t_total[1m]", 20)[0].points) == 3  # ranges skip the stale marker


def test_the_operators_queries_over_a_scraped_simulator() -> None:
    """Every query of a cycle parses and answers for both variants of a vLLM SD the simulator serves."""
    from specdeploy.planning.gpus import find_gpu
    from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, Workload
    from specdeploy_engine.sim.argv import parse_engine_argv
    from specdeploy_engine.sim.engine import Engine, SimRequest
    from specdeploy_engine.sim.metrics import engine_metrics
    from specdeploy_engine.sim.model import served_model

    gpu = find_gpu("H100-80GB")
    assert gpu is not None
    eagle3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'
    p = prometheus()
    for index, (variant, extra) in enumerate((("speculative", ["--speculative-config", eagle3]), ("control", []))):
        argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", *extra]
        served = served_model(parse_engine_argv(argv, gpu=gpu), gpu)
        metrics = engine_metrics(served)
        engine = Engine(served, seed=index, observer=metrics)
        target = p.add_target({"namespace": "n", "pod": f"p{index}", "specdeploy_io_name": "sd",
                               "specdeploy_io_variant": variant}, metrics.render, offset=1.5 + index)
        planned = Workload(QpsSchedule.constant(2), Lengths.parse("100"), Lengths.parse("50")).plan(60, seed=index)
        now, arrived, pending, due = 0.0, 0, None, 0.0
        for scrape_at in p.scrape_times(target, 5.0, 0.0, 60.0):
            while True:   # every step that ends by the scrape, then the scrape
                if pending is None:
                    while arrived < len(planned) and planned[arrived].at <= now:
                        item = planned[arrived]
                        engine.add(SimRequest(f"r{arrived}", item.at, item.prompt_tokens, item.output_tokens), now)
                        arrived += 1
                    pending = engine.plan_step(now)
                    if pending is None:
                        if arrived >= len(planned) or planned[arrived].at > scrape_at:
                            break
                        now = planned[arrived].at
                        continue
                    due = now + pending.seconds
                if due > scrape_at:
                    break
                now = due
                engine.complete_step(pending, now)
                pending = None
            p.scrape(target, T0 + scrape_at)
    samples = asyncio.run(query_all(p, [QueryGroup(EngineKind.VLLM, 60.0)], at=T0 + 60))
    group = samples.groups[QueryGroup(EngineKind.VLLM, 60.0)]
    assert not group.errors
    sample = samples.for_deployment("n", "sd", EngineKind.VLLM, 60.0)
    assert sample.speculative.acceptance_rate is not None and 0.45 < sample.speculative.acceptance_rate < 0.7
    assert sample.control.acceptance_rate is None                   # the control does not speculate
    for values in (sample.speculative, sample.control):
        assert values.requests is not None and 80 < values.requests < 160   # ~2 QPS × 60 s, extrapolated
        assert values.pods == 1.0
        assert values.p99_e2e_latency_seconds is not None and values.p99_e2e_latency_seconds > 0
        # Steps of 6 s at T0 + 0, 6 … 60; nothing was scraped yet at T0 + 0, so that step has no point.
        assert len(values.points(Signal.E2E_LATENCY_COUNT_SERIES)) == 10
