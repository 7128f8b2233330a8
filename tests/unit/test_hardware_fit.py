"""The operator learns its hardware: the control pods' per-token latency at their batch fits one factor on the cost
model's GPU time, which the judgment takes once its interval is narrower than the prior's stated error (issue 28 point 4):
its floor and predictions from then on, the pods' table at calibration's next change (tests/unit/test_recalibration.py)."""

from __future__ import annotations

import dataclasses

import pytest
from analysis_samples import JITTER, sample, variant

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import AnalysisStatus, HardwareFit
from specdeploy.judgment.hardware import factor_interval, fit_hardware, slice_latencies
from specdeploy.judgment.samples import DeploymentSample
from specdeploy.planning.plan import (
    DATASHEET_MODEL_ERROR,
    MEASURED_MODEL_ERROR,
    Plan,
    make_plan,
    plan_document,
)

BATCH = 8


def _spec(gpu: str = "H100-80GB", mode: str = "Auto") -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "replicas": 1, "engine": {"kind": "vllm"}, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "draft_model", "draft": {"name": "meta-llama/Llama-3.2-1B-Instruct"},
                        "numSpeculativeTokens": 5, "schedule": {"mode": mode}},
        "resources": {"gpu": {"product": gpu, "count": 1}},
        "serving": {"maxModelLen": 8192, "maxNumSeqs": 256},
        "analysis": {"baseline": {"mode": "Control", "controlReplicas": 1}},
    })


def _control_at(plan: Plan, slowdown: float, jitter: tuple[float, ...] = JITTER, batch: float = BATCH
                ) -> DeploymentSample:
    """A window whose control pods run `batch` sequences on GPUs `slowdown` × slower than the prior in every step
    (the simulator's hardwareSlowdown): their per-token latency is the prior's step × slowdown, slice by slice."""
    step = plan.base_step_seconds(round(batch)) * slowdown
    return dataclasses.replace(sample(0.6), control=variant(step, 400, jitter, running=batch))


def test_slices_are_delta_sum_over_delta_count() -> None:
    sums = ((0.0, 1.0), (30.0, 2.0), (60.0, 2.0), (90.0, 5.0))
    counts = ((0.0, 10.0), (30.0, 60.0), (60.0, 60.0), (90.0, 160.0))
    assert slice_latencies(sums, counts) == [0.02, 0.03]   # the slice that counted no token is left out


def test_too_few_slices_fit_nothing() -> None:
    assert factor_interval([0.02, 0.021, 0.019], 0.015, 0.0004) is None


def test_a_slower_gpu_is_fitted_within_5_percent_of_its_step() -> None:
    plan = make_plan(_spec())
    fit = fit_hardware(_control_at(plan, 1.25), plan, None)
    assert fit is not None
    assert abs(fit.fitted_step_seconds / fit.measured_step_seconds - 1) < 0.05
    assert fit.fitted_step_seconds > 1.2 * fit.prior_step_seconds
    assert fit.factor_half_width < MEASURED_MODEL_ERROR
    assert fit.applied_factor is not None and fit.applied_factor > 1.25   # the CPU overhead is not the GPU's
    assert "fitted" in fit.message and "prior" in fit.message and "schedule [" in fit.message


def test_a_noisy_window_keeps_the_prior() -> None:
    plan = make_plan(_spec())
    noisy = tuple(0.6 * j / 0.03 for j in JITTER)            # ± 60% per slice
    fit = fit_hardware(_control_at(plan, 1.25, noisy), plan, None)
    assert fit is not None and fit.factor_half_width > MEASURED_MODEL_ERROR
    assert fit.applied_factor is None and "keeps the prior" in fit.message


def test_the_first_fit_better_than_the_prior_is_kept_and_later_fits_are_shown_not_applied() -> None:
    """A load swing moves what one factor measures (prefill and queueing at a full batch): rolling the pods after it
    is what an Auto schedule exists to avoid, so the applied factor stays and status shows the new fit beside it."""
    plan = make_plan(_spec())
    first = fit_hardware(_control_at(plan, 1.25), plan, None)
    assert first is not None and first.applied_factor is not None
    nudged = fit_hardware(_control_at(plan, 1.26), plan, first)
    assert nudged is not None and nudged.applied_factor == first.applied_factor
    moved = fit_hardware(_control_at(plan, 1.6), plan, first)
    assert moved is not None and moved.applied_factor == first.applied_factor and moved.factor > 1.5


def test_the_fitted_plan_derives_its_schedule_and_floor_from_the_slower_gpu() -> None:
    """make_plan under a factor (calibration's, planning.schedule.calibrated_hardware_factor) renders that model's
    table; `with_hardware_factor` prices the floor and predictions and keeps the table the pods run."""
    prior = make_plan(_spec())
    fitted = make_plan(_spec(), hardware_factor=1.4)
    assert fitted.prediction_source == "fitted" and prior.prediction_source == "prior"
    assert fitted.cost is not None and prior.cost is not None
    assert abs(fitted.cost.target_pass_seconds(BATCH, 1) / prior.cost.target_pass_seconds(BATCH, 1) - 1.4) < 1e-9
    assert fitted.schedule is not None and prior.schedule is not None
    # A slower GPU makes the engine's fixed CPU overhead a smaller share of a step: the k steps move.
    assert fitted.schedule.ranges != prior.schedule.ranges
    # Priced on another GPU time, a plan keeps the table its pods run; what that model derives is asked apart.
    assert prior.with_hardware_factor(1.4).schedule == prior.schedule
    assert prior.with_hardware_factor(1.4).derived_schedule() == fitted.schedule
    assert fitted.with_hardware_factor(None).derived_schedule() == prior.schedule
    floor_prior, floor_fitted = prior.acceptance_floor(BATCH), prior.with_hardware_factor(1.4).acceptance_floor(BATCH)
    assert floor_prior is not None and floor_fitted is not None and floor_fitted.rate != floor_prior.rate
    assert fitted.base_step_seconds(BATCH) == prior.base_step_seconds(BATCH)          # always against the prior


def test_the_stated_error_is_the_table_for_an_h100_or_a_fit_wider_from_a_datasheet() -> None:
    assert make_plan(_spec()).model_error == MEASURED_MODEL_ERROR
    assert make_plan(_spec("L40S")).model_error == DATASHEET_MODEL_ERROR
    assert make_plan(_spec("L40S"), hardware_factor=1.1).model_error == MEASURED_MODEL_ERROR


def test_the_fit_round_trips_through_status() -> None:
    plan = make_plan(_spec())
    fit = fit_hardware(_control_at(plan, 1.25), plan, None)
    assert fit is not None
    wire = AnalysisStatus(hardware_fit=fit).to_wire()
    assert AnalysisStatus.model_validate(wire).hardware_fit == HardwareFit.model_validate(wire["hardwareFit"])


def test_plan_json_says_prior_or_fitted_with_the_interval_of_the_models_error() -> None:
    for plan, source, error in ((make_plan(_spec()), "prior", MEASURED_MODEL_ERROR),
                                (make_plan(_spec("L40S")), "prior", DATASHEET_MODEL_ERROR),
                                (make_plan(_spec("L40S"), hardware_factor=1.1), "fitted", MEASURED_MODEL_ERROR)):
        document = plan_document(plan)
        for entry in document["speculationSchedule"]:
            assert entry["modelSource"] == source and entry["modelError"] == error
            low, high = entry["predictedSpeedupInterval"]
            assert low == pytest.approx(entry["predictedSpeedup"] * (1 - error), abs=2e-3)
            assert high == pytest.approx(entry["predictedSpeedup"] * (1 + error), abs=2e-3)
        speedup = document["speedup"]
        assert speedup["modelSource"] == "prior"     # estimated on the datasheet GPU, fitted or not
        assert speedup["speedupAtBatch1Interval"][0] < speedup["speedupAtBatch1"] < speedup["speedupAtBatch1Interval"][1]


def test_plan_text_says_the_model_and_its_interval() -> None:
    from rich.console import Console

    from specdeploy.report import schedule_table

    table = schedule_table(make_plan(_spec()))
    assert table is not None
    console = Console(width=160, record=True)
    console.print(table)
    text = console.export_text()
    assert "from the prior model, ± 9%" in text and "INTERVAL" in text and "prior" in text
