"""The GPUs an SD really got, fitted from its control pods: one factor on the cost model's GPU time (pure).

    fit = fit_hardware(sample, plan, previous_fit)     # None: no control pods, too few slices or no speculation

The control pods run the target without speculation, so their mean per-token latency in a slice of the window
(the per-token histogram's Δ_sum ÷ Δ_count) is one engine step at the batch they run. Against the prior's step at
that batch (`plan.base_step_seconds`), each slice gives a factor on the GPU time — (measured − the engine's CPU
overhead) ÷ the prior's forward pass; their mean with a 95% interval is the fit. One factor is all a window at one
load can identify (docs/analysis.md); it stands for bandwidth and compute together.

The judgment takes the factor (status.analysis.hardwareFit.appliedFactor) once its interval is narrower than the
prior's stated error, and keeps it: from the next sample the acceptance floor and every prediction are the fitted
model's (judgment/speculation.py `_under_fit`), and calibration derives its tables from it, so the pods' Auto table
moves to the fitted one at the first calibration change that pays at the running load (judgment/calibration.py's
gain and minimum period) — not on the fit alone. Later fits are shown, not applied (a load swing does not move it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specdeploy.api.status import HardwareFit
from specdeploy.judgment import evidence
from specdeploy.judgment.comparison import MIN_SLICES, t975
from specdeploy.judgment.plan_view import PlanView
from specdeploy.judgment.recalibration import table_text
from specdeploy.judgment.samples import DeploymentSample, Points, Signal


def slice_latencies(sums: Points, counts: Points) -> list[float]:
    """Mean seconds per token in each slice between consecutive instants that counted tokens."""
    latencies = []
    for (_, sum_a), (_, sum_b), (_, count_a), (_, count_b) in zip(sums, sums[1:], counts, counts[1:], strict=False):
        tokens, seconds = count_b - count_a, sum_b - sum_a
        if tokens > 0 and seconds >= 0 and math.isfinite(tokens) and math.isfinite(seconds):
            latencies.append(seconds / tokens)
    return latencies


def factor_interval(latencies: Sequence[float], prior_pass_s: float, overhead_s: float) -> tuple[float, float] | None:
    """The mean factor on the GPU time over the slices and its 95% half-width (Student's t; a fraction of it); None with fewer
    than MIN_SLICES slices."""
    if len(latencies) < MIN_SLICES or prior_pass_s <= 0:
        return None
    factors = [(latency - overhead_s) / prior_pass_s for latency in latencies]
    mean = sum(factors) / len(factors)
    if mean <= 0:
        return None
    variance = sum((f - mean) ** 2 for f in factors) / (len(factors) - 1)
    return mean, t975(len(factors) - 1) * math.sqrt(variance / len(factors)) / mean


def _applied(factor: float, half_width: float, prior_error: float, previous: HardwareFit | None) -> float | None:
    """The factor the plan takes: the first fit better than the prior, kept from then on. Later fits are shown
    beside it, not applied: one factor cannot follow the load (at a full batch a control step also holds prefill
    chunks and queueing that the model does not), and rolling the pods as the load swings is what an Auto schedule
    exists to avoid. None (the prior) until a fit is better than it."""
    held = previous.applied_factor if previous is not None else None
    if held is not None:
        return held
    return round(factor, 3) if half_width < prior_error else None


def _changed(plan: PlanView, applied: float | None, batch: int) -> str:
    """What the applied factor changes against the prior: the floor at `batch` (now) and the Auto table the pods run
    (at calibration's next change that pays at the running load)."""
    if applied is None:
        return "the judgment keeps the prior"
    prior, fitted = plan.with_hardware_factor(None), plan.with_hardware_factor(applied)
    changes = []
    floor_before, floor_after = prior.acceptance_floor(batch), fitted.acceptance_floor(batch)
    if floor_before is not None and floor_after is not None and not floor_after.fixed:
        changes.append(f"acceptance floor at batch {batch} {evidence.number(floor_before.rate)} → "
                       f"{evidence.number(floor_after.rate)}")
    derived = fitted.derived_schedule()
    if plan.schedule is not None and derived is not None:
        running, after = table_text(plan.schedule.ranges), table_text(derived.ranges)
        changes.append(f"schedule [{running}] → [{after}], for the pods when calibration finds it pays at the "
                       "running load" if running != after else f"schedule [{after}] unchanged")
    return f"the judgment prices with the fitted model (factor {applied:g}): " + ", ".join(
        changes or ["nothing it derives changes"])


def fit_hardware(sample: DeploymentSample, plan: PlanView | None, previous: HardwareFit | None) -> HardwareFit | None:
    """This window's fit from the control pods; None without control slices, a running batch or speculation's
    cost model. `previous`: the last fit, whose applied factor is held while this fit's interval holds it."""
    control = sample.control
    running = control.running_per_pod
    if plan is None or plan.schedule is None or running is None or running <= 0:
        return None
    batch = max(1, round(running))
    latencies = slice_latencies(control.points(Signal.INTER_TOKEN_LATENCY_SUM_SERIES),
                                control.points(Signal.INTER_TOKEN_LATENCY_COUNT_SERIES))
    prior_step, overhead = plan.base_step_seconds(batch), plan.base_step_seconds(batch, 0.0)
    found = factor_interval(latencies, prior_step - overhead, overhead)
    if found is None:
        return None
    factor, half_width = found
    prior_error = plan.with_hardware_factor(None).model_error
    applied = _applied(factor, half_width, prior_error, previous)
    fitted_step = plan.base_step_seconds(batch, factor)
    measured = sum(latencies) / len(latencies)
    better = "narrower" if half_width < prior_error else "not yet narrower"
    message = (f"control pods at batch {batch}: step {evidence.seconds(measured)} measured, "
               f"{evidence.seconds(prior_step)} prior, {evidence.seconds(fitted_step)} fitted (GPU time × "
               f"{factor:.3f} ± {half_width:.1%} from {len(latencies)} slices, {better} than the prior's ± "
               f"{prior_error:.0%}); {_changed(plan, applied, batch)}")
    return HardwareFit(factor=round(factor, 4), factor_half_width=round(half_width, 4), prior_error=prior_error,
                       applied_factor=applied, batch=round(running, 2), measured_step_seconds=measured,
                       prior_step_seconds=prior_step, fitted_step_seconds=fitted_step, slices=len(latencies),
                       message=message)
