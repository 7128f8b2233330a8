"""How long one forward pass takes on one GPU: a roofline over HBM bandwidth and tensor-core FLOP/s.

    cost = model_forward_cost(llama_8b, tensor_parallel_size=1)
    seconds = forward_seconds(cost, find_gpu("H100-80GB"), batch=64, tokens_per_sequence=4)

A decode pass reads every weight once and each sequence's KV cache once, and does 2 FLOPs per active
parameter per token. Few tokens leave it memory-bound (the time does not grow with the tokens: this is
why verifying k+1 drafted tokens costs about as much as decoding one); many tokens make it
compute-bound (the time grows with every token: this is where speculation stops paying). The compute
ceiling is the GPU's FP8 rate for FP8 weights on a GPU with FP8 tensor cores, else its bf16 rate. Kernel
launch gaps and tensor-parallel all-reduces add a fixed time per layer.

Constants are calibrated in docs/speedup-model.md and tests/unit/test_speedup.py against published
measurements; GPU numbers come from planning/gpus.py (vendor datasheets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdeploy.api.spec import Architecture, Quantization
from specdeploy.planning.gpus import GpuProduct
from specdeploy.planning.modelinfo import ModelInfo

# Share of datasheet HBM bandwidth a decode pass reaches (H100 GEMV/attention kernels reach ~80-90%);
# 0.8 with the overheads below gives SGLang's published 158 tok/s for Llama-3.1-8B on one H100.
BANDWIDTH_EFFICIENCY = 0.8
# Share of the dense tensor-core peak that decode/verify GEMMs of a few hundred tokens reach. 0.5
# reproduces the high-load slowdowns of vLLM's 2024-10-17 blog (1.4x with a draft model, 1.8x with
# ngram, Llama3-70B on 4xH100); see docs/speedup-model.md.
COMPUTE_EFFICIENCY = 0.5
# Launch gap per layer per pass under CUDA graphs (norms, rotary, residual kernels between the GEMMs).
LAYER_OVERHEAD_S = 8e-6
# One NVLink all-reduce of a decode-sized activation; a tensor-parallel layer does two.
ALLREDUCE_S = 10e-6
# Scheduling, sampling and output processing once per engine step.
ENGINE_STEP_OVERHEAD_S = 0.4e-3
# Routed experts' share of an MoE model's parameters (the catalog has no expert size). 0.975 gives active
# counts of 37B for DeepSeek-V3 (published 37B of 671B, 8 of 256 experts), 12.5B for Mixtral-8x7B (12.9B of
# 46.7B, 2 of 8) and 6.3B for gpt-oss-120b (5.1B of 117B, 4 of 128).
EXPERT_PARAMETER_SHARE = 0.975
# Tokens already in a sequence's KV cache when it decodes: a mid-length chat turn.
DEFAULT_CONTEXT_TOKENS = 1024

# Bytes per weight; int4-family checkpoints carry a 16-bit scale (and zero) per group of 128 weights.
WEIGHT_BYTES: dict[Quantization, float] = {
    Quantization.NONE: 2.0,
    Quantization.FP8: 1.0,
    Quantization.INT8: 1.0,
    Quantization.AWQ: 0.53,
    Quantization.GPTQ: 0.53,
    Quantization.INT4: 0.53,
}


@dataclass(frozen=True)
class ForwardCost:
    """What one forward pass of one model costs on each of its GPUs."""

    dense_weight_bytes: float           # weights read on every pass
    expert_weight_bytes: float = 0.0    # MoE routed experts: read as far as the pass's tokens touch them
    expert_fraction_per_token: float = 0.0  # experts per token ÷ experts (0 for a dense model)
    flops_per_token: float = 0.0        # 2 × active parameters ÷ TP
    kv_bytes_per_token: float = 0.0     # KV read per cached token of a sequence (full-attention layers)
    window_kv_bytes_per_token: float = 0.0  # the same for sliding-window layers, which read at most `window`
    window: int = 0
    layers: int = 1
    tensor_parallel_size: int = 1
    fp8_weights: bool = False           # FP8 GEMMs where the GPU has FP8 tensor cores

    def scaled(self, factor: float) -> ForwardCost:
        """The same pass with `factor` times the weights and FLOPs (a larger model of the same shape)."""
        return replace(
            self,
            dense_weight_bytes=self.dense_weight_bytes * factor,
            expert_weight_bytes=self.expert_weight_bytes * factor,
            flops_per_token=self.flops_per_token * factor,
        )


def forward_seconds(
    cost: ForwardCost,
    gpu: GpuProduct,
    *,
    batch: int,
    tokens_per_sequence: int = 1,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> float:
    """Seconds for one pass over `batch` sequences of `tokens_per_sequence` new tokens each."""
    tokens = batch * tokens_per_sequence
    touched = 1.0 - (1.0 - cost.expert_fraction_per_token) ** tokens if cost.expert_fraction_per_token else 0.0
    kv_read = batch * (
        cost.kv_bytes_per_token * context_tokens
        + cost.window_kv_bytes_per_token * min(cost.window, context_tokens)
    )
    moved = cost.dense_weight_bytes + cost.expert_weight_bytes * touched + kv_read
    memory_s = moved / (gpu.hbm_bandwidth_gb_s * 1e9 * BANDWIDTH_EFFICIENCY)
    compute_s = cost.flops_per_token * tokens / (peak_flops(cost, gpu) * COMPUTE_EFFICIENCY)
    allreduce_s = 2 * cost.layers * ALLREDUCE_S if cost.tensor_parallel_size > 1 else 0.0
    return max(memory_s, compute_s) + cost.layers * LAYER_OVERHEAD_S + allreduce_s


def peak_flops(cost: ForwardCost, gpu: GpuProduct) -> float:
    """The pass's dense tensor-core peak in FLOP/s: FP8 for FP8 weights on a GPU with FP8 tensor cores
    (vLLM's fp8 runs W8A8 there, FACTS.md), else bf16 (an A100 runs FP8 weight-only, computing in bf16)."""
    if cost.fp8_weights and gpu.fp8_tflops is not None:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


def _embedding_parameters(arch: Architecture) -> int:
    """Input embedding plus lm_head (one matrix when tied)."""
    return arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)


def _kv_bytes_per_token(arch: Architecture, layers: int, tensor_parallel_size: int, element_bytes: float) -> float:
    """KV bytes one cached token costs on each GPU across `layers` attention layers.

    MLA (DeepSeek) stores one latent of kv_lora_rank + qk_rope_head_dim per layer, replicated on every
    rank; grouped-query attention stores K and V per KV head, split over the ranks (at least one each).
    """
    if arch.kv_lora_rank is not None:
        return layers * (arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)) * element_bytes
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    heads_per_rank = max(1.0, arch.num_key_value_heads / tensor_parallel_size)
    return layers * 2 * heads_per_rank * head_dim * element_bytes


def _cost_from_parameters(
    arch: Architecture,
    parameters: float,
    layers: int,
    *,
    tensor_parallel_size: int,
    weight_bytes: float,
    kv_element_bytes: float,
    fp8_weights: bool,
) -> ForwardCost:
    expert_share = EXPERT_PARAMETER_SHARE if arch.num_experts and arch.num_experts_per_token else 0.0
    fraction = arch.num_experts_per_token / arch.num_experts if arch.num_experts and arch.num_experts_per_token else 0.0
    dense, experts = parameters * (1 - expert_share), parameters * expert_share
    window_layers = min(arch.sliding_window_layers or 0, layers) if arch.sliding_window else 0
    return ForwardCost(
        dense_weight_bytes=dense * weight_bytes / tensor_parallel_size,
        expert_weight_bytes=experts * weight_bytes / tensor_parallel_size,
        expert_fraction_per_token=fraction,
        flops_per_token=2 * (dense + experts * fraction) / tensor_parallel_size,
        kv_bytes_per_token=_kv_bytes_per_token(arch, layers - window_layers, tensor_parallel_size, kv_element_bytes),
        window_kv_bytes_per_token=_kv_bytes_per_token(arch, window_layers, tensor_parallel_size, kv_element_bytes),
        window=arch.sliding_window or 0,
        layers=layers,
        tensor_parallel_size=tensor_parallel_size,
        fp8_weights=fp8_weights,
    )


def model_forward_cost(
    model: ModelInfo,
    *,
    tensor_parallel_size: int = 1,
    quantization: Quantization = Quantization.NONE,
    kv_element_bytes: float = 2.0,
    extra_parameters: float = 0.0,
    counts_input_embedding: bool = True,
) -> ForwardCost:
    """The pass of a whole model (a target, a draft model, or an EAGLE head with its own layers).

    An untied input embedding is a gather of a few rows, not a read of the matrix, so it is left out of
    the bytes when `counts_input_embedding` says the parameter count includes it (full models; an EAGLE
    head's count usually does not, it shares the target's). `extra_parameters` are weights read on every
    pass that the model does not own, such as the target's lm_head that an EAGLE-1 head borrows.
    """
    arch = model.architecture
    untied = counts_input_embedding and not arch.tie_word_embeddings
    input_embedding = arch.vocab_size * arch.hidden_size if untied else 0
    return _cost_from_parameters(
        arch,
        max(arch.num_parameters - input_embedding, 1) + extra_parameters,
        arch.num_layers,
        tensor_parallel_size=tensor_parallel_size,
        weight_bytes=weight_bytes_per_parameter(model, quantization),
        kv_element_bytes=kv_element_bytes,
        fp8_weights=has_fp8_weights(model, quantization),
    )


def weight_bytes_per_parameter(model: ModelInfo, quantization: Quantization) -> float:
    """Bytes per weight read: the quantisation's, or for `none` what the checkpoint stores (FP8 for
    DeepSeek-V3, MXFP4 experts for gpt-oss) where the catalog says so, else 16-bit."""
    stored = getattr(model, "checkpoint_bytes_per_param", None)
    if quantization == Quantization.NONE and isinstance(stored, int | float):
        return float(stored)
    return WEIGHT_BYTES[quantization]


def has_fp8_weights(model: ModelInfo, quantization: Quantization) -> bool:
    """Whether the model's Linear weights are FP8: `quantization: fp8`, or `none` on a checkpoint stored
    at one byte per weight. The catalog records bytes, not formats; its one such checkpoint is
    DeepSeek-V3's FP8 e4m3 with block scales (1.003 bytes), while gpt-oss's MXFP4 stores 0.6–0.7."""
    if quantization == Quantization.FP8:
        return True
    return quantization == Quantization.NONE and abs(weight_bytes_per_parameter(model, quantization) - 1.0) < 0.01


def mtp_forward_cost(
    target: ModelInfo,
    *,
    tensor_parallel_size: int = 1,
    quantization: Quantization = Quantization.NONE,
    kv_element_bytes: float = 2.0,
) -> ForwardCost:
    """One pass of a model's own MTP module: one more decoder layer of the model plus its lm_head."""
    arch = target.architecture
    layer_parameters = (arch.num_parameters - _embedding_parameters(arch)) / arch.num_layers
    lm_head = arch.vocab_size * arch.hidden_size
    return _cost_from_parameters(
        arch,
        layer_parameters + lm_head,
        1,
        tensor_parallel_size=tensor_parallel_size,
        weight_bytes=weight_bytes_per_parameter(target, quantization),
        kv_element_bytes=kv_element_bytes,
        fp8_weights=has_fp8_weights(target, quantization),
    )


def decode_step_seconds(
    batch: int,
    model: ModelInfo,
    gpu: GpuProduct,
    tensor_parallel_size: int = 1,
    *,
    quantization: Quantization = Quantization.NONE,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
) -> float:
    """One engine decode step of `model` without speculation: one token for each of `batch` sequences."""
    cost = model_forward_cost(model, tensor_parallel_size=tensor_parallel_size, quantization=quantization)
    return forward_seconds(cost, gpu, batch=batch, context_tokens=context_tokens) + ENGINE_STEP_OVERHEAD_S
