"""judgment/rollback and judgment/oom: counting verdicts, deciding, re-enabling; OOM deaths in pod status.
Tables with the clock passed in; no fakes."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdeploy.api.reasons import FailureReason, InconclusiveReason, ReenableReason, RollbackReason
from specdeploy.api.spec import Analysis, Speculation
from specdeploy.api.status import (
    AnalysisStatus,
    Diagnosis,
    MeanLatency,
    PreviousBaselineStatus,
    ScheduleCalibration,
    SpeculationStatus,
    Speedup,
)
from specdeploy.api.status import Rollback as RollbackRecord
from specdeploy.judgment.comparison import Comparison
from specdeploy.judgment.oom import OutOfMemory, is_out_of_memory, out_of_memory
from specdeploy.judgment.rollback import (
    MAX_BACKOFF_DOUBLINGS,
    Keep,
    Reenabled,
    Rollback,
    auto_reenable_at,
    cooldown_seconds,
    decide,
    next_analysis_state,
    reenable,
    reenabled,
    rolled_back,
    speculation_hash,
)
from specdeploy.judgment.samples import DeploymentSample, SignalValues
from specdeploy.judgment.verdict import Assessment, Failing, Floor, Healthy, Inconclusive, Verdict

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
H = Healthy("fine")
F = Failing(FailureReason.ACCEPTANCE_BELOW_MINIMUM, "acceptance rate 0.31 < minAcceptanceRate 0.50 over 5m (900 requests)")
I = Inconclusive(InconclusiveReason.PROMETHEUS_UNAVAILABLE, "the request count query failed: connection refused")  # noqa: E741
N = Inconclusive(InconclusiveReason.NOT_DRAFTING, "not drafting now: the draft counters did not move in the window")
SAMPLE = DeploymentSample(
    300.0,
    SignalValues(acceptance_rate=0.31, mean_acceptance_length=2.2, p99_inter_token_latency_seconds=math.nan,
                 mean_inter_token_latency_seconds=0.0059, mean_e2e_latency_seconds=2.0,
                 mean_time_to_first_token_seconds=0.2, mean_queue_time_seconds=0.05, requests=900.0),
    SignalValues(p99_inter_token_latency_seconds=0.02, mean_inter_token_latency_seconds=0.005, requests=300.0))
PER_TOKEN = Comparison(ratio=1.18, low=1.09, high=1.27, slices=10, requests=900.0, baseline_requests=300.0)
FIXED = Floor(0.5, "Fixed: minAcceptanceRate 0.50", fixed=True)


def analysis(**fields: Any) -> Analysis:
    return Analysis.model_validate(fields)


def run(verdicts: list[Verdict]) -> AnalysisStatus:
    state = None
    for result in verdicts:
        state = next_analysis_state(state, SAMPLE, Assessment(result), NOW)
    assert state is not None
    return state


# -- counting --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("verdicts", "failures", "inconclusive"), [
    ([F], 1, 0),
    ([F, F, F], 3, 0),
    ([F, F, H], 0, 0),
    ([F, H, F], 1, 0),
    ([F, I, F], 2, 0),         # an inconclusive sample between failures neither resets nor adds
    ([F, I, I, I, F], 2, 0),
    ([I, I, I], 0, 3),
    ([I, I, F], 1, 0),         # a conclusive sample ends the inconclusive run
    ([I, I, H], 0, 0),
    ([F, F, I], 2, 1),
    ([H, H], 0, 0),
    ([N, N, N], 0, 0),         # not drafting counts as nothing: neither inconclusive nor a reset
    ([F, N, F], 2, 0),
    ([F, F, N], 2, 0),
    ([I, N, I], 0, 2),         # ... and does not end an inconclusive run either
    ([I, I, N], 0, 2),
])
def test_consecutive_counters(verdicts: list[Verdict], failures: int, inconclusive: int) -> None:
    state = run(verdicts)
    assert (state.consecutive_failures, state.consecutive_inconclusive) == (failures, inconclusive)


def test_state_shows_the_last_sample_without_nans_and_the_speedup_against_the_control() -> None:
    assessment = Assessment(F, PER_TOKEN, "control", {"speculative": "Decode-bound"}, FIXED)
    state = next_analysis_state(None, SAMPLE, assessment, NOW)
    assert state == AnalysisStatus(
        last_sample_at="2026-03-01T12:00:00Z", acceptance_rate=0.31, mean_acceptance_length=2.2,
        acceptance_floor=0.5, acceptance_floor_basis="Fixed: minAcceptanceRate 0.50",
        mean_inter_token_latency_seconds=0.0059, baseline_mean_inter_token_latency_seconds=0.005,
        p99_inter_token_latency=None, baseline_p99_inter_token_latency="≈ 20 ms",
        per_token_latency="5.9 ms vs 5 ms",
        # the reciprocal of speculative ÷ control, its interval's ends swapped
        speedup=Speedup(value=0.85, low=0.79, high=0.92, baseline="control", requests=900.0, baseline_requests=300.0),
        diagnosis=Diagnosis(speculative="Decode-bound", control=None,
                            message="speculative: queue 50 ms, prefill 150 ms, decode 1.8 s per request"),
        requests=900.0, objective="Latency", mean_queue_time_seconds=0.05,
        verdict="Failing", verdict_reason="AcceptanceBelowMinimum", message=F.evidence,
        consecutive_failures=1, consecutive_inconclusive=0,
    )


def test_state_is_rounded_to_what_kubectl_shows() -> None:
    noisy = DeploymentSample(300.0, SignalValues(acceptance_rate=0.712345, mean_acceptance_length=3.137777,
                                                 mean_inter_token_latency_seconds=0.01234567, requests=900.04))
    floor = Floor(0.11264593, "Auto: break-even 0.09 …")
    state = next_analysis_state(None, noisy, Assessment(H, floor=floor), NOW)
    assert (state.acceptance_rate, state.mean_acceptance_length, state.acceptance_floor) == (0.712, 3.138, 0.113)
    assert (state.mean_inter_token_latency_seconds, state.requests) == (0.012346, 900.0)
    assert state.per_token_latency == "12.3 ms"           # no baseline: the speculative pods alone
    assert state.speedup is None and state.diagnosis is None
    assert state.baseline_mean_inter_token_latency_seconds is None


def test_the_previous_baseline_is_shown_from_the_snapshot_and_kept() -> None:
    snapshot = PreviousBaselineStatus(
        taken_at="2026-01-01T00:00:00Z", requests_per_second=3.0, running_per_pod=4.0,
        inter_token_latency=MeanLatency(mean_seconds=0.008, log_standard_error=0.01, slices=10, requests=900.0),
        p99_inter_token_latency_seconds=0.009)
    before = AnalysisStatus(previous_baseline=snapshot, consecutive_failures=2)
    against = Comparison(ratio=0.74, low=0.70, high=0.78, slices=10, requests=900.0, baseline_requests=900.0)
    state = next_analysis_state(before, SAMPLE, Assessment(H, against, "Previous"), NOW)
    assert state.previous_baseline == snapshot
    assert state.baseline_mean_inter_token_latency_seconds == 0.008
    assert state.baseline_p99_inter_token_latency == "< 10 ms"     # inside vLLM's first bucket: a bound
    assert state.per_token_latency == "5.9 ms vs 8 ms"
    assert state.speedup == Speedup(value=1.35, low=1.28, high=1.43, baseline="Previous", requests=900.0,
                                    baseline_requests=900.0)
    assert (state.verdict, state.message, state.consecutive_failures) == ("Healthy", "fine", 0)
    unknown = next_analysis_state(state, SAMPLE, Assessment(I), NOW)      # no comparison: nothing to show
    assert unknown.speedup is None and unknown.baseline_mean_inter_token_latency_seconds is None
    assert unknown.per_token_latency == "5.9 ms"
    assert (unknown.verdict, unknown.verdict_reason) == ("Inconclusive", "PrometheusUnavailable") and unknown.message == I.message
    assert unknown.previous_baseline == snapshot


# -- deciding --------------------------------------------------------------------------------------

OOM = OutOfMemory("llama-7f9c-x2", "engine", "Error", 1, "2026-03-01T11:59:00Z",
                  "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize(("verdicts", "spec", "ooms", "expected", "reason"), [
    ([F, F], {}, [], Keep, None),
    ([F, F, F], {}, [], Rollback, RollbackReason.ACCEPTANCE_BELOW_MINIMUM),
    ([F], {"failureLimit": 1}, [], Rollback, RollbackReason.ACCEPTANCE_BELOW_MINIMUM),
    ([F, I, F], {"failureLimit": 2}, [], Rollback, RollbackReason.ACCEPTANCE_BELOW_MINIMUM),
    ([F, F, F, I], {}, [], Keep, None),                       # the rollback needs a Failing sample to report
    ([F, F, H, F], {}, [], Keep, None),
    ([I] * 20, {}, [], Keep, None),                           # Hold (default): nothing known, nothing done
    ([I] * 19, {"onInconclusive": "Rollback"}, [], Keep, None),
    ([I] * 20, {"onInconclusive": "Rollback"}, [], Rollback, RollbackReason.INCONCLUSIVE_TOO_LONG),
    ([I] * 3, {"onInconclusive": "Rollback", "inconclusiveLimit": 3}, [], Rollback,
     RollbackReason.INCONCLUSIVE_TOO_LONG),
    ([I, I, N, N], {"onInconclusive": "Rollback", "inconclusiveLimit": 3}, [], Keep, None),   # not drafting
    ([I, N, I, N, I], {"onInconclusive": "Rollback", "inconclusiveLimit": 3}, [], Rollback,
     RollbackReason.INCONCLUSIVE_TOO_LONG),
    ([N] * 20, {"onInconclusive": "Rollback"}, [], Keep, None),
    ([H], {}, [OOM], Rollback, RollbackReason.SPECULATIVE_POD_OUT_OF_MEMORY),   # at once
    ([I], {}, [OOM, OOM], Rollback, RollbackReason.SPECULATIVE_POD_OUT_OF_MEMORY),
    ([H], {"checks": {"rollbackOnOOM": False}}, [OOM], Keep, None),
])
def test_decide(verdicts: list[Verdict], spec: dict[str, Any], ooms: list[OutOfMemory], expected: type,
                reason: RollbackReason | None) -> None:
    decision = decide(run(verdicts), verdicts[-1], analysis(**spec), ooms)
    assert isinstance(decision, expected), decision
    assert getattr(decision, "reason", None) == reason


def test_rollback_evidence_carries_the_count_and_the_numbers() -> None:
    decision = decide(run([F, F, F]), F, analysis())
    assert decision == Rollback(
        RollbackReason.ACCEPTANCE_BELOW_MINIMUM,
        "3 consecutive failing samples (failureLimit 3); the last: acceptance rate 0.31 < minAcceptanceRate 0.50 "
        "over 5m (900 requests)")
    oom = decide(run([H]), H, analysis(), [OOM, OOM])
    assert oom == Rollback(
        RollbackReason.SPECULATIVE_POD_OUT_OF_MEMORY,
        "pod llama-7f9c-x2 container engine ran out of memory (Error, exit code 1) at 2026-03-01T11:59:00Z: "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (and 1 more)")


def test_a_failing_sample_that_decides_at_once_rolls_back_without_failure_limit() -> None:
    """NoSchedulePays on a loss the model states beyond its error, confirmed by the latest slice
    (judgment/speculation.py): its first sample decides, whatever the counters say."""
    at_once = Failing(FailureReason.NO_SCHEDULE_PAYS, "k 2 predicted at 0.87×", at_once=True)
    decision = decide(run([H, at_once]), at_once, analysis(failureLimit=3))
    assert decision == Rollback(
        RollbackReason.NO_SCHEDULE_PAYS,
        "a loss the cost model states beyond its error, confirmed by the latest slice: this sample decides, not "
        "failureLimit 3; k 2 predicted at 0.87×")
    assert isinstance(decide(run([H, F]), F, analysis(failureLimit=3)), Keep)   # any other failure counts


def test_slower_and_explained_counts_toward_failure_limit_and_rolls_back_under_its_own_reason() -> None:
    """SlowerBelowAcceptanceFloor is measured on the window's latency interval: the noise failureLimit is for."""
    explained = Failing(FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR, "per-token latency +10% (95% interval +8%…+11%)")
    assert isinstance(decide(run([H, explained]), explained, analysis(failureLimit=2)), Keep)
    decision = decide(run([H, explained, explained]), explained, analysis(failureLimit=2))
    assert isinstance(decision, Rollback) and decision.reason == RollbackReason.SLOWER_BELOW_ACCEPTANCE_FLOOR
    assert decision.reason.value == "SlowerBelowAcceptanceFloor"


def test_keep_says_how_close_it_came() -> None:
    assert decide(run([F, F]), F, analysis()) == Keep("2 of 3 failing samples in a row; 0 inconclusive in a row")


@given(st.lists(st.sampled_from([H, F, I, N]), min_size=1, max_size=40), st.integers(min_value=1, max_value=5))
def test_no_rollback_without_failure_limit_failures_in_a_row_when_holding(verdicts: list[Verdict],
                                                                          limit: int) -> None:
    """Hold: only `limit` Failing samples with no Healthy between them (Inconclusive aside) roll back."""
    decision = decide(run(verdicts), verdicts[-1], analysis(failureLimit=limit))
    conclusive = [v for v in verdicts if not isinstance(v, Inconclusive)]
    tail = 0
    for result in reversed(conclusive):
        if not isinstance(result, Failing):
            break
        tail += 1
    assert isinstance(decision, Rollback) == (isinstance(verdicts[-1], Failing) and tail >= limit)


# -- rollback and re-enable -------------------------------------------------------------------------

ACTIVE = SpeculationStatus(active=True, since="2026-03-01T10:00:00Z", rollbacks=0)


def test_rolled_back_records_why_and_counts() -> None:
    decision = Rollback(RollbackReason.INTER_TOKEN_LATENCY_REGRESSED, "P99 … 1.37×")
    after = rolled_back(ACTIVE, decision, NOW)
    assert after == SpeculationStatus(   # decided; the pods still speculate until the rollout replaces them
        decided=False, active=True, since="2026-03-01T12:00:00Z", rollbacks=1,
        last_rollback=RollbackRecord(at="2026-03-01T12:00:00Z", reason="InterTokenLatencyRegressed",
                                     evidence="P99 … 1.37×"))
    assert rolled_back(after, decision, NOW + timedelta(hours=1)).rollbacks == 2
    assert rolled_back(None, decision, NOW).rollbacks == 1
    back = reenabled(after, NOW + timedelta(hours=2), Reenabled(ReenableReason.RETRY_REQUESTED, "…"))
    assert (back.decided, back.since, back.rollbacks, back.last_rollback, back.trial) == (
        True, "2026-03-01T14:00:00Z", 1, after.last_rollback, False)
    assert reenabled(after, NOW, Reenabled(ReenableReason.COOLDOWN_ELAPSED, "…")).trial
    assert not reenabled(after, NOW, Reenabled(ReenableReason.SPECULATION_SPEC_CHANGED, "…")).trial


def test_a_rollback_keeps_the_calibration_so_a_re_enable_comes_back_with_the_calibrated_table() -> None:
    calibrated = ACTIVE.model_copy(update={"calibration": ScheduleCalibration(key="k", changes=1)})
    after = rolled_back(calibrated, Rollback(RollbackReason.INTER_TOKEN_LATENCY_REGRESSED, "…"), NOW)
    assert after.calibration == calibrated.calibration


@pytest.mark.parametrize(("trial", "failures", "rolls"), [
    (True, 1, True),      # on trial: the first failing sample decides
    (False, 1, False),    # otherwise failureLimit (3) in a row
    (False, 3, True),
])
def test_on_trial_the_first_failing_sample_rolls_back(trial: bool, failures: int, rolls: bool) -> None:
    speculation = ACTIVE.model_copy(update={"rollbacks": 1, "trial": trial})
    state = AnalysisStatus(consecutive_failures=failures)
    failing = Failing(FailureReason.INTER_TOKEN_LATENCY_REGRESSED, "per-token latency +20%")
    decision = decide(state, failing, analysis(failureLimit=3), trial=speculation)
    assert isinstance(decision, Rollback) == rolls
    if trial:
        assert isinstance(decision, Rollback)
        assert decision.evidence.startswith("a failing sample on trial (re-enabled by the cooldown after rollback 1")
        assert decision.evidence.endswith("per-token latency +20%")


def test_on_trial_an_inconclusive_sample_decides_nothing() -> None:
    speculation = ACTIVE.model_copy(update={"rollbacks": 1, "trial": True})
    quiet = Inconclusive(InconclusiveReason.TOO_FEW_REQUESTS, "3 requests")
    assert isinstance(decide(AnalysisStatus(), quiet, analysis(), trial=speculation), Keep)


@pytest.mark.parametrize(("rollbacks", "seconds"), [(1, 1800), (2, 3600), (3, 7200), (4, 14400),
                                                    (100, 1800 * 2**MAX_BACKOFF_DOUBLINGS)])
def test_cooldown_doubles_with_each_rollback(rollbacks: int, seconds: float) -> None:
    assert cooldown_seconds(analysis(cooldown="30m"), rollbacks) == seconds


def rolled(rollbacks: int, at: datetime = NOW) -> SpeculationStatus:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return SpeculationStatus(active=False, since=stamp, rollbacks=rollbacks,
                             last_rollback=RollbackRecord(at=stamp, reason="AcceptanceBelowMinimum", evidence="…"))


HASH = speculation_hash(Speculation.model_validate({"method": "ngram"}))
OTHER_HASH = speculation_hash(Speculation.model_validate({"method": "ngram", "numSpeculativeTokens": 5}))


@pytest.mark.parametrize(("speculation", "spec", "later", "hashes", "annotations", "reason"), [
    # speculation, analysis, time after NOW, (hash now, hash at rollback), (annotation, seen), expected reason
    (rolled(1), {}, timedelta(days=30), (HASH, HASH), (None, None), None),             # Manual waits forever
    (rolled(1), {}, timedelta(0), (OTHER_HASH, HASH), (None, None), ReenableReason.SPECULATION_SPEC_CHANGED),
    (rolled(1), {}, timedelta(0), (OTHER_HASH, None), (None, None), None),             # nothing recorded
    (rolled(1), {}, timedelta(0), (HASH, HASH), ("1", None), ReenableReason.RETRY_REQUESTED),
    (rolled(1), {}, timedelta(0), (HASH, HASH), ("2", "1"), ReenableReason.RETRY_REQUESTED),
    (rolled(1), {}, timedelta(0), (HASH, HASH), ("1", "1"), None),                     # already seen
    (rolled(1), {}, timedelta(0), (HASH, HASH), ("", None), None),
    (rolled(1), {"reenable": "Auto"}, timedelta(minutes=29), (HASH, HASH), (None, None), None),
    (rolled(1), {"reenable": "Auto"}, timedelta(minutes=30), (HASH, HASH), (None, None),
     ReenableReason.COOLDOWN_ELAPSED),
    (rolled(3), {"reenable": "Auto"}, timedelta(minutes=119), (HASH, HASH), (None, None), None),
    (rolled(3), {"reenable": "Auto"}, timedelta(minutes=120), (HASH, HASH), (None, None),
     ReenableReason.COOLDOWN_ELAPSED),
    (ACTIVE, {"reenable": "Auto"}, timedelta(days=1), (OTHER_HASH, HASH), ("9", None), None),   # not rolled back
    (SpeculationStatus(active=False, rollbacks=0), {"reenable": "Auto"}, timedelta(days=1), (OTHER_HASH, HASH),
     ("9", None), None),                                      # off because the spec says so, not a rollback
])
def test_reenable(speculation: SpeculationStatus, spec: dict[str, Any], later: timedelta, hashes: tuple[str, str],
                  annotations: tuple[str | None, str | None], reason: ReenableReason | None) -> None:
    result = reenable(speculation, analysis(**spec), NOW + later, speculation_hash_now=hashes[0],
                      speculation_hash_at_rollback=hashes[1], retry_annotation=annotations[0],
                      retry_annotation_seen=annotations[1])
    assert (result.reason if result else None) == reason


def test_auto_reenable_time_is_known_in_advance() -> None:
    assert auto_reenable_at(rolled(2), analysis(reenable="Auto", cooldown="10m")) == NOW + timedelta(minutes=20)
    assert auto_reenable_at(rolled(2), analysis(reenable="Manual")) is None
    assert auto_reenable_at(ACTIVE, analysis(reenable="Auto")) is None


def test_speculation_hash_changes_only_with_the_speculation_spec() -> None:
    same = Speculation.model_validate({"method": "ngram", "numSpeculativeTokens": 3})
    assert speculation_hash(same) == HASH           # defaults written out or not: the same settings
    assert OTHER_HASH != HASH
    assert len(HASH) == 16


# -- OOM deaths in pod status ------------------------------------------------------------------------

def pod(name: str, variant: str = "speculative", **states: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"specdeploy.io/variant": variant}},
            "status": {"containerStatuses": [{"name": "engine", "restartCount": 1,
                                              **{k: {"terminated": v} for k, v in states.items()}}]}}


CUDA_LOG = ("INFO loading weights\nTraceback (most recent call last):\n  File \"…\", line 1\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.19 GiB\n")


@pytest.mark.parametrize(("reason", "message", "expected"), [
    ("OOMKilled", "", True),
    ("Error", CUDA_LOG, True),
    ("Error", "RuntimeError: CUDA error: out of memory", True),
    ("Error", "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`", True),
    ("Error", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", True),
    ("Error", "ValueError: some other failure", False),
    ("Completed", "", False),
    (None, None, False),
])
def test_is_out_of_memory(reason: str | None, message: str | None, expected: bool) -> None:
    assert is_out_of_memory(reason, message) is expected


def test_out_of_memory_reads_speculative_pods_only_and_since_the_speculation_began() -> None:
    pods = [
        pod("spec-a", lastState={"reason": "Error", "exitCode": 1, "message": CUDA_LOG,
                                 "finishedAt": "2026-03-01T11:59:00Z"}),
        pod("spec-b", lastState={"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-03-01T09:00:00Z"}),
        pod("control-a", "control", lastState={"reason": "OOMKilled", "exitCode": 137,
                                               "finishedAt": "2026-03-01T11:59:00Z"}),
        pod("spec-c", state={"reason": "OOMKilled", "exitCode": 137},
            lastState={"reason": "OOMKilled", "exitCode": 137}),
        pod("spec-d", lastState={"reason": "Error", "exitCode": 1, "message": "KeyError: 'x'",
                                 "finishedAt": "2026-03-01T11:59:00Z"}),
        {"metadata": {"name": "starting", "labels": {"specdeploy.io/variant": "speculative"}}, "status": {}},
    ]
    found = out_of_memory(pods, since=datetime(2026, 3, 1, 10, 0, tzinfo=UTC))
    assert [(o.pod, o.reason, o.exit_code) for o in found] == [("spec-a", "Error", 1), ("spec-c", "OOMKilled", 137)]
    assert found[0].detail.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert {o.pod for o in out_of_memory(pods)} == {"spec-a", "spec-b", "spec-c"}
