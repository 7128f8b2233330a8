"""judgment/assembly.py: a cycle's query answers → the Samples the judgment reads, on plain answers (no client)."""

from __future__ import annotations

import math

from specdeploy.api.spec import EngineKind
from specdeploy.judgment.assembly import Answer, Sample, assemble, series_key
from specdeploy.judgment.queries import Query, queries_for
from specdeploy.judgment.samples import QueryError, QueryErrorKind, QueryGroup, SeriesKey, Signal

WINDOW = 300.0
QUERIES = {q.signal: q for q in queries_for(EngineKind.VLLM, WINDOW)}


def sd(variant: str, pod: str = "p0", **extra: str) -> dict[str, str]:
    return {"namespace": "prod", "specdeploy_io_name": "llama", "specdeploy_io_variant": variant, "pod": pod,
            **extra}


def answer(signal: Signal, *series: Sample, error: QueryError | None = None) -> Answer:
    query: Query = QUERIES[signal]
    return Answer(query, None if error is not None else list(series), error, 0.01)


def test_values_are_keyed_by_sd_and_variant_and_foreign_series_are_left_out() -> None:
    samples = assemble([answer(Signal.ACCEPTANCE_RATE, Sample(sd("speculative"), 0.71),
                               Sample({"namespace": "prod", "pod": "other"}, 0.99)),
                        answer(Signal.REQUESTS, Sample(sd("speculative"), 120.0), Sample(sd("control"), 118.0))])
    group = samples.groups[QueryGroup(EngineKind.VLLM, WINDOW)]
    assert set(group.values) == {SeriesKey("prod", "llama", "speculative"), SeriesKey("prod", "llama", "control")}
    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, WINDOW)
    assert (sample.speculative.acceptance_rate, sample.speculative.requests) == (0.71, 120.0)
    assert (sample.control.acceptance_rate, sample.control.requests) == (None, 118.0)
    assert samples.query_count == 2
    assert series_key({"namespace": "prod", "specdeploy_io_name": "llama"}) is None


def test_a_failed_query_is_recorded_for_its_signal_and_the_others_still_count() -> None:
    error = QueryError(Signal.P99_E2E_LATENCY, QueryErrorKind.UNAVAILABLE, "Prometheus at x did not answer")
    samples = assemble([answer(Signal.P99_E2E_LATENCY, error=error),
                        answer(Signal.RUNNING, Sample(sd("speculative"), 4.0))])
    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, WINDOW)
    assert sample.errors == {Signal.P99_E2E_LATENCY: error}
    assert sample.speculative.running == 4.0 and sample.speculative.p99_e2e_latency_seconds is None


def test_positions_count_from_one_and_unlabelled_positions_are_ignored() -> None:
    samples = assemble([answer(Signal.DRAFTS, Sample(sd("speculative"), 100.0)),
                        answer(Signal.ACCEPTED_PER_POSITION, Sample(sd("speculative", position="0"), 80.0),
                               Sample(sd("speculative", position="1"), 50.0), Sample(sd("speculative"), 7.0))])
    counts = samples.for_deployment("prod", "llama", EngineKind.VLLM, WINDOW).speculative.position_counts
    assert counts is not None and counts.drafts == 100.0 and counts.accepted == (80.0, 50.0)


def test_slice_series_are_differenced_per_pod_then_summed_and_non_finite_instants_dropped() -> None:
    t = [1000.0 + 30 * i for i in range(4)]
    # Pod a restarts between the 2nd and 3rd instant (its counter starts again); pod b read NaN at the 4th.
    a = Sample(sd("speculative", "a"), 7.0, ((t[0], 10.0), (t[1], 20.0), (t[2], 3.0), (t[3], 7.0)))
    b = Sample(sd("speculative", "b"), math.nan, ((t[0], 0.0), (t[1], 5.0), (t[2], 9.0), (t[3], math.nan)))
    samples = assemble([answer(Signal.E2E_LATENCY_COUNT_SERIES, a, b)])
    sample = samples.for_deployment("prod", "llama", EngineKind.VLLM, WINDOW)
    points = sample.speculative.points(Signal.E2E_LATENCY_COUNT_SERIES)
    assert [at for at, _ in points] == t[:3]
    increases = [later - earlier for (_, earlier), (_, later) in zip(points, points[1:], strict=False)]
    assert increases == [10.0 + 5.0, 3.0 + 4.0]      # a: +10, then 3 after its restart; b: +5, +4
    assert sample.dropped_instants == 1
