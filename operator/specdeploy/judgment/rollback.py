"""From verdicts to decisions: count them, roll speculation back, and bring it back again. Pure; the clock
is an argument.

    state = next_analysis_state(status.analysis, sample, assess(sample, policy), now)
    match decide(state, result, spec.analysis, out_of_memory(pods, since)):
        case Rollback(reason, evidence): speculation = rolled_back(status.speculation, decision, now)
        case Keep(): ...
    if (back := reenable(status.speculation, spec.analysis, ...)) is not None:
        speculation = reenabled(status.speculation, now, back)

Counting (docs/analysis.md "Counting"): a Failing sample adds to `consecutiveFailures` and clears
`consecutiveInconclusive`; an Inconclusive one adds to `consecutiveInconclusive` and leaves the failures
as they are; a Healthy one clears both. So failing, inconclusive, failing is two failures in a row: a
Prometheus blip between two bad samples neither erases the first nor counts as a third. This is Argo
Rollouts' rule for its Error measurements (analysis/analysis.go: an Error touches only
ConsecutiveError, never Failed); unlike Argo, whose failureLimit counts every failure of the run, ours
counts consecutive conclusive samples, because an operator that analyses forever has no run to end.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from specdeploy.api.reasons import InconclusiveReason, ReenableReason, RollbackReason
from specdeploy.api.spec import Analysis, OnInconclusive, Reenable, Speculation
from specdeploy.api.status import AnalysisStatus, BaselineName, Diagnosis, SpeculationStatus, Speedup
from specdeploy.api.status import Rollback as RollbackRecord
from specdeploy.judgment import evidence
from specdeploy.judgment.oom import OutOfMemory
from specdeploy.judgment.samples import DeploymentSample, SignalValues
from specdeploy.judgment.verdict import (
    Assessment,
    Failing,
    Healthy,
    Inconclusive,
    Verdict,
    kind,
    message,
    p99_shown,
    verdict_reason,
)

RETRY_ANNOTATION = "specdeploy.io/retry-speculation"
MAX_BACKOFF_DOUBLINGS = 10
"""Auto re-enable waits cooldown × 2^(rollbacks − 1), the exponent capped here (30m → at most ~21 days)."""


@dataclass(frozen=True)
class Keep:
    """Speculation stays as it is; `message` says how close it came to a rollback."""

    message: str


@dataclass(frozen=True)
class Rollback:
    """Take speculation away; `evidence` is the sentence for status, the Event and the alert."""

    reason: RollbackReason
    evidence: str


Decision = Keep | Rollback


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _speedup(assessment: Assessment) -> Speedup | None:
    """Baseline ÷ speculative mean per-token latency (the comparison's reciprocal), with its interval."""
    found = assessment.per_token
    if found is None or assessment.baseline is None:
        return None
    return Speedup(value=round(1 / found.ratio, 2), low=round(1 / found.high, 2), high=round(1 / found.low, 2),
                   baseline=assessment.baseline, requests=round(found.requests, 1),
                   baseline_requests=round(found.baseline_requests, 1))


def _diagnosis(assessment: Assessment, sample: DeploymentSample) -> Diagnosis | None:
    found = assessment.diagnosis
    if not found:
        return None
    parts = []
    for variant, values in (("speculative", sample.speculative), ("control", sample.control)):
        if variant in found and values.mean_e2e_latency_seconds:
            queue = values.mean_queue_time_seconds or 0.0
            ttft = values.mean_time_to_first_token_seconds or 0.0
            parts.append(f"{variant}: queue {evidence.seconds(queue)}, prefill {evidence.seconds(max(0.0, ttft - queue))}, "
                         f"decode {evidence.seconds(max(0.0, values.mean_e2e_latency_seconds - ttft))} per request")
    return Diagnosis(speculative=found.get("speculative"), control=found.get("control"),
                     message="; ".join(parts) or None)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def next_analysis_state(previous: AnalysisStatus | None, sample: DeploymentSample, assessment: Assessment,
                        now: datetime) -> AnalysisStatus:
    """status.analysis after one more sample: its numbers (NaN shown as null, at the precision `kubectl get`
    shows), the verdict, the speedup, the diagnosis and the counters. NotDrafting counts as nothing."""
    before = previous or AnalysisStatus()
    result = assessment.verdict
    match result:
        case Healthy():
            failures, inconclusive = 0, 0
        case Failing():
            failures, inconclusive = before.consecutive_failures + 1, 0
        case Inconclusive(reason=InconclusiveReason.NOT_DRAFTING):
            failures, inconclusive = before.consecutive_failures, before.consecutive_inconclusive
        case Inconclusive():
            failures, inconclusive = before.consecutive_failures, before.consecutive_inconclusive + 1
    values = sample.speculative
    baseline_values = sample.control if assessment.baseline == BaselineName.CONTROL else None
    snapshot = before.previous_baseline if assessment.baseline == BaselineName.PREVIOUS else None
    baseline_mean = _finite(baseline_values.mean_inter_token_latency_seconds) if baseline_values else (
        snapshot.inter_token_latency.mean_seconds if snapshot and snapshot.inter_token_latency else None)
    baseline_p99 = p99_shown(baseline_values.p99_inter_token_latency_seconds) if baseline_values else (
        p99_shown(snapshot.p99_inter_token_latency_seconds) if snapshot else None)
    floor = assessment.floor
    spec_mean = _finite(values.mean_inter_token_latency_seconds)
    per_token = None
    if spec_mean is not None:
        per_token = evidence.seconds(spec_mean) + (
            f" vs {evidence.seconds(baseline_mean)}" if baseline_mean is not None else "")
    gpus = max(assessment.gpus_per_pod, 1)

    def per_gpu(variant: SignalValues) -> float | None:
        per_pod = variant.per_pod(variant.output_tokens_per_second)
        return None if per_pod is None else round(per_pod / gpus, 1)

    control = sample.control if assessment.baseline == BaselineName.CONTROL else None
    return AnalysisStatus(
        last_sample_at=evidence.rfc3339(now),
        acceptance_rate=_round(_finite(values.acceptance_rate), 3),
        mean_acceptance_length=_round(_finite(values.mean_acceptance_length), 3),
        acceptance_floor=_round(floor.rate, 3) if floor else None,
        acceptance_floor_basis=floor.basis if floor else None,
        mean_inter_token_latency_seconds=_round(_finite(values.mean_inter_token_latency_seconds), 6),
        baseline_mean_inter_token_latency_seconds=_round(baseline_mean, 6),
        p99_inter_token_latency=p99_shown(values.p99_inter_token_latency_seconds),
        baseline_p99_inter_token_latency=baseline_p99,
        per_token_latency=per_token,
        speedup=_speedup(assessment),
        diagnosis=_diagnosis(assessment, sample),
        requests=_round(_finite(values.requests), 1),
        objective=assessment.objective,
        mean_queue_time_seconds=_round(_finite(values.mean_queue_time_seconds), 6),
        baseline_mean_queue_time_seconds=_round(_finite(control.mean_queue_time_seconds), 6) if control else None,
        queue_time_ratio=round(assessment.queue.ratio, 2) if assessment.queue else None,
        output_tokens_per_second_per_gpu=per_gpu(values),
        baseline_output_tokens_per_second_per_gpu=per_gpu(control) if control else None,
        verdict=kind(result),
        verdict_reason=verdict_reason(result),
        message=message(result) + sample.dropped_note,
        consecutive_failures=failures,
        consecutive_inconclusive=inconclusive,
        previous_baseline=before.previous_baseline,
    )


def decide(state: AnalysisStatus, result: Verdict, analysis: Analysis,
           out_of_memory: Sequence[OutOfMemory] = (), *, trial: SpeculationStatus | None = None) -> Decision:
    """Roll back or keep, given the counters after `result` and the speculative pods' OOM deaths.

    OOM first (at once, when `checks.rollbackOnOOM`); then `failureLimit` consecutive Failing samples
    (the current one must be Failing: its evidence is what the rollback reports) — or the first Failing one, on
    `trial` (the speculation status of a cooldown's re-enable not yet judged Healthy) or when it says so itself
    (`Failing.at_once`: not the noise failureLimit counts); then, with
    `onInconclusive: Rollback`, `inconclusiveLimit` consecutive Inconclusive ones.
    """
    if out_of_memory and analysis.checks.rollback_on_oom:
        more = f" (and {len(out_of_memory) - 1} more)" if len(out_of_memory) > 1 else ""
        return Rollback(RollbackReason.SPECULATIVE_POD_OUT_OF_MEMORY, out_of_memory[0].evidence() + more)
    failures, limit = state.consecutive_failures, analysis.failure_limit
    if isinstance(result, Failing) and trial is not None and trial.trial:
        return Rollback(RollbackReason(result.reason.value),
                        f"a failing sample on trial (re-enabled by the cooldown after rollback {trial.rollbacks}, "
                        f"not yet judged Healthy: the first failing sample decides, not failureLimit {limit}); "
                        f"{result.evidence}")
    if isinstance(result, Failing) and result.at_once:
        return Rollback(RollbackReason(result.reason.value),
                        f"a loss the cost model states beyond its error, confirmed by the latest slice: this sample "
                        f"decides, not failureLimit {limit}; {result.evidence}")
    if isinstance(result, Failing) and failures >= limit:
        return Rollback(RollbackReason(result.reason.value),
                        f"{failures} consecutive failing samples (failureLimit {limit}); the last: {result.evidence}")
    inconclusive, inconclusive_limit = state.consecutive_inconclusive, analysis.inconclusive_limit
    if (isinstance(result, Inconclusive) and result.reason != InconclusiveReason.NOT_DRAFTING
            and analysis.on_inconclusive == OnInconclusive.ROLLBACK and inconclusive >= inconclusive_limit):
        return Rollback(RollbackReason.INCONCLUSIVE_TOO_LONG,
                        f"{inconclusive} consecutive inconclusive samples (inconclusiveLimit {inconclusive_limit}, "
                        f"onInconclusive Rollback); the last: {result.message}")
    if out_of_memory:
        return Keep(f"{out_of_memory[0].evidence()}; rollbackOnOOM is false")
    return Keep(f"{failures} of {limit} failing samples in a row; {inconclusive} inconclusive in a row")


def rolled_back(speculation: SpeculationStatus | None, decision: Rollback, now: datetime) -> SpeculationStatus:
    """status.speculation after a rollback: off since now, one more rollback, and why. What runs (active, the
    speculating pods) is as observed, and an Auto schedule's calibration stays: a re-enable comes back with the
    table last calibrated, not the prior."""
    at = evidence.rfc3339(now)
    rollbacks = (speculation.rollbacks if speculation else 0) + 1
    record = RollbackRecord(at=at, reason=decision.reason, evidence=decision.evidence)
    kept = {"active": speculation.active, "speculating_pods": speculation.speculating_pods,
            "calibration": speculation.calibration} if speculation else {}
    return SpeculationStatus(decided=False, since=at, rollbacks=rollbacks, last_rollback=record, **kept)


def reenabled(speculation: SpeculationStatus, now: datetime, back: Reenabled) -> SpeculationStatus:
    """status.speculation when speculation comes back: on since now; the rollback count and record stay
    (they set the next cooldown and tell the story). A re-enable by the cooldown is a trial: nothing measured
    that the cause of the rollback is gone, so the first failing sample takes it back (`decide`); one the
    user asked for (the annotation, a changed spec) is judged as any new speculation."""
    return speculation.model_copy(update={"decided": True, "since": evidence.rfc3339(now),
                                          "trial": back.reason == ReenableReason.COOLDOWN_ELAPSED})


def speculation_hash(speculation: Speculation) -> str:
    """A digest of spec.speculation as written; recorded at rollback, a new value means the user changed it."""
    text = json.dumps(speculation.to_wire(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cooldown_seconds(analysis: Analysis, rollbacks: int) -> float:
    """The wait before Auto re-enables after the `rollbacks`-th rollback: cooldown × 2^(rollbacks − 1)."""
    doublings = min(max(rollbacks - 1, 0), MAX_BACKOFF_DOUBLINGS)
    return analysis.cooldown * 2**doublings


def auto_reenable_at(speculation: SpeculationStatus, analysis: Analysis) -> datetime | None:
    """When `reenable: Auto` brings speculation back; None when it will not (Manual, or not rolled back)."""
    if analysis.reenable != Reenable.AUTO or speculation.decided or speculation.last_rollback is None:
        return None
    at = evidence.parse_rfc3339(speculation.last_rollback.at)
    return at + timedelta(seconds=cooldown_seconds(analysis, max(speculation.rollbacks, 1)))


@dataclass(frozen=True)
class Reenabled:
    """Bring speculation back; `message` is for the Event."""

    reason: ReenableReason
    message: str


def reenable(speculation: SpeculationStatus | None, analysis: Analysis, now: datetime, *,
             speculation_hash_now: str, speculation_hash_at_rollback: str | None,
             retry_annotation: str | None, retry_annotation_seen: str | None) -> Reenabled | None:
    """Whether a rolled-back SD gets speculation back now, and why.

    speculation_hash_at_rollback: `speculation_hash(spec.speculation)` recorded at the rollback; None (not
        recorded) never counts as a change.
    retry_annotation / retry_annotation_seen: the `specdeploy.io/retry-speculation` value now and the one
        recorded at the rollback (or the last retry); any other non-empty value is a request to retry.
    """
    if speculation is None or speculation.decided or speculation.last_rollback is None:
        return None
    if speculation_hash_at_rollback is not None and speculation_hash_now != speculation_hash_at_rollback:
        return Reenabled(ReenableReason.SPECULATION_SPEC_CHANGED,
                         "`spec.speculation` changed since the rollback; speculating again")
    if retry_annotation and retry_annotation != retry_annotation_seen:
        return Reenabled(ReenableReason.RETRY_REQUESTED,
                         f"annotation {RETRY_ANNOTATION}={retry_annotation!r} asks to retry; speculating again")
    due = auto_reenable_at(speculation, analysis)
    if due is not None and now >= due:
        waited = evidence.window(cooldown_seconds(analysis, max(speculation.rollbacks, 1)))
        return Reenabled(ReenableReason.COOLDOWN_ELAPSED,
                         f"reenable is Auto and the cooldown of {waited} after rollback {speculation.rollbacks} "
                         f"has passed; speculating again")
    return None
