"""Speculative ÷ baseline mean latency with a 95% interval: the paired comparison the latency checks decide on.

    comparison = paired_ratio(slices(spec_sums, spec_counts), slices(control_sums, control_counts))
    comparison.ratio, comparison.low, comparison.high      # 1.18, 1.09, 1.27: +18% (95% interval +9…+27%)

Why means and slices. vLLM's per-token histograms start at 10 ms and the next bucket is 2.5× wider
(FACTS.md "vLLM histogram buckets"): a P99 below 10 ms is an upper bound and above it an interpolation
across a wide bucket, and a ratio of two P99s has no notion of how many requests stand behind it. A
histogram's `_sum` ÷ `_count` is exact at any latency. Its uncertainty comes from the window cut into
SLICES slices (judgment/queries.py CUMULATIVE_SERIES): each slice gives one mean per variant, and because
both variants serve the same traffic slice by slice (one Service), the log of the per-slice ratio removes
what the slice's traffic did to both (long prompts, a burst). The interval is Student's t on those log
ratios around the log ratio of the window's means: a paired t interval, valid for the mean of many
requests (the central limit theorem per slice), with the slices as independent replicates. What it
assumes: a slice holds enough requests in each variant for its mean to be roughly normal (MIN_SLICE
requests), and the slices' ratios are exchangeable (no trend within the window — a regression that starts
mid-window widens the interval until the window has moved past it, which is why detection is counted from
the moment the whole window shows it; docs/analysis.md).

For the Previous baseline there is nothing to pair with: `unpaired_ratio` combines the two windows'
standard errors, each from its own slices.

A rate of counted outcomes (the acceptance: accepted ÷ drafted tokens) has its interval from `rate_interval`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from specdeploy.judgment.samples import Points

MIN_SLICES = 4
"""Fewer slices than this (with requests in both variants) give no interval: t with 2 degrees of freedom
is 4.3, an interval too wide to decide anything."""
DECIDABLE_DISTANCE = 0.001
"""An estimate within 0.1% of its limit cannot be told from it by any feasible number of requests."""
MIN_SLICE_REQUESTS = 1.0
"""A slice counts when each variant finished at least this many requests in it."""

Z975 = 1.960
"""The standard normal 0.975 quantile: two-sided 95%, and Student's t beyond 120 degrees of freedom."""

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom (standard tables).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(degrees_of_freedom: int) -> float:
    """The 0.975 quantile of Student's t; the next smaller tabulated df (conservative) between entries."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {degrees_of_freedom}")
    if degrees_of_freedom > 120:
        return Z975
    return _T975[max(df for df in _T975 if df <= degrees_of_freedom)]


@dataclass(frozen=True)
class Comparison:
    """speculative ÷ baseline mean latency: the estimate and its 95% interval, and what it rests on."""

    ratio: float
    low: float
    high: float
    slices: int
    requests: float            # the speculative pods' requests behind the means
    baseline_requests: float
    latest: float | None = None     # the ratio in the window's latest slice (paired comparisons only)

    @property
    def log_half_width(self) -> float:
        return (math.log(self.high) - math.log(self.low)) / 2

    def requests_to_decide(self, limit: float) -> float | None:
        """Requests per variant at which the interval would clear `limit` (√n scaling); None when it does now
        or the estimate sits on the limit."""
        distance = abs(math.log(self.ratio) - math.log(limit))
        half = self.log_half_width
        if half <= distance or distance < DECIDABLE_DISTANCE:
            return None
        return max(self.requests, self.baseline_requests) * (half / distance) ** 2


class Missing(StrEnum):
    """Why two variants have no comparison."""

    TOO_FEW_PAIRED_SLICES = "TooFewPairedSlices"   # fewer than MIN_SLICES slices hold both variants
    TOO_FEW_SLICES = "TooFewSlices"                 # the current window alone (unpaired) has too few
    NO_BASELINE_MEAN = "NoBaselineMean"             # the Previous snapshot has no mean of this latency
    ZERO_MEAN = "ZeroMean"                          # a variant's mean is 0: no ratio


@dataclass(frozen=True)
class NoComparison:
    """No interval, and why; `slices`: the slices that held both variants (TooFewPairedSlices)."""

    why: Missing
    slices: int = 0


@dataclass(frozen=True)
class Slice:
    """One slice of the window: a variant's summed latency and its request count."""

    end: float
    total: float
    count: float


def merge_counters(per_pod: Sequence[Points]) -> Points:
    """One reset-free cumulative series of a variant from its pods' counters at the same instants.

    Per pod an increment is the growth since its previous point, or — when the value fell (the pod restarted)
    — the new value, as Prometheus' increase() counts a reset; a pod's first point adds nothing (its growth
    before it is unknown). The increments are summed over pods and accumulated again.
    """
    growth: dict[float, float] = {}
    for points in per_pod:
        for (_, before), (at, value) in zip(points, points[1:], strict=False):
            growth[at] = growth.get(at, 0.0) + (value - before if value >= before else value)
        if points:
            growth.setdefault(points[0][0], 0.0)
    total, merged = 0.0, []
    for at in sorted(growth):
        total += growth[at]
        merged.append((at, total))
    return tuple(merged)


def slices(sums: Points, counts: Points) -> list[Slice]:
    """The increments between consecutive instants of the cumulative `_sum` and `_count` series.

    A decrease in either (a pod restarted, or one left the sum) is no measurement: that slice is dropped.
    """
    count_at = dict(counts)
    shared = [(at, total, count_at[at]) for at, total in sums if at in count_at]
    result = []
    for (_, total_before, count_before), (at, total, count) in zip(shared, shared[1:], strict=False):
        grown_total, grown_count = total - total_before, count - count_before
        if grown_total < 0 or grown_count < 0 or not (math.isfinite(grown_total) and math.isfinite(grown_count)):
            continue
        result.append(Slice(at, grown_total, grown_count))
    return result


def _mean(parts: list[Slice]) -> tuple[float, float]:
    total, count = sum(p.total for p in parts), sum(p.count for p in parts)
    return (total / count if count > 0 else math.nan), count


def paired_ratio(speculative: list[Slice], baseline: list[Slice]) -> Comparison | NoComparison:
    """The comparison of two variants' slices over the same window, or why there is none."""
    base_at = {s.end: s for s in baseline}
    pairs = [(s, base_at[s.end]) for s in speculative if s.end in base_at
             and s.count >= MIN_SLICE_REQUESTS and base_at[s.end].count >= MIN_SLICE_REQUESTS
             and s.total > 0 and base_at[s.end].total > 0]
    if len(pairs) < MIN_SLICES:
        return NoComparison(Missing.TOO_FEW_PAIRED_SLICES, len(pairs))
    spec_mean, spec_n = _mean([p for p, _ in pairs])
    base_mean, base_n = _mean([b for _, b in pairs])
    if not (spec_mean > 0 and base_mean > 0):
        return NoComparison(Missing.ZERO_MEAN)
    logs = [math.log((p.total / p.count) / (b.total / b.count)) for p, b in pairs]
    center = math.log(spec_mean / base_mean)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Comparison(math.exp(center), math.exp(center - half), math.exp(center + half), len(pairs),
                      spec_n, base_n, latest=math.exp(logs[-1]))


@dataclass(frozen=True)
class Estimate:
    """One variant's mean latency over a window with the standard error of its log (from its slices)."""

    mean: float
    log_standard_error: float
    slices: int
    requests: float


def estimate(parts: list[Slice]) -> Estimate | None:
    """The mean and its log standard error; None with fewer than MIN_SLICES slices holding requests."""
    used = [p for p in parts if p.count >= MIN_SLICE_REQUESTS and p.total > 0]
    if len(used) < MIN_SLICES:
        return None
    mean, count = _mean(used)
    logs = [math.log(p.total / p.count) for p in used]
    return Estimate(mean, statistics.stdev(logs) / math.sqrt(len(logs)), len(used), count)


def unpaired_ratio(now: Estimate, then: Estimate) -> Comparison:
    """now ÷ then with a 95% interval from both standard errors (Welch-style: the smaller df, conservative)."""
    center = math.log(now.mean / then.mean)
    error = math.hypot(now.log_standard_error, then.log_standard_error)
    half = t975(min(now.slices, then.slices) - 1) * error
    return Comparison(math.exp(center), math.exp(center - half), math.exp(center + half),
                      min(now.slices, then.slices), now.requests, then.requests)


def rate_interval(rate: float, units: float) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate in [0, 1] measured over `units` independent units.

    Wilson's rather than the normal approximation's p ± z·√(p(1 − p)/n): that one shrinks to nothing at a rate of 0
    or 1 (an acceptance that collapsed to 0 would claim to be known exactly), Wilson's stays inside [0, 1] and keeps
    a width there (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it for any n).
    """
    if units <= 0 or not math.isfinite(rate):
        return 0.0, 1.0
    rate = min(max(rate, 0.0), 1.0)
    z2 = Z975 * Z975
    center = (rate + z2 / (2 * units)) / (1 + z2 / units)
    half = Z975 * math.sqrt(rate * (1 - rate) / units + z2 / (4 * units * units)) / (1 + z2 / units)
    return max(0.0, center - half), min(1.0, center + half)
