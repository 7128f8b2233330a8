"""Concrete fixes for a rejected memory plan, each re-planned to say what it gives.

Every candidate changes one spec field; it is planned again with the same arithmetic, and its message
says whether that alone fits (with the KV tokens and concurrency it gives) or how far it gets. The
ones that fit come first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from specdeploy.api.spec import METHODS_WITH_DRAFT, Method, Quantization
from specdeploy.api.status import Suggestion
from specdeploy.engines import MULTI_NODE_ENGINES, engine_profile
from specdeploy.engines.profile import MemoryBudget
from specdeploy.planning.budget import (
    PlanInputs,
    PlanNumbers,
    compute,
    longest_max_model_len,
    max_utilization,
)
from specdeploy.planning.catalog import CATALOG, quantised_checkpoints_of
from specdeploy.planning.gpus import GPU_PRODUCTS
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.topology import tensor_parallel_fits

MAX_SUGGESTIONS = 8


@dataclass(frozen=True, slots=True)
class _Candidate:
    field: str
    value: str
    inputs: PlanInputs
    change: str  # what the change does, before the outcome


def _outcome(inputs: PlanInputs, numbers: PlanNumbers) -> str:
    if numbers.fits:
        concurrency = numbers.kv_cache_tokens / inputs.max_model_len
        return (f"fits: {numbers.kv_cache_tokens:,} KV cache tokens per GPU, {concurrency:.2f} sequences of "
                f"maxModelLen {inputs.max_model_len:,} at once")
    if not numbers.startup_fits:
        return "not enough alone: vLLM would still refuse gpuMemoryUtilization above the memory free at startup"
    return f"not enough alone: still {numbers.shortfall_gib:.2f} GiB per GPU short"


def _gib(value: float) -> str:
    return f"{value:.2f} GiB"


def _target_quantization(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    """FP8 for a 16-bit checkpoint; for an 8-bit one, 4-bit AWQ, which needs an AWQ checkpoint (named when the
    catalog has one of the same base model)."""
    current, stored = inputs.target_quantization, inputs.target.stored_quantization
    if current == Quantization.NONE and stored is not None and stored.scheme is not None:
        current = stored.scheme   # a quantised checkpoint: --quantization fp8 would contradict it
    eight_bit = current == Quantization.NONE and (inputs.target.checkpoint_bytes_per_param or 2.0) > 1.0
    if eight_bit:
        variant = replace(inputs, target_quantization=Quantization.FP8)
        yield _Candidate("spec.model.quantization", "fp8", variant,
                         f"FP8 target weights ({_gib(numbers.target_weights_gib)} per GPU now; vLLM and SGLang "
                         "quantise a 16-bit checkpoint as they load it; acceptance drops slightly)")
    elif current in (Quantization.FP8, Quantization.INT8) and not numbers.weights_fit:
        variant = replace(inputs, target_quantization=Quantization.AWQ)
        target = inputs.target
        named = quantised_checkpoints_of(target.base_model or target.name, Quantization.AWQ)
        checkpoint = f"such as {named[0]}" if named else "an AWQ checkpoint"
        yield _Candidate("spec.model.quantization", "awq", variant,
                         f"4-bit AWQ target weights (with {checkpoint} in `spec.model.name`; acceptance drops "
                         "more than with 8 bits)")


def _draft_quantization(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    draft = inputs.draft
    if draft is None or draft.kind != ModelKind.BASE or inputs.draft_quantization != Quantization.NONE:
        return
    variant = replace(inputs, draft_quantization=Quantization.FP8)
    yield _Candidate("spec.speculation.draft.quantization", "fp8", variant,
                     f"FP8 draft weights ({_gib(numbers.draft_weights_gib)} per GPU now)")


def _kv_cache_dtype(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    if inputs.kv_dtype_bytes == 1 or not numbers.weights_fit:
        return
    variant = replace(inputs, kv_dtype_bytes=1)
    yield _Candidate("spec.serving.kvCacheDtype", "fp8", variant,
                     f"an FP8 KV cache (half of {numbers.kv_bytes_per_token:,} bytes per token per GPU)")


def _tensor_parallel(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    """The smallest of 2×, 4× and 8× the tensor parallelism that fits, else the first with how far it gets; only
    sizes the engine can shard the model's heads over, within one node's GPUs (planning/topology.py); pods of more
    GPUs than a node holds are never suggested (`_pipeline_parallel` spans nodes instead)."""
    tp = inputs.tensor_parallel_size
    first: _Candidate | None = None
    sizes = [size for size in (tp * 2, tp * 4, tp * 8)
             if size <= inputs.gpus_per_node and tensor_parallel_fits(inputs.target.architecture, size)]
    for size in sizes:
        draft_tp = size if inputs.draft_tensor_parallel_size == tp else inputs.draft_tensor_parallel_size
        variant = replace(inputs, tensor_parallel_size=size, draft_tensor_parallel_size=draft_tp)
        count = inputs.gpu_count
        also = f"; also set `spec.resources.gpu.count` to {size}" if count is not None and count < size else ""
        candidate = _Candidate("spec.resources.tensorParallelSize", str(size), variant,
                               f"shard the model over {size} GPUs per pod{also}")
        if compute(variant).fits:
            yield candidate
            return
        first = first or candidate
    if first is not None:
        yield first


PIPELINE_STAGES = (2, 3, 4)
"""Pipeline sizes suggested when a node's GPUs are not enough: a layout of 2 to 4 nodes."""


def _pipeline_parallel(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    """When the weights do not fit a whole node's GPUs: the fewest pipeline stages that fit, each a node at the same
    TP (else the most, with how far they get); only for engines that launch across nodes. Below a node's TP,
    `_tensor_parallel` comes first: one field at a time."""
    per_node, tp = inputs.gpus_per_node, inputs.tensor_parallel_size
    # planning/topology.py refuses pipeline stages to an engine that cannot speculate with them (SGLang).
    stages_refused = inputs.speculating and bool(engine_profile(inputs.engine).multi_node.pipeline_speculation_refusal)
    if (inputs.engine not in MULTI_NODE_ENGINES or numbers.weights_fit or inputs.pipeline_parallel_size > 1
            or stages_refused
            or tp != per_node or inputs.gpu_count not in (None, per_node)):
        return
    candidate: _Candidate | None = None
    for stages in PIPELINE_STAGES:
        variant = replace(inputs, pipeline_parallel_size=stages)
        candidate = _Candidate("spec.resources.pipelineParallelSize", str(stages), variant,
                               f"lay the model out across {stages} nodes of {per_node} GPUs, TP {tp} within a node × "
                               f"{stages} pipeline stages (a LeaderWorkerSet per replica)")
        if compute(variant).fits:
            break
    if candidate is not None:
        yield candidate


def _max_model_len(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    if not (numbers.weights_fit and numbers.startup_fits and numbers.kv_allocatable) or numbers.holds_one_request:
        return
    longest = longest_max_model_len(inputs, numbers)
    if longest < 16:
        return
    variant = replace(inputs, max_model_len=longest)
    yield _Candidate("spec.serving.maxModelLen", str(longest), variant,
                     f"the longest context the KV cache holds (now {inputs.max_model_len:,}); longer requests "
                     "are refused")


def _same_family_drafts(target: ModelInfo, draft: ModelInfo) -> list[ModelInfo]:
    """Catalog draft models of the draft's family and vocabulary, smaller than it, largest first."""
    seen: set[int] = set()
    found = []
    for model in CATALOG.values():
        arch = model.architecture
        if (model.kind != ModelKind.BASE or model.family != draft.family or not draft.family
                or arch.vocab_size != draft.architecture.vocab_size
                or arch.num_parameters >= draft.architecture.num_parameters
                or arch.num_parameters in seen or model.name == target.name):
            continue
        seen.add(arch.num_parameters)
        found.append(model)
    return sorted(found, key=lambda model: -model.architecture.num_parameters)


def _smaller_draft(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    draft = inputs.draft
    if draft is None or draft.kind != ModelKind.BASE or inputs.method != Method.DRAFT_MODEL:
        return
    for model in _same_family_drafts(inputs.target, draft):
        variant = replace(inputs, draft=model)
        if compute(variant).fits:
            yield _Candidate("spec.speculation.draft.name", model.name, variant,
                             f"a smaller {draft.family} draft ({model.architecture.num_parameters / 1e9:.2f}B "
                             f"parameters instead of {draft.architecture.num_parameters / 1e9:.2f}B)")
            return


def _ngram(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    if inputs.method not in (*METHODS_WITH_DRAFT, Method.MTP):
        return
    variant = replace(inputs, method=Method.NGRAM, draft=None)
    removed = "remove `spec.speculation.draft`; " if inputs.draft is not None else ""
    yield _Candidate("spec.speculation.method", "ngram", variant,
                     f"{removed}n-gram drafting proposes tokens from the prompt itself, with no draft weights "
                     "or draft KV layers (it pays off on repetitive output such as code edits and RAG)")


def _utilization(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    assert inputs.gpu_memory_gib is not None
    accounting = engine_profile(inputs.engine).memory
    if accounting.budget != MemoryBudget.SHARE_OF_GPU or inputs.kv_cache_memory_gib is not None:
        return
    highest = max_utilization(inputs.gpu_memory_gib) if accounting.start_needs_budget_free else 0.95
    target = highest if not numbers.startup_fits else min(0.95, highest)
    if math.isclose(target, inputs.gpu_memory_utilization) or (
            numbers.startup_fits and target <= inputs.gpu_memory_utilization):
        return
    variant = replace(inputs, gpu_memory_utilization=target)
    yield _Candidate("spec.resources.gpuMemoryUtilization", f"{target:g}", variant,
                     f"let the engine use {target:g} of each GPU (now {inputs.gpu_memory_utilization:g})")


def _kv_cache_memory(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    if inputs.kv_cache_memory_gib is None or inputs.gpu_memory_gib is None:
        return
    room = math.floor((inputs.gpu_memory_gib - numbers.weights_gib - numbers.overhead_gib) * 100) / 100
    if room <= 0 or room >= inputs.kv_cache_memory_gib:
        return
    variant = replace(inputs, kv_cache_memory_gib=room)
    yield _Candidate("spec.serving.kvCacheMemoryGiB", f"{room:g}", variant,
                     f"the largest KV cache the GPU has room for (now {inputs.kv_cache_memory_gib:g} GiB)")


def _larger_gpu(inputs: PlanInputs, numbers: PlanNumbers) -> Iterator[_Candidate]:
    """The last resort: the largest GPU in the table, when it has more memory."""
    assert inputs.gpu_memory_gib is not None
    largest = max(GPU_PRODUCTS.values(), key=lambda gpu: gpu.memory_gib)
    if largest.memory_gib > inputs.gpu_memory_gib:
        variant = replace(inputs, gpu_memory_gib=largest.memory_gib)
        yield _Candidate("spec.resources.gpu.product", largest.name, variant,
                         f"a GPU with {largest.memory_gib:g} GiB (and `spec.resources.gpu.memoryGiB` unset or "
                         f"{largest.memory_gib:g})")


_SOURCES = (
    _target_quantization, _draft_quantization, _tensor_parallel, _pipeline_parallel, _max_model_len, _kv_cache_dtype,
    _smaller_draft, _ngram, _utilization, _kv_cache_memory,
)


def suggest(inputs: PlanInputs, numbers: PlanNumbers) -> list[Suggestion]:
    """Suggestions for a rejected plan, those that fit first; never empty while a larger GPU or more
    tensor parallelism exists."""
    candidates = [candidate for source in _SOURCES for candidate in source(inputs, numbers)]
    if not candidates:
        candidates = list(_larger_gpu(inputs, numbers))
    planned = [(candidate, compute(candidate.inputs)) for candidate in candidates]
    planned.sort(key=lambda pair: not pair[1].fits)
    return [
        Suggestion.model_construct(
            field=candidate.field, value=candidate.value,
            message=f"{candidate.change}: {_outcome(candidate.inputs, result)}",
        )
        for candidate, result in planned[:MAX_SUGGESTIONS]
    ]


def unknown_memory_suggestions(product: str) -> list[Suggestion]:
    example = next(iter(GPU_PRODUCTS.values()))
    return [Suggestion.model_construct(
        field="spec.resources.gpu.memoryGiB", value=f"{example.memory_gib:g}",
        message=(f"the memory of one GPU in GiB as the engine sees it (an {example.name} reports "
                 f"{example.memory_gib:g}); {product!r} is not a known product, so it must be given"),
    )]
