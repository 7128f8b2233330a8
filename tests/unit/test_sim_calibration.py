"""Calibration (issue 5, item 6): the simulator's defaults reproduce published behaviour.

Each test runs the engine core on a virtual clock (no sockets) with the command line the engine ran, and
holds the result to the stated tolerance. Where a publication gives no acceptance rate, the rate is fitted
once and says so; everything else (step times, scheduling, KV cache) is the simulator's default. The
model behind them is in docs/simulator.md.
"""

from __future__ import annotations

import json

import pytest

from specdeploy.planning.acceptance import acceptance_rate_from_alpha, alpha_from_acceptance_length
from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, TemperatureMix, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.virtual import SimulationResult, simulate


def served(argv: list[str], gpu: str) -> ServedModel:
    product = find_gpu(gpu)
    assert product is not None
    return served_model(parse_engine_argv(argv, gpu=product), product)


def with_speculation(argv: list[str], config: dict[str, object]) -> list[str]:
    return [*argv, "--speculative-config", json.dumps(config)]


# --- SGLang docs: EAGLE-3 on Llama-3.1-8B, one H100, batch 1 ---------------------------------------------

def test_eagle3_llama_8b_on_one_h100_at_batch_1() -> None:
    # SGLang docs (speculative decoding, performance highlights, MT-Bench, 1xH100): 158.34 tok/s without
    # speculation, 373.25 with EAGLE-3 (5 steps). Acceptance: vLLM issue #26191's mean acceptance length 3.53
    # at k=7 for the same head (α ≈ 0.745), not fitted to these numbers. One request at a time, MT-Bench-
    # sized prompts. Held to ±5% (baseline) and ±10% (EAGLE-3).
    llama = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    eagle = with_speculation(llama, {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                     "num_speculative_tokens": 5})
    rate = acceptance_rate_from_alpha(alpha_from_acceptance_length(3.53, 7), 5)
    plan = Workload(QpsSchedule.constant(0.05), Lengths.parse("400"), Lengths.parse("256")).plan(600, seed=1)
    plain = simulate(served(llama, "H100-80GB"), plan)
    fast = simulate(served(eagle, "H100-80GB"), plan, knobs=Knobs(acceptance=rate))
    assert 1 / plain.mean("tpot") == pytest.approx(158.34, rel=0.05)
    assert 1 / fast.mean("tpot") == pytest.approx(373.25, rel=0.10)


# --- vLLM blog 2024-10-17: Llama3-70B on 4xH100 ----------------------------------------------------------

LLAMA_70B_TP4 = ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct", "-tp", "4", "--max-model-len", "8192",
                 "--max-num-seqs", "256"]   # vLLM 0.6's default of 256 sequences, when the blog was measured
# ShareGPT conversations (the blog's draft-model workload): about 220 prompt and 200 output tokens on
# average, heavy-tailed. CNN/DailyMail (the n-gram workload): ~1000-token articles, ~100-token summaries.
SHAREGPT = (Lengths.parse("lognormal:220,1.0,4,4096"), Lengths.parse("lognormal:200,0.9,4,2048"))
CNN_DAILYMAIL = (Lengths.parse("normal:1000,300,200,3000"), Lengths.parse("normal:100,30,20,300"))
# The blog's draft, turboderp/Qwama-0.5B-Instruct, is not in the catalog: the simulator times it as the
# catalog's nearest size (Qwen2.5-0.5B, the same body with a larger vocabulary). k is not stated; 5 was
# vLLM's example value then. α 0.56 (draft model) and 0.7 (n-gram on summaries) are the values
# tests/unit/test_speedup.py fitted to the same blog at batch 1; no new fitting here.
QWAMA = {"method": "draft_model", "model": "turboderp/Qwama-0.5B-Instruct", "num_speculative_tokens": 5}
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
QWAMA_ALPHA = 0.56


def latency_ratio(speculative: dict[str, object], alpha: float, lengths: tuple[Lengths, Lengths],
                  qps: float) -> float:
    """Mean request latency without speculation ÷ with it (above 1: speculation is faster)."""
    plan = Workload(QpsSchedule.constant(qps), *lengths).plan(200, seed=2)
    base = simulate(served(LLAMA_70B_TP4, "H100-80GB"), plan, seed=2)
    spec = simulate(served(with_speculation(LLAMA_70B_TP4, speculative), "H100-80GB"), plan, seed=2,
                    knobs=Knobs(acceptance=acceptance_rate_from_alpha(alpha, 5)))
    assert base.unfinished == 0 and spec.unfinished == 0
    return base.mean("e2e") / spec.mean("e2e")


def test_vllm_blog_draft_model_is_1_5x_faster_at_qps_1() -> None:
    # "up to 1.5x Speedup at QPS=1 Llama3-70B on ShareGPT with 4xH100" (draft Qwama-0.5B). ±10%.
    assert latency_ratio(QWAMA, QWAMA_ALPHA, SHAREGPT, 1) == pytest.approx(1.5, rel=0.10)


def test_vllm_blog_draft_model_is_1_4x_slower_at_high_qps() -> None:
    # "At high QPS, we see 1.4x slowdown" (ShareGPT). The blog gives no QPS: the test asks that speculation
    # still pays at moderate load (QPS 8) and that some higher load up to QPS 18 makes it at least 1.4x
    # slower (the simulator: 1.52x faster at QPS 1, 1.43x at 8, 1.10x slower at 14, 1.96x at 16, 3.0x at 17,
    # 4.2x at 18, as the speculative engine saturates first).
    assert latency_ratio(QWAMA, QWAMA_ALPHA, SHAREGPT, 8) > 1.2
    assert any(latency_ratio(QWAMA, QWAMA_ALPHA, SHAREGPT, qps) <= 1 / 1.4 for qps in (14, 16, 18))


def test_vllm_blog_ngram_is_2_8x_faster_at_qps_1_and_slower_at_high_qps() -> None:
    # "up to 2.8x Speedup at QPS=1 Llama3-70B on CNN Dailymail with 4xH100 using n-grams" and "1.8x slowdown"
    # at high QPS. ±10% at QPS 1 (prefill of the ~1000-token articles, which speculation does not speed up,
    # is part of each request's latency). At high QPS the step times give a slowdown, but not the blog's
    # 1.8x: the GPU time of verifying 6 tokens per sequence is not that much (tests/unit/test_speedup.py), and
    # what the blog measured beyond it (V0's n-gram proposer on the CPU) is not simulated. Held to: slower
    # (≤ 0.9) somewhere between QPS 12 and 16, never 1.8x (the simulator: 2.59x faster at QPS 1, 1.22x at
    # 10, 1.32x slower at 12, 1.23x at 14, 1.20x at 16; beyond that both engines are bound by prefill).
    assert latency_ratio(NGRAM, 0.7, CNN_DAILYMAIL, 1) == pytest.approx(2.8, rel=0.10)
    at_load = [latency_ratio(NGRAM, 0.7, CNN_DAILYMAIL, qps) for qps in (12, 14, 16)]
    assert min(at_load) <= 0.9 and min(at_load) > 1 / 1.8


# --- llm-d's speculative decoding guide: EAGLE-3 on Qwen3-32B, 2xH200 ------------------------------------

def test_llm_d_eagle3_stops_paying_between_4_and_8_qps() -> None:
    # llm-d/llm-d guides/spec-decoding/benchmark-results/vllm-qwen3-32b-eagle3 (PR #2074): Qwen3-32B with
    # RedHatAI/Qwen3-32B-speculator.eagle3 (k=3), vLLM defaults, TP=2 on 2xH200; a 1 → 2 → 4 → 8 → 16 QPS
    # ladder of 120 s stages; random-token prompts ~2048 (normal, σ 1024, 10-4096), outputs ~256 (σ 128,
    # 10-512). Published: TPOT p50 −27/−22/−13% at 1/2/4 QPS, then both saturate and the baseline delivers
    # more output tokens (−13% at 8 QPS) with a lower TTFT. "Crossover QPS: ~4-8".
    # The guide publishes no acceptance rate: 0.175 (accepted ÷ drafted, random-token prompts) is fitted once
    # so that TPOT falls 27% at 1 QPS. Everything after that is the simulator's.
    qwen = ["vllm", "serve", "Qwen/Qwen3-32B", "--tensor-parallel-size=2"]
    eagle = with_speculation(qwen, {"model": "RedHatAI/Qwen3-32B-speculator.eagle3", "method": "eagle3",
                                    "num_speculative_tokens": 3})
    ladder = QpsSchedule.parse("0-120:1,120-240:2,240-360:4,360-480:8,480-600:16")
    plan = Workload(ladder, Lengths.parse("normal:2048,1024,10,4096"),
                    Lengths.parse("normal:256,128,10,512")).plan(600, seed=3)
    base = simulate(served(qwen, "H200"), plan, seed=3, horizon=900)
    spec = simulate(served(eagle, "H200"), plan, seed=3, horizon=900, knobs=Knobs(acceptance=0.175))

    def stage(result: SimulationResult, qps: int) -> tuple[float, float, float]:
        start = {1: 0, 2: 120, 4: 240, 8: 360, 16: 480}[qps]
        return (result.percentile("tpot", 50, start, start + 120),
                result.output_tokens_per_second(start, start + 120),
                result.percentile("ttft", 50, start, start + 120))

    base_1, spec_1 = stage(base, 1), stage(spec, 1)
    assert 1 - spec_1[0] / base_1[0] == pytest.approx(0.27, abs=0.03)        # the fitted point
    for qps in (1, 2, 4):                    # pays: lower per-token latency, no throughput lost
        (base_tpot, base_rate, _), (spec_tpot, spec_rate, _) = stage(base, qps), stage(spec, qps)
        assert spec_tpot < 0.92 * base_tpot
        assert spec_rate >= 0.97 * base_rate
    for qps in (8, 16):                      # stops paying: less throughput, longer waits for the first token
        (_, base_rate, base_ttft), (_, spec_rate, spec_ttft) = stage(base, qps), stage(spec, qps)
        assert spec_rate < 0.95 * base_rate
        assert spec_ttft > base_ttft


# --- temperature -----------------------------------------------------------------------------------------

def test_acceptance_falls_as_temperature_rises() -> None:
    # Sampling at a higher temperature makes the target's choice harder to guess: the acceptance the
    # engine reports falls, and tokens per step with it (docs/simulator.md gives the assumed size).
    eagle = served(with_speculation(["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                                    {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                     "num_speculative_tokens": 4}), "H100-80GB")
    rates = []
    for temperature in ("0", "0.5", "1.0", "1.5"):
        plan = Workload(QpsSchedule.constant(2), Lengths.parse("200"), Lengths.parse("200"),
                        TemperatureMix.parse(temperature)).plan(120, seed=4)
        rates.append(simulate(eagle, plan, seed=4).acceptance_rate)
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)
    assert rates[0] == pytest.approx(eagle.default_acceptance_rate, abs=0.02)
    assert rates[2] < 0.9 * rates[0]
