"""step_speculation: rollback after failureLimit, never on nothing, at once on OOM, and back again; the paired
latency comparison against the control and the Previous baseline; the acceptance floor, Fixed or Auto."""

import dataclasses
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from analysis_samples import SLICES, T0
from analysis_samples import sample as _sample

from specdeploy.api.reasons import FailureReason, RollbackReason
from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.status import AnalysisStatus, BaselineName, PreviousBaselineStatus, SpeculationStatus
from specdeploy.api.status import Rollback as RollbackRecord
from specdeploy.judgment.comparison import estimate, slices
from specdeploy.judgment.oom import OutOfMemory
from specdeploy.judgment.rollback import RETRY_ANNOTATION
from specdeploy.judgment.samples import DeploymentSample, Signal
from specdeploy.judgment.speculation import SpeculationStep, step_speculation
from specdeploy.judgment.verdict import Failing
from specdeploy.planning.plan import make_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EAGLE3_8B = {"method": "eagle3", "numSpeculativeTokens": 3, "draft": {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}

# -- resources and samples --------------------------------------------------------------------------


def _resource(analysis: dict[str, Any] | None = None, speculation: dict[str, Any] | None = None,
              example: str = "llama-8b-ngram.yaml") -> SpeculativeDeployment:
    """An example SD with `spec.analysis` (wire names) merged in and `spec.speculation` replaced, validated."""
    document = yaml.safe_load((EXAMPLES / example).read_text())
    spec = document["spec"]
    for key, value in (analysis or {}).items():
        if isinstance(value, dict):
            spec["analysis"][key] = {**spec["analysis"].get(key, {}), **value}
        else:
            spec["analysis"][key] = value
    if speculation is not None:
        spec["speculation"] = speculation
    return load_resource(yaml.safe_dump(document))


def _run(resource: SpeculativeDeployment, samples: list[DeploymentSample | None],
         start: SpeculationStatus | None = None, analysis: AnalysisStatus | None = None) -> list[SpeculationStep]:
    speculation = start or SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    plan = make_plan(resource.spec)
    steps = []
    for i, sample in enumerate(samples):
        step = step_speculation(resource, speculation, analysis, True, sample, [], T0 + timedelta(seconds=30 * i),
                                plan=plan)
        speculation, analysis = step.speculation, step.analysis
        steps.append(step)
    return steps


def _last(steps: list[SpeculationStep]) -> AnalysisStatus:
    analysis = steps[-1].analysis
    assert analysis is not None
    return analysis


def test_the_sample_helper_gives_slices_whose_mean_is_the_stated_one() -> None:
    values = _sample(0.8, itl=0.012).speculative
    parts = slices(values.points(Signal.INTER_TOKEN_LATENCY_SUM_SERIES),
                   values.points(Signal.INTER_TOKEN_LATENCY_COUNT_SERIES))
    assert len(parts) == SLICES and all(p.count == pytest.approx(50) for p in parts)
    found = estimate(parts)
    assert found is not None and found.mean == pytest.approx(0.012, rel=0.005) and found.log_standard_error > 0


# -- failing, healthy, nothing known -----------------------------------------------------------------

def test_failure_limit_consecutive_failures_roll_back_with_evidence() -> None:
    steps = _run(_resource({"failureLimit": 3, "checks": {"minAcceptanceRate": 0.5}}), [_sample(0.3)] * 3)
    assert [s.rollback is not None for s in steps] == [False, False, True]
    last = steps[-1]
    assert not last.speculation.decided
    record = last.speculation.last_rollback
    assert record is not None and record.reason == "AcceptanceBelowMinimum"
    assert "0.30 < minAcceptanceRate 0.50 over 5m" in record.evidence
    assert record.speculation_hash and not record.notified
    assert last.speculation.rollbacks == 1


def test_a_healthy_sample_resets_the_count() -> None:
    resource = _resource({"failureLimit": 3, "checks": {"minAcceptanceRate": 0.5}})
    steps = _run(resource, [_sample(0.3), _sample(0.3), _sample(0.8), _sample(0.3), _sample(0.3)])
    assert all(s.rollback is None for s in steps)
    assert [s.analysis.consecutive_failures for s in steps if s.analysis] == [1, 2, 0, 1, 2]
    assert steps[2].analysis is not None and steps[2].analysis.verdict == "Healthy"


def test_no_data_and_idle_never_roll_back() -> None:
    empty = DeploymentSample(window_seconds=300)
    idle = _sample(0.1, requests=3)
    steps = _run(_resource({"failureLimit": 1, "checks": {"minAcceptanceRate": 0.5}}), [empty] * 30 + [idle] * 30)
    assert all(s.rollback is None and s.speculation.decided for s in steps)
    assert (_last(steps).verdict, _last(steps).verdict_reason) == ("Inconclusive", "TooFewRequests")


def test_not_drafting_is_inconclusive_and_never_counts_towards_on_inconclusive_rollback() -> None:
    """Counters that did not move (NaN acceptance): the engine drafts nothing at this batch size."""
    resource = _resource({"onInconclusive": "Rollback", "inconclusiveLimit": 2})
    steps = _run(resource, [_sample(math.nan)] * 5)
    assert all(s.rollback is None and s.speculation.decided for s in steps)
    state = _last(steps)
    assert (state.verdict, state.verdict_reason) == ("Inconclusive", "NotDrafting")
    assert (state.consecutive_failures, state.consecutive_inconclusive) == (0, 0)
    idle = _run(resource, [_sample(0.8, requests=3)] * 2)          # other inconclusive samples do count
    assert idle[-1].rollback is not None and idle[-1].rollback.reason.value == "InconclusiveTooLong"


# -- latency against the control ---------------------------------------------------------------------

def test_latency_regression_against_control_rolls_back() -> None:
    steps = _run(_resource({"failureLimit": 2}), [_sample(0.8, itl=0.05, control_itl=0.02)] * 2)
    rollback = steps[-1].rollback
    assert rollback is not None
    assert rollback.reason == RollbackReason.INTER_TOKEN_LATENCY_REGRESSED
    failing = steps[-1].verdict
    assert isinstance(failing, Failing) and failing.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED
    assert rollback.evidence == f"2 consecutive failing samples (failureLimit 2); the last: {failing.evidence}"
    state = _last(steps)
    assert state.speedup is not None and state.speedup.high < 1 and state.speedup.baseline == BaselineName.CONTROL
    assert state.speedup.value == pytest.approx(0.02 / 0.05, abs=0.01)               # 50 ms vs 20 ms a token
    assert state.per_token_latency == "50 ms vs 20 ms"


def test_a_faster_speculative_variant_is_healthy_and_shows_its_speedup() -> None:
    steps = _run(_resource({"failureLimit": 1}), [_sample(0.8, itl=0.012, control_itl=0.02)] * 4)
    assert all(s.rollback is None and s.speculation.decided for s in steps)
    state = _last(steps)
    assert state.verdict == "Healthy" and state.verdict_reason is None
    assert state.speedup is not None and state.speedup.baseline == BaselineName.CONTROL
    assert state.speedup.low > 1 and state.speedup.value == pytest.approx(0.02 / 0.012, abs=0.02)
    assert state.speedup.low <= state.speedup.value <= state.speedup.high
    assert (state.speedup.requests, state.speedup.baseline_requests) == (pytest.approx(500), pytest.approx(250))
    assert state.per_token_latency == "12 ms vs 20 ms"
    assert (state.p99_inter_token_latency, state.baseline_p99_inter_token_latency) == ("≈ 24 ms", "≈ 40 ms")
    assert state.diagnosis is not None and state.diagnosis.speculative == "Decode-bound"


def test_a_latency_difference_the_window_cannot_resolve_is_inconclusive_not_failing() -> None:
    """+9.5% with the interval holding the limit 1.10: how many requests would tell, not a rollback."""
    steps = _run(_resource({"failureLimit": 1}), [_sample(0.8, itl=0.0219, control_itl=0.02)] * 3)
    assert all(s.rollback is None for s in steps)
    state = _last(steps)
    assert (state.verdict, state.verdict_reason) == ("Inconclusive", "NotEnoughEvidence")
    assert (state.consecutive_failures, state.consecutive_inconclusive) == (0, 3)
    assert state.speedup is not None and state.speedup.low < 1 / 1.10 < state.speedup.high   # holds the limit


def test_a_sample_without_slice_series_decides_no_latency() -> None:
    bare = _sample(0.8, itl=0.05)
    bare = dataclasses.replace(bare, speculative=dataclasses.replace(bare.speculative, series={}))
    steps = _run(_resource({"failureLimit": 1}), [bare] * 3)
    assert all(s.rollback is None for s in steps)
    assert (_last(steps).verdict, _last(steps).verdict_reason) == ("Inconclusive", "NotEnoughEvidence")


# -- the acceptance floor ---------------------------------------------------------------------------

def test_acceptance_far_below_a_fixed_floor_rolls_back_even_when_faster_than_the_control() -> None:
    resource = _resource({"failureLimit": 2, "checks": {"minAcceptanceRate": 0.6}}, EAGLE3_8B)
    steps = _run(resource, [_sample(0.1, itl=0.012)] * 2)
    rollback = steps[-1].rollback
    assert rollback is not None and rollback.reason.value == "AcceptanceBelowMinimum"
    assert "acceptance rate 0.10 < minAcceptanceRate 0.60 over" in rollback.evidence
    state = _last(steps)
    assert (state.acceptance_floor, state.acceptance_floor_basis) == (0.6, "Fixed: minAcceptanceRate 0.60")


def test_auto_floor_keeps_a_healthy_eagle3_head_with_low_acceptance() -> None:
    """EAGLE-3 on Llama-3.1-8B at k=3 measures ~0.47: under the old constant 0.5, above the break-even."""
    sample = _sample(0.47, itl=0.0085, control_itl=0.02, running=8.0, pods=2.0)
    steps = _run(_resource({"failureLimit": 1}, EAGLE3_8B), [sample] * 3)
    assert all(s.rollback is None and s.speculation.decided for s in steps)
    state = _last(steps)
    assert state.verdict == "Healthy"
    assert state.acceptance_floor is not None and 0.05 < state.acceptance_floor < 0.2
    assert state.acceptance_floor_basis is not None
    assert state.acceptance_floor_basis.startswith("Auto: break-even") and "batch 4" in state.acceptance_floor_basis
    assert state.speedup is not None and state.speedup.low > 2
    fixed = _run(_resource({"failureLimit": 1, "checks": {"minAcceptanceRate": 0.5}}, EAGLE3_8B), [sample])
    assert fixed[-1].rollback is not None and fixed[-1].rollback.reason.value == "AcceptanceBelowMinimum"


def test_without_a_baseline_the_auto_floor_decides_alone() -> None:
    resource = _resource({"failureLimit": 1, "baseline": {"mode": "None", "controlReplicas": 0}}, EAGLE3_8B)
    assert _last(_run(resource, [_sample(0.47)])).verdict == "Healthy"
    steps = _run(resource, [_sample(0.03)])
    rollback = steps[-1].rollback
    assert rollback is not None and rollback.reason.value == "AcceptanceBelowMinimum"
    assert "Auto: break-even" in rollback.evidence


def test_sglang_tree_acceptance_is_judged_per_chain_position_from_the_acceptance_length() -> None:
    """With eagleTopk > 1 SGLang's own rate divides by the draft tree; the floor means accepted ÷ proposed chain
    positions, (L − 1) ÷ k from the mean acceptance length L. With topk 1 its rate is already that."""
    chain = _resource({"failureLimit": 1, "checks": {"minAcceptanceRate": 0.5}}, example="sglang-llama-8b-eagle3.yaml")
    assert _last(_run(chain, [_sample(0.7, itl=0.012, mean_acceptance_length=1.6)])).acceptance_rate == 0.7
    resource = chain.model_copy(update={"spec": chain.spec.model_copy(update={
        "speculation": chain.spec.speculation.model_copy(update={"eagle_topk": 4})})})
    good = _sample(0.3, itl=0.012, mean_acceptance_length=3.4)     # (3.4 − 1) ÷ 3 = 0.8
    state = _last(_run(resource, [good]))
    assert state.verdict == "Healthy" and state.acceptance_rate == 0.8
    bad = _sample(0.9, itl=0.012, mean_acceptance_length=1.6)      # (1.6 − 1) ÷ 3 = 0.2
    steps = _run(resource, [bad])
    assert steps[-1].rollback is not None and steps[-1].rollback.reason.value == "AcceptanceBelowMinimum"
    assert _last(steps).acceptance_rate == 0.2


# -- out of memory, rollback and back ---------------------------------------------------------------

def test_out_of_memory_rolls_back_at_once_without_a_sample() -> None:
    death = OutOfMemory(pod="x-1", container="engine", reason="Error", exit_code=1,
                        finished_at="2026-11-29T10:00:00Z", detail="torch.OutOfMemoryError: CUDA out of memory")
    speculation = SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    step = step_speculation(_resource(), speculation, None, True, None, [death], T0)
    assert step.rollback is not None and step.rollback.reason.value == "SpeculativePodOutOfMemory"
    assert not step.speculation.decided


def _rolled_back(resource: SpeculativeDeployment) -> SpeculationStatus:
    speculation = _run(resource, [_sample(0.8, itl=0.05)] * resource.spec.analysis.failure_limit)[-1].speculation
    assert not speculation.decided
    return speculation


def test_retry_annotation_brings_speculation_back_once() -> None:
    resource = _resource()
    speculation = _rolled_back(resource)
    same = step_speculation(resource, speculation, None, True, None, [], T0 + timedelta(minutes=5))
    assert not same.speculation.decided
    annotated = resource.model_copy(update={"metadata": resource.metadata.model_copy(
        update={"annotations": {RETRY_ANNOTATION: "1"}})})
    back = step_speculation(annotated, speculation, None, True, None, [], T0 + timedelta(minutes=5))
    assert back.speculation.decided and back.reenabled is not None
    assert back.reenabled.reason.value == "RetryRequested"   # the Event is decide's (tests/unit/test_decide.py)
    again = step_speculation(annotated, back.speculation, back.analysis, True, None, [], T0 + timedelta(minutes=6))
    assert again.reenabled is None, "the same annotation value is acted on once"


def test_changing_spec_speculation_brings_it_back() -> None:
    resource = _resource()
    speculation = _rolled_back(resource)
    changed = resource.model_copy(update={"spec": resource.spec.model_copy(update={
        "speculation": resource.spec.speculation.model_copy(update={"num_speculative_tokens": 2})})})
    step = step_speculation(changed, speculation, None, True, None, [], T0 + timedelta(minutes=1))
    assert step.speculation.decided and step.reenabled is not None
    assert not step.speculation.trial, "a re-enable the user asked for is judged as new speculation, no trial"


def test_auto_reenable_after_the_cooldown() -> None:
    resource = _resource({"reenable": "Auto", "cooldown": "10m"})
    speculation = _rolled_back(resource)
    at = datetime.fromisoformat(speculation.last_rollback.at.replace("Z", "+00:00"))  # type: ignore[union-attr]
    early = step_speculation(resource, speculation, None, True, None, [], at + timedelta(seconds=599))
    assert not early.speculation.decided
    due = step_speculation(resource, speculation, None, True, None, [], at + timedelta(seconds=600))
    assert due.speculation.decided


def test_the_cooldowns_re_enable_is_a_trial_the_first_failing_sample_ends_and_a_healthy_window_passes() -> None:
    resource = _resource({"reenable": "Auto", "cooldown": "10m", "failureLimit": 3})
    speculation = _rolled_back(resource).model_copy(update={"active": False})
    at = datetime.fromisoformat(speculation.last_rollback.at.replace("Z", "+00:00"))  # type: ignore[union-attr]
    due = step_speculation(resource, speculation, None, True, None, [], at + timedelta(minutes=10))
    assert due.speculation.decided and due.speculation.trial

    regressed = _sample(0.8, itl=0.05, control_itl=0.02)
    failed = step_speculation(resource, due.speculation, due.analysis, True, regressed, [], at + timedelta(minutes=11))
    assert failed.rollback is not None, "on trial one failing sample is enough, not failureLimit 3"
    assert failed.rollback.evidence.startswith("a failing sample on trial (re-enabled by the cooldown after rollback 1")
    assert not failed.speculation.decided and not failed.speculation.trial and failed.speculation.rollbacks == 2

    faster = _sample(0.8, itl=0.012, control_itl=0.02)
    early = step_speculation(resource, due.speculation, due.analysis, True, faster, [], at + timedelta(minutes=11))
    assert early.speculation.decided and early.speculation.trial, \
        "a minute in, the 5-minute window still holds the pods that did not speculate: Healthy does not judge them"
    passed = step_speculation(resource, early.speculation, early.analysis, True, faster, [],
                              at + timedelta(minutes=15))
    assert passed.speculation.decided and not passed.speculation.trial
    after = step_speculation(resource, passed.speculation, passed.analysis, True, regressed, [],
                             at + timedelta(minutes=16))
    assert after.rollback is None, "judged Healthy once on a window of its own: failureLimit counts again"


def test_a_rejected_generation_changes_nothing() -> None:
    speculation = SpeculationStatus(active=True, since="2026-11-29T09:00:00Z")
    step = step_speculation(_resource({"failureLimit": 1}), speculation, None, False, _sample(0.1, itl=0.05), [], T0)
    assert step.speculation == speculation and step.rollback is None


def test_a_sample_while_rolled_back_is_recorded_so_the_next_is_an_interval_later() -> None:
    resource = _resource()
    speculation = _rolled_back(resource).model_copy(update={"active": False})   # the rollout is done
    later = T0 + timedelta(minutes=3)
    step = step_speculation(resource, speculation, None, True, _sample(0.8, running=8.0, pods=2.0), [], later)
    assert step.analysis is not None and step.analysis.last_sample_at == "2026-11-29T10:03:00Z"
    snapshot = step.analysis.previous_baseline
    assert snapshot is not None, "the pods without speculation are the Previous baseline"
    assert snapshot.running_per_pod == 4.0 and snapshot.requests_per_second == pytest.approx(500 / 300)
    assert snapshot.inter_token_latency is not None and snapshot.inter_token_latency.slices == SLICES
    assert snapshot.inter_token_latency.mean_seconds == pytest.approx(0.02, rel=0.005)
    assert snapshot.inter_token_latency.log_standard_error > 0
    assert snapshot.e2e_latency is not None and snapshot.time_to_first_token is not None


def test_no_previous_baseline_while_the_rollback_still_rolls() -> None:
    """Decided but not done: some pods still speculate, so the sample is no measure of the pods without it."""
    resource = _resource()
    rolling = _rolled_back(resource)
    assert rolling.active and not rolling.decided
    step = step_speculation(resource, rolling, None, True, _sample(0.8, running=8.0, pods=2.0), [],
                            T0 + timedelta(minutes=3))
    assert step.analysis is not None and step.analysis.last_sample_at == "2026-11-29T10:03:00Z"
    assert step.analysis.previous_baseline is None


# -- the Previous baseline --------------------------------------------------------------------------

def test_previous_baseline_compares_at_matched_load_only() -> None:
    resource = _resource({"failureLimit": 1, "baseline": {"mode": "Previous", "controlReplicas": 0}})
    annotated = resource.model_copy(update={"metadata": resource.metadata.model_copy(
        update={"annotations": {RETRY_ANNOTATION: "1"}})})
    rolled = SpeculationStatus(active=False, since="2026-11-29T09:00:00Z", rollbacks=1, last_rollback=RollbackRecord(
        at="2026-11-29T09:00:00Z", reason="InterTokenLatencyRegressed", evidence="…"))
    without = step_speculation(resource, rolled, None, True, _sample(0.8, running=8.0, pods=2.0), [], T0)
    assert without.analysis is not None and without.analysis.previous_baseline is not None
    back = step_speculation(annotated, without.speculation, without.analysis, True, None, [], T0)
    assert back.speculation.decided

    matched = _sample(0.8, itl=0.012, running=9.0, pods=2.0)       # 4.5 vs 4.0 running per pod: within 30%
    faster = _run(annotated, [matched], back.speculation, back.analysis)
    state = _last(faster)
    assert state.verdict == "Healthy"
    assert state.speedup is not None and state.speedup.baseline == BaselineName.PREVIOUS and state.speedup.low > 1
    assert state.per_token_latency is not None and state.per_token_latency.startswith("12 ms vs 20")
    assert state.previous_baseline == without.analysis.previous_baseline, "the snapshot is kept"

    slower = _run(annotated, [_sample(0.8, itl=0.05, running=8.0, pods=2.0)], back.speculation, back.analysis)
    assert slower[-1].rollback is not None and slower[-1].rollback.reason.value == "InterTokenLatencyRegressed"

    busier = _sample(0.8, itl=0.05, running=16.0, pods=2.0)         # 8 vs 4 running per pod: not comparable
    steps = _run(annotated, [busier] * 3, back.speculation, back.analysis)
    assert all(s.rollback is None for s in steps)
    assert (_last(steps).verdict, _last(steps).verdict_reason) == ("Inconclusive", "LoadDiffersFromPrevious")


def test_a_previous_snapshot_from_before_the_comparison_is_never_a_failure() -> None:
    """A snapshot written before the per-token comparison has no load and no means: nothing to compare with
    at matched load, so Inconclusive — however slow the pods are now — until a new one is taken."""
    resource = _resource({"failureLimit": 1, "baseline": {"mode": "Previous", "controlReplicas": 0}})
    old = AnalysisStatus(previous_baseline=PreviousBaselineStatus(
        taken_at="2026-11-29T09:00:00Z", requests_per_second=3.0, p99_inter_token_latency_seconds=0.025))
    steps = _run(resource, [_sample(0.8, itl=0.05, running=8.0, pods=2.0)] * 3, analysis=old)
    assert all(s.rollback is None for s in steps)
    state = _last(steps)
    assert (state.verdict, state.verdict_reason) == ("Inconclusive", "LoadDiffersFromPrevious")
    assert state.message is not None and "unknown" in state.message
