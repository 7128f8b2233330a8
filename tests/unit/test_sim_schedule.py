"""k schedules in the simulator: vLLM's k by batch size, TensorRT-LLM's draft length by batch size and
max_concurrency, SGLang's adaptive tiers; read from the engines' flags, refused as the engines refuse them,
followed step by step on the virtual clock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from simulated import simulator_on_loopback

from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen.workload import Lengths, PlannedRequest, QpsSchedule, Workload
from specdeploy_engine.sim.argv import EngineArgvError, parse_engine_argv
from specdeploy_engine.sim.engine import Engine, SimRequest
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.metrics import engine_metrics
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.schedule import (
    AdaptiveTiers,
    SglangAdaptiveSchedule,
    k_at,
    next_tier,
    trtllm_k_steps,
    vllm_k_steps,
)
from specdeploy_engine.sim.virtual import SimulationResult, simulate

H100 = find_gpu("H100-80GB")
assert H100 is not None
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_HEAD = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def vllm_spec(**extra: object) -> str:
    return json.dumps({"method": "eagle3", "model": EAGLE3_HEAD, "num_speculative_tokens": 3, **extra})


def vllm(*args: str) -> ServedModel:
    assert H100 is not None
    return served_model(parse_engine_argv(["vllm", "serve", LLAMA_8B, *args], gpu=H100), H100)


def refusal(argv: list[str], config_dir: Path | None = None) -> EngineArgvError:
    with pytest.raises(EngineArgvError) as caught:
        parse_engine_argv(argv, config_dir=config_dir, gpu=H100)
    return caught.value


def burst(count: int, prompt: int = 64, output: int = 40) -> list[PlannedRequest]:
    return [PlannedRequest(0.0, prompt, output, 0.0) for _ in range(count)]


# --- vLLM ---------------------------------------------------------------------------------------------------

def test_vllm_table_reads_as_steps_with_gaps_and_the_tail_carrying_the_previous_k() -> None:
    steps = vllm_k_steps([[9, 64, 1], [1, 4, 3], [65, 128, 0]])
    assert steps == ((1, 3), (9, 1), (65, 0))
    assert [k_at(steps, batch, 3) for batch in (1, 4, 5, 8, 9, 64, 65, 128, 5000)] == [3, 3, 3, 3, 1, 1, 0, 0, 0]
    assert k_at(vllm_k_steps([[1, 8, 5]]), 2, 3) == 3          # clamped to num_speculative_tokens, not refused


@pytest.mark.parametrize(("table", "message"), [
    ([[1, 8, 3], [8, 16, 1]], "Batch-size ranges must be non-overlapping and sorted."),
    ([[1, 8, 3], [20, 16, 1]], "Batch-size range start must be <= end for (20, 16, 1)."),
    ([[2, 8, 3]], "The first batch-size range must start at 1"),
    ([[1, 8, -1]], "num_speculative_tokens_per_batch_size values must be >= 0."),
    ([[0, 8, 1]], "Batch-size range (0, 8) must be positive."),
    ([], "num_speculative_tokens_per_batch_size must not be empty."),
    ([[1, 8]], "Each num_speculative_tokens_per_batch_size entry must be a 3-item sequence"),
    ({"1-16": 3}, "Input should be a valid list"),
    ([[1, "8", 3]], "Input should be a valid integer"),
])
def test_vllm_refuses_a_bad_table_at_start_up(table: object, message: str) -> None:
    error = refusal(["vllm", "serve", LLAMA_8B, "--speculative-config",
                     vllm_spec(num_speculative_tokens_per_batch_size=table)])
    assert error.exit_code == 1 and message in error.stderr and error.stderr.startswith("Traceback")


def test_vllm_drops_the_table_with_data_parallelism_as_vllm_warns() -> None:
    served = vllm("--data-parallel-size", "2", "--speculative-config",
                  vllm_spec(num_speculative_tokens_per_batch_size=[[1, 4, 3], [5, 1024, 0]]))
    assert served.config.speculation is not None and served.config.speculation.k_steps == ()
    assert any("Disabling num_speculative_tokens_per_batch_size" in note for note in served.notes)


def test_vllm_verifies_in_each_step_what_the_previous_step_drafted_for_its_batch_size() -> None:
    served = vllm("--speculative-config", vllm_spec(num_speculative_tokens_per_batch_size=[[1, 2, 3], [3, 1024, 0]]))
    engine = Engine(served, seed=1)
    for index in range(4):
        engine.add(SimRequest(f"r{index}", 0.0, 64, 40), 0.0)
    first = engine.plan_step(0.0)
    assert first is not None and first.draft_k == 0                    # four requests scheduled: K = 0
    assert first.shape.drafting_seqs == 4 and first.shape.draft_passes == 0
    engine.complete_step(first, first.seconds)
    second = engine.plan_step(first.seconds)
    assert second is not None and second.verify_k == 0 and second.shape.verify_tokens == 1
    engine.complete_step(second, first.seconds + second.seconds)
    engine.abort(engine.running[0], 0.0)
    engine.abort(engine.running[0], 0.0)
    third = engine.plan_step(1.0)                                       # two left: K = 3 again
    assert third is not None and third.verify_k == 0 and third.draft_k == 3
    engine.complete_step(third, 1.1)
    fourth = engine.plan_step(1.1)
    assert fourth is not None and fourth.verify_k == 3 and fourth.shape.verify_tokens == 4
    assert engine.schedule.k_now == 3


def test_vllm_counters_stop_at_k_zero_and_positions_move_only_where_drafted() -> None:
    served = vllm("--speculative-config", vllm_spec(num_speculative_tokens_per_batch_size=[[1, 4, 2], [5, 1024, 0]]))
    metrics = engine_metrics(served)
    wide = simulate(served, burst(16, output=30), seed=3, observer=metrics, knobs=Knobs(acceptance=1.0))
    assert wide.drafted_tokens == 0 and wide.accepted_tokens == 0
    text = metrics.render()
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0' in text
    narrow = simulate(served, burst(2, output=30), seed=3, observer=metrics, knobs=Knobs(acceptance=1.0))
    assert narrow.drafted_tokens > 0 and narrow.acceptance_rate == 1.0
    text = metrics.render()
    accepted = {position: _sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position)
                for position in ("0", "1", "2")}
    assert accepted["0"] == accepted["1"] > 0 and accepted["2"] == 0    # k 2 of 3: position 2 never drafted


def _sample(text: str, name: str, position: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'position="{position}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for position {position}")


def test_a_vllm_step_that_drafts_nothing_costs_the_zero_draft_overhead_more_than_no_speculation() -> None:
    off = Engine(vllm())
    zero = Engine(vllm("--speculative-config", vllm_spec(num_speculative_tokens_per_batch_size=[[1, 1024, 0]])))
    for engine in (off, zero):
        for index in range(32):
            engine.add(SimRequest(f"r{index}", 0.0, 200, 50), 0.0)
    for _ in range(3):
        plain, drafting_nothing = off.plan_step(0.0), zero.plan_step(0.0)
        assert plain is not None and drafting_nothing is not None
        assert drafting_nothing.seconds == pytest.approx(plain.seconds * (1 + Knobs().zero_draft_overhead))
        off.complete_step(plain, plain.seconds)
        zero.complete_step(drafting_nothing, drafting_nothing.seconds)
    zero.knobs.update({"zeroDraftOverhead": 0.0})
    plain, drafting_nothing = off.plan_step(1.0), zero.plan_step(1.0)
    assert plain is not None and drafting_nothing is not None
    assert drafting_nothing.seconds == pytest.approx(plain.seconds)


# The check the simulated-day comparison relies on: QPS 1 → 24 → 1 on the virtual clock, with an acceptance
# low enough that speculating at k = 3 costs more than it gives once batches are large.
DAY = "0-40s:1,40-100s:24,100-140s:1"
HIGH = (60.0, 100.0)               # arrivals in the busy phase once its batches have grown
LOW = (110.0, 140.0)


def _day(*args: str, zero_draft_overhead: float = Knobs().zero_draft_overhead) -> SimulationResult:
    workload = Workload(qps=QpsSchedule.parse(DAY), prompt=Lengths.parse("500"), output=Lengths.parse("300"))
    planned = workload.plan(duration=140.0, seed=1)
    knobs = Knobs(acceptance=0.15, zero_draft_overhead=zero_draft_overhead)
    return simulate(vllm("--max-num-seqs", "256", *args), planned, seed=1, knobs=knobs)


def test_over_a_day_a_k_zero_schedule_beats_always_on_and_trails_always_off_by_the_k_zero_cost() -> None:
    table = vllm_spec(num_speculative_tokens_per_batch_size=[[1, 16, 3], [17, 1024, 0]])
    off = _day()
    on = _day("--speculative-config", vllm_spec())
    scheduled = _day("--speculative-config", table)
    free = _day("--speculative-config", table, zero_draft_overhead=0.0)
    tpot = {name: result.mean("tpot", *HIGH) for name, result in
            (("off", off), ("on", on), ("scheduled", scheduled), ("free", free))}
    assert tpot["off"] < tpot["scheduled"] < tpot["on"]
    assert tpot["free"] == pytest.approx(tpot["off"], rel=0.05)         # the gap to off is the k = 0 cost
    assert scheduled.mean("tpot", *LOW) == pytest.approx(on.mean("tpot", *LOW), rel=0.05)
    assert scheduled.mean("tpot", *LOW) < off.mean("tpot", *LOW)


def test_the_real_time_server_follows_the_table_and_reports_the_k_in_use() -> None:
    argv = ["vllm", "serve", LLAMA_8B, "--speculative-config",
            vllm_spec(num_speculative_tokens_per_batch_size=[[1, 1, 3], [2, 1024, 0]])]

    async def main() -> None:
        async with simulator_on_loopback(argv) as base, httpx.AsyncClient(timeout=30) as client:
            body = {"model": LLAMA_8B, "prompt": "one two three", "max_tokens": 30, "temperature": 0}
            await asyncio.gather(*(client.post(base + "/v1/completions", json=body) for _ in range(4)))
            info = (await client.get(base + "/admin/info")).json()
            assert info["k"] == 3 and info["kInUse"] == 0           # the last steps ran four requests
            assert info["kSchedule"]["fromBatchSize"] == [[1, 3], [2, 0]]
            await client.post(base + "/v1/completions", json=body)
            assert (await client.get(base + "/admin/info")).json()["kInUse"] == 3
            knobs = (await client.post(base + "/admin/knobs", json={"zeroDraftOverhead": 0.3})).json()
            assert knobs["zeroDraftOverhead"] == 0.3
            assert (await client.get(base + "/server_info")).status_code == 404     # vLLM has none
    asyncio.run(main())


# --- TensorRT-LLM -------------------------------------------------------------------------------------------

def trtllm(tmp_path: Path, speculative: dict[str, object]) -> list[str]:
    config = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 4,
                                     "speculative_model": EAGLE3_HEAD, **speculative},
              "return_perf_metrics": True}
    (tmp_path / "trtllm.yaml").write_text(json.dumps(config))
    return ["trtllm-serve", LLAMA_8B, "--config", "/etc/specdeploy/trtllm.yaml"]


def test_trtllm_schedule_thresholds_as_documented() -> None:
    steps = trtllm_k_steps({8: 2, 4: 4, 32: 1}, 4)
    assert [k_at(steps, batch, 4) for batch in (1, 4, 5, 8, 9, 32, 33, 500)] == [4, 4, 2, 2, 1, 1, 0, 0]


def test_trtllm_reads_the_schedule_and_max_concurrency_from_its_config(tmp_path: Path) -> None:
    config = parse_engine_argv(trtllm(tmp_path, {"draft_len_schedule": {4: 4, 8: 2}}), config_dir=tmp_path)
    assert config.speculation is not None and config.speculation.k_steps == ((1, 4), (5, 2), (9, 0))
    config = parse_engine_argv(trtllm(tmp_path, {"max_concurrency": 6}), config_dir=tmp_path)
    assert config.speculation is not None and config.speculation.k_steps == ((1, 4), (7, 0))


@pytest.mark.parametrize(("speculative", "message"), [
    ({"draft_len_schedule": {1: 2, 8: 1}}, "draft_len_schedule[1] must equal max_draft_len"),
    ({"draft_len_schedule": {1: 4, 8: 5}}, "all draft lengths must be <= max_draft_len"),
    ({"draft_len_schedule": {0: 4}}, "batch size threshold must be >= 1, got 0"),
    ({"draft_len_schedule": {1: 4, 8: -1}}, "draft length must be >= 0, got -1"),
    ({"draft_len_schedule": {1: 4}, "max_concurrency": 8}, "max_concurrency and draft_len_schedule are mutually"),
    ({"max_concurrency": 0}, "Input should be greater than 0"),
])
def test_trtllm_refuses_a_bad_schedule(tmp_path: Path, speculative: dict[str, object], message: str) -> None:
    error = refusal(trtllm(tmp_path, speculative), tmp_path)
    assert error.exit_code == 1 and message in error.stderr and "Eagle3DecodingConfig" in error.stderr


def test_trtllm_turns_speculation_off_above_max_concurrency(tmp_path: Path) -> None:
    assert H100 is not None
    served = served_model(parse_engine_argv(trtllm(tmp_path, {"max_concurrency": 4}), config_dir=tmp_path), H100)
    metrics = engine_metrics(served)
    busy = simulate(served, burst(12), seed=2, observer=metrics)
    assert busy.drafted_tokens < 12 * 40 // 5        # speculation only once few requests are left
    quiet = simulate(served, burst(3), seed=2)
    assert quiet.drafted_tokens > 0 and quiet.drafted_tokens % 4 == 0
    text = metrics.render()
    drafted = [line for line in text.splitlines() if line.startswith("trtllm_spec_decode_drafted_tokens_total{")]
    assert len({line.rsplit(" ", 1)[1] for line in drafted}) == 1          # every drafted position moved alike


# --- SGLang -------------------------------------------------------------------------------------------------

def sglang(*args: str) -> list[str]:
    return ["python3", "-m", "sglang.launch_server", "--model-path", LLAMA_8B, "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", EAGLE3_HEAD, "--speculative-adaptive", *args]


def test_sglang_tier_rule_with_its_default_hysteresis() -> None:
    tiers = AdaptiveTiers(candidate_steps=(1, 3, 7), initial_steps=3)
    assert next_tier(tiers, 3, 0.25) == 1 and next_tier(tiers, 3, 0.26) == 3
    assert next_tier(tiers, 3, 2.5) == 3 and next_tier(tiers, 3, 2.51) == 7
    assert next_tier(tiers, 7, 0.2) == 1                                  # several tiers in one update


def test_sglang_moves_tiers_only_after_warmup_and_on_the_update_interval() -> None:
    schedule = SglangAdaptiveSchedule(7, AdaptiveTiers(candidate_steps=(1, 3, 7), initial_steps=3))
    for _ in range(14):
        schedule.observe([3, 3])
        assert schedule.tier == 3                  # batches 1-10 warm up, 11-14 wait for the interval
    schedule.observe([3, 3])
    assert schedule.tier == 7 and schedule.ema > 2.5
    schedule.observe([])                           # a batch without verifies counts for nothing
    assert schedule.batches == 15


def test_sglang_reads_the_adaptive_config_file(tmp_path: Path) -> None:
    (tmp_path / "adaptive.json").write_text(json.dumps({"candidate_steps": [1, 2, 4], "warmup_batches": 3}))
    config = parse_engine_argv(sglang("--speculative-adaptive-config", "/etc/specdeploy/adaptive.json"),
                               config_dir=tmp_path)
    speculation = config.speculation
    assert speculation is not None and speculation.adaptive is not None
    assert speculation.adaptive.candidate_steps == (1, 2, 4) and speculation.adaptive.initial_steps == 2
    assert speculation.adaptive.warmup_batches == 3 and speculation.adaptive.ema_alpha == 0.2
    assert speculation.num_speculative_tokens == 4 and speculation.verify_tokens == 5
    default = parse_engine_argv(sglang("--speculative-num-steps", "7")).speculation
    assert default is not None and default.adaptive is not None and default.adaptive.candidate_steps == (1, 3, 7)


def test_sglang_refuses_steps_outside_the_tiers_and_a_missing_config(tmp_path: Path) -> None:
    error = refusal(sglang("--speculative-num-steps", "5"))
    assert error.exit_code == 1 and "--speculative-num-steps=5 is not in the adaptive config candidate_steps" \
        in error.stderr
    error = refusal(sglang("--speculative-adaptive-config", "/etc/specdeploy/none.json"), tmp_path)
    assert "FileNotFoundError" in error.stderr


def test_sglang_falls_back_to_static_steps_where_adaptive_cannot_run() -> None:
    config = parse_engine_argv(sglang("--speculative-eagle-topk", "4", "--speculative-num-steps", "5",
                                      "--speculative-num-draft-tokens", "8"))
    assert config.speculation is not None and config.speculation.adaptive is None
    assert config.speculation.num_speculative_tokens == 5
    assert config.notes == ("speculative_adaptive disabled: speculative_eagle_topk=4 (only topk=1 is supported). "
                            "Falling back to static speculative params.",)


def test_sglang_server_info_reports_the_active_tier() -> None:
    async def main() -> None:
        async with simulator_on_loopback(sglang("--enable-metrics"), knobs=Knobs(acceptance=0.0)) as base, \
                httpx.AsyncClient(timeout=30) as client:
            info = (await client.get(base + "/server_info")).json()
            assert info["speculative_adaptive"] is True and info["speculative_num_steps"] == 3
            assert info["internal_states"][0]["speculative_num_steps"] == 3
            body = {"model": LLAMA_8B, "prompt": "one two three", "max_tokens": 200, "temperature": 0}
            await asyncio.gather(*(client.post(base + "/v1/completions", json=body) for _ in range(2)))
            state = (await client.get(base + "/server_info")).json()["internal_states"][0]
            assert state["speculative_num_steps"] == 1 and state["speculative_num_draft_tokens"] == 2
            assert state["avg_spec_accept_length"] == 1.0
    asyncio.run(main())


def test_sglang_drops_to_the_lowest_tier_when_nothing_is_accepted() -> None:
    assert H100 is not None
    served = served_model(parse_engine_argv(sglang("--enable-metrics")), H100)
    engine = Engine(served, seed=4, knobs=Knobs(acceptance=0.0))
    assert engine.schedule.k_now == 3
    for index in range(4):
        engine.add(SimRequest(f"r{index}", 0.0, 64, 200), 0.0)
    now, verified = 0.0, []
    while engine.has_work:
        step = engine.plan_step(now)
        assert step is not None
        now += step.seconds
        engine.complete_step(step, now)
        verified.append(step.verify_k)
    assert verified[1] == 3 and verified[-1] == 1 and engine.schedule.k_now == 1
