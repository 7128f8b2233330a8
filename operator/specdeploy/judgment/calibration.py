"""Calibration of an `Auto` schedule from the acceptance measured per draft position (pure).

    decision = calibrate(sample.position_counts, current, plan, max_k=5, max_num_seqs=256,
                         batch=sample.speculative.running_per_pod, last_change_at=rolled_at, now=now)
    decision.change                 # True: roll decision.schedule
    decision.reason                 # why not (CalibrationReason) when not
    decision.gain                   # predicted speedup after ÷ before − 1 at the observed batch

`Auto` derives k per batch range from the roofline and an acceptance per draft position (planning/schedule.py, asked
through the plan's view, judgment/plan_view.py); until something is measured that acceptance is the method's prior. The engines count what each position really
accepts (vLLM spec_decode_num_accepted_tokens_per_pos_total ÷ spec_decode_num_drafts_total, TensorRT-LLM's
accepted ÷ drafted tokens per token_position; SGLang reports an accept length only, so it is never calibrated).
This module turns those counts into the acceptance the plan's `derive_schedule` takes and decides whether the schedule it
derives is worth a change: a changed schedule is a changed pod template, so every change restarts pods. The rule,
in order:

1. Evidence: position 1's acceptance must be known to ±MAX_HALF_WIDTH (95%, binomial) from at least MIN_DRAFTS
   drafts; otherwise keep (TooFewDrafts).
2. The acceptance per position: measured rates made non-increasing (weighted pool-adjacent-violators), the
   positions not measured extrapolated from the last measured one (`acceptance_per_position`).
3. The schedule derived from it: the same table → keep (SameSchedule); k = 0 everywhere → keep (NeverPays: an
   acceptance collapse is the rollback's, and a schedule that never drafts still pays k = 0's cost).
4. The gain at the batch the pods run now (running requests per pod over the window): the new table's predicted
   speedup ÷ the current table's, both under the measured acceptance, below 1 + MIN_RELATIVE_GAIN → keep
   (GainBelowMinimum); a new table itself predicted slower than no speculation there → keep (LosesAtLoad: the
   best a table does at that load still loses, so moving k is no fix, and the rollback's pods, at 1×, are).
5. The period: less than MIN_PERIOD_SECONDS since the last change → keep (WithinMinimumPeriod), with the time
   from which it may change.

Otherwise change. Every decision carries the numbers behind it: the estimate per position with its standard error,
the acceptance used, the derived table, and the predicted speedups per batch range before and after.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdeploy.api.reasons import CalibrationReason
from specdeploy.api.spec import ScheduleMode
from specdeploy.api.status import PositionSource
from specdeploy.judgment.plan_view import PlanView, Schedule, ScheduleRange
from specdeploy.judgment.samples import PositionCounts

Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""

MAX_HALF_WIDTH = 0.02
"""The widest 95% interval of position 1's acceptance a calibration accepts: ±0.02. Position 1 is the one every
k drafts and the one the others hang on (position i counts only drafts whose positions before it were accepted),
and near the break-even a k is chosen on differences of a few hundredths: at the roofline's costs a change of 0.02
in position 1 moves the tokens per step at k = 1, and so its predicted speedup, by 1–2%, under MIN_RELATIVE_GAIN.
It takes 2 401 drafts at an acceptance of 0.5 (the widest case), 1 801 at 0.75; a busy pod drafts that many in
seconds."""

MIN_DRAFTS = 1000
"""Drafts needed whatever the interval says. The binomial interval is too narrow for a rate near 0 or 1 (at 0.99
and 100 drafts it claims ±0.02) and it treats drafts as independent, which the drafts of one request are not
(they share a prompt and a topic); a thousand drafts span many requests at any load that drafts at all."""

MIN_RELATIVE_GAIN = 0.05
"""A change must be predicted 5% faster at the observed batch than the schedule running. Below that, the model's
own error decides rather than the measurement: the roofline is held to published measurements within ±5% at
best and +25% at worst (docs/speedup-model.md), and a change restarts pods, which costs their capacity while they load."""

MIN_PERIOD_SECONDS = 1800.0
"""At most one change per 30 minutes. Each change restarts the speculative pods (minutes of lost capacity while a
model loads, cold prefix caches after), and acceptance follows the workload's mix through the day: a shorter
period would chase the mix minute by minute. Thirty minutes is six 5-minute analysis windows of fresh evidence."""


@dataclass(frozen=True)
class PositionEstimate:
    """One draft position (from 1): what was counted and what the calibration uses.

    drafted, accepted: the counts for the position (drafted: the drafts counted for it, see
        PositionCounts.drafted_at). For an extrapolated position these are what the engine reported and are not
        used: on vLLM past the smallest k the schedule drafts, `drafts` counts drafts that never proposed the
        position, and its rate is only a lower bound.
    measured_rate: accepted ÷ drafted as counted; None where nothing was drafted.
    standard_error: the binomial √(p(1 − p) / n) of measured_rate; None where nothing was drafted.
    rate: the acceptance `derive_schedule` is given for the position.
    """

    position: int
    drafted: float
    accepted: float
    measured_rate: float | None
    standard_error: float | None
    rate: float
    source: PositionSource


@dataclass(frozen=True)
class Evidence:
    """Whether the window holds enough drafts: position 1's acceptance and its 95% half-width."""

    drafts: float
    rate: float
    half_width: float
    enough: bool
    min_drafts: int = MIN_DRAFTS
    max_half_width: float = MAX_HALF_WIDTH


@dataclass(frozen=True)
class RangeComparison:
    """Batch sizes min_batch..max_batch (both included) over which neither table changes k, with the predicted
    speedup at each end before (the table running) and after (the derived one), both under the measured acceptance.
    """

    min_batch: int
    max_batch: int
    k_before: int
    k_after: int
    speedup_before_at_min_batch: float
    speedup_before_at_max_batch: float
    speedup_after_at_min_batch: float
    speedup_after_at_max_batch: float


@dataclass(frozen=True)
class CalibrationDecision:
    """Keep the schedule running (reason set) or change it to `schedule` (change True, reason None).

    evidence, positions: None and () without counts.
    acceptance: the acceptance per position 1..max_k the table was derived from; () when none was derived.
    schedule: the derived table, also when it is kept (what a change would roll); None when none was derived.
    comparison: the batch ranges of both tables, before and after.
    batch: the observed batch, as a whole number of running sequences per pod within 1..max_num_seqs.
    speedup_before, speedup_after, gain: at `batch`, gain = after ÷ before − 1.
    earliest_change_at: for WithinMinimumPeriod, the Unix time from which the change may roll.
    """

    change: bool
    reason: CalibrationReason | None
    evidence: Evidence | None = None
    positions: tuple[PositionEstimate, ...] = ()
    acceptance: tuple[float, ...] = ()
    schedule: tuple[ScheduleRange, ...] | None = None
    comparison: tuple[RangeComparison, ...] = ()
    batch: int | None = None
    speedup_before: float | None = None
    speedup_after: float | None = None
    gain: float | None = None
    earliest_change_at: float | None = None


def standard_error(accepted: float, drafted: float) -> float:
    """The binomial standard error of accepted ÷ drafted (the rate clipped to [0, 1])."""
    rate = min(max(accepted / drafted, 0.0), 1.0)
    return math.sqrt(rate * (1.0 - rate) / drafted)


def evidence_of(counts: PositionCounts) -> Evidence:
    """Position 1's acceptance and whether it is known well enough (MIN_DRAFTS, MAX_HALF_WIDTH)."""
    drafted = counts.drafted_at(1)
    accepted = counts.accepted[0] if counts.accepted else 0.0
    if drafted <= 0:
        return Evidence(drafted, math.nan, math.inf, False)
    rate = min(max(accepted / drafted, 0.0), 1.0)
    half_width = Z_95 * standard_error(accepted, drafted)
    return Evidence(drafted, rate, half_width, drafted >= MIN_DRAFTS and half_width <= MAX_HALF_WIDTH)


@dataclass(frozen=True)
class AcceptanceShift:
    """Position 1's acceptance moved within the window: over the rest of it (`before`) and over its latest slice
    (`latest`), each known to calibration's evidence rule, their 95% intervals apart."""

    before: Evidence
    latest: Evidence


@dataclass(frozen=True)
class AcceptanceNow:
    """The counts per draft position that describe the acceptance now: the latest slice's after a shift, else the
    window's (None without counts)."""

    counts: PositionCounts | None
    shift: AcceptanceShift | None = None


def _without(window: PositionCounts, latest: PositionCounts) -> PositionCounts:
    """The window's counts less its latest slice's (each clipped at 0: both are increase() extrapolations)."""
    top = len(window.accepted)
    accepted = tuple(max(window.accepted[i] - (latest.accepted[i] if i < len(latest.accepted) else 0.0), 0.0)
                     for i in range(top))
    drafted = None if window.drafted is None else tuple(
        max(window.drafted[i] - latest.drafted_at(i + 1), 0.0) for i in range(len(window.drafted)))
    return PositionCounts(max(window.drafts - latest.drafts, 0.0), accepted, drafted)


def acceptance_now(window: PositionCounts | None, latest: PositionCounts | None) -> AcceptanceNow:
    """The window's counts, unless position 1's acceptance in the latest slice differs from the rest of the window
    beyond both 95% intervals, each side holding the evidence a calibration needs (MIN_DRAFTS, ±MAX_HALF_WIDTH):
    then the latest slice's.

    The window averages acceptance over five minutes. When the prompt mix turns, its average is a blend of before
    and after that lags the change by most of a window — and a blend predicts that the k running still pays after
    the new acceptance has made it lose. The latest slice alone is what runs now; it is used only when it is
    known as well as calibration requires and is not the window's own noise (a steady acceptance keeps the larger
    window's counts). A busy pod drafts the 1,000–2,400 drafts the rule asks for in seconds; a quiet one may not
    in one slice, and then the window stands.
    """
    if window is None or latest is None:
        return AcceptanceNow(window)
    now, before = evidence_of(latest), evidence_of(_without(window, latest))
    if not (now.enough and before.enough) or abs(now.rate - before.rate) <= now.half_width + before.half_width:
        return AcceptanceNow(window)
    return AcceptanceNow(latest, AcceptanceShift(before, now))


def non_increasing(rates: Sequence[float], weights: Sequence[float]) -> tuple[float, ...]:
    """The weighted least-squares fit to `rates` that never increases (pool adjacent violators).

    Position i + 1 is accepted only when position i was, so its acceptance cannot exceed position i's in
    expectation, and with the same drafts counted at every position the counts never cross. They can cross in a
    window when the denominators differ: TensorRT-LLM counts each position's own drafts; Prometheus' increase()
    extrapolates each series separately at the window's edges; a position's series that first appears inside the
    window (TensorRT-LLM creates it on its first count) is undercounted. A crossing is then noise, and the schedule
    must not read it as a later position worth more than an earlier one. Weighted by the drafts behind each rate,
    the pooled fit is the maximum-likelihood estimate of binomial rates under that order: a crossing pair becomes
    their drafts-weighted mean, instead of the later one clipped down (biased low) or the earlier raised (biased
    high). Rates already non-increasing are returned unchanged.
    """
    if len(rates) != len(weights):
        raise ValueError(f"{len(rates)} rates and {len(weights)} weights")
    blocks: list[list[float]] = []      # [weighted mean, total weight, length]
    for rate, weight in zip(rates, weights, strict=True):
        blocks.append([rate, max(weight, 0.0), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            later, earlier = blocks.pop(), blocks[-1]
            total = earlier[1] + later[1]
            mean = (earlier[0] * earlier[1] + later[0] * later[1]) / total if total > 0 else (earlier[0] + later[0]) / 2
            blocks[-1] = [mean, total, earlier[2] + later[2]]
    return tuple(mean for mean, _, length in blocks for _ in range(int(length)))


def _exactly_counted(counts: PositionCounts, current: Schedule) -> int:
    """How many leading positions every counted draft proposed, each with at least MIN_DRAFTS drafts.

    With drafts counted per position (TensorRT-LLM) that is each position's own count. vLLM counts drafts only as
    a whole, and a draft proposes as many positions as the k of its batch: only the positions up to the smallest
    k > 0 of the schedule running were proposed by every draft counted.
    """
    top = len(counts.accepted)
    if counts.drafted is None:
        drafting = [r.k for r in current.ranges if r.k > 0]
        top = min(top, min(drafting, default=0))
    exact = 0
    while exact < top and counts.drafted_at(exact + 1) >= MIN_DRAFTS:
        exact += 1
    return exact


def acceptance_per_position(
    counts: PositionCounts, current: Schedule, max_k: int
) -> tuple[PositionEstimate, ...]:
    """The acceptance of positions 1..max_k from the counts: measured where every counted draft proposed the
    position, non-increasing (`non_increasing`), and past the measured positions extrapolated.

    A position no draft in the window proposed (a schedule whose k stayed below it) is unknown, not 0: reading
    it as 0 would hold k down for good once a schedule stopped drafting it. So past the last measured position m
    the acceptance continues with m's conditional acceptance c = rate(m) ÷ rate(m − 1) (rate(0) = 1): position
    m + j gets rate(m)·c^j, Leviathan's one α per position (planning/acceptance.py) fitted to the last
    measurement. Position 1 must be measured (the evidence rule sees to it).
    """
    measured = _exactly_counted(counts, current)
    if measured == 0:
        raise ValueError("position 1 has too few drafts to calibrate from")
    raw = [min(max(counts.accepted[i] / counts.drafted_at(i + 1), 0.0), 1.0) for i in range(measured)]
    rates = list(non_increasing(raw, [counts.drafted_at(i + 1) for i in range(measured)]))
    before_last = rates[-2] if measured > 1 else 1.0
    conditional = rates[-1] / before_last if before_last > 0 else 0.0
    while len(rates) < max_k:
        rates.append(rates[-1] * conditional)
    estimates = []
    for position in range(1, max_k + 1):
        drafted = counts.drafted_at(position) if position <= len(counts.accepted) else 0.0
        accepted = counts.accepted[position - 1] if position <= len(counts.accepted) else 0.0
        known = drafted > 0
        estimates.append(PositionEstimate(
            position=position,
            drafted=drafted,
            accepted=accepted,
            measured_rate=accepted / drafted if known else None,
            standard_error=standard_error(accepted, drafted) if known else None,
            rate=rates[position - 1],
            source=PositionSource.MEASURED if position <= measured else PositionSource.EXTRAPOLATED,
        ))
    return tuple(estimates)


def compare(
    plan: PlanView, acceptance: Sequence[float], before: Schedule, after: Schedule, max_num_seqs: int,
) -> tuple[RangeComparison, ...]:
    """The batch ranges over which neither table changes k, with both tables' predicted speedups."""
    starts = sorted({1} | {r.min_batch for r in (*before.ranges, *after.ranges) if 1 <= r.min_batch <= max_num_seqs})
    ends = [start - 1 for start in starts[1:]] + [max_num_seqs]

    def speedup(schedule: Schedule, batch: int) -> float:
        return plan.predicted_speedup(acceptance, batch, schedule.k_at(batch))

    return tuple(
        RangeComparison(start, end, before.k_at(start), after.k_at(start),
                        speedup(before, start), speedup(before, end), speedup(after, start), speedup(after, end))
        for start, end in zip(starts, ends, strict=True)
    )


def _same(before: Sequence[ScheduleRange], after: Sequence[ScheduleRange]) -> bool:
    return [(r.min_batch, r.max_batch, r.k) for r in before] == [(r.min_batch, r.max_batch, r.k) for r in after]


def calibrate(
    counts: PositionCounts | None,
    current: Schedule,
    plan: PlanView,
    *,
    max_k: int,
    max_num_seqs: int,
    batch: float,
    last_change_at: float,
    now: float,
) -> CalibrationDecision:
    """Keep the schedule running or change it, from one window's counts per draft position (see the module).

    counts: the speculative pods' drafts and accepted tokens per position (DeploymentSample.position_counts).
    current: the schedule the pods run. plan: the plan they run, whose cost model derives the table and predicts the
        speedups. max_k (spec.speculation.numSpeculativeTokens), max_num_seqs (spec.serving.maxNumSeqs).
    batch: running requests per pod over the window (SignalValues.running_per_pod), where the gain is judged;
        rounded into 1..max_num_seqs, and a non-finite one taken as 1.
    last_change_at, now: Unix times of the last schedule change (the rollout of the schedule running) and of now.
    """
    if current.mode != ScheduleMode.AUTO:
        return CalibrationDecision(False, CalibrationReason.NOT_AUTO)
    if counts is None or not counts.accepted:
        return CalibrationDecision(False, CalibrationReason.NO_POSITION_COUNTS)
    evidence = evidence_of(counts)
    if not evidence.enough:
        return CalibrationDecision(False, CalibrationReason.TOO_FEW_DRAFTS, evidence)
    if _exactly_counted(counts, current) == 0:     # vLLM counting drafts of a schedule that drafts nothing
        return CalibrationDecision(False, CalibrationReason.TOO_FEW_DRAFTS, evidence)
    positions = acceptance_per_position(counts, current, max_k)
    acceptance = tuple(p.rate for p in positions)
    derived = plan.derive_schedule(acceptance)
    observed = min(max(round(batch), 1), max_num_seqs) if math.isfinite(batch) else 1
    before = plan.predicted_speedup(acceptance, observed, current.k_at(observed))
    after = plan.predicted_speedup(acceptance, observed, derived.k_at(observed))
    gain = after / before - 1.0
    decision = CalibrationDecision(
        change=False, reason=None, evidence=evidence, positions=positions, acceptance=acceptance, schedule=derived.ranges,
        comparison=compare(plan, acceptance, current, derived, max_num_seqs), batch=observed,
        speedup_before=before, speedup_after=after, gain=gain,
    )
    if _same(current.ranges, derived.ranges):
        return _keep(decision, CalibrationReason.SAME_SCHEDULE)
    if all(r.k == 0 for r in derived.ranges):
        return _keep(decision, CalibrationReason.NEVER_PAYS)
    if gain < MIN_RELATIVE_GAIN:
        return _keep(decision, CalibrationReason.GAIN_BELOW_MINIMUM)
    if after < 1.0:
        return _keep(decision, CalibrationReason.LOSES_AT_LOAD)
    if now - last_change_at < MIN_PERIOD_SECONDS:
        return _keep(decision, CalibrationReason.WITHIN_MINIMUM_PERIOD, earliest_change_at=last_change_at + MIN_PERIOD_SECONDS)
    return dataclasses.replace(decision, change=True)


def _keep(decision: CalibrationDecision, reason: CalibrationReason, earliest_change_at: float | None = None
          ) -> CalibrationDecision:
    return dataclasses.replace(decision, reason=reason, earliest_change_at=earliest_change_at)
