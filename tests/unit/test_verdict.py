"""analysis/verdict: tables of samples and limits in, Healthy / Failing / Inconclusive out. No fakes."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.analysis.reasons import FailureReason, InconclusiveReason
from specdeploy.analysis.samples import DeploymentSample, QueryError, QueryErrorKind, Signal, SignalValues
from specdeploy.analysis.verdict import (
    LOAD_TOLERANCE,
    Failing,
    Healthy,
    Inconclusive,
    PreviousBaseline,
    Verdict,
    baseline_p99_inter_token_latency,
    kind,
    label,
    message,
    previous_baseline,
    verdict,
)
from specdeploy.api.spec import BaselineMode, Checks

NAN = math.nan
CONTROL, PREVIOUS, NONE = BaselineMode.CONTROL, BaselineMode.PREVIOUS, BaselineMode.NONE
MIN_REQUESTS = 20
WINDOW = 300.0

SPECULATIVE = SignalValues(
    acceptance_rate=0.71, mean_acceptance_length=3.1, p99_inter_token_latency_seconds=0.030,
    p99_e2e_latency_seconds=5.0, p99_time_to_first_token_seconds=0.50, requests=1234.0, running=8.0, waiting=0.0,
)
CONTROL_PODS = SignalValues(
    p99_inter_token_latency_seconds=0.030, p99_e2e_latency_seconds=5.0, p99_time_to_first_token_seconds=0.50,
    requests=410.0, running=3.0, waiting=0.0,
)
# Taken at 1234 requests / 300 s = 4.11 requests/s.
SNAPSHOT = PreviousBaseline("2026-01-01T00:00:00Z", 1234.0 / WINDOW, 0.030, 5.0, 0.50)


def sample(errors: dict[Signal, QueryErrorKind] | None = None, control: dict[str, Any] | None = None,
           **speculative: float | None) -> DeploymentSample:
    return DeploymentSample(
        window_seconds=WINDOW,
        speculative=dataclasses.replace(SPECULATIVE, **speculative),
        control=dataclasses.replace(CONTROL_PODS, **(control or {})),
        errors={s: QueryError(s, k, f"{k.value} from the test") for s, k in (errors or {}).items()},
    )


def checks(**limits: Any) -> Checks:
    return Checks.model_validate(limits)


CASES: list[tuple[str, DeploymentSample, BaselineMode, Checks, PreviousBaseline | None, type, str | None]] = [
    # id, sample, mode, checks, previous baseline, verdict type, reason
    ("healthy-control", sample(), CONTROL, checks(), None, Healthy, None),
    ("healthy-none", sample(), NONE, checks(), None, Healthy, None),
    ("healthy-previous", sample(), PREVIOUS, checks(), SNAPSHOT, Healthy, None),
    ("acceptance-at-limit", sample(acceptance_rate=0.50), CONTROL, checks(), None, Healthy, None),
    ("itl-at-limit", sample(p99_inter_token_latency_seconds=0.033), CONTROL, checks(), None, Healthy, None),
    # failures
    ("acceptance-low", sample(acceptance_rate=0.31), CONTROL, checks(), None,
     Failing, FailureReason.ACCEPTANCE_BELOW_MINIMUM),
    ("itl-regressed", sample(p99_inter_token_latency_seconds=0.041), CONTROL, checks(), None,
     Failing, FailureReason.INTER_TOKEN_LATENCY_REGRESSED),
    ("e2e-regressed", sample(p99_e2e_latency_seconds=6.5), CONTROL, checks(), None,
     Failing, FailureReason.E2E_LATENCY_REGRESSED),
    ("ttft-regressed", sample(p99_time_to_first_token_seconds=0.80), CONTROL, checks(), None,
     Failing, FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED),
    ("slo-broken", sample(p99_e2e_latency_seconds=5.0), NONE, checks(maxP99E2ELatencySeconds=4), None,
     Failing, FailureReason.E2E_LATENCY_ABOVE_SLO),
    ("itl-regressed-vs-previous", sample(p99_inter_token_latency_seconds=0.041), PREVIOUS, checks(), SNAPSHOT,
     Failing, FailureReason.INTER_TOKEN_LATENCY_REGRESSED),
    ("stricter-ratio", sample(p99_inter_token_latency_seconds=0.032), CONTROL,
     checks(maxP99InterTokenLatencyRatio=1.05), None, Failing, FailureReason.INTER_TOKEN_LATENCY_REGRESSED),
    # mode None checks no ratios
    ("none-ignores-ratios", sample(p99_inter_token_latency_seconds=0.300), NONE, checks(), None, Healthy, None),
    # nothing known: never a failure
    ("idle", sample(requests=0.0, acceptance_rate=NAN, p99_inter_token_latency_seconds=NAN), CONTROL, checks(),
     None, Inconclusive, InconclusiveReason.TOO_FEW_REQUESTS),
    ("few-requests", sample(requests=12.0, acceptance_rate=0.1), CONTROL, checks(), None,
     Inconclusive, InconclusiveReason.TOO_FEW_REQUESTS),
    ("no-series", sample(requests=None), CONTROL, checks(), None, Inconclusive, InconclusiveReason.NO_DATA),
    ("nan-requests", sample(requests=NAN), CONTROL, checks(), None, Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    ("prometheus-down", sample(errors={s: QueryErrorKind.UNAVAILABLE for s in Signal}, acceptance_rate=0.1),
     CONTROL, checks(), None, Inconclusive, InconclusiveReason.PROMETHEUS_UNAVAILABLE),
    ("acceptance-nan", sample(acceptance_rate=NAN), NONE, checks(), None,
     Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    ("acceptance-inf", sample(acceptance_rate=math.inf), NONE, checks(), None,
     Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    ("acceptance-missing", sample(acceptance_rate=None), NONE, checks(), None,
     Inconclusive, InconclusiveReason.NO_DATA),
    ("itl-bad-query", sample(errors={Signal.P99_INTER_TOKEN_LATENCY: QueryErrorKind.BAD_QUERY}), CONTROL, checks(),
     None, Inconclusive, InconclusiveReason.PROMETHEUS_BAD_QUERY),
    ("itl-nan", sample(p99_inter_token_latency_seconds=NAN), CONTROL, checks(), None,
     Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    ("control-few", sample(control={"requests": 5.0}, p99_inter_token_latency_seconds=0.3), CONTROL, checks(),
     None, Inconclusive, InconclusiveReason.CONTROL_TOO_FEW_REQUESTS),
    ("control-absent", sample(control={f.name: None for f in dataclasses.fields(SignalValues)}), CONTROL,
     checks(), None, Inconclusive, InconclusiveReason.NO_CONTROL_DATA),
    ("control-itl-zero", sample(control={"p99_inter_token_latency_seconds": 0.0}), CONTROL, checks(), None,
     Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    ("no-previous", sample(), PREVIOUS, checks(), None, Inconclusive, InconclusiveReason.NO_PREVIOUS_BASELINE),
    ("load-differs", sample(requests=2000.0, p99_inter_token_latency_seconds=0.3), PREVIOUS, checks(), SNAPSHOT,
     Inconclusive, InconclusiveReason.LOAD_DIFFERS_FROM_PREVIOUS),
    ("slo-unmeasured", sample(p99_e2e_latency_seconds=NAN), NONE, checks(maxP99E2ELatencySeconds=4), None,
     Inconclusive, InconclusiveReason.NOT_A_NUMBER),
    # a clear failure on valid numbers is not hidden by another signal's trouble
    ("acceptance-low-itl-error", sample(acceptance_rate=0.2,
                                        errors={Signal.P99_INTER_TOKEN_LATENCY: QueryErrorKind.UNAVAILABLE}),
     CONTROL, checks(), None, Failing, FailureReason.ACCEPTANCE_BELOW_MINIMUM),
    ("acceptance-low-control-few", sample(acceptance_rate=0.2, control={"requests": 5.0}), CONTROL, checks(), None,
     Failing, FailureReason.ACCEPTANCE_BELOW_MINIMUM),
    ("acceptance-low-load-differs", sample(acceptance_rate=0.2, requests=5000.0), PREVIOUS, checks(), SNAPSHOT,
     Failing, FailureReason.ACCEPTANCE_BELOW_MINIMUM),
]


@pytest.mark.parametrize(("sample_", "mode", "checks_", "previous", "expected", "reason"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_verdict(sample_: DeploymentSample, mode: BaselineMode, checks_: Checks, previous: PreviousBaseline | None,
                 expected: type, reason: str | None) -> None:
    result = verdict(sample_, checks_, mode, MIN_REQUESTS, previous)
    assert isinstance(result, expected), result
    assert getattr(result, "reason", None) == reason


# -- evidence: the numbers and the limits, in one sentence ------------------------------------------

@pytest.mark.parametrize(("sample_", "mode", "checks_", "text"), [
    (sample(acceptance_rate=0.31), NONE, checks(),
     "acceptance rate 0.31 < minAcceptanceRate 0.50 over 5m (1,234 requests)"),
    (sample(acceptance_rate=0.499), NONE, checks(),
     "acceptance rate 0.499 < minAcceptanceRate 0.500 over 5m (1,234 requests)"),
    (sample(p99_inter_token_latency_seconds=0.041), CONTROL, checks(),
     "P99 inter-token latency 41 ms is 1.37× the control's 30 ms, above maxP99InterTokenLatencyRatio 1.10 "
     "over 5m (1,234 requests; control 410)"),
    (sample(p99_e2e_latency_seconds=12.3), NONE, checks(maxP99E2ELatencySeconds=10),
     "P99 end-to-end latency 12.3 s > maxP99E2ELatencySeconds 10 s over 5m (1,234 requests)"),
    (sample(acceptance_rate=0.2, p99_time_to_first_token_seconds=1.0), CONTROL, checks(),
     "acceptance rate 0.20 < minAcceptanceRate 0.50; P99 time to first token 1 s is 2.00× the control's 500 ms, "
     "above maxP99TimeToFirstTokenRatio 1.50 over 5m (1,234 requests; control 410)"),
])
def test_failing_evidence_reads_as_one_sentence(sample_: DeploymentSample, mode: BaselineMode, checks_: Checks,
                                                text: str) -> None:
    result = verdict(sample_, checks_, mode, MIN_REQUESTS)
    assert isinstance(result, Failing)
    assert result.evidence == text


def test_inconclusive_message_says_what_was_missing() -> None:
    result = verdict(sample(requests=12.0), checks(), CONTROL, MIN_REQUESTS)
    assert result == Inconclusive(InconclusiveReason.TOO_FEW_REQUESTS,
                                  "the speculative pods finished 12 requests in 5m, fewer than minRequests 20")
    down = verdict(sample(errors={Signal.REQUESTS: QueryErrorKind.UNAVAILABLE}), checks(), CONTROL, MIN_REQUESTS)
    assert isinstance(down, Inconclusive)
    assert "request count query failed: Unavailable from the test" in down.message


def test_load_tolerance_is_the_documented_thirty_percent() -> None:
    assert LOAD_TOLERANCE == 0.30
    inside = sample(requests=1234.0 * 1.29)
    outside = sample(requests=1234.0 * 1.31)
    assert isinstance(verdict(inside, checks(), PREVIOUS, MIN_REQUESTS, SNAPSHOT), Healthy)
    assert isinstance(verdict(outside, checks(), PREVIOUS, MIN_REQUESTS, SNAPSHOT), Inconclusive)


def test_healthy_summary_lists_the_numbers() -> None:
    result = verdict(sample(), checks(), CONTROL, MIN_REQUESTS)
    assert result == Healthy(
        "acceptance rate 0.71; P99 inter-token latency 1.00× the control's; P99 end-to-end latency 1.00× the "
        "control's; P99 time to first token 1.00× the control's over 5m (1,234 requests; control 410)")


@pytest.mark.parametrize(("result", "short", "kind_"), [
    (Healthy("fine"), "Healthy", "Healthy"),
    (Failing(FailureReason.E2E_LATENCY_ABOVE_SLO, "slow"), "Failing: E2ELatencyAboveSLO", "Failing"),
    (Inconclusive(InconclusiveReason.NO_DATA, "nothing"), "Inconclusive: NoData", "Inconclusive"),
])
def test_label_kind_and_message(result: Verdict, short: str, kind_: str) -> None:
    assert label(result) == short
    assert kind(result) == kind_
    assert message(result) in ("fine", "slow", "nothing")


# -- properties ------------------------------------------------------------------------------------

_VALUES = st.one_of(st.none(), st.just(NAN), st.just(math.inf), st.floats(min_value=0, max_value=1e4))


@given(requests=st.floats(min_value=0, max_value=MIN_REQUESTS - 0.01), acceptance=_VALUES, itl=_VALUES,
       mode=st.sampled_from(list(BaselineMode)))
def test_fewer_than_min_requests_is_always_inconclusive(requests: float, acceptance: float | None,
                                                        itl: float | None, mode: BaselineMode) -> None:
    result = verdict(sample(requests=requests, acceptance_rate=acceptance, p99_inter_token_latency_seconds=itl),
                     checks(maxP99E2ELatencySeconds=1), mode, MIN_REQUESTS, SNAPSHOT)
    assert isinstance(result, Inconclusive)
    assert result.reason == InconclusiveReason.TOO_FEW_REQUESTS


@given(broken=st.sets(st.sampled_from([s for s in Signal if s != Signal.REQUESTS]), min_size=1),
       how=st.sampled_from(["none", "nan", "error"]), mode=st.sampled_from(list(BaselineMode)))
def test_what_cannot_be_measured_never_fails_a_healthy_sample(broken: set[Signal], how: str,
                                                              mode: BaselineMode) -> None:
    if how == "error":
        sample_ = sample(errors=dict.fromkeys(broken, QueryErrorKind.UNAVAILABLE))
    else:
        missing: float | None = None if how == "none" else NAN
        sample_ = DeploymentSample(WINDOW, dataclasses.replace(SPECULATIVE, **dict.fromkeys(
            (s.value for s in broken), missing)), CONTROL_PODS)
    result = verdict(sample_, checks(maxP99E2ELatencySeconds=10), mode, MIN_REQUESTS, SNAPSHOT)
    assert not isinstance(result, Failing)


@given(acceptance=st.floats(min_value=0, max_value=1), limit=st.floats(min_value=0, max_value=1))
def test_acceptance_fails_exactly_below_the_limit(acceptance: float, limit: float) -> None:
    result = verdict(sample(acceptance_rate=acceptance), checks(minAcceptanceRate=limit), NONE, MIN_REQUESTS)
    assert isinstance(result, Failing) == (acceptance < limit)


# -- the Previous baseline snapshot -----------------------------------------------------------------

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_previous_baseline_snapshots_load_and_latencies() -> None:
    snapshot = previous_baseline(sample(p99_time_to_first_token_seconds=NAN), MIN_REQUESTS, NOW)
    assert snapshot == PreviousBaseline("2026-03-01T12:00:00Z", 1234.0 / WINDOW, 0.030, 5.0, None)


@pytest.mark.parametrize("requests", [None, NAN, 0.0, 19.0])
def test_previous_baseline_needs_min_requests(requests: float | None) -> None:
    assert previous_baseline(sample(requests=requests), MIN_REQUESTS, NOW) is None


def test_baseline_itl_follows_the_mode() -> None:
    assert baseline_p99_inter_token_latency(sample(control={"p99_inter_token_latency_seconds": 0.02}),
                                            CONTROL, None) == 0.02
    assert baseline_p99_inter_token_latency(sample(control={"p99_inter_token_latency_seconds": NAN}),
                                            CONTROL, None) is None
    assert baseline_p99_inter_token_latency(sample(), PREVIOUS, SNAPSHOT) == 0.030
    assert baseline_p99_inter_token_latency(sample(), PREVIOUS, None) is None
    assert baseline_p99_inter_token_latency(sample(), NONE, SNAPSHOT) is None


def test_the_pure_analysis_modules_do_no_io() -> None:
    """STYLE.md layers: verdicts, decisions, queries and metrics import no HTTP or Kubernetes client."""
    code = ("import sys\n"
            "import specdeploy.analysis.verdict, specdeploy.analysis.rollback, specdeploy.analysis.queries\n"
            "import specdeploy.analysis.oom, specdeploy.analysis.metrics, specdeploy.analysis.samples\n"
            "print(sorted(m for m in ('httpx', 'kopf', 'lightkube', 'kubernetes', 'prometheus_api_client')"
            " if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
