"""The memory plan's reasons: one function per finding code, each message with its numbers and a way out.

Codes: UnknownGpuMemory, WeightsDoNotFit, GpuMemoryUtilizationTooHigh, KVCacheMemoryDoesNotFit,
KVCacheTooSmall (errors: the engine would refuse to start); ConcurrencyBelowMaxNumSeqs,
SGLangReserveTooSmall (warnings); KVCacheMemoryFixed (info).
"""

from __future__ import annotations

import math

from specdeploy.api.status import Finding, Severity
from specdeploy.engines import engine_profile
from specdeploy.engines.profile import MemoryBudget
from specdeploy.planning.budget import PlanInputs, PlanNumbers, max_utilization
from specdeploy.planning.gpus import GPU_PRODUCTS
from specdeploy.planning.overhead import CUDA_CONTEXT_BYTES, GIB


def _finding(code: str, severity: Severity, message: str) -> Finding:
    return Finding.model_construct(code=code, severity=severity, message=message)


def _overhead(numbers: PlanNumbers) -> str:
    return (
        f"{numbers.overhead_gib:.2f} GiB of overhead (activation peak {numbers.activation_peak_gib:.2f}, "
        f"CUDA graphs {numbers.cuda_graph_gib:.2f}, non-torch {numbers.non_torch_gib:.2f})"
    )


def _weights(inputs: PlanInputs, numbers: PlanNumbers) -> str:
    text = f"{numbers.target_weights_gib:.2f} GiB of target weights"
    if inputs.target_quantization.value != "none":
        text += f" ({inputs.target_quantization.value})"
    if numbers.draft_weights_gib:
        text += f" + {numbers.draft_weights_gib:.2f} GiB of draft weights"
    return text + " per GPU"


def _budget(inputs: PlanInputs, numbers: PlanNumbers) -> str:
    memory, utilization = inputs.gpu_memory_gib, inputs.gpu_memory_utilization
    accounting = engine_profile(inputs.engine).memory
    if accounting.budget == MemoryBudget.SHARE_OF_FREE_FOR_WEIGHTS_AND_KV:
        return (f"the {numbers.budget_gib:.2f} GiB that --mem-fraction-static {utilization:g} gives weights and "
                "KV cache")
    if accounting.fixed_kv_cache and inputs.kv_cache_memory_gib is not None:
        return f"the GPU's {memory:g} GiB"
    return f"the {numbers.budget_gib:.2f} GiB budget ({memory:g} GiB × gpuMemoryUtilization {utilization:g})"


def unknown_gpu_memory(product: str) -> Finding:
    known = ", ".join(GPU_PRODUCTS)
    return _finding(
        "UnknownGpuMemory", Severity.ERROR,
        f"`spec.resources.gpu.product` {product!r} is not in the GPU table and `spec.resources.gpu.memoryGiB` "
        f"is not set, so the plan cannot tell how much memory one GPU has; set `spec.resources.gpu.memoryGiB` "
        f"or use a known product ({known})",
    )


def weights_do_not_fit(inputs: PlanInputs, numbers: PlanNumbers) -> Finding:
    return _finding(
        "WeightsDoNotFit", Severity.ERROR,
        f"{_weights(inputs, numbers)} do not fit {_budget(inputs, numbers)}; quantise the target "
        "(`spec.model.quantization`), shard it over more GPUs (`spec.resources.tensorParallelSize`) or "
        "use a smaller draft",
    )


def utilization_too_high(inputs: PlanInputs, numbers: PlanNumbers) -> Finding:
    assert inputs.gpu_memory_gib is not None
    free = inputs.gpu_memory_gib - CUDA_CONTEXT_BYTES / GIB
    return _finding(
        "GpuMemoryUtilizationTooHigh", Severity.ERROR,
        f"`spec.resources.gpuMemoryUtilization` {inputs.gpu_memory_utilization:g} asks vLLM for "
        f"{numbers.budget_gib:.2f} GiB per GPU but only about {free:.2f} GiB are free when it starts (the "
        f"CUDA context takes about {CUDA_CONTEXT_BYTES / GIB:.2f} GiB), so vLLM refuses to start; use at most "
        f"{max_utilization(inputs.gpu_memory_gib):.2f}",
    )


def kv_cache_memory_does_not_fit(inputs: PlanInputs, numbers: PlanNumbers) -> Finding:
    assert inputs.gpu_memory_gib is not None
    total = numbers.weights_gib + numbers.overhead_gib + numbers.kv_cache_gib
    room = inputs.gpu_memory_gib - numbers.weights_gib - numbers.overhead_gib
    return _finding(
        "KVCacheMemoryDoesNotFit", Severity.ERROR,
        f"`spec.serving.kvCacheMemoryGiB` {numbers.kv_cache_gib:g} plus {_weights(inputs, numbers)} and "
        f"{_overhead(numbers)} make {total:.2f} GiB, more than the GPU's {inputs.gpu_memory_gib:g} GiB; set "
        f"it to at most {max(room, 0.0):.2f}",
    )


def kv_cache_too_small(inputs: PlanInputs, numbers: PlanNumbers, longest: int) -> Finding:
    length = inputs.max_model_len
    if numbers.kv_cache_gib <= 0:
        what = (f"{_weights(inputs, numbers)} and {_overhead(numbers)} use all of {_budget(inputs, numbers)}: "
                "nothing is left for the KV cache")
    else:
        what = (f"one request of maxModelLen {length:,} needs {numbers.request_kv_gib:.2f} GiB of KV cache "
                f"({numbers.kv_bytes_per_token:,} bytes per token per GPU) but only {numbers.kv_cache_gib:.2f} "
                f"GiB ({numbers.kv_cache_tokens:,} tokens) are left after {_weights(inputs, numbers)} and "
                f"{_overhead(numbers)}")
    way_out = (f"; the longest `spec.serving.maxModelLen` that fits is {longest:,}" if longest
               else "; free memory first (see the suggestions)")
    return _finding("KVCacheTooSmall", Severity.ERROR, f"{what}, so the engine refuses to start{way_out}")


def concurrency_below_max_num_seqs(inputs: PlanInputs, numbers: PlanNumbers) -> Finding:
    concurrency = numbers.kv_cache_tokens / inputs.max_model_len
    return _finding(
        "ConcurrencyBelowMaxNumSeqs", Severity.WARNING,
        f"the KV cache holds {numbers.kv_cache_tokens:,} tokens: {concurrency:.2f} sequences of maxModelLen "
        f"{inputs.max_model_len:,} at once, not the {inputs.max_num_seqs} of `spec.serving.maxNumSeqs`; "
        "when that many long requests run together the engine preempts and queues them. Lower "
        f"`spec.serving.maxNumSeqs` to {max(1, math.floor(concurrency))} or `spec.serving.maxModelLen`, or add "
        "memory if they are expected",
    )


def sglang_reserve_too_small(inputs: PlanInputs, numbers: PlanNumbers) -> Finding:
    fraction = inputs.gpu_memory_utilization
    free = numbers.reserve_gib / (1 - fraction) if fraction < 1 else 0.0
    suggested = math.floor((1 - numbers.reserve_needed_gib / free) * 100) / 100 if free else 0.0
    return _finding(
        "SGLangReserveTooSmall", Severity.WARNING,
        f"SGLang keeps activations, CUDA graphs and the draft's weights outside --mem-fraction-static "
        f"{fraction:g}: the {numbers.reserve_gib:.2f} GiB left there is less than the estimated "
        f"{numbers.reserve_needed_gib:.2f} GiB they need (activation peak {numbers.activation_peak_gib:.2f}, "
        f"CUDA graphs {numbers.cuda_graph_gib:.2f}, draft weights {numbers.draft_weights_gib:.2f}), so it may run "
        f"out of memory capturing CUDA graphs; lower `spec.resources.gpuMemoryUtilization` to {suggested:.2f}",
    )


def kv_cache_memory_fixed(inputs: PlanInputs) -> Finding:
    return _finding(
        "KVCacheMemoryFixed", Severity.INFO,
        f"`spec.serving.kvCacheMemoryGiB` fixes the KV cache at {inputs.kv_cache_memory_gib:g} GiB per GPU: "
        "vLLM skips its memory profiling and ignores `spec.resources.gpuMemoryUtilization`",
    )
