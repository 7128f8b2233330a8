"""KV cache bytes per token, per GPU, for the attention layers of a target and its draft.

vLLM's page for one layer (`vllm/v1/kv_cache_interface.py`, `AttentionSpec.page_size_bytes`) is
2 × block_size × kv_heads × head_size × dtype bytes; MLA layers (`MLAAttentionSpec`) store one latent
head of kv_lora_rank + qk_rope_head_dim with no factor 2, and the latent cache is replicated on every
tensor-parallel rank (vLLM shards MLA attention by query heads only; vllm-project/vllm#51454 measures
7.7x more KV cache with DP 8 than with TP 8). Grouped-query KV heads are
split over tensor parallelism, at least one per GPU (`ModelConfig.get_num_kv_heads`).

A sliding-window layer holds at most min(window - 1 + max_num_batched_tokens, max_model_len) tokens
per request (`SlidingWindowSpec.max_memory_usage_bytes`). The plan folds that into one per-token cost
at maxModelLen: full-attention bytes plus the sliding layers' bytes scaled by the share of the
request they hold. Tokens ÷ maxModelLen is then exactly the number of maxModelLen requests that fit,
vLLM's "Maximum concurrency"; current vLLM prints "GPU KV cache size" as that concurrency × max_model_len
too (`kv_cache_utils.py`: the naive num_blocks ÷ groups count "underestimates capacity" of sliding-window
models, which older releases printed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdeploy.api.spec import Architecture
from specdeploy.planning.weights import head_dim

BLOCK_SIZE = 16
"""Tokens per KV cache block (vLLM's default `--block-size` on CUDA)."""


@dataclass(frozen=True, slots=True)
class KvGroup:
    """Attention layers that hold the same tokens: their bytes per token on one GPU, and their window."""

    bytes_per_token: int
    window: int | None = None  # None: full attention


def layer_bytes_per_token(arch: Architecture, tensor_parallel_size: int, kv_dtype_bytes: int) -> int:
    """KV bytes one attention layer stores per token on one GPU."""
    if arch.kv_lora_rank is not None:
        return (arch.kv_lora_rank + (arch.qk_rope_head_dim or 0)) * kv_dtype_bytes
    kv_heads = max(1, math.ceil(arch.num_key_value_heads / tensor_parallel_size))
    return 2 * kv_heads * head_dim(arch) * kv_dtype_bytes


def model_groups(
    arch: Architecture, tensor_parallel_size: int, kv_dtype_bytes: int, layers: int | None = None
) -> list[KvGroup]:
    """The KV groups of `layers` attention layers shaped like `arch` (all of its layers by default)."""
    per_layer = layer_bytes_per_token(arch, tensor_parallel_size, kv_dtype_bytes)
    count = arch.num_layers if layers is None else layers
    window = arch.sliding_window
    if window is None or layers is not None:
        return [KvGroup(per_layer * count)] if count else []
    sliding = count if arch.sliding_window_layers is None else min(arch.sliding_window_layers, count)
    groups = []
    if count - sliding:
        groups.append(KvGroup(per_layer * (count - sliding)))
    if sliding:
        groups.append(KvGroup(per_layer * sliding, window))
    return groups


def held_tokens(group: KvGroup, max_model_len: int, max_num_batched_tokens: int) -> int:
    """Tokens of one maxModelLen request that `group` keeps."""
    if group.window is None:
        return max_model_len
    return min(group.window - 1 + max_num_batched_tokens, max_model_len)


def bytes_per_token(groups: list[KvGroup], max_model_len: int, max_num_batched_tokens: int) -> int:
    """Per-token cost at maxModelLen: full layers in full, sliding layers by the share they hold."""
    full = sum(g.bytes_per_token for g in groups if g.window is None)
    sliding = sum(
        g.bytes_per_token * held_tokens(g, max_model_len, max_num_batched_tokens)
        for g in groups if g.window is not None
    )
    return full + math.ceil(sliding / max_model_len)


def kv_cache_tokens(kv_cache_bytes: float, kv_bytes_per_token: int) -> int:
    """Tokens `kv_cache_bytes` hold, in whole blocks of BLOCK_SIZE tokens (0 when nothing fits)."""
    if kv_cache_bytes <= 0 or kv_bytes_per_token <= 0:
        return 0
    return int(kv_cache_bytes) // (kv_bytes_per_token * BLOCK_SIZE) * BLOCK_SIZE
