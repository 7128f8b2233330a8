"""spec.analysis.objective: which checks decide under Latency, Throughput and Both. Plain values, no fakes.

The scenario behind the defaults (docs/analysis.md "Objectives"): a speculative variant whose draft leaves fewer
concurrent sequences queues first while each of its tokens is faster — at 3 requests/s per pod the simulator's
Llama-3.1-8B + 1B draft (k = 5, H100, gpu-memory-utilization 0.35) measured 11.8 ms per token against 12.9 ms,
and a mean queue time of 522 ms against 89 ms.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from analysis_samples import JITTER, T0, token_counter, variant
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from specdeploy.api.reasons import FailureReason, InconclusiveReason, RollbackReason
from specdeploy.api.spec import Analysis, BaselineMode, Checks, Objective, SpeculativeDeploymentSpec
from specdeploy.cli import main
from specdeploy.judgment.rollback import next_analysis_state
from specdeploy.judgment.samples import DeploymentSample, Signal, SignalValues
from specdeploy.judgment.verdict import (
    Assessment,
    Check,
    CheckResult,
    Failing,
    Healthy,
    Inconclusive,
    Outcome,
    Policy,
    Verdict,
    assess,
    objective_checks,
    previous_baseline,
    render,
    verdict,
)
from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.exposition import parse
from specdeploy_engine.sim.metrics import engine_metrics
from specdeploy_engine.sim.model import served_model
from specdeploy_engine.sim.virtual import simulate

LATENCY, THROUGHPUT, BOTH = Objective.LATENCY, Objective.THROUGHPUT, Objective.BOTH
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PREFILL = 0.15          # scheduled → first token of a 4096-token prompt, both variants


def pods(itl: float, queue: float, *, requests: float, pods: float, waiting: float = 0.0,
         jitter: tuple[float, ...] = JITTER, **values: Any) -> SignalValues:
    """One variant: `pods` pods serving `requests` in the window, TTFT = queue + PREFILL."""
    return variant(itl, requests, jitter, ttft=queue + PREFILL, queue=queue, pods=pods, waiting=waiting * pods,
                   **values)


def queue_first(spec_queue: float = 0.522, control_queue: float = 0.089, requests: float = 900,
                **speculative: Any) -> DeploymentSample:
    """Two speculative pods and one control pod at the same load per pod: speculation faster per token, but
    queueing first."""
    return DeploymentSample(
        window_seconds=300,
        speculative=pods(0.0118, spec_queue, requests=requests, pods=2, waiting=1.6, acceptance_rate=0.55,
                         mean_acceptance_length=3.75, **speculative),
        control=pods(0.0129, control_queue, requests=requests / 2, pods=1, waiting=0.3, jitter=JITTER[::-1]),
    )


def result_of(found: Assessment, which: Check) -> CheckResult:
    result = found.check(which)
    assert result is not None, (which, found.checks)
    return result


def policy(objective: Objective, mode: BaselineMode = BaselineMode.CONTROL, gpus: int = 1, **limits: Any) -> Policy:
    return Policy(Checks.model_validate(limits), mode, 20, None, None, objective=objective, gpus_per_pod=gpus)


# -- the defaults -----------------------------------------------------------------------------------

def test_an_sd_without_an_objective_is_judged_by_latency() -> None:
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "ngram"},
    })
    assert spec.analysis.objective == LATENCY
    assert Policy().objective == LATENCY
    checks = spec.analysis.checks
    assert (checks.max_queue_time_ratio, checks.queue_time_floor_seconds, checks.min_output_tokens_per_gpu_ratio) == (
        2.0, 0.05, 0.90)
    assert Analysis.model_validate({"objective": "Both"}).to_wire()["objective"] == "Both"


def test_throughput_and_both_need_a_control() -> None:
    for objective in ("Throughput", "Both"):
        with pytest.raises(ValidationError, match="need `spec.analysis.baseline.mode` Control"):
            Analysis.model_validate({"objective": objective, "baseline": {"mode": "Previous"}})
    assert Analysis.model_validate({"objective": "Latency", "baseline": {"mode": "None"}}).objective == LATENCY


def test_each_objective_names_the_limits_that_decide() -> None:
    checks = Checks()
    assert set(objective_checks(LATENCY, checks)) == {
        "maxPerTokenLatencyRatio", "maxPrefillTimeRatio", "prefillTimeFloorSeconds", "maxInferenceTimeRatio",
        "maxP99E2ELatencySeconds"}
    assert set(objective_checks(THROUGHPUT, checks)) == {
        "maxQueueTimeRatio", "queueTimeFloorSeconds", "minOutputTokensPerGpuRatio", "maxP99E2ELatencySeconds"}
    assert set(objective_checks(BOTH, checks)) == set(objective_checks(LATENCY, checks)) | set(
        objective_checks(THROUGHPUT, checks))


def test_plan_prints_the_objective() -> None:
    example = str(EXAMPLES / "llama-70b-fp8-tp2.yaml")
    document = json.loads(CliRunner().invoke(main, ["plan", "-o", "json", "--offline", example]).output)
    assert document["analysis"]["objective"] == "Latency"
    assert document["analysis"]["checks"]["maxPerTokenLatencyRatio"] == 1.10
    text = " ".join(CliRunner().invoke(main, ["plan", "--offline", example]).output.replace("│", " ").split())
    assert "objective Latency" in text and "queueing is not judged" in text


# -- speculation that queues first with a faster token --------------------------------------------

def test_latency_is_not_failed_by_queueing_but_says_what_throughput_would_judge() -> None:
    found = assess(queue_first(), policy(LATENCY))
    assert isinstance(found.verdict, Healthy), found.verdict
    for check in (Check.PER_TOKEN_LATENCY, Check.E2E_LATENCY, Check.TIME_TO_FIRST_TOKEN):
        assert (result_of(found, check).outcome, result_of(found, check).counted) == (Outcome.PASSED, True), check
    queue = result_of(found, Check.QUEUE_TIME)
    assert queue.outcome == Outcome.FAILED and not queue.counted          # what Throughput would fail on
    assert f"not counted under objective Latency (queueing and throughput: objective Throughput or Both judges " \
           f"them): {render(queue)}" in found.verdict.summary


def test_throughput_fails_on_queueing_with_the_numbers() -> None:
    found = assess(queue_first(), policy(THROUGHPUT))
    result = found.verdict
    assert isinstance(result, Failing), result
    assert result.reason == FailureReason.QUEUE_TIME_REGRESSED
    assert RollbackReason(result.reason.value) == RollbackReason.QUEUE_TIME_REGRESSED
    queue = result_of(found, Check.QUEUE_TIME)
    assert queue.outcome == Outcome.FAILED and queue.counted and queue.comparison == found.queue
    assert queue.limit == 2.0 and queue.comparison is not None and queue.comparison.low > queue.limit
    assert queue.comparison.ratio == pytest.approx(0.522 / 0.089, rel=0.01)
    assert (queue.comparison.requests, queue.comparison.baseline_requests) == (900, 450)
    # the per-token checks are computed and shown, and not counted
    per_token = result_of(found, Check.PER_TOKEN_LATENCY)
    assert per_token.outcome == Outcome.PASSED and not per_token.counted
    assert found.per_token is not None and found.per_token.ratio < 1


def test_golden_throughput_message() -> None:
    result = verdict(queue_first(), policy(THROUGHPUT))
    assert isinstance(result, Failing) and result.evidence == (
        "queue time 5.87× (95% interval 5.79×…5.94×) the control's, above maxQueueTimeRatio 2.00; mean 522 ms vs 89 ms "
        "(each counted as at least queueTimeFloorSeconds 50 ms), 1.6 vs 0.3 requests waiting per pod, 900 vs 450 "
        "requests in 10 slices: the speculative pods queue first at the same load (fewer sequences fit beside the "
        "draft, or each takes longer) over 5m (900 requests; control 450), objective Throughput; not counted under "
        "objective Throughput (latency checks): per-token latency −9% (95% interval −10%…−7%) vs the control; "
        "end-to-end latency without the queue −8% (95% interval −9%…−7%) vs the control; time to first token without "
        "the queue ±0% (95% interval −1%…+1%) vs the control")


def test_both_fails_when_either_set_fails() -> None:
    found = assess(queue_first(), policy(BOTH))
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.QUEUE_TIME_REGRESSED
    assert {r.check for r in found.checks if r.counted} >= {
        Check.PER_TOKEN_LATENCY, Check.E2E_LATENCY, Check.TIME_TO_FIRST_TOKEN, Check.QUEUE_TIME, Check.OUTPUT_PER_GPU}
    slower = queue_first(spec_queue=0.089)
    slower = dataclasses.replace(slower, speculative=pods(0.0129 * 1.4, 0.089, requests=900, pods=2,
                                                           acceptance_rate=0.55))
    assert isinstance(verdict(slower, policy(THROUGHPUT)), Healthy)
    both = verdict(slower, policy(BOTH))
    assert isinstance(both, Failing) and both.reason == FailureReason.INTER_TOKEN_LATENCY_REGRESSED


@pytest.mark.parametrize("objective", list(Objective))
def test_too_few_requests_is_inconclusive_under_every_objective(objective: Objective) -> None:
    few = queue_first(requests=12)
    found = assess(few, policy(objective))
    assert isinstance(found.verdict, Inconclusive) and found.verdict.reason == InconclusiveReason.TOO_FEW_REQUESTS
    assert result_of(found, Check.REQUESTS).value == 12 and found.objective == objective
    no_control = dataclasses.replace(queue_first(), control=SignalValues())
    result = verdict(no_control, policy(objective))
    assert isinstance(result, Inconclusive) and result.reason == InconclusiveReason.NO_CONTROL_DATA


def test_throughput_without_slices_is_inconclusive_never_failing() -> None:
    sample = queue_first()
    bare = dataclasses.replace(sample.speculative, series={
        signal: points for signal, points in sample.speculative.series.items()
        if signal not in (Signal.QUEUE_TIME_SUM_SERIES, Signal.QUEUE_TIME_COUNT_SERIES)})
    found = assess(dataclasses.replace(sample, speculative=bare), policy(THROUGHPUT))
    assert isinstance(found.verdict, Inconclusive) and found.verdict.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE
    queue = result_of(found, Check.QUEUE_TIME)
    assert queue.outcome == Outcome.UNDECIDED and queue.comparison is None            # no interval at all


def test_throughput_with_baseline_none_is_inconclusive() -> None:
    result = verdict(queue_first(), policy(THROUGHPUT, BaselineMode.NONE))
    assert isinstance(result, Inconclusive) and result.reason == InconclusiveReason.NO_CONTROL_DATA


@settings(max_examples=80, deadline=None)
@given(st.floats(0.0, 0.05), st.floats(0.0, 0.05), st.sampled_from([THROUGHPUT, BOTH]))
def test_queueing_under_the_floor_never_fails(spec_queue: float, control_queue: float, objective: Objective) -> None:
    """Both variants waiting less than queueTimeFloorSeconds (50 ms) is noise, whatever their ratio."""
    result = verdict(queue_first(spec_queue, control_queue), policy(objective))
    assert not isinstance(result, Failing), result


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 20.0), st.integers(0, 9))
def test_the_same_queueing_on_both_sides_never_fails(queue: float, shift: int) -> None:
    """The same mean queue time (only slice noise apart) under Throughput: never a failure."""
    jitter = JITTER[shift:] + JITTER[:shift]
    sample = DeploymentSample(300, pods(0.0118, queue, requests=900, pods=2, jitter=jitter, acceptance_rate=0.55),
                              pods(0.0118, queue, requests=450, pods=1, jitter=JITTER[::-1]))
    result: Verdict = verdict(sample, policy(THROUGHPUT))
    assert not isinstance(result, Failing), result


# -- output tokens per second per GPU ---------------------------------------------------------------

def test_fewer_tokens_per_gpu_at_the_same_load_fails_throughput() -> None:
    sample = queue_first(spec_queue=0.089, tokens_per_second=2 * 844.0)
    sample = dataclasses.replace(sample, control=dataclasses.replace(
        sample.control, output_tokens_per_second=970.0,
        series={**sample.control.series, Signal.OUTPUT_TOKENS_SERIES: _tokens(970.0, JITTER[::-1])}))
    found = assess(sample, policy(THROUGHPUT))
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.OUTPUT_THROUGHPUT_REGRESSED
    tokens = result_of(found, Check.OUTPUT_PER_GPU)
    assert tokens.outcome == Outcome.FAILED and tokens.limit == 0.90
    assert tokens.comparison is not None and tokens.comparison.high < tokens.limit
    assert tokens.comparison.ratio == pytest.approx(844 / 970, rel=0.01)
    assert "844 vs 970 tokens/s per GPU, 2 vs 1 pods of 1 GPU" in found.verdict.evidence    # per GPU, as counted
    assert isinstance(verdict(sample, policy(LATENCY)), Healthy)


def test_tokens_are_counted_per_gpu() -> None:
    """Two speculative pods serve twice one control pod's tokens: the same per pod, so the same per GPU."""
    found = assess(queue_first(spec_queue=0.089), policy(THROUGHPUT, gpus=4))
    assert isinstance(found.verdict, Healthy), found.verdict
    assert found.output_per_gpu is not None and found.output_per_gpu.ratio == pytest.approx(1.0, rel=0.01)
    state = next_analysis_state(None, queue_first(spec_queue=0.089), found, T0)
    assert state.objective == "Throughput"
    assert state.output_tokens_per_second_per_gpu == state.baseline_output_tokens_per_second_per_gpu == 75.0
    assert state.mean_queue_time_seconds == 0.089 and state.queue_time_ratio == 1.0


def _tokens(per_second: float, jitter: tuple[float, ...]) -> tuple[tuple[float, float], ...]:
    return token_counter(per_second, jitter)


# -- Latency reads the time in the engine ----------------------------------------------------------

def test_latency_judges_time_to_first_token_without_the_queue() -> None:
    """TTFT with the queue 2.1 s vs 0.2 s (10×, far above 1.50), prefill the same: not a TTFT failure."""
    result = verdict(queue_first(spec_queue=1.95, control_queue=0.05), policy(LATENCY))
    assert isinstance(result, Healthy), result


def test_a_slower_prefill_still_fails_latency() -> None:
    sample = queue_first(spec_queue=0.05, control_queue=0.05)
    slow = pods(0.0118, 0.05, requests=900, pods=2, acceptance_rate=0.55)
    slower_prefill = {Signal.PREFILL_TIME_SUM_SERIES: _scaled(slow, Signal.PREFILL_TIME_SUM_SERIES, 2.0)}
    slow = dataclasses.replace(slow, series={**slow.series, **slower_prefill})
    found = assess(dataclasses.replace(sample, speculative=slow), policy(LATENCY))
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED
    prefill = result_of(found, Check.TIME_TO_FIRST_TOKEN).comparison
    assert prefill is not None and prefill.ratio == pytest.approx(2.0, rel=0.01)


# Measured on the simulator (benchmarks/default_checks.py, docs/decisions.md): the Llama-3.1-70B FP8 SD of
# examples/llama-70b-fp8-tp2.yaml (8B FP8 draft, k = 4) at 8 requests/s per pod, ~256-token prompts: prefill 45 ms
# vs 27 ms (the draft's own prefill and its k proposals ride on the step that completes a prompt), per token
# 15.8 ms vs 18.2 ms, the whole request 12% sooner.
SHORT_PROMPT_PREFILL = (0.0451, 0.0266)


def _short_prompts() -> DeploymentSample:
    spec_prefill, control_prefill = SHORT_PROMPT_PREFILL
    return DeploymentSample(
        window_seconds=300,
        speculative=variant(0.0158, 2400, JITTER, ttft=0.005 + spec_prefill, queue=0.005, running=8,
                            acceptance_rate=0.28, mean_acceptance_length=2.12),
        control=variant(0.0182, 2400, JITTER[::-1], ttft=0.005 + control_prefill, queue=0.005, running=8),
    )


def test_a_drafters_prefill_on_short_prompts_is_no_latency_regression_at_the_defaults() -> None:
    """1.7× a prefill of 27 ms, both below prefillTimeFloorSeconds (100 ms): equal, while each token is faster."""
    found = assess(_short_prompts(), policy(LATENCY))
    assert isinstance(found.verdict, Healthy), found.verdict
    prefill = result_of(found, Check.TIME_TO_FIRST_TOKEN)
    assert prefill.outcome == Outcome.PASSED and prefill.comparison is not None
    assert prefill.comparison.ratio == pytest.approx(1.0)
    assert "each counted as at least prefillTimeFloorSeconds 100 ms" in render(prefill)


def test_without_the_prefill_floor_the_ratio_of_short_prefills_decides() -> None:
    found = assess(_short_prompts(), policy(LATENCY, prefillTimeFloorSeconds=0))
    assert isinstance(found.verdict, Failing) and found.verdict.reason == FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED
    prefill = result_of(found, Check.TIME_TO_FIRST_TOKEN).comparison
    assert prefill is not None and prefill.ratio == pytest.approx(0.0451 / 0.0266, rel=0.01) and prefill.low > 1.5


def test_the_prefill_floor_holds_against_a_previous_snapshot_too() -> None:
    """The control's short prefill taken as the Previous baseline, the speculative pods' 1.7× of it now."""
    short = _short_prompts()
    before = previous_baseline(dataclasses.replace(short, speculative=short.control), 20, T0)
    assert before is not None and before.prefill_time is not None
    assert before.prefill_time.mean_seconds == pytest.approx(SHORT_PROMPT_PREFILL[1], rel=0.02)
    judged = dataclasses.replace(short, control=SignalValues())
    kept = assess(judged, Policy(Checks(), BaselineMode.PREVIOUS, 20, None, before))
    prefill = result_of(kept, Check.TIME_TO_FIRST_TOKEN)
    assert prefill.outcome == Outcome.PASSED, render(prefill)
    measured = assess(judged, Policy(Checks(prefillTimeFloorSeconds=0), BaselineMode.PREVIOUS, 20, None, before))
    assert result_of(measured, Check.TIME_TO_FIRST_TOKEN).outcome != Outcome.PASSED


def _scaled(values: SignalValues, signal: Signal, factor: float) -> tuple[tuple[float, float], ...]:
    points = values.points(signal)
    start = points[0][1]
    return tuple((at, start + (value - start) * factor) for at, value in points)


def test_without_engine_histograms_the_queue_is_taken_off_slice_by_slice() -> None:
    """SGLang and TensorRT-LLM have no prefill or inference histograms: TTFT / E2E − queue time, per slice."""
    engine_time = (Signal.PREFILL_TIME_SUM_SERIES, Signal.PREFILL_TIME_COUNT_SERIES,
                   Signal.INFERENCE_TIME_SUM_SERIES, Signal.INFERENCE_TIME_COUNT_SERIES)

    def without(values: SignalValues) -> SignalValues:
        return dataclasses.replace(values, series={s: p for s, p in values.series.items() if s not in engine_time})

    sample = queue_first(spec_queue=1.95, control_queue=0.05)
    derived = dataclasses.replace(sample, speculative=without(sample.speculative), control=without(sample.control))
    found = assess(derived, policy(LATENCY))
    assert isinstance(found.verdict, Healthy), found.verdict
    prefill = result_of(found, Check.TIME_TO_FIRST_TOKEN).comparison
    assert prefill is not None and prefill.ratio == pytest.approx(1.0, abs=0.005)       # the 1.9 s queue taken off


def test_the_slo_counts_under_every_objective() -> None:
    for objective in Objective:
        result = verdict(queue_first(spec_queue=0.05), policy(objective, maxP99E2ELatencySeconds=1.0))
        assert isinstance(result, Failing) and result.reason == FailureReason.E2E_LATENCY_ABOVE_SLO


def test_a_previous_snapshot_holds_the_time_in_the_engine() -> None:
    snapshot = previous_baseline(queue_first(), 20, T0)
    assert snapshot is not None and snapshot.prefill_time is not None and snapshot.inference_time is not None
    assert snapshot.prefill_time.mean_seconds == pytest.approx(PREFILL, rel=0.02)
    assert math.isclose(snapshot.time_to_first_token.mean_seconds if snapshot.time_to_first_token else 0,
                        0.522 + PREFILL, rel_tol=0.02)


# -- the simulator exports the time in the engine -------------------------------------------------

def test_the_simulator_splits_a_request_into_queue_prefill_and_decode_as_vllm_does() -> None:
    """vLLM's queue + inference = end to end and prefill + decode = inference, request by request, so the sums
    add up; a batch that is full (max-num-seqs 2 at 4 requests/s) makes requests queue."""
    gpu = find_gpu("H100-80GB")
    assert gpu is not None
    served = served_model(parse_engine_argv(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs",
                                             "2"], gpu=gpu), gpu)
    metrics = engine_metrics(served)
    plan = Workload(QpsSchedule.constant(4), Lengths.parse("200"), Lengths.parse("100")).plan(20, seed=1)
    simulate(served, plan, observer=metrics)
    families = parse(metrics.render())

    def total(name: str, part: str) -> float:
        return families[name].value(f"{name}_{part}")

    queue, e2e = total("vllm:request_queue_time_seconds", "sum"), total("vllm:e2e_request_latency_seconds", "sum")
    prefill, decode = total("vllm:request_prefill_time_seconds", "sum"), total("vllm:request_decode_time_seconds", "sum")
    inference = total("vllm:request_inference_time_seconds", "sum")
    assert total("vllm:request_inference_time_seconds", "count") == total("vllm:e2e_request_latency_seconds", "count")
    assert queue > 0.5 * e2e                      # the batch was full: most of the time is waiting
    assert queue + inference == pytest.approx(e2e)
    assert prefill + decode == pytest.approx(inference)
    assert families["vllm:generation_tokens_total"].value() == pytest.approx(80 * 100, rel=0.05)


def test_noisy_tokens_beside_a_queue_that_keeps_up_pass() -> None:
    """Below saturation the token rates differ by arrival noise only: undecided there is not Inconclusive when
    the speculative pods queue no more than the control."""
    noisy = (0.3, -0.25, 0.2, -0.3, 0.25, 0.0, -0.2, 0.3, -0.25, 0.1)

    def with_noisy_tokens(sample: DeploymentSample) -> DeploymentSample:
        spec = sample.speculative
        series = {**spec.series, Signal.OUTPUT_TOKENS_SERIES: _tokens(600.0, noisy)}   # 300/s per pod, as the control
        return dataclasses.replace(sample, speculative=dataclasses.replace(spec, series=series))

    found = assess(with_noisy_tokens(queue_first(spec_queue=0.01, control_queue=0.01)), policy(THROUGHPUT))
    assert isinstance(found.verdict, Healthy), found.verdict
    assert found.output_per_gpu is not None and found.output_per_gpu.low < 0.9 < found.output_per_gpu.high
    tokens = result_of(found, Check.OUTPUT_PER_GPU)
    assert (tokens.outcome, tokens.reason, tokens.kept_up) == (Outcome.PASSED, None, True)
    assert result_of(found, Check.QUEUE_TIME).outcome == Outcome.PASSED
    assert render(tokens).endswith(", undecided, but the speculative pods queue no more than the control: they keep "
                                   "up with the offered load")
    result = verdict(with_noisy_tokens(queue_first()), policy(THROUGHPUT))
    assert isinstance(result, Failing) and result.reason == FailureReason.QUEUE_TIME_REGRESSED
