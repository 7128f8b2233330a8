"""The simulator's hardware: seconds per forward pass from a measured H100 table, not from the planner.

    cost = pass_cost(model_shape(target), find_gpu("H100-80GB"))
    cost.seconds(tokens=64 * 4, tokens_per_sequence=4, kv_tokens=64 * 1024)

The table (h100-step-times.json beside this file, a copy of tests/data/h100-step-times.json: one forward pass of
Llama-3.1-8B, Llama-3.2-1B, Llama-3.1-8B's EAGLE-3 head and a Llama-3.1-70B TP-4 rank on an H100 80GB, batch
1–256 × 1–5 new tokens, 1,024 cached tokens per sequence) is the hardware's truth. A cell splits into what
reads the KV cache (B × 1,024 × KV bytes per token at the measured copy bandwidth) and what does not; the rest,
a function of the pass's tokens alone, is log-linear between measured token counts and splits again into
kernel gaps, weight streaming and growth with tokens. Other models, contexts and GPUs scale those parts by
the rules of docs/simulator.md ("Hardware profile"). The planner's cost model (planning/roofline.py,
speedup.py) is another model of the same table; this module shares no code with it, so the benchmarks grade
the planner against hardware rather than against itself.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from specdeploy.api.spec import Quantization
from specdeploy.planning.gpus import GPU_PRODUCTS, GpuProduct
from specdeploy.planning.modelinfo import ModelInfo

TABLE_PATH = Path(__file__).with_name("h100-step-times.json")
PROFILE_GPU = "H100-80GB"
# The plain PyTorch forward of the table launches about twice the kernels per layer an engine does (no fused
# add+RMSNorm or SiLU·mul, attention through torch's SDPA with its reshapes: tests/data/h100-step-times.md).
# The simulator keeps half of the table's per-layer kernel gaps and everything else as measured: the bytes
# and FLOPs a fused kernel moves are the same, only the launches and their tails go.
ENGINE_KERNEL_GAP_FACTOR = 0.5
# An engine step outside the GPU passes (scheduling, sampling, output processing) and each drafting pass's
# own (the proposer's input preparation and sampling). Chosen so the simulator meets SGLang's published
# Llama-3.1-8B batch-1 numbers (158 tok/s plain, 373 with EAGLE-3; tests/unit/test_sim_calibration.py).
ENGINE_STEP_OVERHEAD_S = 150e-6
DRAFT_PASS_OVERHEAD_S = 100e-6
# Attention over many cached tokens (a prefill chunk, a long verify) runs at this share of the measured GEMM
# FLOP/s: an assumption (FlashAttention-class kernels on Hopper reach about half of dense GEMM throughput).
ATTENTION_FLOPS_SHARE = 0.5
# A tensor-parallel pass all-reduces the hidden state twice per layer: a fixed latency each (an assumption of
# NVLink-class links) plus the bytes over the link bandwidth (NVLink 4: 450 GB/s per direction per H100).
ALLREDUCE_LATENCY_S = 8e-6
LINK_BYTES_PER_S = 450e9
# Bytes per weight for each quantisation (int4 families carry a 16-bit scale per 128 weights).
WEIGHT_BYTES = {Quantization.NONE: 2.0, Quantization.FP8: 1.0, Quantization.INT8: 1.0,
                Quantization.AWQ: 0.53, Quantization.GPTQ: 0.53, Quantization.INT4: 0.53}
# An MoE's parameters in its routed experts (an assumption: Mixtral 96%, DeepSeek-V3 98%, Qwen3-30B-A3B 97%).
EXPERT_SHARE = 0.97
ACTIVATION_BYTES = 2.0


@dataclass(frozen=True)
class ModelShape:
    """What one forward pass of a model computes on one GPU (a tensor-parallel rank)."""

    weight_bytes: float                  # dense weights read every pass
    expert_weight_bytes: float           # routed-expert weights; a pass reads the experts its tokens touch
    expert_fraction: float               # experts per token ÷ experts (0: dense)
    flops_per_token: float               # 2 × active parameters
    kv_bytes_per_token: float            # KV bytes per cached token, full-attention layers
    window_kv_bytes_per_token: float     # the same for sliding-window layers
    window: int                          # the sliding window (0: none)
    attention_flops_per_pair: float      # FLOPs per new token per cached token it attends to
    layers: int
    hidden_size: int
    tensor_parallel_size: int = 1
    fp8: bool = False


def _attention_numbers(heads: float, kv_heads: float, head_dim: int, layers: int, element_bytes: float,
                       kv_lora_rank: int | None = None, rope_dim: int = 0) -> tuple[float, float]:
    """KV bytes per cached token and attention FLOPs per (new, cached) token pair over `layers` layers."""
    if kv_lora_rank is not None:  # MLA: one latent per layer, replicated; absorbed attention
        return layers * (kv_lora_rank + rope_dim) * element_bytes, layers * heads * 2 * (2 * kv_lora_rank + rope_dim)
    return layers * 2 * kv_heads * head_dim * element_bytes, layers * heads * 4 * head_dim


def model_shape(model: ModelInfo, *, tensor_parallel_size: int = 1, quantization: Quantization = Quantization.NONE,
                kv_element_bytes: float = 2.0, extra_parameters: float = 0.0, counts_input_embedding: bool = True,
                layers: int | None = None, parameters: float | None = None) -> ModelShape:
    """A catalog model's pass on one rank. An untied input embedding is a gather, not a read; an EAGLE head's
    count excludes the embeddings it shares. `layers`/`parameters` override the model's (an MTP module)."""
    arch = model.architecture
    tp = tensor_parallel_size
    untied = counts_input_embedding and not arch.tie_word_embeddings
    total = (parameters if parameters is not None
             else max(arch.num_parameters - (arch.vocab_size * arch.hidden_size if untied else 0), 1))
    total += extra_parameters
    moe = bool(arch.num_experts and arch.num_experts_per_token)
    fraction = (arch.num_experts_per_token or 0) / (arch.num_experts or 1) if moe else 0.0
    experts = total * EXPERT_SHARE if moe else 0.0
    dense = total - experts
    stored = model.checkpoint_bytes_per_param
    per_weight = float(stored) if quantization == Quantization.NONE and stored else WEIGHT_BYTES[quantization]
    n_layers = layers if layers is not None else arch.num_layers
    window_layers = min(arch.sliding_window_layers or 0, n_layers) if arch.sliding_window else 0
    head_dim = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    heads, kv_heads = max(1.0, arch.num_attention_heads / tp), max(1.0, arch.num_key_value_heads / tp)
    full_kv, full_flops = _attention_numbers(heads, kv_heads, head_dim, n_layers - window_layers, kv_element_bytes,
                                             arch.kv_lora_rank, arch.qk_rope_head_dim or 0)
    window_kv, _ = _attention_numbers(heads, kv_heads, head_dim, window_layers, kv_element_bytes,
                                      arch.kv_lora_rank, arch.qk_rope_head_dim or 0)
    return ModelShape(
        weight_bytes=dense * per_weight / tp, expert_weight_bytes=experts * per_weight / tp, expert_fraction=fraction,
        flops_per_token=2 * (dense + experts * fraction) / tp, kv_bytes_per_token=full_kv,
        window_kv_bytes_per_token=window_kv, window=arch.sliding_window or 0, attention_flops_per_pair=full_flops,
        layers=n_layers, hidden_size=arch.hidden_size, tensor_parallel_size=tp,
        fp8=abs(per_weight - 1.0) < 0.01 and quantization in (Quantization.NONE, Quantization.FP8),
    )


def _table_model_shape(shape: dict[str, int]) -> ModelShape:
    """A table model from its `shape` entry (bf16, one GPU: the 70B entry is already one TP-4 rank)."""
    d, ff, hd, layers = shape["d"], shape["ff"], shape["hd"], shape["layers"]
    heads, kv_heads = shape["h"], shape["hkv"]
    per_layer = shape.get("qkv_in", d) * (heads + 2 * kv_heads) * hd + heads * hd * d + 3 * d * ff
    parameters = layers * per_layer + shape["vocab"] * d + shape.get("fc_in", 0) * d
    kv, flops = _attention_numbers(heads, kv_heads, hd, layers, 2.0)
    return ModelShape(weight_bytes=2.0 * parameters, expert_weight_bytes=0.0, expert_fraction=0.0,
                      flops_per_token=2.0 * parameters, kv_bytes_per_token=kv, window_kv_bytes_per_token=0.0,
                      window=0, attention_flops_per_pair=flops, layers=layers, hidden_size=d)


@dataclass(frozen=True)
class TableModel:
    """One model of the table, split into its parts (seconds, on the measured H100)."""

    name: str
    shape: ModelShape
    tokens: tuple[float, ...]     # log of the pass's new tokens, ascending
    rest: tuple[float, ...]       # the cell without its KV read at those tokens (mean over batch × tokens)
    kernel_gaps: float            # rest at 1 token minus the weights at the measured bandwidth

    def rest_at(self, tokens: float) -> float:
        """The non-KV part at `tokens` new tokens: log-linear between measured counts, linear in tokens beyond
        the largest (the last segment's seconds per token)."""
        x = math.log(max(1.0, tokens))
        if x >= self.tokens[-1]:
            n1, n0 = math.exp(self.tokens[-1]), math.exp(self.tokens[-2])
            slope = (self.rest[-1] - self.rest[-2]) / (n1 - n0)
            return self.rest[-1] + slope * (tokens - n1)
        i = bisect.bisect_right(self.tokens, x)
        if i == 0:
            return self.rest[0]
        x0, x1 = self.tokens[i - 1], self.tokens[i]
        return self.rest[i - 1] + (self.rest[i] - self.rest[i - 1]) * (x - x0) / (x1 - x0)


@cache
def _table() -> tuple[dict[str, TableModel], float, float, int]:
    data = json.loads(TABLE_PATH.read_text())
    bandwidth = data["hardware"]["copyReadPlusWriteTBs"] * 1e12
    flops = data["hardware"]["bf16Gemm8192TFLOPs"] * 1e12
    context = int(data["context"])
    models = {}
    for name, entry in data["models"].items():
        shape = _table_model_shape(entry["shape"])
        by_tokens: dict[int, list[float]] = {}
        for cell, ms in entry["ms"].items():
            batch, per_sequence = (int(part) for part in cell.split("x"))
            kv_read = batch * context * shape.kv_bytes_per_token / bandwidth
            by_tokens.setdefault(batch * per_sequence, []).append(ms / 1e3 - kv_read)
        counts = sorted(by_tokens)
        rest = tuple(sum(by_tokens[n]) / len(by_tokens[n]) for n in counts)
        gaps = max(0.0, rest[0] - shape.weight_bytes / bandwidth)
        models[name] = TableModel(name, shape, tuple(math.log(n) for n in counts), rest, gaps)
    return models, bandwidth, flops, context


def table_models() -> dict[str, TableModel]:
    """The table's models, split into parts."""
    return _table()[0]


def nearest_table_model(shape: ModelShape) -> TableModel:
    """The measured model nearest in weight bytes, FLOPs per token and layers (log distances, summed)."""
    def distance(model: TableModel) -> float:
        ref = model.shape
        return (abs(math.log((shape.weight_bytes + shape.expert_weight_bytes) / ref.weight_bytes))
                + abs(math.log(shape.flops_per_token / ref.flops_per_token))
                + abs(math.log(shape.layers / ref.layers)))
    return min(table_models().values(), key=distance)


@dataclass(frozen=True)
class PassCost:
    """Seconds of one forward pass of one model on one GPU product, as the simulated hardware runs it."""

    shape: ModelShape
    reference: TableModel
    kernel_gaps_s: float          # the reference's gaps, per layer × this model's layers, × the engine factor
    bandwidth: float              # bytes/s this GPU streams (the measured H100 copy rate × datasheet ratio)
    flops: float                  # FLOP/s (the measured H100 GEMM rate × datasheet ratio, FP8's for FP8 weights)
    growth_scale: float           # how this model's growth with tokens relates to the reference's

    @property
    def window(self) -> int:
        return self.shape.window

    @property
    def window_kv_bytes_per_token(self) -> float:
        return self.shape.window_kv_bytes_per_token

    def seconds(self, *, tokens: int, tokens_per_sequence: int = 1, kv_tokens: int = 0, window_kv_tokens: int = 0,
                attention_pairs: float | None = None) -> float:
        """A pass over `tokens` new tokens (`tokens_per_sequence` each for decoding sequences) that reads
        `kv_tokens` cached tokens (full layers) and `window_kv_tokens` (window layers). `attention_pairs`
        (new × cached token pairs) defaults to tokens_per_sequence × kv_tokens."""
        if tokens <= 0:
            return 0.0
        shape, ref = self.shape, self.reference
        touched = 1.0 - (1.0 - shape.expert_fraction) ** tokens if shape.expert_fraction else 0.0
        weights = (shape.weight_bytes + shape.expert_weight_bytes * touched) / self.bandwidth
        growth = (ref.rest_at(tokens) - ref.rest[0]) * self.growth_scale
        kv_read = (kv_tokens * shape.kv_bytes_per_token + window_kv_tokens * shape.window_kv_bytes_per_token) / self.bandwidth
        pairs = tokens_per_sequence * kv_tokens if attention_pairs is None else attention_pairs
        attention = max(kv_read, pairs * shape.attention_flops_per_pair / (self.flops * ATTENTION_FLOPS_SHARE))
        seconds = self.kernel_gaps_s + weights + growth + attention
        if shape.tensor_parallel_size > 1:
            link = tokens * shape.hidden_size * ACTIVATION_BYTES * 2 * (shape.tensor_parallel_size - 1) / shape.tensor_parallel_size
            seconds += 2 * shape.layers * (ALLREDUCE_LATENCY_S + link / LINK_BYTES_PER_S)
        return seconds


def pass_cost(shape: ModelShape, gpu: GpuProduct, *, kernel_gap_factor: float = ENGINE_KERNEL_GAP_FACTOR) -> PassCost:
    """`shape` on `gpu`: the nearest table model's parts, scaled (docs/simulator.md, "Hardware profile")."""
    _, measured_bandwidth, measured_flops, _ = _table()
    profile = GPU_PRODUCTS[PROFILE_GPU]
    ref = nearest_table_model(shape)
    bandwidth = measured_bandwidth * gpu.hbm_bandwidth_gb_s / profile.hbm_bandwidth_gb_s
    peak = gpu.fp8_tflops if shape.fp8 and gpu.fp8_tflops else gpu.bf16_tflops
    flops = measured_flops * peak / profile.bf16_tflops
    growth_scale = (shape.flops_per_token / ref.shape.flops_per_token) * (measured_flops / flops)
    return PassCost(
        shape=shape, reference=ref, kernel_gaps_s=ref.kernel_gaps / ref.shape.layers * shape.layers * kernel_gap_factor,
        bandwidth=bandwidth, flops=flops, growth_scale=growth_scale,
    )
