"""The memory plan against public facts and engine semantics: weights by quantisation, KV bytes per
token, vLLM's measured startup numbers, verdicts, the draft's cost and the suggestions on rejection."""

from __future__ import annotations

from typing import Any

import pytest

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import MemoryPlan, Severity, Suggestion, Verdict
from specdeploy.planning.budget import gpu_memory_gib
from specdeploy.planning.catalog import CATALOG, resolve_draft, resolve_target
from specdeploy.planning.kv import kv_cache_tokens
from specdeploy.planning.memory import plan_memory, trtllm_free_gpu_memory_fraction
from specdeploy.planning.overhead import CUDA_CONTEXT_BYTES
from specdeploy.planning.weights import embedding_parameters

GIB = 2**30
GB = 1e9
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def make_spec(
    model: str | dict[str, Any] = LLAMA_70B,
    speculation: dict[str, Any] | None = None,
    **sections: Any,
) -> SpeculativeDeploymentSpec:
    document: dict[str, Any] = {
        "model": {"name": model} if isinstance(model, str) else model,
        "speculation": speculation or {"method": "ngram"},
    }
    document.update(sections)
    return SpeculativeDeploymentSpec.model_validate(document)


def plan(spec: SpeculativeDeploymentSpec, speculate: bool = True) -> MemoryPlan:
    return plan_memory(spec, resolve_target(spec), resolve_draft(spec), speculate=speculate)


def codes(memory: MemoryPlan) -> list[str]:
    return [finding.code for finding in memory.reasons]


DRAFT_8B = {"method": "draft_model", "draft": {"name": LLAMA_8B}}


# --- the issue's public facts --------------------------------------------------------------------------


def test_llama_70b_bf16_is_about_140_gb_and_does_not_fit_an_80_gb_h100() -> None:
    memory = plan(make_spec(LLAMA_70B))
    assert memory.per_gpu.target_weights_gib * GIB / GB == pytest.approx(140, rel=0.02)
    assert memory.verdict == Verdict.REJECTED and not memory.fits
    assert codes(memory)[0] == "WeightsDoNotFit"


def test_llama_70b_int8_is_about_70_gb_and_fits_with_about_10_gb_left() -> None:
    spec = make_spec({"name": LLAMA_70B, "quantization": "int8"},
                     resources={"gpuMemoryUtilization": 0.95}, serving={"maxModelLen": 8192, "maxNumSeqs": 8})
    memory = plan(spec)
    weights_gb = memory.per_gpu.target_weights_gib * GIB / GB
    assert weights_gb == pytest.approx(70, rel=0.05)  # 1 byte per Linear weight, embeddings in bf16
    left = gpu_memory_gib(spec) - memory.per_gpu.target_weights_gib  # type: ignore[operator]
    assert 9 <= left <= 13
    assert memory.fits


def test_llama_70b_int4_is_about_35_gb_of_weights() -> None:
    memory = plan(make_spec({"name": LLAMA_70B, "quantization": "awq"}))
    int8 = plan(make_spec({"name": LLAMA_70B, "quantization": "int8"}))
    weights_gb = memory.per_gpu.target_weights_gib * GIB / GB
    # 35 GB of 4-bit weights, plus group scales and the 16-bit embedding and LM head (~40 GB total).
    assert 35 <= weights_gb <= 40
    assert memory.per_gpu.target_weights_gib / int8.per_gpu.target_weights_gib == pytest.approx(0.55, abs=0.03)


def test_an_8b_bf16_draft_adds_about_16_gb_that_comes_out_of_the_kv_cache() -> None:
    spec = make_spec({"name": LLAMA_70B, "quantization": "fp8"}, DRAFT_8B,
                     resources={"gpu": {"product": "B200"}}, serving={"maxModelLen": 32768})
    memory = plan(spec)
    assert memory.per_gpu.draft_weights_gib * GIB / GB == pytest.approx(16, rel=0.03)
    assert memory.draft_cost.kv_cache_gib >= memory.per_gpu.draft_weights_gib
    without = plan(spec, speculate=False)
    assert without.per_gpu.kv_cache_gib - memory.per_gpu.kv_cache_gib == pytest.approx(
        memory.draft_cost.kv_cache_gib, abs=0.002)
    assert memory.draft_cost.kv_cache_tokens == without.kv_cache_tokens - memory.kv_cache_tokens > 0
    assert memory.draft_cost.concurrent_sequences == pytest.approx(
        memory.draft_cost.kv_cache_tokens / 32768, abs=0.01)


@pytest.mark.parametrize(("model", "expected"), [
    (LLAMA_8B, 131_072), (LLAMA_70B, 327_680), ("Qwen/Qwen3-1.7B", 114_688),
])
def test_vllm_kv_bytes_per_token_bf16_tp1(model: str, expected: int) -> None:
    assert plan(make_spec(model)).kv_bytes_per_token == expected


MHA_6_7B = {  # Llama-2-7B's shape: the issue's 6.7B multi-head model, 12.55 GiB of bf16 weights
    "numLayers": 32, "hiddenSize": 4096, "intermediateSize": 11008, "numAttentionHeads": 32,
    "numKeyValueHeads": 32, "headDim": 128, "vocabSize": 32000, "numParameters": 6_738_415_616,
    "maxPositionEmbeddings": 4096,
}


def test_vllm_on_an_h100_reporting_79_19_gib_matches_the_measured_kv_cache() -> None:
    spec = make_spec({"name": "acme/mha-6.7b", "architecture": MHA_6_7B}, resources={"gpu": {"memoryGiB": 79.19}})
    memory = plan(spec, speculate=False)
    assert memory.per_gpu.budget_gib == pytest.approx(71.27, abs=0.01)
    assert memory.per_gpu.target_weights_gib == pytest.approx(12.55, abs=0.01)
    assert memory.per_gpu.kv_cache_gib == pytest.approx(56.18, rel=0.05)
    assert memory.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2


def test_kv_tokens_are_exact_given_the_kv_memory() -> None:
    # 56.18 GiB of KV cache at 512 KiB per token: 7,191 blocks of 16 tokens (vLLM's log).
    assert kv_cache_tokens(56.18 * GIB, 524_288) == 7191 * 16
    spec = make_spec({"name": "acme/mha-6.7b", "architecture": MHA_6_7B},
                     resources={"gpu": {"memoryGiB": 79.19}}, serving={"kvCacheMemoryGiB": 56.18})
    assert plan(spec, speculate=False).kv_cache_tokens == 7191 * 16


def test_kv_cache_tokens_edge_cases() -> None:
    assert kv_cache_tokens(0, 1024) == 0
    assert kv_cache_tokens(-5 * GIB, 1024) == 0
    assert kv_cache_tokens(16 * 1024 - 1, 1024) == 0
    assert kv_cache_tokens(16 * 1024, 1024) == 16


GEMMA_3_4B = {  # google/gemma-3-4b-it text model; 8.58 GiB of weights as vLLM loads them (with vision)
    "numLayers": 34, "hiddenSize": 2560, "intermediateSize": 10240, "numAttentionHeads": 8,
    "numKeyValueHeads": 4, "headDim": 256, "vocabSize": 262208, "numParameters": int(8.58 * GIB / 2),
    "maxPositionEmbeddings": 131072, "slidingWindow": 1024, "slidingWindowLayers": 29,
}


def test_gemma_3_4b_overheads_land_near_vllms_measurement() -> None:
    # vLLM at 0.9 of a 178.36 GiB GPU (B200 defaults: maxNumSeqs 1024, maxNumBatchedTokens 8192) measured
    # activation peak 9.96 GiB (262k vocabulary), non-torch 0.07 GiB, CUDA graphs 0.65 GiB.
    spec = make_spec({"name": "google/gemma-3-4b-it", "architecture": GEMMA_3_4B},
                     resources={"gpu": {"product": "B200"}}, serving={"maxNumSeqs": 1024})
    per_gpu = plan(spec, speculate=False).per_gpu
    assert per_gpu.budget_gib == pytest.approx(178.36 * 0.9, abs=0.01)
    assert per_gpu.target_weights_gib == pytest.approx(8.58, abs=0.01)
    assert per_gpu.activation_peak_gib == pytest.approx(9.96, rel=0.05)  # 9.59: -3.7%
    assert per_gpu.non_torch_gib == pytest.approx(0.07, abs=0.07)
    assert per_gpu.cuda_graph_gib == pytest.approx(0.65, rel=0.05)


@pytest.mark.parametrize(("model", "measured"), [
    # llm-d-benchmark config_explorer/empirical-vllm-memory-results.md: H100, vLLM V1 defaults
    (LLAMA_8B, 4.76), ("openai/gpt-oss-20b", 7.38), ("Qwen/Qwen3-0.6B", 5.56), ("Qwen/Qwen3-32B", 5.64),
])
def test_activation_peak_matches_vllm_on_an_h100(model: str, measured: float) -> None:
    spec = make_spec(model, serving={"maxNumSeqs": 1024, "maxModelLen": 16000})
    assert plan(spec, speculate=False).per_gpu.activation_peak_gib == pytest.approx(measured, abs=0.05)


def test_activation_peak_with_256_sequences_matches_vllms_log() -> None:
    # vLLM PR #10511: Meta-Llama-3-8B (the shape of Llama-3.1-8B), 256 sequences, 8192 batched tokens:
    # "PyTorch activation peak memory 1.26GiB".
    spec = make_spec(LLAMA_8B, serving={"maxNumSeqs": 256, "maxNumBatchedTokens": 8192, "maxModelLen": 8192})
    assert plan(spec, speculate=False).per_gpu.activation_peak_gib == pytest.approx(1.26, abs=0.05)


def test_llama_70b_fp8_tp2_matches_vllm_on_two_h100s() -> None:
    # Same source: weights 33.88 GiB, activation 4.84 GiB, non-torch 0.55 GiB per GPU.
    spec = make_spec({"name": "meta-llama/Llama-3.3-70B-Instruct", "quantization": "fp8"},
                     resources={"tensorParallelSize": 2}, serving={"maxNumSeqs": 1024, "maxModelLen": 16000})
    per_gpu = plan(spec, speculate=False).per_gpu
    assert per_gpu.target_weights_gib == pytest.approx(33.88, rel=0.01)
    assert per_gpu.activation_peak_gib == pytest.approx(4.84, abs=0.05)
    assert per_gpu.non_torch_gib == pytest.approx(0.55, abs=0.01)


def test_gpt_oss_weights_are_the_mxfp4_checkpoint() -> None:
    assert plan(make_spec("openai/gpt-oss-20b")).per_gpu.target_weights_gib == pytest.approx(13.47, abs=0.01)
    assert plan(make_spec("openai/gpt-oss-120b")).per_gpu.target_weights_gib == pytest.approx(64.38, abs=0.01)


def test_qwen3_5_mtp_layer_weighs_about_what_vllm_loads() -> None:
    # FACTS.md: Qwen3.5-9B + MTP k=1, weights 17.66 -> 18.12 GiB. Its GDN layers are not modelled, so
    # only the MTP layer's weight is checked.
    arch = {"numLayers": 32, "hiddenSize": 4096, "intermediateSize": 12288, "numAttentionHeads": 16,
            "numKeyValueHeads": 4, "headDim": 256, "vocabSize": 248320, "numParameters": int(17.66 * GIB / 2),
            "maxPositionEmbeddings": 262144, "numNextnPredictLayers": 1}
    spec = make_spec({"name": "Qwen/Qwen3.5-9B", "architecture": arch}, {"method": "mtp", "numSpeculativeTokens": 1},
                     serving={"maxModelLen": 32768})
    per_gpu = plan(spec).per_gpu
    assert per_gpu.target_weights_gib == pytest.approx(17.66, abs=0.01)
    assert per_gpu.draft_weights_gib == pytest.approx(18.12 - 17.66, rel=0.10)


# --- weights and KV of drafts, TP, dtypes ---------------------------------------------------------------


def test_eagle3_head_adds_its_own_layer_and_shares_the_embeddings() -> None:
    spec = make_spec(LLAMA_8B, {"method": "eagle3", "draft": {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}})
    memory = plan(spec)
    assert memory.kv_bytes_per_token == 131_072 + 4096  # one extra layer of 8 KV heads
    assert memory.per_gpu.draft_weights_gib == pytest.approx(0.425e9 * 2 / GIB, rel=0.02)


def test_eagle1_head_does_not_count_the_targets_embeddings_and_lm_head_again() -> None:
    spec = make_spec(LLAMA_8B, {"method": "eagle", "draft": {"name": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}})
    draft_bytes = plan(spec).per_gpu.draft_weights_gib * GIB
    shared_bytes = embedding_parameters(CATALOG[LLAMA_8B].architecture) * 2
    assert draft_bytes < shared_bytes / 3


def test_mtp_adds_its_layers_to_weights_and_kv() -> None:
    memory = plan(make_spec("XiaomiMiMo/MiMo-7B-RL", {"method": "mtp", "numSpeculativeTokens": 1}))
    assert memory.kv_bytes_per_token == 37 * 2 * 8 * 128 * 2  # 36 layers + 1 MTP layer
    assert memory.per_gpu.draft_weights_gib == pytest.approx(0.4, abs=0.1)
    assert plan(make_spec("XiaomiMiMo/MiMo-7B-RL")).per_gpu.draft_weights_gib == 0  # ngram loads no MTP layer


def test_mla_cache_is_one_latent_head_replicated_over_tensor_parallelism() -> None:
    spec = make_spec("deepseek-ai/DeepSeek-V3", {"method": "mtp", "numSpeculativeTokens": 1},
                     resources={"gpu": {"product": "H200", "count": 8}, "tensorParallelSize": 8},
                     serving={"maxModelLen": 32768})
    memory = plan(spec)
    assert memory.kv_bytes_per_token == 62 * (512 + 64) * 2  # 61 layers + 1 MTP layer, no factor 2, no TP split
    assert memory.per_gpu.target_weights_gib == pytest.approx(671e9 * 1.003 / 8 / GIB, rel=0.001)  # FP8
    assert memory.per_gpu.draft_weights_gib == pytest.approx(11.5e9 / 8 / GIB, rel=0.1)


def test_gqa_heads_split_over_tp_but_never_below_one() -> None:
    for tp, per_token in ((1, 131_072), (2, 65_536), (8, 16_384), (16, 16_384)):
        spec = make_spec(LLAMA_8B, resources={"gpu": {"count": tp}, "tensorParallelSize": tp})
        assert plan(spec).kv_bytes_per_token == per_token


def test_fp8_kv_cache_halves_the_bytes_per_token() -> None:
    assert plan(make_spec(LLAMA_8B, serving={"kvCacheDtype": "fp8"})).kv_bytes_per_token == 65_536


def test_tensor_parallelism_shards_weights() -> None:
    one = plan(make_spec(LLAMA_70B))
    four = plan(make_spec(LLAMA_70B, resources={"tensorParallelSize": 4}))
    assert four.per_gpu.target_weights_gib == pytest.approx(one.per_gpu.target_weights_gib / 4, abs=0.001)
    assert four.per_gpu.non_torch_gib > one.per_gpu.non_torch_gib  # NCCL buffers


def test_sliding_window_layers_hold_only_their_window() -> None:
    # Mistral-7B v0.1: every layer slides over 4096 tokens, so a 32k request holds
    # min(4095 + 8192, 32768) = 12287 tokens per layer.
    memory = plan(make_spec("mistralai/Mistral-7B-v0.1", serving={"maxModelLen": 32768}))
    assert memory.kv_bytes_per_token == -(-131_072 * 12287 // 32768)
    # gpt-oss-20b: 12 full layers plus 12 layers of a 128-token window.
    oss = plan(make_spec("openai/gpt-oss-20b", serving={"maxModelLen": 131072}))
    full_layers = 12 * 2 * 8 * 64 * 2
    assert oss.kv_bytes_per_token == full_layers + -(-full_layers * (127 + 8192) // 131072)
    assert oss.max_concurrency == pytest.approx(oss.kv_cache_tokens / 131072, abs=0.01)


def test_max_model_len_defaults_to_the_models_maximum() -> None:
    assert plan(make_spec("Qwen/Qwen3-8B")).max_model_len == 40960
    assert plan(make_spec("Qwen/Qwen3-8B", serving={"maxModelLen": 8192})).max_model_len == 8192


# --- verdicts ------------------------------------------------------------------------------------------


def test_a_comfortable_plan_fits_without_warnings() -> None:
    memory = plan(make_spec(LLAMA_8B, serving={"maxModelLen": 8192, "maxNumSeqs": 16}))
    assert memory.verdict == Verdict.FITS and memory.fits
    assert memory.reasons == [] and memory.suggestions == []
    assert memory.kv_cache_tokens % 16 == 0
    assert memory.max_concurrency == round(memory.kv_cache_tokens / 8192, 2)


def test_fewer_sequences_than_max_num_seqs_is_a_warning_naming_the_real_concurrency() -> None:
    memory = plan(make_spec(LLAMA_8B))  # 128k context × 256 sequences do not fit; ~3 do
    assert memory.verdict == Verdict.FITS_WITH_WARNINGS and memory.fits
    (finding,) = memory.reasons
    assert finding.code == "ConcurrencyBelowMaxNumSeqs" and finding.severity == Severity.WARNING
    assert f"{memory.max_concurrency:.2f} sequences" in finding.message
    assert "`spec.serving.maxNumSeqs`" in finding.message


def test_a_kv_cache_smaller_than_one_request_is_rejected_with_the_longest_context_that_fits() -> None:
    memory = plan(make_spec(LLAMA_8B, resources={"gpu": {"product": "L4"}}))
    assert memory.verdict == Verdict.REJECTED
    (finding,) = memory.reasons
    assert finding.code == "KVCacheTooSmall" and finding.severity == Severity.ERROR
    assert "longest `spec.serving.maxModelLen` that fits is" in finding.message
    suggestion = next(s for s in memory.suggestions if s.field == "spec.serving.maxModelLen")
    longest = int(suggestion.value)
    assert f"{longest:,}" in finding.message
    assert plan(make_spec(LLAMA_8B, resources={"gpu": {"product": "L4"}}, serving={"maxModelLen": longest})).fits
    longer = make_spec(LLAMA_8B, resources={"gpu": {"product": "L4"}}, serving={"maxModelLen": longest + 16})
    assert not plan(longer).fits


def test_no_memory_left_for_the_kv_cache_is_rejected() -> None:
    # Llama-3.3-70B FP8 on one H100: vLLM fails with "No available memory for the cache blocks" (llm-d data).
    memory = plan(make_spec({"name": "meta-llama/Llama-3.3-70B-Instruct", "quantization": "fp8"},
                            serving={"maxNumSeqs": 1024, "maxModelLen": 16000}))
    assert memory.per_gpu.kv_cache_gib < 0
    assert codes(memory) == ["KVCacheTooSmall"]
    assert "nothing is left for the KV cache" in memory.reasons[0].message


def test_unknown_gpu_memory_is_rejected_with_a_reason_and_a_suggestion() -> None:
    memory = plan(make_spec(LLAMA_8B, resources={"gpu": {"product": "X9000"}}))
    assert memory.verdict == Verdict.REJECTED
    assert codes(memory) == ["UnknownGpuMemory"]
    assert "`spec.resources.gpu.memoryGiB`" in memory.reasons[0].message
    assert memory.suggestions[0].field == "spec.resources.gpu.memoryGiB"
    explicit = plan(make_spec(LLAMA_8B, resources={"gpu": {"product": "X9000", "memoryGiB": "80Gi"}}))
    assert explicit.per_gpu.budget_gib == pytest.approx(72.0)


def test_utilization_above_the_free_memory_is_rejected_by_vllm() -> None:
    memory = plan(make_spec(LLAMA_8B, resources={"gpuMemoryUtilization": 1.0}, serving={"maxModelLen": 8192}))
    assert codes(memory)[0] == "GpuMemoryUtilizationTooHigh"
    suggestion = next(s for s in memory.suggestions if s.field == "spec.resources.gpuMemoryUtilization")
    assert float(suggestion.value) == 0.99
    assert plan(make_spec(LLAMA_8B, resources={"gpuMemoryUtilization": 0.99}, serving={"maxModelLen": 8192})).fits


# --- vLLM --kv-cache-memory, SGLang and TensorRT-LLM ----------------------------------------------------


def test_kv_cache_memory_replaces_the_budget_arithmetic() -> None:
    spec = make_spec(LLAMA_8B, resources={"gpuMemoryUtilization": 0.5}, serving={"kvCacheMemoryGiB": 40})
    memory = plan(spec)
    assert memory.per_gpu.kv_cache_gib == 40
    assert memory.per_gpu.budget_gib == pytest.approx(79.19)  # utilisation is ignored
    assert memory.kv_cache_tokens == kv_cache_tokens(40 * GIB, 131_072)
    assert "KVCacheMemoryFixed" in codes(memory) and memory.fits


def test_a_kv_cache_memory_larger_than_the_gpu_has_room_for_is_rejected() -> None:
    memory = plan(make_spec(LLAMA_8B, serving={"kvCacheMemoryGiB": 70}))
    assert memory.verdict == Verdict.REJECTED and "KVCacheMemoryDoesNotFit" in codes(memory)
    assert memory.kv_cache_tokens == 0
    suggestion = next(s for s in memory.suggestions if s.field == "spec.serving.kvCacheMemoryGiB")
    assert plan(make_spec(LLAMA_8B, serving={"kvCacheMemoryGiB": float(suggestion.value)})).fits


def test_sglang_gives_mem_fraction_static_of_the_free_memory_to_weights_and_kv() -> None:
    spec = make_spec(LLAMA_8B, engine={"kind": "sglang"}, serving={"maxModelLen": 8192, "maxNumSeqs": 16})
    memory = plan(spec)
    free = 79.19 - CUDA_CONTEXT_BYTES / GIB
    assert memory.per_gpu.budget_gib == pytest.approx(0.9 * free, abs=0.001)
    assert memory.per_gpu.kv_cache_gib == pytest.approx(0.9 * free - memory.per_gpu.target_weights_gib, abs=0.002)
    assert memory.fits


def test_sglang_warns_when_activations_do_not_fit_outside_the_static_fraction() -> None:
    spec = make_spec(LLAMA_8B, engine={"kind": "sglang"}, resources={"gpuMemoryUtilization": 0.97},
                     serving={"maxModelLen": 8192, "maxNumSeqs": 1024})
    memory = plan(spec)
    finding = next(f for f in memory.reasons if f.code == "SGLangReserveTooSmall")
    assert finding.severity == Severity.WARNING and "`spec.resources.gpuMemoryUtilization`" in finding.message
    assert memory.verdict == Verdict.FITS_WITH_WARNINGS


def test_sglang_draft_weights_leave_the_kv_pool_alone_but_draft_layers_cost_tokens() -> None:
    spec = make_spec(LLAMA_70B, DRAFT_8B, engine={"kind": "sglang"},
                     resources={"gpu": {"product": "H200", "count": 2}, "tensorParallelSize": 2},
                     serving={"maxModelLen": 8192})
    memory, without = plan(spec), plan(spec, speculate=False)
    assert memory.per_gpu.kv_cache_gib == without.per_gpu.kv_cache_gib
    assert memory.kv_cache_tokens < without.kv_cache_tokens


def test_trtllm_fraction_reproduces_the_planned_kv_cache() -> None:
    spec = make_spec({"name": LLAMA_70B, "quantization": "fp8"}, DRAFT_8B, engine={"kind": "trtllm"},
                     resources={"gpu": {"product": "H200"}}, serving={"maxModelLen": 16384})
    memory = plan(spec)
    memory_gib = gpu_memory_gib(spec)
    assert memory_gib is not None
    fraction = trtllm_free_gpu_memory_fraction(memory, memory_gib)
    per_gpu = memory.per_gpu
    free_after_profiling = (memory_gib - CUDA_CONTEXT_BYTES / GIB - per_gpu.target_weights_gib
                            - per_gpu.draft_weights_gib - per_gpu.activation_peak_gib - per_gpu.non_torch_gib)
    assert 0 < fraction < 1
    assert fraction * free_after_profiling == pytest.approx(per_gpu.kv_cache_gib, abs=0.01)
    assert fraction * free_after_profiling <= per_gpu.kv_cache_gib
    assert trtllm_free_gpu_memory_fraction(plan(make_spec(LLAMA_70B)), 79.19) == 0.0


# --- speculation on and off -------------------------------------------------------------------------------


def test_without_speculation_the_draft_costs_nothing() -> None:
    spec = make_spec({"name": LLAMA_70B, "quantization": "fp8"}, DRAFT_8B, resources={"gpu": {"product": "B200"}})
    memory = plan(spec, speculate=False)
    assert memory.per_gpu.draft_weights_gib == 0
    assert memory.kv_bytes_per_token == 327_680
    assert (memory.draft_cost.kv_cache_gib, memory.draft_cost.kv_cache_tokens) == (0, 0)
    disabled = make_spec({"name": LLAMA_70B, "quantization": "fp8"}, {**DRAFT_8B, "enabled": False},
                         resources={"gpu": {"product": "B200"}})
    assert plan(disabled) == memory


# --- suggestions ---------------------------------------------------------------------------------------


def apply(spec: SpeculativeDeploymentSpec, suggestion: Suggestion) -> SpeculativeDeploymentSpec:
    """`spec` with the suggestion written into it, as a user would."""
    document = spec.to_wire()
    path = suggestion.field.removeprefix("spec.").split(".")
    parent = document
    for key in path[:-1]:
        parent = parent.setdefault(key, {})
    value: Any = suggestion.value
    if path[-1] in ("tensorParallelSize", "maxModelLen"):
        value = int(value)
        if path[-1] == "tensorParallelSize" and "count" in document["resources"].get("gpu", {}):
            document["resources"]["gpu"]["count"] = value
    elif path[-1] in ("gpuMemoryUtilization", "kvCacheMemoryGiB"):
        value = float(value)
    elif path[-1] == "product":
        document["resources"]["gpu"].pop("memoryGiB", None)
    elif path[-1] == "method":
        document["speculation"].pop("draft", None)
    parent[path[-1]] = value
    return SpeculativeDeploymentSpec.model_validate(document)


REJECTED_SPECS = {
    "70B bf16 + 8B draft on one H100": make_spec(LLAMA_70B, DRAFT_8B),
    "70B fp8 + 8B draft on one H100": make_spec({"name": LLAMA_70B, "quantization": "fp8"}, DRAFT_8B,
                                                serving={"maxModelLen": 8192}),
    "Qwen3-32B + Qwen3-8B draft": make_spec("Qwen/Qwen3-32B", {"method": "draft_model", "draft": {"name": "Qwen/Qwen3-8B"}},
                                            serving={"maxModelLen": 8192}),
    "8B at 128k on an L4": make_spec(LLAMA_8B, resources={"gpu": {"product": "L4"}}),
    "405B fp8 on 4 H100s": make_spec({"name": "meta-llama/Llama-3.1-405B-Instruct", "quantization": "fp8"},
                                 resources={"gpu": {"count": 4}, "tensorParallelSize": 4}),
    "SGLang 70B on one H100": make_spec(LLAMA_70B, engine={"kind": "sglang"}),
}


@pytest.mark.parametrize("name", REJECTED_SPECS)
def test_every_suggestion_is_what_re_planning_it_gives(name: str) -> None:
    spec = REJECTED_SPECS[name]
    memory = plan(spec)
    assert memory.verdict == Verdict.REJECTED
    assert memory.suggestions
    seen_not_fitting = False
    for suggestion in memory.suggestions:
        fits = ": fits:" in suggestion.message
        assert fits or "not enough alone" in suggestion.message
        assert plan(apply(spec, suggestion)).fits == fits, suggestion
        assert not (fits and seen_not_fitting), "fitting suggestions come first"
        seen_not_fitting |= not fits


def test_a_rejected_70b_with_an_8b_draft_gets_the_issues_fixes() -> None:
    memory = plan(REJECTED_SPECS["70B bf16 + 8B draft on one H100"])
    by_field = {s.field: s for s in memory.suggestions}
    assert by_field["spec.model.quantization"].value == "fp8"
    assert by_field["spec.speculation.draft.quantization"].value == "fp8"
    assert by_field["spec.resources.tensorParallelSize"].value in ("2", "4")
    assert by_field["spec.speculation.method"].value == "ngram"
    assert ": fits:" in by_field["spec.resources.tensorParallelSize"].message


def test_a_smaller_draft_of_the_same_family_is_suggested() -> None:
    memory = plan(REJECTED_SPECS["Qwen3-32B + Qwen3-8B draft"])
    suggestion = next(s for s in memory.suggestions if s.field == "spec.speculation.draft.name")
    assert suggestion.value == "Qwen/Qwen3-1.7B"  # the largest Qwen3 draft that fits
    assert ": fits:" in suggestion.message


def test_tensor_parallel_suggestion_mentions_the_gpu_count_when_it_is_set() -> None:
    memory = plan(REJECTED_SPECS["405B fp8 on 4 H100s"])
    suggestion = next(s for s in memory.suggestions if s.field == "spec.resources.tensorParallelSize")
    assert suggestion.value == "8" and "`spec.resources.gpu.count` to 8" in suggestion.message
