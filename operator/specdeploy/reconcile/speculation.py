"""Whether the pods speculate after this reconcile, and what the analysis says: a pure step.

Inputs: the previous status, the spec, the plan's outcome, the analysis sample (None between samples),
the out-of-memory deaths of speculative pods and the clock. Rollback state lives in status only: a
rollback sets `speculation.active` false with the evidence; a change of `spec.speculation`, the
annotation `specdeploy.io/retry-speculation` or `reenable: Auto` after the cooldown brings it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from specdeploy.analysis import evidence
from specdeploy.analysis.oom import OutOfMemory
from specdeploy.analysis.reasons import InconclusiveReason
from specdeploy.analysis.rollback import (
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
from specdeploy.analysis.samples import DeploymentSample
from specdeploy.analysis.verdict import (
    Inconclusive,
    PreviousBaseline,
    Verdict,
    message,
    previous_baseline,
    verdict,
)
from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.status import AnalysisStatus, PreviousBaselineStatus, SpeculationStatus
from specdeploy.reconcile.conditions import Event


@dataclass(frozen=True)
class SpeculationStep:
    speculation: SpeculationStatus
    analysis: AnalysisStatus | None
    verdict: Verdict | None = None          # the verdict on this step's sample, if one was taken
    rollback: Rollback | None = None        # a rollback decided in this step
    reenabled: Reenabled | None = None      # speculation came back in this step
    events: list[Event] = field(default_factory=list)


def _snapshot(analysis: AnalysisStatus | None) -> PreviousBaseline | None:
    stored = analysis.previous_baseline if analysis is not None else None
    return PreviousBaseline(**stored.model_dump()) if stored is not None else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(state: AnalysisStatus) -> AnalysisStatus:
    """Measurements at the precision `kubectl get sd` should show (and that stays stable between samples)."""
    return state.model_copy(update={
        "acceptance_rate": _round(state.acceptance_rate, 3),
        "mean_acceptance_length": _round(state.mean_acceptance_length, 3),
        "p99_inter_token_latency_seconds": _round(state.p99_inter_token_latency_seconds, 5),
        "baseline_p99_inter_token_latency_seconds": _round(state.baseline_p99_inter_token_latency_seconds, 5),
        "requests": _round(state.requests, 1),
    })


def step_speculation(
    resource: SpeculativeDeployment,
    previous: SpeculationStatus | None,
    previous_analysis: AnalysisStatus | None,
    accepted: bool,
    sample: DeploymentSample | None,
    out_of_memory: list[OutOfMemory],   # deaths of speculative pods since speculation.since
    now: datetime,
) -> SpeculationStep:
    """The speculation and analysis state after one reconcile of `resource`."""
    at = evidence.rfc3339(now)
    spec = resource.spec
    if not accepted:  # a rejected generation changes nothing that runs
        return SpeculationStep(previous or SpeculationStatus(active=False, since=at), previous_analysis)
    annotation = resource.metadata.annotations.get(RETRY_ANNOTATION)
    hash_now = speculation_hash(spec.speculation)
    if previous is None:
        return SpeculationStep(
            SpeculationStatus(active=spec.speculation.enabled, since=at, retry_annotation_seen=annotation),
            previous_analysis,
        )
    speculation, analysis, events = previous, previous_analysis, []
    back: Reenabled | None = None
    if not spec.speculation.enabled:
        if speculation.active:
            speculation = speculation.model_copy(update={"active": False, "since": at})
    elif not speculation.active:
        if speculation.last_rollback is None:  # the spec had turned it off; now it is on again
            speculation = speculation.model_copy(update={"active": True, "since": at})
        else:
            back = reenable(
                speculation, spec.analysis, now, speculation_hash_now=hash_now,
                speculation_hash_at_rollback=speculation.last_rollback.speculation_hash,
                retry_annotation=annotation, retry_annotation_seen=speculation.retry_annotation_seen,
            )
            if back is not None:
                speculation = reenabled(speculation, now).model_copy(update={"retry_annotation_seen": annotation})
                analysis = (analysis or AnalysisStatus()).model_copy(
                    update={"consecutive_failures": 0, "consecutive_inconclusive": 0})
                events.append(Event.normal("SpeculationReenabled", back.message))
    if not speculation.active:
        if sample is not None:  # measure the pods without speculation: the Previous baseline
            update: dict[str, object] = {"last_sample_at": at}   # sampled: not due again before `interval`
            snapshot = previous_baseline(sample, spec.analysis.min_requests, now)
            if snapshot is not None:
                update["previous_baseline"] = PreviousBaselineStatus(**snapshot.__dict__)
            analysis = (analysis or AnalysisStatus()).model_copy(update=update)
        return SpeculationStep(speculation, analysis, reenabled=back, events=events)
    deaths = out_of_memory
    if sample is None and not deaths:
        return SpeculationStep(speculation, analysis, reenabled=back, events=events)
    baseline = _snapshot(analysis)
    result: Verdict
    if sample is not None:
        result = verdict(sample, spec.analysis.checks, spec.analysis.baseline.mode, spec.analysis.min_requests,
                         baseline)
        state = next_analysis_state(analysis, sample, result, now, baseline_mode=spec.analysis.baseline.mode,
                                    previous_baseline=baseline)
        state = _rounded(state).model_copy(update={
            "message": message(result),
            "previous_baseline": analysis.previous_baseline if analysis is not None else None,
        })
    else:  # an OOM death between samples: decide on it alone, counters unchanged
        result = Inconclusive(InconclusiveReason.NO_DATA, "no sample in this reconcile")
        state = analysis or AnalysisStatus()
    decision = decide(state, result, spec.analysis, deaths)
    if isinstance(decision, Rollback):
        speculation = rolled_back(speculation, decision, now)
        assert speculation.last_rollback is not None
        speculation = speculation.model_copy(update={
            "last_rollback": speculation.last_rollback.model_copy(update={"speculation_hash": hash_now}),
            "retry_annotation_seen": annotation,
        })
        return SpeculationStep(speculation, state, result if sample else None, rollback=decision,
                               reenabled=back, events=events)
    return SpeculationStep(speculation, state, result if sample else None, reenabled=back, events=events)
