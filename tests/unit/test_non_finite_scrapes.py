"""A scrape that reads NaN or ±Inf in a counter or histogram: its instant leaves the SD's slices (judgment/samples.py
finite_instants), the rest of the window still decides, and the sample says how many instants it left out."""

from __future__ import annotations

import dataclasses
import math

from analysis_samples import sample

from specdeploy.judgment.comparison import merge_counters
from specdeploy.judgment.samples import DeploymentSample, Points, Signal, finite_instants
from specdeploy.judgment.verdict import Failing, Policy, assess

SUMS = Signal.INTER_TOKEN_LATENCY_SUM_SERIES


def _poisoned(points: Points, index: int, value: float) -> Points:
    return tuple((at, value if i == index else total) for i, (at, total) in enumerate(points))


def _through_the_merge(measured: DeploymentSample, bad: float, index: int = 2) -> DeploymentSample:
    """`measured` as query_all would build it from one pod per variant whose ITL `_sum` read `bad` at instant
    `index`: per-pod series → finite_instants → merge_counters."""
    per_pod = {(variant, signal): [points] for variant, values in (("speculative", measured.speculative),
                                                                   ("control", measured.control))
               for signal, points in values.series.items()}
    per_pod[("speculative", SUMS)] = [_poisoned(per_pod[("speculative", SUMS)][0], index, bad)]
    kept, left_out = finite_instants(per_pod)

    def merged(variant: str) -> dict[Signal, Points]:
        return {signal: merge_counters(pods) for (owner, signal), pods in kept.items() if owner == variant}

    return dataclasses.replace(
        measured, speculative=dataclasses.replace(measured.speculative, series=merged("speculative")),
        control=dataclasses.replace(measured.control, series=merged("control")), dropped_instants=left_out)


def test_one_nan_scrape_leaves_a_verdict_from_the_other_slices() -> None:
    regressed = sample(0.8, itl=0.026, control_itl=0.02)
    whole = assess(regressed, Policy())
    assert isinstance(whole.verdict, Failing) and whole.per_token is not None and whole.per_token.slices == 10
    for bad in (math.nan, math.inf, -math.inf):
        found = _through_the_merge(regressed, bad)
        result = assess(found, Policy())
        assert isinstance(result.verdict, Failing), result.verdict
        assert result.per_token is not None and result.per_token.slices == 9   # the instant's slice joined the next
        assert found.dropped_instants == 1
        assert found.dropped_note == "; 1 instant of the window left out of its slices: a scrape read NaN or ±Inf"


def test_without_leaving_it_out_one_nan_blinds_the_rest_of_the_window() -> None:
    """Why: merge_counters accumulates growth, so every total after the NaN is NaN."""
    points = _poisoned(sample(0.8).speculative.points(SUMS), 3, math.nan)
    assert all(math.isnan(total) for _, total in merge_counters([points])[3:])
    kept, left_out = finite_instants({SUMS: [points]})
    assert left_out == 1 and all(math.isfinite(total) for _, total in merge_counters(kept[SUMS]))


def test_a_window_without_bad_scrapes_is_untouched() -> None:
    measured = sample(0.8)
    per_pod = {signal: [points] for signal, points in measured.speculative.series.items()}
    assert finite_instants(per_pod) == (per_pod, 0)
    assert measured.dropped_note == ""
