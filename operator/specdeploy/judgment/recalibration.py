"""An `Auto` schedule that follows the measured acceptance per draft position: `calibrate` wired into status (pure).

    speculation, change = recalibrate(spec, speculation, plan, sample, now)

Called by `judgment/speculation.py` `step_speculation` on each analysis sample while the pods speculate. The
schedule the pods run is the plan's (`plan.schedule`, read through judgment/plan_view.py): planning derives it from
`status.speculation.calibration`'s positions when they were measured for this spec, else from the method's prior. So the status is the whole state: a change writes the new positions there, the next plan derives
the new table from them and the children roll through the usual apply; a restarted operator reads the same
positions and renders the same table. The positions change only with the schedule: a kept decision records
itself (`lastDecision`) and leaves the positions, and so the table, as they were.

The minimum period runs from the later of the last change calibration made and `speculation.since` (the
decision's last change: a re-enable restarts the pods as a change does).

The derived table is one the engine can run: for TensorRT-LLM, whose table drafts its largest k at batch 1, the
derivation never lets k rise with the batch (planning.schedule.derive_schedule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from specdeploy.api.reasons import CalibrationReason
from specdeploy.api.spec import ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.api.status import (
    CalibrationDecisionStatus,
    CalibrationKind,
    PositionAcceptance,
    ScheduleCalibration,
    ScheduleEntry,
    SpeculationStatus,
)
from specdeploy.judgment import evidence
from specdeploy.judgment.calibration import (
    AcceptanceNow,
    AcceptanceShift,
    CalibrationDecision,
    acceptance_now,
    calibrate,
)
from specdeploy.judgment.plan_view import PlanView, ScheduleRange
from specdeploy.judgment.queries import latest_seconds
from specdeploy.judgment.samples import DeploymentSample


@dataclass(frozen=True)
class Recalibration:
    """A schedule change decided in this step: the Event's message and the decision behind it."""

    message: str
    decision: CalibrationDecision


def table_text(ranges: Sequence[ScheduleRange] | Sequence[ScheduleEntry]) -> str:
    """"1–12: k 3, 13–32: k 1"."""
    return ", ".join(f"{r.min_batch}–{r.max_batch}: k {r.k}" if r.min_batch != r.max_batch else f"{r.min_batch}: k {r.k}"
                     for r in ranges)


def _entries(ranges: Sequence[ScheduleRange]) -> list[ScheduleEntry]:
    return [ScheduleEntry(min_batch=r.min_batch, max_batch=r.max_batch, k=r.k) for r in ranges]


def _last_change_at(speculation: SpeculationStatus, calibration: ScheduleCalibration | None) -> float:
    """The time the minimum period runs from: the later of the last change and `speculation.since`."""
    times = [evidence.parse_rfc3339(at).timestamp() for at in (
        speculation.since, calibration.last_change_at if calibration is not None else None) if at]
    return max(times, default=-math.inf)


def shift_text(shift: AcceptanceShift, latest: float) -> str:
    """The shift in words: "position 1's acceptance moved from 0.60 ± 0.004 over the rest of the window to 0.20 ±
    0.006 in its last 30 s"."""
    return (f"position 1's acceptance moved from {evidence.number(shift.before.rate)} ± "
            f"{evidence.number(shift.before.half_width, 3)} over the rest of the window to "
            f"{evidence.number(shift.latest.rate)} ± {evidence.number(shift.latest.half_width, 3)} in its last "
            f"{evidence.seconds(latest)}")


def _message(decision: CalibrationDecision, before: Sequence[ScheduleRange], now: AcceptanceNow,
             latest: float) -> str:
    """The decision in a sentence, with the acceptance, the tables and the predicted speedups."""
    text = _decision_text(decision, before)
    return text if now.shift is None else f"{text}; {shift_text(now.shift, latest)}: calibrated from that slice"


def _decision_text(decision: CalibrationDecision, before: Sequence[ScheduleRange]) -> str:
    found = decision.evidence
    if not decision.acceptance:
        if found is None or not math.isfinite(found.half_width):
            return "no acceptance per draft position measured in the window"
        return (f"position 1's acceptance {evidence.number(found.rate)} ± {evidence.number(found.half_width, 3)} "
                f"(95%) from {evidence.count(found.drafts)} drafts: too few to calibrate from (it takes ± "
                f"{found.max_half_width:g} from at least {found.min_drafts:,})")
    rates = ", ".join(evidence.number(rate) for rate in decision.acceptance)
    drafts = evidence.count(found.drafts) if found is not None else "no"
    head = f"acceptance per draft position {rates} (from {drafts} drafts)"
    if decision.schedule is None or decision.speedup_before is None or decision.speedup_after is None:
        return head
    at = (f"predicted speedup at batch {decision.batch}: {evidence.number(decision.speedup_before)}× → "
          f"{evidence.number(decision.speedup_after)}× ({decision.gain:+.0%})" if decision.gain is not None else "")
    if decision.change:
        return f"{head}: schedule [{table_text(before)}] → [{table_text(decision.schedule)}]; {at}"
    return f"{head}: derives [{table_text(decision.schedule)}] against [{table_text(before)}]; {at}"


def _decision_status(decision: CalibrationDecision, message: str) -> CalibrationDecisionStatus:
    reason = (CalibrationReason.SCHEDULE_RECALIBRATED if decision.change
              else decision.reason or CalibrationReason.SAME_SCHEDULE)
    return CalibrationDecisionStatus(
        kind=CalibrationKind.CHANGED if decision.change else CalibrationKind.KEPT, reason=reason, message=message, batch=decision.batch,
        speedup_before=round(decision.speedup_before, 3) if decision.speedup_before is not None else None,
        speedup_after=round(decision.speedup_after, 3) if decision.speedup_after is not None else None,
        earliest_change_at=(evidence.rfc3339(datetime.fromtimestamp(decision.earliest_change_at, tz=UTC))
                            if decision.earliest_change_at is not None else None),
    )


def recalibrate(
    spec: SpeculativeDeploymentSpec,
    speculation: SpeculationStatus,
    plan: PlanView | None,
    sample: DeploymentSample,
    now: datetime,
) -> tuple[SpeculationStatus, Recalibration | None]:
    """`speculation` with this sample's calibration recorded (an `Auto` schedule only), and the change if one.

    `plan`: the plan the pods run (made with `speculation.calibration`); None or without a schedule, nothing is
    calibrated. Fixed and Table schedules are never calibrated: a record left from an earlier Auto is dropped.
    """
    if spec.speculation.schedule_mode != ScheduleMode.AUTO:
        return (speculation.model_copy(update={"calibration": None}) if speculation.calibration is not None
                else speculation), None
    if plan is None or plan.schedule is None:
        return speculation, None
    key = plan.calibration_key
    record = speculation.calibration
    if record is not None and record.key != key:     # measured for another drafter, k or target: start again
        record = ScheduleCalibration(key=key, changes=record.changes, last_change_at=record.last_change_at)
    record = record or ScheduleCalibration(key=key)
    current = plan.schedule
    decision, measured = _calibrated(spec, speculation, plan, sample, now)
    message = _message(decision, current.ranges, measured, latest_seconds(sample.window_seconds))
    update: dict[str, object] = {"last_decision": _decision_status(decision, message)}
    change = None
    if decision.change and decision.schedule is not None:
        at = evidence.rfc3339(now)
        update |= {
            "positions": [PositionAcceptance(position=p.position, rate=p.rate, source=p.source,
                                             drafted=p.drafted, accepted=p.accepted, standard_error=p.standard_error)
                          for p in decision.positions],
            "schedule": _entries(decision.schedule), "hardware_factor": plan.hardware_factor,
            "measured_at": at, "changes": record.changes + 1,
            "last_change_at": at,
        }
        change = Recalibration(message, decision)
    return speculation.model_copy(update={"calibration": record.model_copy(update=update)}), change


def _calibrated(spec: SpeculativeDeploymentSpec, speculation: SpeculationStatus, plan: PlanView,
                sample: DeploymentSample, now: datetime) -> tuple[CalibrationDecision, AcceptanceNow]:
    """The calibration of `sample`, from the acceptance it measured now (the latest slice's after a move)."""
    assert plan.schedule is not None
    batch = sample.speculative.running_per_pod
    measured = acceptance_now(sample.position_counts, sample.latest_position_counts)
    return calibrate(
        measured.counts, plan.schedule, plan,
        max_k=spec.speculation.num_speculative_tokens, max_num_seqs=spec.serving.max_num_seqs,
        batch=batch if batch is not None else math.nan,
        last_change_at=_last_change_at(speculation, speculation.calibration), now=now.timestamp(),
    ), measured


@dataclass(frozen=True)
class BestAtLoad:
    """The best any k does at the load the pods run, under the acceptance measured per draft position, and what the
    table running does there."""

    k: int
    speedup: float                  # predicted tokens per second ÷ without speculation (the rollback's pods)
    batch: int
    acceptance: tuple[float, ...]
    drafts: float
    running_k: int                  # the k the table running drafts at `batch`
    running_speedup: float          # its predicted speedup there
    shift: AcceptanceShift | None   # the acceptance is the latest slice's: it moved within the window


def best_at_load(spec: SpeculativeDeploymentSpec, speculation: SpeculationStatus, plan: PlanView | None,
                 sample: DeploymentSample, now: datetime) -> BestAtLoad | None:
    """What the best k would do at this sample's batch, from the acceptance it measured per position; None unless
    an `Auto` schedule runs and the window holds the evidence calibration needs (judgment/calibration.py)."""
    if spec.speculation.schedule_mode != ScheduleMode.AUTO or plan is None or plan.schedule is None:
        return None
    decision, measured = _calibrated(spec, speculation, plan, sample, now)
    if (decision.evidence is None or not decision.evidence.enough or not decision.acceptance or decision.batch is None
            or decision.speedup_before is None):
        return None
    k, speedup = max(((k, plan.predicted_speedup(decision.acceptance, decision.batch, k))
                      for k in range(1, spec.speculation.num_speculative_tokens + 1)), key=lambda found: found[1])
    return BestAtLoad(k, speedup, decision.batch, decision.acceptance, decision.evidence.drafts,
                      plan.schedule.k_at(decision.batch), decision.speedup_before, measured.shift)
