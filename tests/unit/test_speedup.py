"""The speedup model: Leviathan's formulas, vLLM's acceptance rate, the roofline, and calibration against
published measurements (each with the tolerance it is held to and why)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from model_fixtures import (
    DEEPSEEK_V3,
    EAGLE1_8B,
    EAGLE3_8B,
    LLAMA_8B,
    LLAMA_70B,
    MIMO_7B,
    QWAMA_05B,
)

from specdeploy.api.spec import Method, SpeculativeDeploymentSpec
from specdeploy.planning.acceptance import (
    DEFAULT_ALPHA,
    MTP_REUSED_ALPHA,
    acceptance_rate_from_alpha,
    alpha_from_acceptance_length,
    alpha_from_acceptance_rate,
    default_alpha,
    draft_size_alpha,
    expected_tokens_per_step,
)
from specdeploy.planning.catalog import lookup
from specdeploy.planning.gpus import GPU_PRODUCTS, find_gpu
from specdeploy.planning.roofline import ForwardCost, decode_step_seconds, forward_seconds, model_forward_cost
from specdeploy.planning.schedule import schedule_cost, speculation_schedule
from specdeploy.planning.speedup import (
    K_MAX,
    SpeculationCost,
    best_k,
    context_tokens_for,
    estimate_speedup,
    speculation_breakeven_batch_size,
    speculation_cost,
    speedup,
    verify_tokens_for,
)

H100 = GPU_PRODUCTS["H100-80GB"]
H200 = GPU_PRODUCTS["H200"]
alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
ks = st.integers(min_value=1, max_value=K_MAX)


def make_spec(model: str, method: str, draft: str | None, k: int, *, tp: int = 1, max_num_seqs: int = 256,
              gpu: str = "H100-80GB", quantization: str = "none", **speculation: Any) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "model": {"name": model, "quantization": quantization},
        "speculation": {"method": method, "numSpeculativeTokens": k, **speculation},
        "resources": {"tensorParallelSize": tp, "gpu": {"product": gpu}},
        # 1,024 cached tokens per sequence, the measured table's context (planning.speedup.context_tokens_for).
        "serving": {"maxModelLen": 8192, "maxNumSeqs": max_num_seqs},
    }
    if draft is not None:
        document["speculation"]["draft"] = {"name": draft}
    return SpeculativeDeploymentSpec.model_validate(document)


# --- Leviathan et al. 2023 -------------------------------------------------------------------------------

def test_expected_tokens_per_step_matches_leviathan() -> None:
    assert expected_tokens_per_step(0.8, 5) == pytest.approx((1 - 0.8**6) / 0.2)   # 3.689
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0


def test_speedup_matches_leviathan() -> None:
    assert speedup(0.8, 5, 0.05) == pytest.approx((1 - 0.8**6) / (0.2 * 1.25))
    assert speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)   # nothing accepted: the draft is pure cost


def test_vllm_acceptance_rate_is_not_alpha() -> None:
    # accepted ÷ drafted = (E[tokens] − 1) / k: α 0.8 at k 5 shows as 0.538 in vLLM's metrics.
    assert acceptance_rate_from_alpha(0.8, 5) == pytest.approx(0.5379, abs=1e-4)
    assert acceptance_rate_from_alpha(0.8, 1) == pytest.approx(0.8)


def test_alpha_behind_published_acceptance_lengths() -> None:
    # vLLM issue #26191: EAGLE-3 on Llama-3.1-8B, k=7, mean acceptance length 3.53 → the eagle3 default.
    assert alpha_from_acceptance_length(3.53, 7) == pytest.approx(DEFAULT_ALPHA[Method.EAGLE3], abs=0.01)
    # nebius/MTP-DeepSeek-V3-0324: the original MTP module reused at K=7 reaches 3.20.
    assert alpha_from_acceptance_length(3.20, 7) == pytest.approx(MTP_REUSED_ALPHA, abs=0.01)


def test_inverse_refuses_impossible_measurements() -> None:
    with pytest.raises(ValueError, match="between 1 and 4"):
        alpha_from_acceptance_length(4.5, 3)
    with pytest.raises(ValueError, match="between 0 and 1"):
        alpha_from_acceptance_rate(1.2, 3)


def test_best_k_grows_with_alpha_and_shrinks_with_draft_cost() -> None:
    assert best_k(0.9, 0.02) > best_k(0.6, 0.02) > 1
    assert best_k(0.9, 0.5) < best_k(0.9, 0.02)
    assert best_k(0.2, 0.3) == 1


@given(alphas, alphas, ks, st.floats(min_value=0.0, max_value=2.0))
def test_speedup_increases_with_alpha(a: float, b: float, k: int, c: float) -> None:
    low, high = sorted((a, b))
    assert speedup(low, k, c) <= speedup(high, k, c) + 1e-12


@given(alphas, ks)
def test_tokens_per_step_lie_between_one_and_k_plus_one(alpha: float, k: int) -> None:
    assert 1.0 <= expected_tokens_per_step(alpha, k) <= k + 1 + 1e-9


@given(alphas, st.floats(min_value=0.0, max_value=2.0), st.integers(min_value=1, max_value=32))
def test_best_k_lies_in_range_and_is_within_one_percent_of_the_best(alpha: float, c: float, k_max: int) -> None:
    chosen = best_k(alpha, c, k_max)
    assert 1 <= chosen <= k_max
    assert speedup(alpha, chosen, c) >= 0.99 * max(speedup(alpha, k, c) for k in range(1, k_max + 1))


@given(st.floats(min_value=0.01, max_value=0.99), ks)
def test_alpha_round_trips_through_vllm_acceptance_rate(alpha: float, k: int) -> None:
    assert alpha_from_acceptance_rate(acceptance_rate_from_alpha(alpha, k), k) == pytest.approx(alpha, abs=1e-6)


# --- roofline --------------------------------------------------------------------------------------------

def test_llama_8b_decodes_158_tokens_per_second_on_one_h100() -> None:
    # SGLang docs (speculative decoding, performance highlights): 158.34 tok/s without speculation, 1xH100.
    assert 1 / decode_step_seconds(1, LLAMA_8B, H100, 1) == pytest.approx(158.34, rel=0.05)


def test_verifying_a_few_tokens_costs_about_one_step_but_many_cost_many() -> None:
    cost = model_forward_cost(LLAMA_8B)
    one = forward_seconds(cost, H100, batch=1)
    assert forward_seconds(cost, H100, batch=1, tokens_per_sequence=6) == pytest.approx(one, rel=0.01)
    big = forward_seconds(cost, H100, batch=512, context_tokens=128)
    assert forward_seconds(cost, H100, batch=512, tokens_per_sequence=4, context_tokens=128) > 3 * big


def test_a_long_context_makes_verifying_cheaper_but_not_free() -> None:
    # Each sequence's KV cache is read once for all its new tokens, so the longer the context, the smaller the
    # share of a verify pass its extra tokens add. But the GEMMs and attention are separate kernels: at 512
    # sequences the GEMMs of 4 tokens each are compute-bound whatever the context, and add their time to the KV
    # read (measured: tests/data/h100-step-times.json, Llama-3.1-8B at batch 256 with 5 tokens ≈ GEMMs + KV).
    cost = model_forward_cost(LLAMA_8B)

    def verify_over_decode(context: int) -> float:
        return (forward_seconds(cost, H100, batch=512, tokens_per_sequence=4, context_tokens=context)
                / forward_seconds(cost, H100, batch=512, context_tokens=context))

    assert verify_over_decode(4096) < verify_over_decode(1024) < verify_over_decode(128)
    assert 1.2 < verify_over_decode(4096) < 1.6


def test_tensor_parallel_splits_weights_and_adds_all_reduces() -> None:
    tp1 = model_forward_cost(LLAMA_70B, tensor_parallel_size=1)
    tp4 = model_forward_cost(LLAMA_70B, tensor_parallel_size=4)
    assert tp4.dense_weight_bytes == pytest.approx(tp1.dense_weight_bytes / 4)
    assert forward_seconds(tp4, H100, batch=1) < forward_seconds(tp1, H100, batch=1) / 3


def test_moe_reads_only_the_experts_its_tokens_touch() -> None:
    cost = model_forward_cost(DEEPSEEK_V3, tensor_parallel_size=8)
    one = forward_seconds(cost, H200, batch=1)
    assert forward_seconds(cost, H200, batch=1, tokens_per_sequence=2) > 1.2 * one   # a second token's experts
    # At 256 sequences nearly every expert is read anyway: a second token per sequence adds little.
    assert forward_seconds(cost, H200, batch=256, tokens_per_sequence=2) < 1.1 * forward_seconds(cost, H200, batch=256)
    dense = model_forward_cost(LLAMA_8B)
    assert forward_seconds(dense, H100, batch=1, tokens_per_sequence=2) < 1.01 * forward_seconds(dense, H100, batch=1)


# --- calibration against published measurements ----------------------------------------------------------

BLOG_DRAFT_ALPHA = 0.56


def test_vllm_blog_draft_model_at_low_load() -> None:
    # vLLM blog 2024-10-17: 1.5x at QPS 1, Llama3-70B on 4xH100, draft turboderp/Qwama-0.5B-Instruct
    # (ShareGPT). k is not stated; 5 was vLLM's example value then. α 0.56 is what this model needs (fitted
    # once; a vocabulary-transplanted draft agrees less than a same-family one). Held to ±5%.
    cost = speculation_cost(make_spec(LLAMA_70B.name, "draft_model", QWAMA_05B.name, 5, tp=4),
                            LLAMA_70B, QWAMA_05B, H100)
    assert cost.speedup(1, BLOG_DRAFT_ALPHA, 5) == pytest.approx(1.5, rel=0.05)


def test_vllm_blog_draft_model_at_high_load() -> None:
    # Same blog: 1.4x slower at high QPS. Not fitted: with the α above, the model must cross 1 inside
    # vLLM's default 256 sequences and be at least 1.4x slower by then (the blog gives no batch size).
    cost = speculation_cost(make_spec(LLAMA_70B.name, "draft_model", QWAMA_05B.name, 5, tp=4),
                            LLAMA_70B, QWAMA_05B, H100)
    breakeven = speculation_breakeven_batch_size(cost, BLOG_DRAFT_ALPHA, 5, 256)
    assert breakeven is not None and 32 <= breakeven <= 128
    assert cost.speedup(256, BLOG_DRAFT_ALPHA, 5) <= 1 / 1.4


def test_vllm_blog_ngram_at_low_and_high_load() -> None:
    # Same blog: 2.8x at QPS 1 with n-grams on CNN/DailyMail, 1.8x slower at high QPS. α 0.7 (summaries
    # copy their article) gives 2.8x within ±6%. At 256 sequences the GPU time alone is slower, but far less
    # than the blog's 1.8x (0.85x; a measured TP-4 rank of the 70B verifies 5 tokens per sequence in 3.3x a
    # decode at batch 256, the model in 2.9x: tests/data/h100-step-times.json): what the blog measured
    # beyond that is not GPU time — V0's per-sequence n-gram proposer on the CPU, and long
    # CNN/DailyMail prefills sharing the steps — which this model does not hold.
    cost = speculation_cost(make_spec(LLAMA_70B.name, "ngram", None, 5, tp=4), LLAMA_70B, None, H100)
    assert cost.draft_cost_ratio() == 0.0
    assert cost.speedup(1, 0.7, 5) == pytest.approx(2.8, rel=0.06)
    assert 1 / 1.8 < cost.speedup(256, 0.7, 5) < 0.9


def test_eagle3_llama_8b_on_one_h100() -> None:
    # SGLang docs: 158.34 → 373.25 tok/s (2.36x) at batch 1 with EAGLE-3 (5 steps); EAGLE-3 paper: 1.38x
    # at batch 64 in SGLang. α from vLLM's measured chain acceptance (issue #26191), not from these.
    # MT-Bench turns are short: 512 cached tokens. Batch 1 within ±10%. Batch 64: the model is optimistic
    # near the compute ridge (and SGLang's batch-64 settings are not published), held to +25% / −5%.
    cost = speculation_cost(make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 5), LLAMA_8B, EAGLE3_8B, H100,
                            context_tokens=512)
    alpha = alpha_from_acceptance_length(3.53, 7)
    assert cost.speedup(1, alpha, 5) == pytest.approx(373.25 / 158.34, rel=0.10)
    at_64 = cost.speedup(64, alpha, 5)
    assert 1.38 * 0.95 <= at_64 <= 1.38 * 1.25
    assert at_64 < cost.speedup(1, alpha, 5)


def test_deepseek_v3_mtp_speeds_up_decoding_1_8x() -> None:
    # DeepSeek-V3 technical report §5.4.3: second-token acceptance 85-90% gives "1.8 times TPS". Served at
    # large batch on 8xH200 with FP8 weights; α = 0.875. Within ±10% at 128-256 sequences.
    cost = speculation_cost(make_spec(DEEPSEEK_V3.name, "mtp", None, 1, tp=8, gpu="H200", quantization="fp8"),
                            DEEPSEEK_V3, None, H200)
    for batch in (128, 256):
        assert cost.speedup(batch, 0.875, 1) == pytest.approx(1.8, rel=0.10)


# --- breakeven -------------------------------------------------------------------------------------------

def test_breakeven_is_the_first_batch_that_loses() -> None:
    cost = speculation_cost(make_spec(LLAMA_70B.name, "draft_model", LLAMA_8B.name, 3, tp=2),
                            LLAMA_70B, LLAMA_8B, H100)
    breakeven = speculation_breakeven_batch_size(cost, 0.6, 3, 1024)
    assert breakeven is not None
    assert cost.speedup(breakeven, 0.6, 3) < 1 <= cost.speedup(breakeven - 1, 0.6, 3)
    assert speculation_breakeven_batch_size(cost, 0.6, 3, breakeven - 1) is None


draft_factors = st.floats(min_value=0.05, max_value=20.0)


@given(draft_factors, draft_factors, st.floats(min_value=0.3, max_value=0.95), st.integers(min_value=1, max_value=8))
def test_a_more_expensive_draft_never_raises_the_breakeven(f1: float, f2: float, alpha: float, k: int) -> None:
    target = model_forward_cost(LLAMA_70B, tensor_parallel_size=2)
    draft = model_forward_cost(LLAMA_8B, tensor_parallel_size=2)
    cheap, dear = sorted((f1, f2))
    at_cheap = speculation_breakeven_batch_size(SpeculationCost(target, draft.scaled(cheap), H100), alpha, k, 2048)
    at_dear = speculation_breakeven_batch_size(SpeculationCost(target, draft.scaled(dear), H100), alpha, k, 2048)
    assert (at_dear or 4096) <= (at_cheap or 4096)


@given(st.floats(min_value=0.3, max_value=0.95), st.integers(min_value=1, max_value=8), draft_factors)
def test_breakeven_found_by_grid_and_bisection_is_exact_for_dense_models(alpha: float, k: int, factor: float) -> None:
    cost = SpeculationCost(model_forward_cost(LLAMA_8B), model_forward_cost(LLAMA_8B).scaled(factor / 20), H100)
    breakeven = speculation_breakeven_batch_size(cost, alpha, k, 1024)
    assume(breakeven is not None)
    assert breakeven is not None
    assert cost.speedup(breakeven, alpha, k) < 1
    assert breakeven == 1 or cost.speedup(breakeven - 1, alpha, k) >= 1


@given(alphas, st.integers(min_value=1, max_value=8))
def test_speedup_at_batch_one_grows_with_alpha(alpha: float, k: int) -> None:
    cost = SpeculationCost(model_forward_cost(LLAMA_70B, tensor_parallel_size=2),
                           model_forward_cost(LLAMA_8B, tensor_parallel_size=2), H100)
    assert cost.speedup(1, alpha, k) <= cost.speedup(1, min(1.0, alpha + 0.05), k) + 1e-12


def test_free_drafter_costs_nothing_per_pass() -> None:
    cost = SpeculationCost(model_forward_cost(LLAMA_8B), None, H100)
    assert cost.draft_pass_seconds(64) == 0.0
    assert cost.speculative_step_seconds(1, 5) == pytest.approx(cost.baseline_step_seconds(1), rel=0.01)


def test_forward_cost_scaling_scales_bytes_and_flops_only() -> None:
    cost = ForwardCost(dense_weight_bytes=10.0, flops_per_token=4.0, kv_bytes_per_token=2.0, layers=3)
    double = cost.scaled(2.0)
    assert (double.dense_weight_bytes, double.flops_per_token, double.kv_bytes_per_token, double.layers) == (20, 8, 2, 3)


# --- estimate_speedup ------------------------------------------------------------------------------------

def test_estimate_for_eagle3_uses_the_default_and_says_so() -> None:
    spec = make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3)
    estimate = estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, H100)
    assert estimate.alpha == DEFAULT_ALPHA[Method.EAGLE3]
    assert not estimate.acceptance_rate_measured
    assert estimate.assumed_acceptance_rate == pytest.approx(acceptance_rate_from_alpha(0.75, 3))
    assert estimate.expected_tokens_per_step == pytest.approx(expected_tokens_per_step(0.75, 3))
    assert 1.8 < estimate.speedup_at_batch_1 < 2.6
    assert 0.02 < estimate.draft_cost_ratio < 0.2


def test_estimate_from_a_measured_vllm_acceptance_rate() -> None:
    spec = make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3)
    low = estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, H100, acceptance_rate=0.2)
    high = estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, H100, acceptance_rate=0.7)
    assert low.acceptance_rate_measured and low.assumed_acceptance_rate == 0.2
    assert low.alpha == pytest.approx(alpha_from_acceptance_rate(0.2, 3))
    assert low.speedup_at_batch_1 < high.speedup_at_batch_1
    assert (low.breakeven_batch_size or 10**6) <= (high.breakeven_batch_size or 10**6)


def test_quantised_target_lowers_the_assumed_alpha_int4_more_than_fp8() -> None:
    alphas_by_quantization = {
        q: estimate_speedup(make_spec(LLAMA_70B.name, "draft_model", LLAMA_8B.name, 3, tp=2, quantization=q),
                            LLAMA_70B, LLAMA_8B, H100).alpha
        for q in ("none", "fp8", "awq")
    }
    assert alphas_by_quantization["none"] > alphas_by_quantization["fp8"] > alphas_by_quantization["awq"]


def test_mtp_defaults_follow_the_reused_layer() -> None:
    assert default_alpha(Method.MTP, 1) == DEFAULT_ALPHA[Method.MTP]
    assert default_alpha(Method.MTP, 3) == MTP_REUSED_ALPHA
    assert default_alpha(Method.MTP, 3, mtp_layers=3) == DEFAULT_ALPHA[Method.MTP]
    estimate = estimate_speedup(make_spec(MIMO_7B.name, "mtp", None, 1), MIMO_7B, None, H100)
    assert estimate.speedup_at_batch_1 > 1.3


def test_eagle1_head_reads_the_targets_lm_head() -> None:
    eagle1 = speculation_cost(make_spec(LLAMA_8B.name, "eagle", EAGLE1_8B.name, 3), LLAMA_8B, EAGLE1_8B, H100)
    eagle3 = speculation_cost(make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3), LLAMA_8B, EAGLE3_8B, H100)
    assert eagle1.draft_cost_ratio() > eagle3.draft_cost_ratio()


def test_ngram_drafts_for_free_and_stops_paying_when_compute_bound() -> None:
    estimate = estimate_speedup(make_spec(LLAMA_8B.name, "ngram", None, 3, max_num_seqs=4096), LLAMA_8B, None, H100)
    assert estimate.draft_cost_ratio == 0.0
    assert estimate.breakeven_batch_size is not None
    assert estimate.speedup_at_max_batch < 1


def test_small_max_num_seqs_means_speculation_always_pays() -> None:
    estimate = estimate_speedup(make_spec(LLAMA_70B.name, "draft_model", LLAMA_8B.name, 3, tp=2, max_num_seqs=8),
                                LLAMA_70B, LLAMA_8B, H100)
    assert estimate.breakeven_batch_size is None
    assert estimate.speedup_at_max_batch > 1


def test_unknown_gpu_uses_the_reference_gpu_and_names_it() -> None:
    spec = make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3)
    assert estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, None) == estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, H100)
    assert estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, None).gpu == "H100-80GB"
    assert estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, find_gpu("L4")).speedup_at_batch_1 > 1


def test_to_wire_is_camel_case_json() -> None:
    wire = estimate_speedup(make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3), LLAMA_8B, EAGLE3_8B, H100).to_wire()
    assert set(wire) == {
        "method", "k", "assumedAcceptanceRate", "acceptanceRateSource", "alpha", "expectedTokensPerStep",
        "draftCostRatio", "speedupAtBatch1", "speedupAtMaxBatch", "maxBatchSize", "breakevenBatchSize",
        "bestK", "gpu", "contextTokens", "verifiedTokensPerSequence",
    }
    assert wire["method"] == "eagle3" and wire["k"] == 3 and wire["acceptanceRateSource"] == "assumed"
    assert wire["alpha"] == 0.75 and isinstance(wire["speedupAtBatch1"], float)


# --- what the model is asked (issue 28 point 5) -----------------------------------------------------------

def test_a_smaller_draft_is_assumed_to_agree_less_often() -> None:
    # Leviathan et al. 2023 Table 3's slope: α falls ~0.025 per doubling of target ÷ draft parameters.
    target = lookup("meta-llama/Llama-3.1-70B-Instruct")
    assert target is not None
    alphas = []
    for name in ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", LLAMA_8B.name):
        draft = lookup(name)
        assert draft is not None
        alphas.append(estimate_speedup(make_spec(target.name, "draft_model", name, 3, tp=4), target, draft, H100).alpha)
    assert alphas[0] < alphas[1] < alphas[2] == pytest.approx(DEFAULT_ALPHA[Method.DRAFT_MODEL], abs=0.002)
    assert alphas[0] == pytest.approx(draft_size_alpha(70.6 / 1.24), abs=0.002) and alphas[0] < 0.55


def test_the_schedule_assumes_the_same_prior_as_the_estimate() -> None:
    target, draft = lookup("meta-llama/Llama-3.1-70B-Instruct"), lookup("meta-llama/Llama-3.2-1B-Instruct")
    assert target is not None and draft is not None
    spec = make_spec(target.name, "draft_model", draft.name, 3, tp=4)
    estimate = estimate_speedup(spec, target, draft, H100)
    schedule = speculation_schedule(spec, target, schedule_cost(spec, target, draft, H100))
    assert schedule.ranges[0].speedup_at_min_batch == pytest.approx(estimate.speedup_at_batch_1, rel=1e-9)


def test_a_checkpoint_quantised_from_another_model_lowers_the_prior_as_the_spec_quantisation_does() -> None:
    awq = lookup("casperhansen/llama-3.3-70b-instruct-awq")
    head = lookup("yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
    assert awq is not None and head is not None and awq.stored_quantization is not None
    stored = estimate_speedup(make_spec(awq.name, "eagle3", head.name, 3, tp=4), awq, head, H100)
    base = lookup("meta-llama/Llama-3.3-70B-Instruct")
    assert base is not None
    written = estimate_speedup(make_spec(base.name, "eagle3", head.name, 3, tp=4, quantization="awq"), base, head, H100)
    assert stored.alpha == pytest.approx(written.alpha) == pytest.approx(0.75 * 0.93)
    assert stored.speedup_at_batch_1 == pytest.approx(written.speedup_at_batch_1, rel=1e-6), "priced at 4-bit weights too"


@pytest.mark.parametrize(("max_model_len", "context"), [(4096, 512), (8192, 1024), (32768, 2048), (None, 2048)])
def test_the_context_is_the_sds(max_model_len: int | None, context: int) -> None:
    spec = make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3)
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"max_model_len": max_model_len})})
    assert context_tokens_for(spec, LLAMA_8B) == context
    assert estimate_speedup(spec, LLAMA_8B, EAGLE3_8B, H100).context_tokens == context
    measured = schedule_cost(spec, LLAMA_8B, EAGLE3_8B, H100, context_tokens=6000)
    assert measured.context_tokens == 6000, "the pods' measured mean context replaces the assumption"


def test_a_tensorrt_llm_tree_verifies_its_total_draft_tokens() -> None:
    chain = make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3)
    assert verify_tokens_for(chain) is None
    for extra, tokens in (({"max_total_draft_tokens": 12}, 13), ({"eagle_choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}, 6)):
        spec = SpeculativeDeploymentSpec.model_validate({
            **chain.to_wire(), "engine": {"kind": "trtllm"},
            "speculation": {**chain.speculation.to_wire(), "extraConfig": extra}})
        assert verify_tokens_for(spec) == tokens


def test_draft_tokens_are_refused_for_a_chain() -> None:
    with pytest.raises(ValueError, match="numDraftTokens"):
        make_spec(LLAMA_8B.name, "eagle3", EAGLE3_8B.name, 3, numDraftTokens=16)
