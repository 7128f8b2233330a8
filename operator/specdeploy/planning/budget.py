"""Per-GPU memory arithmetic for one deployment, with each engine's own way of sizing the KV cache.

- vLLM: the budget is total memory × gpu_memory_utilization (per GPU, of the total, not the free
  memory); KV cache = budget − weights − activation peak − non-torch memory − CUDA graphs (vLLM
  `gpu_worker.determine_available_memory`; CUDA graph memory is estimated and subtracted by default
  since v0.21). vLLM refuses to start when the budget exceeds the memory free at startup.
  `--kv-cache-memory` (spec.serving.kvCacheMemoryGiB) replaces all of that: the KV cache is exactly
  that size and utilisation is ignored, so it fits when weights + overhead + KV cache fit the GPU.
- SGLang: `--mem-fraction-static` (rendered from gpuMemoryUtilization) is the share of the memory free
  at startup for weights and KV pool together: KV = fraction × free − target weights (sglang
  `model_runner.profile_max_num_token`: rest = available after load − total × (1 − fraction)).
  Activations, CUDA graphs and the draft model, loaded after the pool, live in the other share.
- TensorRT-LLM: `kv_cache_config.free_gpu_memory_fraction` is the share of the memory still free after
  the weights and a profiling forward pass that goes to the KV cache. The plan sizes the KV cache
  like vLLM and `trtllm_free_gpu_memory_fraction` gives the fraction that makes TensorRT-LLM
  allocate exactly that.

A layout of pipeline stages (spec.resources.pipelineParallelSize) is planned for its last stage: the stage holds
the target's layers ÷ stages, rounded up (vLLM `get_pp_indices`, vllm/distributed/utils.py, splits the layers evenly,
a remainder to the other stages, so no stage holds more), the same share of its weights (embedding and lm_head
counted as spread evenly, an approximation) and KV, and the whole drafter: vLLM builds the drafter on the last
pipeline rank only (`GPUModelRunner.__init__`, vllm/v1/worker/gpu_model_runner.py: "we put the entire draft model on
the last PP rank"), MTP layers included. SGLang refuses pipeline stages with speculation (planning/topology.py).
"""


from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specdeploy.api.spec import (
    METHODS_WITH_DRAFT,
    EngineKind,
    KvCacheDtype,
    Method,
    Quantization,
    SpeculativeDeploymentSpec,
)
from specdeploy.api.status import MemoryPlan
from specdeploy.engines import engine_profile
from specdeploy.engines.profile import MemoryBudget
from specdeploy.planning import kv, overhead
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.modelinfo import ModelInfo, ModelKind
from specdeploy.planning.topology import GPUS_PER_NODE, gpus_per_node
from specdeploy.planning.weights import draft_weight_bytes, model_weight_bytes, mtp_weight_bytes

GIB = 2**30
DTYPE_BYTES = 2  # bfloat16 and float16


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the arithmetic reads, taken out of the spec once (suggestions re-plan variants of it)."""

    engine: EngineKind
    gpu_memory_gib: float | None
    gpu_memory_utilization: float
    tensor_parallel_size: int
    draft_tensor_parallel_size: int
    target: ModelInfo
    target_quantization: Quantization
    method: Method | None  # None: no speculation
    draft: ModelInfo | None
    draft_quantization: Quantization
    num_speculative_tokens: int
    kv_dtype_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_memory_gib: float | None
    gpu_count: int | None = None
    pipeline_parallel_size: int = 1
    gpus_per_node: int = GPUS_PER_NODE

    @property
    def stage_layers(self) -> int:
        """The target's layers on the last pipeline stage, rounded up: all of them without pipeline parallelism."""
        return math.ceil(self.target.architecture.num_layers / self.pipeline_parallel_size)

    @property
    def mtp_layers(self) -> int:
        if self.method != Method.MTP:
            return 0
        return self.target.architecture.num_nextn_predict_layers

    @property
    def speculating(self) -> bool:
        return self.method is not None


@dataclass(frozen=True, slots=True)
class PlanNumbers:
    """The arithmetic's result, per GPU, in GiB unless named otherwise."""

    budget_gib: float
    target_weights_gib: float
    draft_weights_gib: float
    activation_peak_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_cache_tokens: int
    request_tokens: int  # one maxModelLen request, in whole blocks
    weights_fit: bool = True
    startup_fits: bool = True  # vLLM: the budget is not more than the memory free at startup
    kv_allocatable: bool = True  # kvCacheMemoryGiB: weights + overhead + KV cache fit the GPU
    reserve_gib: float = 0.0  # SGLang: the share outside mem-fraction-static
    reserve_needed_gib: float = 0.0

    @property
    def weights_gib(self) -> float:
        return self.target_weights_gib + self.draft_weights_gib

    @property
    def overhead_gib(self) -> float:
        return self.activation_peak_gib + self.non_torch_gib + self.cuda_graph_gib

    @property
    def request_kv_gib(self) -> float:
        """KV cache one maxModelLen request needs."""
        return self.request_tokens * self.kv_bytes_per_token / GIB

    @property
    def holds_one_request(self) -> bool:
        return self.kv_cache_tokens >= self.request_tokens

    @property
    def fits(self) -> bool:
        return self.weights_fit and self.startup_fits and self.kv_allocatable and self.holds_one_request

    @property
    def shortfall_gib(self) -> float:
        """How much more memory per GPU this plan needs to hold one maxModelLen request."""
        if not self.kv_allocatable:
            return max(0.0, self.weights_gib + self.overhead_gib + self.kv_cache_gib - self.budget_gib)
        return max(0.0, self.request_kv_gib - self.kv_cache_gib)


def gpu_memory_gib(spec: SpeculativeDeploymentSpec) -> float | None:
    """Memory of one GPU: `spec.resources.gpu.memoryGiB`, else the product table's, else None."""
    gpu = spec.resources.gpu
    if gpu.memory_gib is not None:
        return gpu.memory_gib
    product = find_gpu(gpu.product)
    return product.memory_gib if product is not None else None


def resolved_max_model_len(spec: SpeculativeDeploymentSpec, target: ModelInfo) -> int:
    return spec.serving.max_model_len or target.architecture.max_position_embeddings


def plan_inputs(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None, *, speculate: bool = True
) -> PlanInputs:
    speculation = spec.speculation
    method = speculation.method if speculate and speculation.enabled else None
    uses_draft = method in METHODS_WITH_DRAFT and draft is not None
    draft_spec = speculation.draft
    tp = spec.resources.tensor_parallel_size
    draft_tp = draft_spec.tensor_parallel_size if draft_spec and draft_spec.tensor_parallel_size else tp
    return PlanInputs(
        engine=spec.engine.kind,
        gpu_memory_gib=gpu_memory_gib(spec),
        gpu_memory_utilization=spec.resources.gpu_memory_utilization,
        tensor_parallel_size=tp,
        draft_tensor_parallel_size=draft_tp,
        target=target,
        target_quantization=spec.model.quantization,
        method=method,
        draft=draft if uses_draft else None,
        draft_quantization=draft_spec.quantization if draft_spec else Quantization.NONE,
        num_speculative_tokens=speculation.num_speculative_tokens,
        kv_dtype_bytes=DTYPE_BYTES if spec.serving.kv_cache_dtype == KvCacheDtype.AUTO else 1,
        max_model_len=resolved_max_model_len(spec, target),
        max_num_seqs=spec.serving.max_num_seqs,
        max_num_batched_tokens=spec.serving.max_num_batched_tokens,
        kv_cache_memory_gib=spec.serving.kv_cache_memory_gib,
        gpu_count=spec.resources.gpu.count,
        pipeline_parallel_size=spec.resources.pipeline_parallel_size,
        gpus_per_node=gpus_per_node(spec),
    )


def without_speculation(inputs: PlanInputs) -> PlanInputs:
    return replace(inputs, method=None, draft=None)


def kv_groups(inputs: PlanInputs) -> list[kv.KvGroup]:
    """KV groups of the target's layers (the last pipeline stage's), the draft's (all of a draft model's, an EAGLE
    head's own layers) and the target's MTP layers when method is mtp."""
    target = inputs.target.architecture
    tp, kv_bytes = inputs.tensor_parallel_size, inputs.kv_dtype_bytes
    groups = kv.model_groups(target, tp, kv_bytes)
    if inputs.pipeline_parallel_size > 1:   # the last stage's share of each group
        groups = [replace(group, bytes_per_token=math.ceil(group.bytes_per_token * inputs.stage_layers
                                                           / target.num_layers)) for group in groups]
    draft = inputs.draft
    if draft is not None:
        arch, draft_tp = draft.architecture, inputs.draft_tensor_parallel_size
        layers = None if draft.kind == ModelKind.BASE else arch.num_layers
        groups += kv.model_groups(arch, draft_tp, kv_bytes, layers=layers)
    if inputs.mtp_layers:
        groups += kv.model_groups(target, tp, kv_bytes, layers=inputs.mtp_layers)
    return groups


def _draft_weights_gib(inputs: PlanInputs) -> float:
    if inputs.draft is not None:
        size = draft_weight_bytes(inputs.draft, inputs.draft_quantization, DTYPE_BYTES)
        return size / inputs.draft_tensor_parallel_size / GIB
    if inputs.mtp_layers:
        size = mtp_weight_bytes(inputs.target, inputs.target_quantization, DTYPE_BYTES)
        return size / inputs.tensor_parallel_size / GIB
    return 0.0


def compute(inputs: PlanInputs) -> PlanNumbers:
    """The per-GPU memory plan for `inputs` (whose GPU memory must be known)."""
    assert inputs.gpu_memory_gib is not None
    memory, tp = inputs.gpu_memory_gib, inputs.tensor_parallel_size
    target, draft = inputs.target, inputs.draft
    stage_share = inputs.stage_layers / target.architecture.num_layers
    target_weights = model_weight_bytes(target, inputs.target_quantization, DTYPE_BYTES) * stage_share / tp / GIB
    draft_weights = _draft_weights_gib(inputs)
    weights = target_weights + draft_weights

    batched = inputs.max_num_batched_tokens
    per_token = kv.bytes_per_token(kv_groups(inputs), inputs.max_model_len, batched)
    request_tokens = math.ceil(inputs.max_model_len / kv.BLOCK_SIZE) * kv.BLOCK_SIZE

    activation = overhead.activation_peak_bytes(
        target.architecture,
        draft.architecture if draft is not None else None,
        max_num_seqs=inputs.max_num_seqs,
        max_num_batched_tokens=batched,
        tensor_parallel_size=tp,
        draft_tensor_parallel_size=inputs.draft_tensor_parallel_size,
        dtype_bytes=DTYPE_BYTES,
    ) / GIB
    non_torch = overhead.non_torch_bytes(tp) / GIB
    layers = inputs.stage_layers + inputs.mtp_layers
    if draft is not None:
        layers += draft.architecture.num_layers
    query_len = 1 + inputs.num_speculative_tokens if inputs.speculating else 1
    cuda_graphs = overhead.cuda_graph_bytes(layers, inputs.max_num_seqs, batched, query_len) / GIB
    overheads = activation + non_torch + cuda_graphs
    utilization = inputs.gpu_memory_utilization

    weights_fit, startup_fits, allocatable = True, True, True
    reserve, reserve_needed = 0.0, 0.0
    accounting = engine_profile(inputs.engine).memory
    if accounting.budget == MemoryBudget.SHARE_OF_FREE_FOR_WEIGHTS_AND_KV:
        nccl = overhead.non_torch_bytes(tp) - overhead.NON_TORCH_BYTES  # allocated before SGLang measures
        free = memory - (overhead.CUDA_CONTEXT_BYTES + nccl) / GIB
        budget = utilization * free
        kv_cache = budget - target_weights
        weights_fit = target_weights <= budget
        reserve = (1 - utilization) * free
        reserve_needed = draft_weights + activation + cuda_graphs + overhead.NON_TORCH_BYTES / GIB
    elif accounting.fixed_kv_cache and inputs.kv_cache_memory_gib is not None:
        budget = memory
        kv_cache = inputs.kv_cache_memory_gib
        weights_fit = weights <= memory
        allocatable = weights + overheads + kv_cache <= memory
    else:
        budget = memory * utilization
        kv_cache = budget - weights - overheads
        weights_fit = weights <= budget
        if accounting.start_needs_budget_free:
            startup_fits = budget <= memory - overhead.CUDA_CONTEXT_BYTES / GIB

    return PlanNumbers(
        budget_gib=budget,
        target_weights_gib=target_weights,
        draft_weights_gib=draft_weights,
        activation_peak_gib=activation,
        non_torch_gib=non_torch,
        cuda_graph_gib=cuda_graphs,
        kv_cache_gib=kv_cache,
        kv_bytes_per_token=per_token,
        kv_cache_tokens=kv.kv_cache_tokens(kv_cache * GIB, per_token) if allocatable else 0,
        request_tokens=request_tokens,
        weights_fit=weights_fit,
        startup_fits=startup_fits,
        kv_allocatable=allocatable,
        reserve_gib=reserve,
        reserve_needed_gib=reserve_needed,
    )


def max_utilization(memory_gib: float) -> float:
    """The highest gpuMemoryUtilization vLLM accepts on a GPU of `memory_gib` (two decimals, down)."""
    return math.floor((memory_gib - overhead.CUDA_CONTEXT_BYTES / GIB) / memory_gib * 100) / 100


def trtllm_free_gpu_memory_fraction(plan: MemoryPlan, gpu_memory_gib: float) -> float:
    """TensorRT-LLM's `kv_cache_config.free_gpu_memory_fraction` that allocates the plan's KV cache.

    TensorRT-LLM gives the KV cache that fraction of the memory still free after the CUDA context, the
    weights and its profiling forward pass (activations and non-torch memory); CUDA graphs are captured
    afterwards from the rest. Rounded down to four decimals so the engine never takes more than planned;
    0 when the plan leaves no KV cache.
    """
    per_gpu = plan.per_gpu
    free = (
        gpu_memory_gib - overhead.CUDA_CONTEXT_BYTES / GIB - per_gpu.target_weights_gib
        - per_gpu.draft_weights_gib - per_gpu.activation_peak_gib - per_gpu.non_torch_gib
    )
    if free <= 0 or per_gpu.kv_cache_gib <= 0:
        return 0.0
    return min(1.0, math.floor(per_gpu.kv_cache_gib / free * 10_000) / 10_000)


def longest_max_model_len(inputs: PlanInputs, numbers: PlanNumbers) -> int:
    """The longest maxModelLen (whole blocks, at most the planned one) whose request fits the plan's
    KV cache; 0 when not even one block does. Longer contexts need more KV per request, so a bisection
    on the request's size finds it."""
    groups, batched = kv_groups(inputs), inputs.max_num_batched_tokens
    kv_bytes = numbers.kv_cache_gib * GIB

    def holds(length: int) -> bool:
        return kv.kv_cache_tokens(kv_bytes, kv.bytes_per_token(groups, length, batched)) >= length

    low, high = 0, inputs.max_model_len // kv.BLOCK_SIZE  # in blocks
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle * kv.BLOCK_SIZE):
            low = middle
        else:
            high = middle - 1
    return low * kv.BLOCK_SIZE
