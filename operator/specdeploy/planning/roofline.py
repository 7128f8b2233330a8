"""How long one forward pass takes on one GPU: a roofline over HBM bandwidth and tensor-core FLOP/s.

    cost = model_forward_cost(llama_8b, tensor_parallel_size=1)
    seconds = forward_seconds(cost, find_gpu("H100-80GB"), batch=64, tokens_per_sequence=4)

A pass is two kinds of kernel plus the time between kernels:
- the GEMMs read every weight once (an MoE's experts as far as the pass's tokens touch them), read and
  write every token's activations, and do 2 FLOPs per active parameter per token;
- attention reads each sequence's KV cache once and does 4 × heads × head_dim FLOPs per layer per new token per
  cached token (QKᵀ and PV), so its work grows with tokens per sequence × context;
- each layer pays a fixed kernel time (launches and the small norm, rotary, activation kernels between
  the GEMMs), which dominates a small, narrow model's pass; a tensor-parallel layer adds two all-reduces.

Each kind's time is a smooth maximum of its memory time and its compute time, (m^p + c^p)^(1/p), not
max(m, c): measured, verifying 5 tokens per sequence costs +14% over decoding 1 at batch 32 on Llama-3.1-8B
where max() sees no cost until the compute knee (tests/data/h100-step-times.json). The GEMMs' shapes set
where the transition falls: weights against FLOPs put it near tokens ≈ peak ÷ bandwidth, and each GEMM's
activations in and out (tokens × (K + N)) move it later the wider the layer. The compute ceiling is the
GPU's FP8 rate for FP8 weights on a GPU with FP8 tensor cores, else its bf16 rate.

Constants are fitted to one measured table (one H100, Llama-shaped bf16 passes, 1,024 cached tokens) and
checked against published end-to-end measurements (docs/speedup-model.md, tests/unit/test_step_cost_table.py,
tests/unit/test_speedup.py); other GPUs are scaled by their datasheet bandwidth and FLOP/s (planning/gpus.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdeploy.api.spec import Architecture, Quantization
from specdeploy.planning.gpus import GpuProduct
from specdeploy.planning.modelinfo import ModelInfo

# The four constants below are fitted together to tests/data/h100-step-times.json (one H100, 108 cells of
# Llama-3.1-8B, Llama-3.2-1B, the EAGLE-3 head and a Llama-3.1-70B TP-4 rank): every cell within ±9%, mean 3.6%
# (tests/unit/test_step_cost_table.py, docs/speedup-model.md). Other GPUs scale by their datasheets.
# Share of datasheet HBM bandwidth the passes reach (weights, KV and activations alike): 2.91 TB/s on an H100,
# where the table's own 2 GiB copy reached 3.04 (read + write).
BANDWIDTH_EFFICIENCY = 0.87
# Share of the dense tensor-core peak the GEMMs and attention reach once compute-bound: 593 TFLOP/s bf16 on an
# H100, where the table's own 8192³ GEMM reached 797; decode-shaped GEMMs are skinny.
COMPUTE_EFFICIENCY = 0.60
# p of the smooth maximum (m^p + c^p)^(1/p) of a kernel class's memory and compute times: how gradually a
# pass turns compute-bound (∞ would be max(), the hard knee).
TRANSITION_SHARPNESS = 3.2
# Kernel time per layer per pass under CUDA graphs: launches and the small kernels between the GEMMs. The
# table's plain PyTorch forward pays 54 µs per layer; it runs about twice the kernels per layer of an engine's
# fused layer (~20: unfused RMSNorm, SiLU·mul, cache and layout copies, against ~10: fused add+RMSNorm ×2,
# rotary, cache write, attention, SiLU·mul and the four GEMMs), so an engine pays half. With it, Llama-3.1-8B
# decodes 155 tok/s on one H100 (SGLang docs: 158), and a 16-layer 1B draft pays 0.43 ms per pass in gaps.
LAYER_OVERHEAD_S = 27e-6
# One NVLink all-reduce of a decode-sized activation; a tensor-parallel layer does two. Not in the table
# (one GPU); its growth with the tokens of a large pass is not modelled.
ALLREDUCE_S = 10e-6
# Scheduling, sampling and output processing once per engine step (not in the table: GPU time only).
ENGINE_STEP_OVERHEAD_S = 0.4e-3
# A layout whose pipeline stages span nodes (planning/topology.py) sends each step's activations over the network
# between stages, an assumption (nothing measured here): one NCCL send/receive between nodes costs ~30 µs before its
# bytes, and a 400 Gb/s InfiniBand NDR link per GPU (HGX H100/H200 reference networks) carries 50 GB/s.
INTER_NODE_HOP_LATENCY_S = 30e-6
INTER_NODE_BANDWIDTH_GB_S = 50.0
# Routed experts' share of an MoE model's parameters (the catalog has no expert size). 0.975 gives active
# counts of 37B for DeepSeek-V3 (published 37B of 671B, 8 of 256 experts), 12.5B for Mixtral-8x7B (12.9B of
# 46.7B, 2 of 8) and 6.3B for gpt-oss-120b (5.1B of 117B, 4 of 128).
EXPERT_PARAMETER_SHARE = 0.975
# Tokens in a sequence's KV cache where nothing else is said: the context the measured table was taken at. The
# plan asks with the SD's own (planning.speedup.context_tokens_for, or the pods' measured mean).
DEFAULT_CONTEXT_TOKENS = 1024
# Bytes per activation element: engines keep activations in 16-bit, FP8 checkpoints included.
ACTIVATION_BYTES = 2.0

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
    activation_bytes_per_token: float = 0.0  # each token's activations in and out of every kernel, all layers
    kv_bytes_per_token: float = 0.0     # KV read per cached token of a sequence (full-attention layers)
    window_kv_bytes_per_token: float = 0.0  # the same for sliding-window layers, which read at most `window`
    window: int = 0
    attention_flops_per_token: float = 0.0  # per new token per cached token it attends to (full-attention layers)
    window_attention_flops_per_token: float = 0.0  # the same for sliding-window layers
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
    layer_overhead_s: float = LAYER_OVERHEAD_S,
) -> float:
    """Seconds for one pass over `batch` sequences of `tokens_per_sequence` new tokens each, every sequence
    with `context_tokens` in its KV cache. `layer_overhead_s`: the kernel time per layer (an engine's by default;
    a forward of other kernels pays its own, as the measured table's plain PyTorch forward does)."""
    return pass_seconds(
        cost, gpu, tokens=batch * tokens_per_sequence, kv_tokens=batch * context_tokens,
        window_kv_tokens=batch * min(cost.window, context_tokens), tokens_per_sequence=tokens_per_sequence,
        layer_overhead_s=layer_overhead_s,
    )


def pass_seconds(
    cost: ForwardCost,
    gpu: GpuProduct,
    *,
    tokens: int,
    kv_tokens: int = 0,
    window_kv_tokens: int = 0,
    tokens_per_sequence: int = 1,
    layer_overhead_s: float = LAYER_OVERHEAD_S,
) -> float:
    """One pass over `tokens` new tokens, `tokens_per_sequence` of each sequence, whose sequences hold
    `kv_tokens` cached tokens in all (`window_kv_tokens`: the same capped at the sliding window)."""
    if tokens <= 0:
        return 0.0
    bandwidth = gpu.hbm_bandwidth_gb_s * 1e9 * BANDWIDTH_EFFICIENCY
    flops = peak_flops(cost, gpu) * COMPUTE_EFFICIENCY
    fraction = cost.expert_fraction_per_token
    touched = 1.0 - (1.0 - fraction) ** tokens if fraction else 0.0
    weights = cost.dense_weight_bytes + cost.expert_weight_bytes * touched
    gemm_s = _smooth_max((weights + cost.activation_bytes_per_token * tokens) / bandwidth,
                         cost.flops_per_token * tokens / flops)
    kv_read = cost.kv_bytes_per_token * kv_tokens + cost.window_kv_bytes_per_token * window_kv_tokens
    attended = tokens_per_sequence * (
        cost.attention_flops_per_token * kv_tokens + cost.window_attention_flops_per_token * window_kv_tokens)
    attention_s = _smooth_max(kv_read / bandwidth, attended / flops)
    return gemm_s + attention_s + cost.layers * layer_overhead_s + allreduce_seconds(cost)


def allreduce_seconds(cost: ForwardCost) -> float:
    """The pass's tensor-parallel all-reduces: two per layer, none on one GPU."""
    return 2 * cost.layers * ALLREDUCE_S if cost.tensor_parallel_size > 1 else 0.0


def pipeline_hop_seconds(stages: int, tokens: int, hidden_size: int) -> float:
    """The network in one step of a pipeline of `stages` over `tokens` new tokens: each of the stages − 1
    boundaries sends the tokens' hidden states and residual (vLLM's IntermediateTensors, 16-bit), and the last stage
    returns the sampled tokens to the first, so `stages` hops of latency. The stages themselves run one after
    another for a step (the pipeline bubble): the pass's time is every layer's, as on one node, which
    `forward_seconds` already gives; the engine's batches in flight fill the bubble for throughput only."""
    if stages <= 1:
        return 0.0
    sent = (stages - 1) * tokens * hidden_size * 2 * ACTIVATION_BYTES
    return stages * INTER_NODE_HOP_LATENCY_S + sent / (INTER_NODE_BANDWIDTH_GB_S * 1e9)


def _smooth_max(memory_s: float, compute_s: float) -> float:
    """max(memory_s, compute_s) rounded off near the ridge, where neither HBM nor the tensor cores are kept busy."""
    p = TRANSITION_SHARPNESS
    return float((memory_s**p + compute_s**p) ** (1 / p))


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


def _attention_flops_per_token(arch: Architecture, layers: int, tensor_parallel_size: int) -> float:
    """FLOPs one new token spends per cached token it attends to, on each GPU across `layers` layers: QKᵀ and PV
    for each query head (GQA: 2 × 2 × head_dim; MLA, absorbed: 2 × (2 × kv_lora_rank + qk_rope_head_dim))."""
    heads = max(1.0, arch.num_attention_heads / tensor_parallel_size)
    if arch.kv_lora_rank is not None:
        return layers * heads * 2 * (2 * arch.kv_lora_rank + (arch.qk_rope_head_dim or 0))
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    return layers * heads * 4 * head_dim


def _activation_bytes_per_token(arch: Architecture, layers: int, tensor_parallel_size: int, vocab: int) -> float:
    """Bytes one token's activations move through an engine's fused kernels on each GPU: every GEMM's input
    and output (qkv, o, gate_up, down, then lm_head and the sampler's read of the logits), two fused
    add+RMSNorms of the hidden state in and out, rotary on q and k, the KV cache write and SiLU·mul.
    An MoE layer is counted with `intermediate_size`, as if dense; `vocab` is the rows the lm_head computes."""
    tp = tensor_parallel_size
    hidden, intermediate = arch.hidden_size, arch.intermediate_size / tp
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    heads, kv_heads = arch.num_attention_heads / tp, max(1.0, arch.num_key_value_heads / tp)
    per_layer = 12 * hidden + 6 * intermediate + head_dim * (4 * heads + 6 * kv_heads)
    return (layers * per_layer + hidden + 2 * vocab / tp) * ACTIVATION_BYTES


def _cost_from_parameters(
    arch: Architecture,
    parameters: float,
    layers: int,
    *,
    tensor_parallel_size: int,
    weight_bytes: float,
    kv_element_bytes: float,
    fp8_weights: bool,
    vocab: int,
) -> ForwardCost:
    expert_share = EXPERT_PARAMETER_SHARE if arch.num_experts and arch.num_experts_per_token else 0.0
    fraction = arch.num_experts_per_token / arch.num_experts if arch.num_experts and arch.num_experts_per_token else 0.0
    dense, experts = parameters * (1 - expert_share), parameters * expert_share
    window_layers = min(arch.sliding_window_layers or 0, layers) if arch.sliding_window else 0
    tp = tensor_parallel_size
    return ForwardCost(
        dense_weight_bytes=dense * weight_bytes / tp,
        expert_weight_bytes=experts * weight_bytes / tp,
        expert_fraction_per_token=fraction,
        flops_per_token=2 * (dense + experts * fraction) / tp,
        activation_bytes_per_token=_activation_bytes_per_token(arch, layers, tp, vocab),
        kv_bytes_per_token=_kv_bytes_per_token(arch, layers - window_layers, tp, kv_element_bytes),
        window_kv_bytes_per_token=_kv_bytes_per_token(arch, window_layers, tp, kv_element_bytes),
        window=arch.sliding_window or 0,
        attention_flops_per_token=_attention_flops_per_token(arch, layers - window_layers, tp),
        window_attention_flops_per_token=_attention_flops_per_token(arch, window_layers, tp),
        layers=layers,
        tensor_parallel_size=tp,
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
        vocab=model.draft_vocab_size or arch.vocab_size,
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
        vocab=arch.vocab_size,
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
