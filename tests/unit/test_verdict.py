"""judgment/verdict: samples with slice series and limits in, Healthy / Failing / Inconclusive out. No fakes."""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeploy.api.reasons import FailureReason, InconclusiveReason
from specdeploy.api.spec import BaselineMode, Checks
from specdeploy.api.status import BaselineName, Bound
from specdeploy.judgment.samples import (
    DeploymentSample,
    QueryError,
    QueryErrorKind,
    Signal,
    SignalValues,
    chain_acceptance,
)
from specdeploy.judgment.verdict import (
    Assessment,
    Check,
    CheckResult,
    Failing,
    Floor,
    Healthy,
    Inconclusive,
    Outcome,
    Policy,
    assess,
    change,
    diagnose,
    kind,
    message,
    p99_shown,
    previous_baseline,
    render,
    verdict,
    verdict_reason,
)

NAN = math.nan
CONTROL, PREVIOUS, NONE = BaselineMode.CONTROL, BaselineMode.PREVIOUS, BaselineMode.NONE
WINDOW = 300.0
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
AUTO = Floor(0.11, "Auto: break-even 0.09 at batch 1 for eagle3 k=3, floor 0.11 with the 5% margin")
FIXED = Floor(0.5, "Fixed: minAcceptanceRate 0.50", fixed=True)

_SERIES = {
    "tpot": (Signal.INTER_TOKEN_LATENCY_SUM_SERIES, Signal.INTER_TOKEN_LATENCY_COUNT_SERIES,
             Signal.MEAN_INTER_TOKEN_LATENCY),
    "e2e": (Signal.E2E_LATENCY_SUM_SERIES, Signal.E2E_LATENCY_COUNT_SERIES, Signal.MEAN_E2E_LATENCY),
    "ttft": (Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES, Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES,
             Signal.MEAN_TIME_TO_FIRST_TOKEN),
    # Without prefill / inference series the Latency objective judges TTFT and E2E less the queue, slice by slice.
    "queue": (Signal.QUEUE_TIME_SUM_SERIES, Signal.QUEUE_TIME_COUNT_SERIES, Signal.MEAN_QUEUE_TIME),
}


def variant(tpot: float, *, requests: float = 600.0, jitter: float = 0.02, seed: int = 0, e2e: float = 2.0,
            ttft: float = 0.05, queue: float = 0.005, slices: int = 10, **values: Any) -> SignalValues:
    """One variant over a 5m window: each latency's slices jitter around its mean, `requests` spread evenly."""
    rng = random.Random(seed)
    per_slice = requests / slices
    series: dict[Signal, tuple[tuple[float, float], ...]] = {}
    means: dict[Signal, float] = {}
    for name, mean in (("tpot", tpot), ("e2e", e2e), ("ttft", ttft), ("queue", queue)):
        sums_signal, counts_signal, mean_signal = _SERIES[name]
        total = count = 0.0
        sums, counts = [(1000.0, 0.0)], [(1000.0, 0.0)]
        for i in range(1, slices + 1):
            total += mean * (1 + rng.gauss(0, jitter)) * per_slice
            count += per_slice
            sums.append((1000.0 + 30 * i, total))
            counts.append((1000.0 + 30 * i, count))
        series[sums_signal], series[counts_signal] = tuple(sums), tuple(counts)
        means[mean_signal] = total / count if count else NAN
    fields: dict[str, Any] = {
        "acceptance_rate": 0.71, "mean_acceptance_length": 3.1, "requests": requests, "running": 8.0, "pods": 2.0,
        "p99_inter_token_latency_seconds": 0.0099, "p99_e2e_latency_seconds": e2e * 2,
        "p99_time_to_first_token_seconds": ttft * 3, "mean_queue_time_seconds": queue,
        **{signal.value: mean for signal, mean in means.items()},
    }
    fields.update(values)
    return SignalValues(series=series, **fields)


CONTROL_PODS = variant(0.0080, requests=300.0, seed=1, acceptance_rate=None, mean_acceptance_length=None)


def sample(speculative: SignalValues | None = None, control: SignalValues | None = None,
           errors: dict[Signal, QueryErrorKind] | None = None) -> DeploymentSample:
    return DeploymentSample(
        window_seconds=WINDOW,
        speculative=speculative if speculative is not None else variant(0.0050),
        control=control if control is not None else CONTROL_PODS,
        errors={s: QueryError(s, k, f"{k.value} from the test") for s, k in (errors or {}).items()},
    )


def result_of(found: Assessment, which: Check) -> CheckResult:
    result = found.check(which)
    assert result is not None, (which, found.checks)
    return result


def policy(mode: BaselineMode = CONTROL, floor: Floor | None = AUTO, previous: Any = None, **limits: Any) -> Policy:
    return Policy(Checks.model_validate(limits), mode, 20, floor, previous)


def test_faster_speculation_is_healthy_with_its_interval() -> None:
    found = assess(sample(), policy())
    assert isinstance(found.verdict, Healthy), found.verdict
    assert found.per_token is not None and found.per_token.high < 1.0
    assert found.per_token.ratio == pytest.approx(0.0050 / 0.0080, rel=0.03)
    passed = result_of(found, Check.PER_TOKEN_LATENCY)
    assert passed.outcome == Outcome.PASSED and passed.reason is None and passed.comparison == found.per_token
    assert passed.limit == 1.10 and passed.comparison.high <= passed.limit
    assert found.baseline == BaselineName.CONTROL


def test_below_the_first_bucket_the_mean_still_sees_the_gain() -> None:
    """Both P99s are 9.9 ms (inside vLLM's first bucket): shown as a bound; the means decide."""
    found = assess(sample(variant(0.0050), CONTROL_PODS), policy())
    assert isinstance(found.verdict, Healthy)
    assert p99_shown(0.0099) == "< 10 ms"
    assert p99_shown(0.031) == "≈ 31 ms"
    assert p99_shown(NAN) is None


def test_a_clear_per_token_regression_fails_with_its_interval_and_counts() -> None:
    found = assess(sample(variant(0.0080 * 1.30, seed=2)), policy())
    assert isinstance(found.verdict, Failing)
    assert found.verdict.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    failed = result_of(found, Check.PER_TOKEN_LATENCY)
    assert failed.outcome == Outcome.FAILED and failed.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    assert failed.comparison is not None and failed.limit == 1.10 and failed.comparison.low > failed.limit
    assert failed.comparison.ratio == pytest.approx(1.30, abs=0.02)
    assert (failed.comparison.requests, failed.comparison.baseline_requests, failed.comparison.slices) == (600, 300, 10)


def test_golden_failing_message() -> None:
    """The sentence status, the Event and the alert carry: the numbers, the limit, the counts, the window."""
    result = verdict(sample(variant(0.0080 * 1.30, seed=2)), policy())
    assert message(result) == (
        "per-token latency +30% (95% interval +27%…+32%) vs the control, above maxPerTokenLatencyRatio 1.10; mean "
        "10.4 ms vs 7.98 ms, P99 < 10 ms vs < 10 ms; 600 vs 300 requests in 10 slices over 5m (600 requests; control "
        "300), objective Latency")


def test_a_regression_the_interval_cannot_separate_from_the_limit_is_inconclusive() -> None:
    found = assess(sample(variant(0.0080 * 1.12, seed=3, jitter=0.15), variant(0.0080, requests=300.0, seed=4,
                                                                               jitter=0.15)), policy())
    assert isinstance(found.verdict, Inconclusive)
    assert found.verdict.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE
    undecided = result_of(found, Check.PER_TOKEN_LATENCY)
    assert undecided.outcome == Outcome.UNDECIDED and undecided.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE
    assert undecided.comparison is not None and undecided.limit is not None
    assert undecided.comparison.low < undecided.limit < undecided.comparison.high
    assert undecided.needed is not None and undecided.needed > 600          # more requests per variant would tell


def test_golden_inconclusive_message() -> None:
    result = verdict(sample(variant(0.0080 * 1.12, seed=3, jitter=0.15), variant(0.0080, requests=300.0, seed=4,
                                                                                 jitter=0.15)), policy())
    assert message(result) == (
        "per-token latency +15% (95% interval +5%…+25%) vs the control: the interval holds maxPerTokenLatencyRatio "
        "1.10; about 2,263 requests per variant would tell; mean 9.45 ms vs 8.21 ms, P99 < 10 ms vs < 10 ms; 600 vs "
        "300 requests in 10 slices over 5m (600 requests; control 300), objective Latency")


def test_within_the_limit_is_healthy_only_when_the_whole_interval_is() -> None:
    assert isinstance(verdict(sample(variant(0.0080 * 1.05, seed=5, jitter=0.01)), policy()), Healthy)
    stricter = verdict(sample(variant(0.0080 * 1.05, seed=5, jitter=0.01)), policy(maxP99InterTokenLatencyRatio=1.02))
    assert isinstance(stricter, Failing)


@pytest.mark.parametrize(("speculative", "control", "reason"), [
    (variant(0.005, requests=12.0), CONTROL_PODS, InconclusiveReason.TOO_FEW_REQUESTS),
    (variant(0.005), variant(0.008, requests=5.0), InconclusiveReason.CONTROL_TOO_FEW_REQUESTS),
    (variant(0.005), SignalValues(), InconclusiveReason.NO_CONTROL_DATA),
    (variant(0.005, requests=0.0, acceptance_rate=NAN), CONTROL_PODS, InconclusiveReason.TOO_FEW_REQUESTS),
    (variant(0.005, slices=3), variant(0.008, slices=3, requests=300.0), InconclusiveReason.NOT_ENOUGH_EVIDENCE),
])
def test_too_little_evidence_is_inconclusive(speculative: SignalValues, control: SignalValues,
                                             reason: InconclusiveReason) -> None:
    result = verdict(sample(speculative, control), policy())
    assert isinstance(result, Inconclusive) and result.reason == reason, result


def test_a_failed_series_query_is_inconclusive_with_the_prometheus_reason() -> None:
    result = verdict(sample(errors={Signal.INTER_TOKEN_LATENCY_SUM_SERIES: QueryErrorKind.UNAVAILABLE}), policy())
    assert isinstance(result, Inconclusive) and result.reason == InconclusiveReason.PROMETHEUS_UNAVAILABLE


def test_auto_floor_explains_but_the_measured_comparison_decides() -> None:
    """Acceptance 0.05 below the Auto floor while the pods are measured faster than control: Healthy, and said."""
    found = assess(sample(variant(0.0050, acceptance_rate=0.05)), policy())
    assert isinstance(found.verdict, Healthy)
    acceptance = result_of(found, Check.ACCEPTANCE)
    assert acceptance.outcome == Outcome.FAILED and not acceptance.counted            # explains, does not decide
    assert (acceptance.value, acceptance.limit) == (0.05, AUTO.rate)
    assert render(acceptance) in found.verdict.summary                                  # and is said


def test_auto_floor_decides_alone_without_a_baseline() -> None:
    result = verdict(sample(variant(0.0050, acceptance_rate=0.05)), policy(NONE))
    assert isinstance(result, Failing) and result.reason == FailureReason.ACCEPTANCE_BELOW_MINIMUM
    assert isinstance(verdict(sample(variant(0.0050, acceptance_rate=0.47)), policy(NONE)), Healthy)


def test_a_fixed_floor_is_the_users_rule_beside_a_baseline_too() -> None:
    found = assess(sample(variant(0.0050, acceptance_rate=0.31)), policy(floor=FIXED))
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.ACCEPTANCE_BELOW_MINIMUM
    acceptance = result_of(found, Check.ACCEPTANCE)
    assert acceptance.counted and (acceptance.value, acceptance.limit) == (0.31, 0.50)
    assert result_of(found, Check.PER_TOKEN_LATENCY).outcome == Outcome.PASSED      # faster, and still failing


def test_the_collapse_fails_on_latency_with_acceptance_as_the_explanation() -> None:
    found = assess(sample(variant(0.0080 * 1.27, seed=6, acceptance_rate=0.02)), policy())
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    acceptance = result_of(found, Check.ACCEPTANCE)
    assert acceptance.outcome == Outcome.FAILED and not acceptance.counted and acceptance.value == 0.02
    assert render(acceptance) in found.verdict.evidence


# -- slower and explained: a measured loss with the acceptance surely below its floor, inside the ratio limit --------


def counted(tpot: float, acceptance: float, drafts: float = 20_000.0, *, seed: int = 20, jitter: float = 0.01,
            **values: Any) -> SignalValues:
    """Speculative pods (EAGLE-3, k 3) whose acceptance rate is counted over `drafts` drafts (vLLM's counters)."""
    per_position = {1: 3 * acceptance * drafts * 0.8, 2: 3 * acceptance * drafts * 0.15, 3: 3 * acceptance * drafts * 0.05}
    return variant(tpot, seed=seed, jitter=jitter, acceptance_rate=acceptance, drafts=drafts,
                   positions={Signal.ACCEPTED_PER_POSITION: per_position}, **values)


def control_pods(seed: int = 120, jitter: float = 0.01) -> SignalValues:
    return variant(0.0080, requests=300.0, seed=seed, jitter=jitter, acceptance_rate=None, mean_acceptance_length=None)


K3_COLLAPSE = sample(counted(0.0080 / 0.91, 0.02), control_pods())
"""The issue's EAGLE-3 SD at k 3 after its acceptance collapsed to 0.02 (Auto floor 0.11): 0.91× the control's
speed (95% interval 0.90–0.92), a per-token ratio of 1.10 whose interval holds the 1.10 limit."""


def test_the_k3_collapse_inside_the_ratio_limit_fails_slower_and_explained() -> None:
    found = assess(K3_COLLAPSE, policy())
    assert found.per_token is not None
    assert (round(1 / found.per_token.ratio, 2), round(1 / found.per_token.high, 2),
            round(1 / found.per_token.low, 2)) == (0.91, 0.90, 0.92)     # the measurement
    assert found.per_token.low < 1.10 < found.per_token.high                   # the ratio check alone: undecided
    assert isinstance(found.verdict, Failing), found.verdict
    assert found.verdict.reason == FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR
    assert not found.verdict.at_once                                           # failureLimit still counts
    said = found.verdict.evidence
    assert said.startswith("per-token latency +10% (95% interval +8%…+11%) vs the control, slower beyond noise (the "
                           "ratio limit maxPerTokenLatencyRatio 1.10 tolerates noise, not a loss), and the "
                           "acceptance rate 0.020 (95% interval 0.018…0.022, 20,000 drafts) is below the acceptance "
                           "floor 0.11 (Auto: break-even 0.09"), said
    assert "the drafts cost more than they save; mean 8.79 ms vs 8 ms" in said and said.count("acceptance rate") == 1
    assert verdict_reason(found.verdict) == "SlowerBelowAcceptanceFloor"


def test_a_loss_the_limit_passes_fails_too_when_the_acceptance_explains_it() -> None:
    """+5%, the whole interval below the 1.10 limit (the ratio check passes) and above 1."""
    found = assess(sample(counted(0.0080 * 1.05, 0.02), control_pods()), policy())
    assert found.per_token is not None and found.per_token.low > 1.0 and found.per_token.high < 1.10
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR


def test_a_healthy_k3_is_not_failed_by_it() -> None:
    found = assess(sample(counted(0.0050, 0.47), control_pods()), policy())
    assert isinstance(found.verdict, Healthy), found.verdict


@pytest.mark.parametrize(("speculative", "why"), [
    (counted(0.0080 * 1.05, 0.30), "slower beyond noise, but the acceptance is above its floor: the ratio limit decides"),
    (counted(0.0080 * 1.05, 0.10, drafts=1_200), "acceptance 0.10 with 1,200 drafts: its interval reaches the floor"),
    (counted(0.0080 * 1.05, 0.02, drafts=500), "fewer drafts than MIN_DRAFTS: not known well enough to fail on"),
    (variant(0.0080 * 1.05, seed=20, jitter=0.01, acceptance_rate=0.02), "no draft counts (SGLang): no interval"),
    (counted(0.0080 * 1.01, 0.02, jitter=0.05), "the per-token interval reaches 1: not measurably slower"),
    (counted(0.0080 * 0.95, 0.02), "faster than the control: the acceptance explains nothing to fail"),
])
def test_slower_and_explained_needs_both_parts_certain(speculative: SignalValues, why: str) -> None:
    result = verdict(sample(speculative, control_pods(jitter=0.05 if "reaches 1" in why else 0.01)), policy())
    assert not isinstance(result, Failing), (why, result)


def test_slower_and_explained_stays_inconclusive_where_the_ratio_check_is() -> None:
    """The k 3 collapse's latency with too few drafts to know the acceptance: the ratio check's Inconclusive stands."""
    result = verdict(sample(counted(0.0080 / 0.91, 0.02, drafts=500), control_pods()), policy())
    assert isinstance(result, Inconclusive) and result.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE, result


def test_slower_and_explained_leaves_a_latency_failure_and_a_fixed_floor_their_own_reasons() -> None:
    over = verdict(sample(counted(0.0080 * 1.27, 0.02, seed=6), control_pods()), policy())
    assert isinstance(over, Failing) and over.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    fixed = verdict(K3_COLLAPSE, policy(floor=FIXED))
    assert isinstance(fixed, Failing) and fixed.reason == FailureReason.ACCEPTANCE_BELOW_MINIMUM


def test_slower_and_explained_against_a_previous_baseline_at_matched_load() -> None:
    before = previous_baseline(sample(control_pods(seed=9)), 20, NOW)
    assert before is not None
    found = assess(sample(counted(0.0080 * 1.08, 0.02, seed=21, jitter=0.005)), policy(PREVIOUS, previous=before))
    result = found.verdict
    assert isinstance(result, Failing) and result.reason == FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR, result
    assert found.baseline == BaselineName.PREVIOUS and found.per_token is not None and found.per_token.low > 1.0


def test_not_drafting_is_its_own_inconclusive() -> None:
    found = assess(sample(variant(0.0075, acceptance_rate=NAN, seed=7)), policy())
    assert isinstance(found.verdict, Inconclusive) and found.verdict.reason == InconclusiveReason.NOT_DRAFTING
    acceptance = result_of(found, Check.ACCEPTANCE)
    assert acceptance.outcome == Outcome.UNDECIDED and acceptance.reason == InconclusiveReason.NOT_DRAFTING


def test_a_regression_while_queue_bound_says_so() -> None:
    queued = variant(0.0080 * 1.4, seed=8, e2e=2.0, ttft=1.5, queue=1.4)
    result = assess(sample(queued), policy())
    assert isinstance(result.verdict, Failing)
    assert result.diagnosis["speculative"] == Bound.QUEUE
    assert "Queue-bound (waiting 70% of end-to-end latency)" in result.verdict.evidence


@pytest.mark.parametrize(("ttft", "queue", "e2e", "expected"), [
    (0.05, 0.005, 2.0, Bound.DECODE), (1.5, 1.4, 2.0, Bound.QUEUE), (1.5, 0.0, 2.0, Bound.PREFILL),
])
def test_diagnosis(ttft: float, queue: float, e2e: float, expected: Bound) -> None:
    values = SignalValues(mean_time_to_first_token_seconds=ttft, mean_queue_time_seconds=queue,
                          mean_e2e_latency_seconds=e2e)
    assert diagnose(values) == expected
    assert diagnose(SignalValues()) is None


def test_previous_baseline_at_matched_load() -> None:
    before = previous_baseline(sample(variant(0.0080, seed=9, acceptance_rate=None)), 20, NOW)
    assert before is not None and before.running_per_pod == 4.0 and before.inter_token_latency is not None
    faster = assess(sample(variant(0.0050, seed=10)), policy(PREVIOUS, previous=before))
    assert isinstance(faster.verdict, Healthy) and faster.baseline == BaselineName.PREVIOUS
    slower = assess(sample(variant(0.0080 * 1.4, seed=11)), policy(PREVIOUS, previous=before))
    assert isinstance(slower.verdict, Failing) and slower.baseline == BaselineName.PREVIOUS
    assert result_of(slower, Check.PER_TOKEN_LATENCY).outcome == Outcome.FAILED
    busier = assess(sample(variant(0.0050, running=16.0)), policy(PREVIOUS, previous=before))
    assert isinstance(busier.verdict, Inconclusive)
    assert busier.verdict.reason == InconclusiveReason.LOAD_DIFFERS_FROM_PREVIOUS
    assert result_of(busier, Check.BASELINE).reason == InconclusiveReason.LOAD_DIFFERS_FROM_PREVIOUS
    assert busier.baseline is None and busier.per_token is None


def test_without_a_matched_previous_baseline_acceptance_decides_alone() -> None:
    result = verdict(sample(variant(0.0050, acceptance_rate=0.05)), policy(PREVIOUS))
    assert isinstance(result, Failing) and result.reason == FailureReason.ACCEPTANCE_BELOW_MINIMUM


def test_the_absolute_slo() -> None:
    result = verdict(sample(), policy(maxP99E2ELatencySeconds=1.0))
    assert isinstance(result, Failing) and result.reason == FailureReason.E2E_LATENCY_ABOVE_SLO


def test_labels_and_messages() -> None:
    result = verdict(sample(variant(0.0080 * 1.3, seed=2)), policy())
    assert kind(result) == "Failing" and verdict_reason(result) == "InterTokenLatencyRegressed"
    assert message(result) == result.evidence
    assert change(1.18) == "+18%" and change(0.62) == "−38%" and change(1.004) == "+0.4%" and change(1.0) == "±0%"


def test_sglang_acceptance_means_chain_positions() -> None:
    """SGLang's tree-normalised rate is replaced by (accept length − 1) ÷ k."""
    values = SignalValues(acceptance_rate=0.2, mean_acceptance_length=2.5)
    normalised = chain_acceptance(DeploymentSample(WINDOW, values), 3)
    assert normalised.speculative.acceptance_rate == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.002, 0.1), st.integers(0, 10_000), st.floats(0.0, 0.2))
def test_the_same_engine_on_both_sides_never_fails(tpot: float, seed: int, jitter: float) -> None:
    """Speculative and control pods with the same latency (only noise apart): never a latency failure."""
    same = sample(variant(tpot, seed=seed, jitter=jitter), variant(tpot, seed=seed + 1, jitter=jitter,
                                                                   requests=300.0))
    result = verdict(same, policy())
    assert not isinstance(result, Failing), result


def test_no_failure_from_missing_numbers() -> None:
    empty = dataclasses.replace(variant(0.005), series={})
    result = verdict(sample(empty), policy())
    assert isinstance(result, Inconclusive)
