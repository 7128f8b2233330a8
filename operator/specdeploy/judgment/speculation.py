"""Whether the pods speculate after this reconcile, and what the analysis says: a pure step.

Inputs: the previous status, the spec, the plan's outcome, the analysis sample (None between samples),
the out-of-memory deaths of speculative pods and the clock; with the plan, an `Auto` schedule is calibrated on
each sample while the pods speculate (judgment/recalibration.py), its measured positions kept in
`speculation.calibration`, from which the next plan derives the table. Rollback state lives in status only: a
rollback sets `speculation.decided` false with the evidence; a change of `spec.speculation`, the
annotation `specdeploy.io/retry-speculation` or `reenable: Auto` after the cooldown brings it back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime

from specdeploy.api.reasons import FailureReason, InconclusiveReason
from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.spec import Objective, ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.api.status import AnalysisStatus, SpeculationStatus
from specdeploy.engines import engine_profile
from specdeploy.judgment import evidence
from specdeploy.judgment.calibration import MIN_RELATIVE_GAIN
from specdeploy.judgment.hardware import fit_hardware
from specdeploy.judgment.oom import OutOfMemory
from specdeploy.judgment.plan_view import PlanView, Schedule
from specdeploy.judgment.queries import latest_seconds
from specdeploy.judgment.recalibration import Recalibration, best_at_load, recalibrate, shift_text, table_text
from specdeploy.judgment.rollback import (
    RETRY_ANNOTATION,
    Reenabled,
    Rollback,
    decide,
    next_analysis_state,
    reenable,
    reenabled,
    rolled_back,
    speculation_hash,
)
from specdeploy.judgment.samples import DeploymentSample, chain_acceptance
from specdeploy.judgment.verdict import (
    Assessment,
    Failing,
    Floor,
    Healthy,
    Inconclusive,
    Policy,
    Verdict,
    assess,
    change,
    interval,
    previous_baseline,
)


@dataclass(frozen=True)
class SpeculationStep:
    speculation: SpeculationStatus
    analysis: AnalysisStatus | None
    verdict: Verdict | None = None          # the verdict on this step's sample, if one was taken
    rollback: Rollback | None = None        # a rollback decided in this step
    reenabled: Reenabled | None = None      # speculation came back in this step
    recalibrated: Recalibration | None = None   # the Auto schedule changed in this step (status records it)


def _floor(sample: DeploymentSample, plan: PlanView | None) -> Floor | None:
    """The plan's acceptance floor: minAcceptanceRate, or unset (Auto) the cost model's break-even at the batch the
    pods run now, for the k drafted there. None without a plan (nothing to derive it from)."""
    if plan is None:
        return None
    batch = sample.speculative.running_per_pod
    found = plan.acceptance_floor(batch, _drafted_k(plan, batch))
    return Floor(found.rate, found.describe(), fixed=found.fixed) if found is not None else None


def _on_table(plan: PlanView | None, batch: float | None) -> tuple[Schedule, int] | None:
    """The table the pods run (not for a Fixed schedule) and `batch` as a whole number within its ranges; None
    without a table or a measured batch."""
    schedule = plan.schedule if plan is not None else None
    if schedule is None or schedule.mode == ScheduleMode.FIXED or batch is None or not math.isfinite(batch):
        return None
    table = schedule.ranges
    return schedule, min(max(round(batch), table[0].min_batch), table[-1].max_batch)


def _drafted_k(plan: PlanView | None, batch: float | None) -> int | None:
    """The k a schedule drafts at `batch` (the nearest drafting range below a k = 0 one: the window's drafts were
    made there); None for a Fixed schedule or an unmeasured batch."""
    found = _on_table(plan, batch)
    if found is None:
        return None
    schedule, at = found
    drafting = [r.k for r in schedule.ranges if r.min_batch <= at and r.k > 0]
    return drafting[-1] if drafting else None


def _under_fit(plan: PlanView | None, analysis: AnalysisStatus | None) -> PlanView | None:
    """The plan the judgment prices with: the schedule the pods run, and the cost model at the hardware fit's
    applied factor once there is one (judgment/hardware.py), so the floor, the predictions and calibration's
    derivations are the fitted model's (the prior's until then)."""
    fit = analysis.hardware_fit if analysis is not None else None
    if plan is None or fit is None or fit.applied_factor is None or plan.hardware_factor == fit.applied_factor:
        return plan
    return plan.with_hardware_factor(fit.applied_factor)


def schedule_at_load(plan: PlanView | None, sample: DeploymentSample | None) -> str | None:
    """Where on its schedule the speculative pods ran when they were judged: the batch per pod the window
    averaged and the k the table drafts there. None for a Fixed schedule (k is k at every batch) or without a
    measured batch. A rollback's evidence carries it, so a schedule that loses at one load is named at that load
    (and a loss in a k = 0 range is the engine's cost of a schedule that does not draft, not the drafts')."""
    batch = sample.speculative.running_per_pod if sample is not None else None
    found = _on_table(plan, batch)
    if found is None or batch is None:
        return None
    schedule, at = found
    drafted = schedule.k_at(at)
    where = f"k {drafted}" if drafted else "k 0, drafting off in the engine"
    return (f"at {evidence.number(batch, 1)} running requests per pod the schedule drafts {where} "
            f"(table {table_text(schedule.ranges)})")


PREDICTED_LOSS = MIN_RELATIVE_GAIN
"""A table predicted this much slower than no speculation at the measured acceptance is a loss the model can state
on its own: the roofline is held to published measurements within ±5% at best (docs/speedup-model.md), the same
margin a calibration's gain must clear."""


def loss_no_schedule_fixes(spec: SpeculativeDeploymentSpec, speculation: SpeculationStatus, plan: PlanView | None,
                           sample: DeploymentSample, assessment: Assessment, now: datetime) -> Failing | None:
    """An `Auto` schedule that loses and cannot be re-derived into one that pays: Failing NoSchedulePays.

    Predicted, always: at the acceptance measured per draft position (calibration's evidence; the latest slice's
    when it moved within the window, judgment/calibration.py `acceptance_now`) no k pays at the pods' batch — the
    best is slower than no speculation, and a k = 0 range still costs a step (vllm#49986) — so the schedule, which
    only moves k, cannot fix it; the rollback can. And a loss, one of:
    - measured: the per-token latency is above the baseline's with the whole 95% interval above 1 — a loss beyond
      noise, though it may hold the `maxPerTokenLatencyRatio` limit, which is a tolerance for changes whose
      worth the operator cannot predict;
    - predicted beyond the model's error, and not contradicted: the table running is predicted more than
      PREDICTED_LOSS below 1× there, and in the window's latest slice the speculative pods were slower per token
      than the baseline. When acceptance turns, the window's interval mixes slices from before the turn and
      excludes 1 only once most of the window has passed; the acceptance counts tell at once. This one rolls back
      on its sample (`Failing.at_once`): failureLimit guards against noisy latency, and here the acceptance counted
      over thousands of drafts predicts a loss beyond the model's error that the latency confirms; two more
      intervals would be a minute of requests served at that loss, at the load where it is largest.
    A loss the model thinks another k would turn into a gain is calibration's to fix. Only where per-token latency
    counts (objectives Latency and Both), and over a Healthy verdict or one that held the limit
    (NotEnoughEvidence); every other verdict stands."""
    verdict, found = assessment.verdict, assessment.per_token
    if (spec.speculation.schedule_mode != ScheduleMode.AUTO or spec.analysis.objective == Objective.THROUGHPUT
            or found is None or assessment.baseline is None):
        return None
    if not (isinstance(verdict, Healthy) or (
            isinstance(verdict, Inconclusive) and verdict.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE)):
        return None
    measured = found.low > 1.0
    latest_slower = found.latest is not None and found.latest > 1.0
    if not (measured or latest_slower):
        return None
    best = best_at_load(spec, speculation, plan, sample, now)
    if best is None or best.speedup >= 1.0:
        return None
    rates = ", ".join(evidence.number(rate) for rate in best.acceptance)
    moved = f"{shift_text(best.shift, latest_seconds(sample.window_seconds))}; " if best.shift is not None else ""
    at = f"at the acceptance measured per draft position ({rates}; {evidence.count(best.drafts)} drafts)"
    no_k = (f"no k pays at {best.batch} running requests per pod: the best, k {best.k}, is predicted at "
            f"{evidence.number(best.speedup)}× of no speculation")
    if measured:
        return Failing(FailureReason.NO_SCHEDULE_PAYS, (
            f"per-token latency {interval(found)} vs the {assessment.baseline}, and {moved}{at} {no_k} — a loss no "
            "schedule fixes"))
    if best.running_speedup >= 1.0 - PREDICTED_LOSS:
        return None
    assert found.latest is not None
    return Failing(FailureReason.NO_SCHEDULE_PAYS, (
        f"{moved}{at} the schedule's k {best.running_k} is predicted at {evidence.number(best.running_speedup)}× of "
        f"no speculation and {no_k}; in the window's latest slice per-token latency was {change(found.latest)} vs "
        f"the {assessment.baseline} (the window's {interval(found)} still mixes slices from before) — a loss no "
        "schedule fixes"), at_once=True)


def _a_window_since_reenabled(speculation: SpeculationStatus, spec: SpeculativeDeploymentSpec, now: datetime) -> bool:
    """Whether a whole analysis window has passed since speculation came back: until then a Healthy verdict still
    averages the slices of the pods that did not speculate, and the re-enabled pods' own counts may not have two
    scrapes yet — it does not end a trial."""
    since = evidence.parse_rfc3339(speculation.since) if speculation.since else None
    return since is None or (now - since).total_seconds() >= spec.analysis.window


def _policy(spec: SpeculativeDeploymentSpec, sample: DeploymentSample, analysis: AnalysisStatus | None,
            plan: PlanView | None) -> Policy:
    return Policy(spec.analysis.checks, spec.analysis.baseline.mode, spec.analysis.min_requests,
                  _floor(sample, plan), analysis.previous_baseline if analysis is not None else None,
                  objective=spec.analysis.objective, gpus_per_pod=spec.resources.gpu_count)


def _normalised(spec: SpeculativeDeploymentSpec, sample: DeploymentSample) -> DeploymentSample:
    """An engine that drafts trees (its profile's `tree_drafting`: SGLang) divides its own rate by the draft tree when
    eagleTopk > 1; minAcceptanceRate means accepted ÷ proposed chain positions, so trees are judged by (accept length
    − 1) ÷ k. With topk 1 the tree is the chain and SGLang's rate already means that (its denominator,
    num_draft_tokens − 1, is k)."""
    if engine_profile(spec.engine.kind).tree_drafting and spec.speculation.eagle_topk > 1:
        return chain_acceptance(sample, spec.speculation.num_speculative_tokens)
    return sample


def step_speculation(
    resource: SpeculativeDeployment,
    previous: SpeculationStatus | None,
    previous_analysis: AnalysisStatus | None,
    accepted: bool,
    sample: DeploymentSample | None,
    out_of_memory: list[OutOfMemory],   # deaths of speculative pods since speculation.since
    now: datetime,
    *,
    plan: PlanView | None = None,       # the plan the pods run: the acceptance floor and the schedule come from it
) -> SpeculationStep:
    """The speculation and analysis state after one reconcile of `resource`."""
    at = evidence.rfc3339(now)
    spec = resource.spec
    if not accepted:  # a rejected generation changes nothing that runs
        return SpeculationStep(previous or SpeculationStatus(decided=False, since=at), previous_analysis)
    annotation = resource.metadata.annotations.get(RETRY_ANNOTATION)
    hash_now = speculation_hash(spec.speculation)
    if previous is None:
        return SpeculationStep(
            SpeculationStatus(decided=spec.speculation.enabled, since=at, retry_annotation_seen=annotation),
            previous_analysis,
        )
    speculation, analysis = previous, previous_analysis
    plan = _under_fit(plan, analysis)
    back: Reenabled | None = None
    if not spec.speculation.enabled:
        if speculation.decided:
            speculation = speculation.model_copy(update={"decided": False, "since": at})
    elif not speculation.decided:
        if speculation.last_rollback is None:  # the spec had turned it off; now it is on again
            speculation = speculation.model_copy(update={"decided": True, "since": at})
        else:
            back = reenable(
                speculation, spec.analysis, now, speculation_hash_now=hash_now,
                speculation_hash_at_rollback=speculation.last_rollback.speculation_hash,
                retry_annotation=annotation, retry_annotation_seen=speculation.retry_annotation_seen,
            )
            if back is not None:
                speculation = reenabled(speculation, now, back).model_copy(
                    update={"retry_annotation_seen": annotation})
                analysis = (analysis or AnalysisStatus()).model_copy(
                    update={"consecutive_failures": 0, "consecutive_inconclusive": 0})
    if not speculation.decided:
        # Measure the pods without speculation (the Previous baseline) once none speculates any more: while
        # a rollback rolls, the sample mixes both kinds of pod.
        if sample is not None:
            update: dict[str, object] = {"last_sample_at": at}   # sampled: not due again before `interval`
            snapshot = None if speculation.active else previous_baseline(sample, spec.analysis.min_requests, now)
            if snapshot is not None:
                update["previous_baseline"] = snapshot
            analysis = (analysis or AnalysisStatus()).model_copy(update=update)
        return SpeculationStep(speculation, analysis, reenabled=back)
    deaths = out_of_memory
    if sample is None and not deaths:
        return SpeculationStep(speculation, analysis, reenabled=back)
    result: Verdict
    if sample is not None:
        sample = _normalised(spec, sample)
        assessment: Assessment = assess(sample, _policy(spec, sample, analysis, plan))
        if (loss := loss_no_schedule_fixes(spec, speculation, plan, sample, assessment, now)) is not None:
            assessment = dataclasses.replace(assessment, verdict=loss)
        result = assessment.verdict
        state = next_analysis_state(analysis, sample, assessment, now)
        held = analysis.hardware_fit if analysis is not None else None
        # The next plan takes the fit's applied factor; a window without control slices keeps the last fit.
        state = state.model_copy(update={"hardware_fit": fit_hardware(sample, plan, held) or held})
    else:  # an OOM death between samples: decide on it alone, counters unchanged
        result = Inconclusive(InconclusiveReason.NO_DATA, "no sample in this reconcile")
        state = analysis or AnalysisStatus()
    decision = decide(state, result, spec.analysis, deaths, trial=speculation)
    if speculation.trial and isinstance(result, Healthy) and _a_window_since_reenabled(speculation, spec, now):
        speculation = speculation.model_copy(update={"trial": False})   # judged: from now on failureLimit counts
    if isinstance(decision, Rollback) and (where := schedule_at_load(plan, sample)) is not None:
        decision = dataclasses.replace(decision, evidence=f"{decision.evidence}; {where}")
    if isinstance(decision, Rollback):
        speculation = rolled_back(speculation, decision, now)
        assert speculation.last_rollback is not None
        speculation = speculation.model_copy(update={
            "last_rollback": speculation.last_rollback.model_copy(update={"speculation_hash": hash_now}),
            "retry_annotation_seen": annotation,
        })
        return SpeculationStep(speculation, state, result if sample else None, rollback=decision,
                               reenabled=back)
    recalibrated = None
    if sample is not None:
        speculation, recalibrated = recalibrate(spec, speculation, plan, sample, now)
    return SpeculationStep(speculation, state, result if sample else None, reenabled=back, recalibrated=recalibrated)
