"""The engine core on a virtual clock: continuous batching, chunked prefill, the KV cache, speculative
steps, knobs and determinism."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen.workload import Lengths, PlannedRequest, QpsSchedule, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.engine import Engine, SimRequest
from specdeploy_engine.sim.knobs import KnobError, Knobs
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.virtual import simulate

H100 = find_gpu("H100-80GB")
assert H100 is not None
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3}'


def served(*args: str) -> ServedModel:
    assert H100 is not None
    return served_model(parse_engine_argv(["vllm", "serve", LLAMA_8B, *args], gpu=H100), H100)


def burst(count: int, prompt: int = 100, output: int = 50, temperature: float = 0.0) -> list[PlannedRequest]:
    return [PlannedRequest(0.0, prompt, output, temperature) for _ in range(count)]


def test_max_num_seqs_bounds_the_batch_and_the_rest_wait() -> None:
    engine = Engine(served("--max-num-seqs", "4"))
    for index in range(10):
        engine.add(SimRequest(f"r{index}", 0.0, 100, 20), 0.0)
    step = engine.plan_step(0.0)
    assert step is not None
    assert len(engine.running) == 4 and len(engine.waiting) == 6
    assert step.shape.prefill_tokens == 400 and step.shape.decode_seqs == 0


def test_chunked_prefill_takes_the_token_budget_and_decodes_go_first() -> None:
    engine = Engine(served("--max-num-batched-tokens", "512"))
    engine.add(SimRequest("short", 0.0, 100, 50), 0.0)
    first = engine.plan_step(0.0)
    assert first is not None
    engine.complete_step(first, first.seconds)
    engine.add(SimRequest("long", 0.0, 2000, 50), first.seconds)
    second = engine.plan_step(first.seconds)
    assert second is not None
    assert second.shape.decode_seqs == 1                    # the running request decodes first
    assert second.shape.prefill_tokens == 511               # the long prompt gets the rest of the budget
    now = first.seconds + second.seconds
    engine.complete_step(second, now)
    long = next(request for request in engine.running if request.id == "long")
    assert long.prefilled == 511 and long.first_token_at is None


def test_speculation_verifies_k_plus_one_and_emits_accepted_plus_one() -> None:
    result_plain = simulate(served(), burst(1, output=200))
    result_spec = simulate(served("--speculative-config", EAGLE3), burst(1, output=200), knobs=Knobs(acceptance=1.0))
    assert result_plain.steps == 200                    # one prefill step (first token), 199 decode steps
    # Every draft accepted: k + 1 = 4 tokens per step after the first.
    assert result_spec.steps == 1 + math.ceil(199 / 4)
    assert result_spec.acceptance_rate == 1.0
    nothing = simulate(served("--speculative-config", EAGLE3), burst(1, output=200), knobs=Knobs(acceptance=0.0))
    assert nothing.acceptance_rate == 0.0 and nothing.steps == 200
    assert nothing.requests[0].e2e > result_plain.requests[0].e2e    # drafting costs time and buys nothing


def test_the_acceptance_knob_sets_the_measured_vllm_rate() -> None:
    model = served("--speculative-config", EAGLE3)
    plan = Workload(QpsSchedule.constant(4), Lengths.parse("200"), Lengths.parse("200")).plan(60, seed=3)
    for rate in (0.3, 0.8):
        assert simulate(model, plan, knobs=Knobs(acceptance=rate)).acceptance_rate == pytest.approx(rate, abs=0.02)
    assert simulate(model, plan).acceptance_rate == pytest.approx(model.default_acceptance_rate, abs=0.02)


def test_noise_spreads_acceptance_over_requests_but_keeps_its_mean() -> None:
    model = served("--speculative-config", EAGLE3)
    plan = Workload(QpsSchedule.constant(4), Lengths.parse("200"), Lengths.parse("200")).plan(120, seed=4)
    noisy = simulate(model, plan, knobs=Knobs(acceptance=0.6, noise=0.15))
    assert noisy.acceptance_rate == pytest.approx(0.6, abs=0.04)
    tpots = noisy.values("tpot")
    calm = simulate(model, plan, knobs=Knobs(acceptance=0.6)).values("tpot")
    assert max(tpots) - min(tpots) > max(calm) - min(calm)


def test_extra_latency_is_added_to_every_step() -> None:
    model = served()
    plain = simulate(model, burst(1, output=50))
    slowed = simulate(model, burst(1, output=50), knobs=Knobs(extra_latency_seconds=0.01))
    assert slowed.requests[0].e2e == pytest.approx(plain.requests[0].e2e + 50 * 0.01, rel=1e-9)


def test_slower_hardware_stretches_every_step_by_its_factor() -> None:
    model = served()
    plain = simulate(model, burst(1, output=50))
    slower = simulate(model, burst(1, output=50), knobs=Knobs(hardware_slowdown=1.25))
    assert slower.requests[0].e2e == pytest.approx(plain.requests[0].e2e * 1.25, rel=1e-9)
    with pytest.raises(KnobError, match="hardwareSlowdown"):
        Knobs().update({"hardwareSlowdown": 0})


def test_the_same_seed_and_requests_give_the_same_run() -> None:
    model = served("--speculative-config", EAGLE3)
    plan = Workload(QpsSchedule.constant(8), Lengths.parse("lognormal:300,0.5"), Lengths.parse("100-300")).plan(
        30, seed=9)
    first, second = simulate(model, plan, seed=5), simulate(model, plan, seed=5)
    assert first == second
    assert simulate(model, plan, seed=6).accepted_tokens != first.accepted_tokens


def test_queueing_grows_with_load() -> None:
    model = served("--max-num-seqs", "8")
    light = simulate(model, Workload(QpsSchedule.constant(1), Lengths.parse("200"), Lengths.parse("200")).plan(60))
    heavy = simulate(model, Workload(QpsSchedule.constant(20), Lengths.parse("200"), Lengths.parse("200")).plan(60))
    assert light.mean("queue") < 0.01
    assert heavy.mean("queue") > 1.0 and heavy.mean("ttft") > 10 * light.mean("ttft")


def test_a_full_kv_cache_holds_requests_back_and_preempts_when_decodes_grow() -> None:
    tiny = replace(served(), kv_cache_tokens=4096)
    engine = Engine(tiny)
    for index in range(8):
        engine.add(SimRequest(f"r{index}", 0.0, 1000, 400), 0.0)
    step = engine.plan_step(0.0)
    assert step is not None
    assert len(engine.running) == 4 and len(engine.waiting) == 4     # 4 × 1001 tokens fit in 4096
    now = 0.0
    while engine.has_work:
        step = engine.plan_step(now)
        assert step is not None
        now += step.seconds
        engine.complete_step(step, now)
        assert engine.kv_used_blocks() <= engine.kv_capacity_blocks  # type: ignore[operator]
    assert engine.num_preemptions > 0


def test_an_aborted_request_leaves_the_batch() -> None:
    engine = Engine(served())
    request = SimRequest("r", 0.0, 100, 1000)
    engine.add(request, 0.0)
    step = engine.plan_step(0.0)
    assert step is not None
    engine.complete_step(step, step.seconds)
    engine.abort(request, step.seconds)
    assert request.finish_reason == "abort" and not engine.has_work
    assert engine.plan_step(step.seconds) is None


def test_temperature_lowers_acceptance_and_speed() -> None:
    model = served("--speculative-config", EAGLE3)
    greedy = simulate(model, burst(20, output=300, temperature=0.0), knobs=Knobs(acceptance=0.7))
    hot = simulate(model, burst(20, output=300, temperature=1.0), knobs=Knobs(acceptance=0.7))
    assert hot.acceptance_rate < greedy.acceptance_rate - 0.05
    assert hot.mean("tpot") > greedy.mean("tpot")
