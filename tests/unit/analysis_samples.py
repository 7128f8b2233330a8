"""Analysis samples for tests: the signals of both variants with the slice series the paired comparison reads.

    sample(0.8, itl=0.012, control_itl=0.02)     # speculation 40% faster per token than the control

The series are cumulative `_sum` / `_count` points at SLICES + 1 instants SLICE_SECONDS apart, as the
CUMULATIVE_SERIES subqueries answer them; each slice's mean wobbles a little (JITTER), differently in the
two variants, so the per-slice ratios have a spread and the interval a width.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from specdeploy.judgment.samples import DeploymentSample, Points, Signal, SignalValues

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
SLICES = 10
SLICE_SECONDS = 30.0
START = T0.timestamp() - SLICES * SLICE_SECONDS
JITTER = (0.03, -0.02, 0.01, -0.03, 0.02, 0.0, -0.01, 0.03, -0.02, 0.01)
"""Each slice's mean latency is the variant's mean × (1 + jitter): the per-slice ratios differ (the stdev of
their logs is not 0), as in any real window. The control gets the pattern reversed."""

_PAIRS = (
    (Signal.INTER_TOKEN_LATENCY_SUM_SERIES, Signal.INTER_TOKEN_LATENCY_COUNT_SERIES),
    (Signal.E2E_LATENCY_SUM_SERIES, Signal.E2E_LATENCY_COUNT_SERIES),
    (Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES, Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES),
)


def cumulative(mean: float, requests: float, jitter: Sequence[float]) -> tuple[Points, Points]:
    """A histogram's cumulative `_sum` and `_count` at SLICES + 1 instants SLICE_SECONDS apart (the counters had
    run before the window): `requests` spread evenly over the slices, slice i's mean `mean` × (1 + jitter[i])."""
    count = 10_000.0
    total = count * mean
    sums, counts = [(START, total)], [(START, count)]
    for i, wobble in enumerate(jitter):
        count += requests / SLICES
        total += requests / SLICES * mean * (1 + wobble)
        sums.append((START + SLICE_SECONDS * (i + 1), total))
        counts.append((START + SLICE_SECONDS * (i + 1), count))
    return tuple(sums), tuple(counts)


_ENGINE_PAIRS = (
    (Signal.INFERENCE_TIME_SUM_SERIES, Signal.INFERENCE_TIME_COUNT_SERIES),
    (Signal.PREFILL_TIME_SUM_SERIES, Signal.PREFILL_TIME_COUNT_SERIES),
    (Signal.QUEUE_TIME_SUM_SERIES, Signal.QUEUE_TIME_COUNT_SERIES),
)
OUTPUT_TOKENS = 200


def token_counter(per_second: float, jitter: Sequence[float]) -> Points:
    """A generation-tokens counter at the slice instants: `per_second` tokens a second, slice i × (1 + jitter[i])."""
    total, points = 1e6, [(START, 1e6)]
    for i, wobble in enumerate(jitter):
        total += per_second * SLICE_SECONDS * (1 + wobble)
        points.append((START + SLICE_SECONDS * (i + 1), total))
    return tuple(points)


def variant(itl: float, requests: float, jitter: Sequence[float], ttft: float = 0.2, queue: float = 0.01,
            pods: float = 1.0, waiting: float = 0.0, tokens_per_second: float | None = None,
            **values: Any) -> SignalValues:
    """One variant's signals: mean per-token latency `itl`, OUTPUT_TOKENS output tokens a request, mean queue time
    `queue` (inside `ttft`), the slice series of every latency (with and without the queue), the generation-tokens
    counter (by default what `requests` over the window make) and, for display, P99s and the means."""
    e2e = ttft + OUTPUT_TOKENS * itl
    series: dict[Signal, Points] = {}
    for (sums, counts), mean in zip(_PAIRS, (itl, e2e, ttft), strict=True):
        series[sums], series[counts] = cumulative(mean, requests, jitter)
    for (sums, counts), mean in zip(_ENGINE_PAIRS, (e2e - queue, ttft - queue, queue), strict=True):
        series[sums], series[counts] = cumulative(mean, requests, jitter)
    rate = tokens_per_second if tokens_per_second is not None else requests * OUTPUT_TOKENS / (SLICES * SLICE_SECONDS)
    series[Signal.OUTPUT_TOKENS_SERIES] = token_counter(rate, jitter)
    return SignalValues(
        mean_inter_token_latency_seconds=itl, mean_e2e_latency_seconds=e2e, mean_time_to_first_token_seconds=ttft,
        mean_queue_time_seconds=queue, p99_inter_token_latency_seconds=2 * itl, p99_e2e_latency_seconds=2 * e2e,
        p99_time_to_first_token_seconds=2 * ttft, requests=requests, pods=pods, waiting=waiting,
        output_tokens_per_second=rate, series=series, **values)


def sample(acceptance: float, requests: float = 500, itl: float = 0.02, control_itl: float = 0.02,
           k: int = 3, **speculative: Any) -> DeploymentSample:
    """A 5-minute sample: the speculative pods with `acceptance` (and the mean acceptance length it means at `k`)
    and mean per-token latency `itl`, the control with `control_itl` and half the requests."""
    values = {"acceptance_rate": acceptance, "mean_acceptance_length": 1 + k * acceptance, **speculative}
    return DeploymentSample(
        window_seconds=300,
        speculative=variant(itl, requests, JITTER, **values),
        control=variant(control_itl, requests / 2, JITTER[::-1]),
    )
