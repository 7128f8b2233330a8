"""judgment/comparison: slices from cumulative series, the paired interval and the unpaired one. Plain numbers."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.judgment.comparison import (
    MIN_SLICES,
    Comparison,
    Missing,
    NoComparison,
    Slice,
    estimate,
    merge_counters,
    paired_ratio,
    rate_interval,
    slices,
    t975,
    unpaired_ratio,
)


def cumulative(means: list[float], counts: list[float], start: float = 1000.0, step: float = 30.0):
    """(sum points, count points): cumulative series whose slices have these means and counts."""
    total = count = 0.0
    sums, tallies = [(start, 0.0)], [(start, 0.0)]
    for i, (mean, n) in enumerate(zip(means, counts, strict=True), start=1):
        total += mean * n
        count += n
        sums.append((start + i * step, total))
        tallies.append((start + i * step, count))
    return tuple(sums), tuple(tallies)


def variant(means: list[float], counts: list[float]) -> list[Slice]:
    return slices(*cumulative(means, counts))


def test_slices_are_the_increments_and_a_reset_is_dropped() -> None:
    sums = ((0.0, 0.0), (30.0, 3.0), (60.0, 1.0), (90.0, 5.0))
    counts = ((0.0, 0.0), (30.0, 10.0), (60.0, 2.0), (90.0, 12.0))
    assert slices(sums, counts) == [Slice(30.0, 3.0, 10.0), Slice(90.0, 4.0, 10.0)]


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(9) == pytest.approx(2.262)
    assert t975(22) == t975(20)        # between entries: the smaller df, a wider interval
    assert t975(1000) == pytest.approx(1.96)
    with pytest.raises(ValueError):
        t975(0)


def test_a_clear_slowdown_has_an_interval_around_it() -> None:
    rng = random.Random(1)
    control = [0.005 * (1 + rng.gauss(0, 0.03)) for _ in range(10)]
    speculative = [c * 1.30 * (1 + rng.gauss(0, 0.03)) for c in control]
    found = paired_ratio(variant(speculative, [40.0] * 10), variant(control, [20.0] * 10))
    assert isinstance(found, Comparison)
    assert found.low < 1.30 < found.high and found.low > 1.2 and found.high < 1.4
    assert found.slices == 10 and found.requests == 400 and found.baseline_requests == 200


def test_pairing_removes_what_the_traffic_did_to_both() -> None:
    """Slices that differ 3× in latency (long prompts, a burst) but keep the ratio give a narrow interval."""
    control = [0.005, 0.015, 0.005, 0.010, 0.004, 0.012, 0.006, 0.009]
    speculative = [c * 0.6 * (1 + 0.01 * (-1) ** i) for i, c in enumerate(control)]
    found = paired_ratio(variant(speculative, [30.0] * 8), variant(control, [30.0] * 8))
    assert isinstance(found, Comparison)
    assert found.high / found.low < 1.05


def test_too_few_slices_is_a_reason_not_an_interval() -> None:
    found = paired_ratio(variant([0.01, 0.01, 0.01], [5.0] * 3), variant([0.01, 0.01, 0.01], [5.0] * 3))
    assert found == NoComparison(Missing.TOO_FEW_PAIRED_SLICES, slices=3) and found.slices < MIN_SLICES
    empty = paired_ratio(variant([0.01] * 6, [0.0] * 6), variant([0.01] * 6, [5.0] * 6))
    assert empty == NoComparison(Missing.TOO_FEW_PAIRED_SLICES, slices=0)


def test_requests_to_decide_scales_with_the_square_of_the_interval() -> None:
    rng = random.Random(3)
    control = [0.02 * (1 + rng.gauss(0, 0.1)) for _ in range(10)]
    speculative = [c * 1.12 * (1 + rng.gauss(0, 0.1)) for c in control]
    found = paired_ratio(variant(speculative, [10.0] * 10), variant(control, [10.0] * 10))
    assert isinstance(found, Comparison)
    assert found.low < 1.10 < found.high
    needed = found.requests_to_decide(1.10)
    assert needed is not None and needed > found.requests


def test_unpaired_combines_both_errors() -> None:
    now = estimate(variant([0.011, 0.012, 0.0115, 0.0118, 0.0112, 0.0121], [20.0] * 6))
    then = estimate(variant([0.010, 0.0102, 0.0099, 0.0101, 0.0098, 0.0103], [20.0] * 6))
    assert now is not None and then is not None
    found = unpaired_ratio(now, then)
    assert found.low < found.ratio < found.high
    assert found.ratio == pytest.approx(now.mean / then.mean)
    assert estimate(variant([0.01] * 3, [1.0] * 3)) is None


@given(st.lists(st.floats(0.002, 0.2), min_size=MIN_SLICES, max_size=12),
       st.lists(st.floats(-0.2, 0.2), min_size=12, max_size=12),
       st.floats(0.3, 3.0))
def test_the_interval_holds_the_estimate(control: list[float], noise: list[float], factor: float) -> None:
    speculative = [c * factor * math.exp(e) for c, e in zip(control, noise, strict=False)]
    found = paired_ratio(variant(speculative, [7.0] * len(control)), variant(control, [5.0] * len(control)))
    assert isinstance(found, Comparison)
    assert found.low <= found.ratio <= found.high
    assert found.low > 0


def test_pods_are_differenced_one_by_one_and_a_restart_counts_as_prometheus_counts_it() -> None:
    """Two pods; the second restarts between 60 and 90 s: its counter falls from 50 to 4, which is 4 new."""
    steady = ((30.0, 100.0), (60.0, 110.0), (90.0, 120.0), (120.0, 130.0))
    restarted = ((30.0, 40.0), (60.0, 50.0), (90.0, 4.0), (120.0, 9.0))
    merged = merge_counters([steady, restarted])
    assert merged == ((30.0, 0.0), (60.0, 20.0), (90.0, 34.0), (120.0, 49.0))
    # Summed before differencing, the restart would read as a fall of 36 (a dropped slice) or, with more
    # pods growing, as growth that never happened.
    late = ((90.0, 7.0), (120.0, 8.0))      # a pod that started inside the window: its first point adds nothing
    assert merge_counters([steady, late])[-1] == (120.0, 31.0)
    assert merge_counters([]) == ()


def test_a_rate_interval_is_wilsons() -> None:
    """The textbook case (p 0.5 over 100: 0.404…0.596), a width at a rate of 0, narrower with more units."""
    assert rate_interval(0.5, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    low, high = rate_interval(0.0, 1000)
    assert low == 0.0 and high == pytest.approx(0.0038, abs=1e-4)       # a collapse to 0 is not known exactly
    assert rate_interval(0.02, 20_000)[1] < rate_interval(0.02, 2_000)[1] < rate_interval(0.02, 200)[1]
    assert rate_interval(0.3, 0) == (0.0, 1.0)


@given(st.floats(0.0, 1.0), st.floats(1.0, 1e6))
def test_a_rate_interval_holds_the_rate_inside_zero_to_one(rate: float, units: float) -> None:
    low, high = rate_interval(rate, units)
    assert 0.0 <= low <= rate + 1e-12 and rate - 1e-12 <= high <= 1.0
