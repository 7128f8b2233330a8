"""The memory plan: does target + draft + KV cache fit, what does the draft cost, and what would fix it.

    plan = plan_memory(spec, resolve_target(spec), resolve_draft(spec))

Verdicts (../shared/DESIGN.md): weights do not fit → Rejected; the KV cache cannot hold one request
of maxModelLen → Rejected (the engine refuses to start); it holds fewer than maxNumSeqs of them →
FitsWithWarnings naming the real concurrency; otherwise Fits. The arithmetic is in `budget`, the
messages in `memory_findings`, the fixes in `suggestions`; docs/memory-model.md explains the model.
"""

from __future__ import annotations

from dataclasses import replace

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import DraftCost, Finding, MemoryPlan, PerGpuMemory, Severity, Verdict
from specdeploy.engines import engine_profile
from specdeploy.engines.profile import MemoryBudget
from specdeploy.planning import memory_findings as findings
from specdeploy.planning.budget import (
    PlanInputs,
    PlanNumbers,
    compute,
    gpu_memory_gib,
    longest_max_model_len,
    plan_inputs,
    trtllm_free_gpu_memory_fraction,
    without_speculation,
)
from specdeploy.planning.kv import kv_cache_tokens
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.suggestions import suggest, unknown_memory_suggestions

__all__ = ["gpu_memory_gib", "kv_cache_tokens", "plan_memory", "trtllm_free_gpu_memory_fraction"]


def _round(value: float) -> float:
    return round(value, 3)


def reasons(inputs: PlanInputs, numbers: PlanNumbers) -> list[Finding]:
    """Why the plan has its verdict: errors first, then warnings and notes."""
    found: list[Finding] = []
    if not numbers.weights_fit:
        found.append(findings.weights_do_not_fit(inputs, numbers))
    if not numbers.startup_fits:
        found.append(findings.utilization_too_high(inputs, numbers))
    if numbers.weights_fit and not numbers.kv_allocatable:
        found.append(findings.kv_cache_memory_does_not_fit(inputs, numbers))
    if numbers.weights_fit and numbers.kv_allocatable and not numbers.holds_one_request:
        found.append(findings.kv_cache_too_small(inputs, numbers, longest_max_model_len(inputs, numbers)))
    if numbers.fits and numbers.kv_cache_tokens < inputs.max_model_len * inputs.max_num_seqs:
        found.append(findings.concurrency_below_max_num_seqs(inputs, numbers))
    accounting = engine_profile(inputs.engine).memory
    if (accounting.budget == MemoryBudget.SHARE_OF_FREE_FOR_WEIGHTS_AND_KV
            and numbers.reserve_needed_gib > numbers.reserve_gib):
        found.append(findings.sglang_reserve_too_small(inputs, numbers))
    if accounting.fixed_kv_cache and inputs.kv_cache_memory_gib is not None:
        found.append(findings.kv_cache_memory_fixed(inputs))
    return found


def _draft_cost(inputs: PlanInputs, numbers: PlanNumbers, baseline: PlanNumbers) -> DraftCost:
    tokens = baseline.kv_cache_tokens - numbers.kv_cache_tokens
    return DraftCost.model_construct(
        kv_cache_gib=_round(baseline.kv_cache_gib - numbers.kv_cache_gib),
        kv_cache_tokens=tokens,
        concurrent_sequences=round(tokens / inputs.max_model_len, 2),
    )


def _per_gpu(numbers: PlanNumbers) -> PerGpuMemory:
    return PerGpuMemory.model_construct(
        budget_gib=_round(numbers.budget_gib),
        target_weights_gib=_round(numbers.target_weights_gib),
        draft_weights_gib=_round(numbers.draft_weights_gib),
        overhead_gib=_round(numbers.overhead_gib),
        activation_peak_gib=_round(numbers.activation_peak_gib),
        non_torch_gib=_round(numbers.non_torch_gib),
        cuda_graph_gib=_round(numbers.cuda_graph_gib),
        kv_cache_gib=_round(numbers.kv_cache_gib),
    )


def _unknown_memory_plan(spec: SpeculativeDeploymentSpec, inputs: PlanInputs) -> MemoryPlan:
    product = spec.resources.gpu.product
    return MemoryPlan.model_construct(
        verdict=Verdict.REJECTED, fits=False,
        per_gpu=PerGpuMemory.model_construct(
            budget_gib=0.0, target_weights_gib=0.0, draft_weights_gib=0.0, overhead_gib=0.0,
            activation_peak_gib=0.0, non_torch_gib=0.0, cuda_graph_gib=0.0, kv_cache_gib=0.0,
        ),
        kv_bytes_per_token=0, kv_cache_tokens=0, max_model_len=inputs.max_model_len, max_concurrency=0.0,
        draft_cost=DraftCost.model_construct(kv_cache_gib=0.0, kv_cache_tokens=0, concurrent_sequences=0.0),
        reasons=[findings.unknown_gpu_memory(product)],
        suggestions=unknown_memory_suggestions(product),
    )


def plan_memory(
    spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None, *, speculate: bool = True,
    num_speculative_tokens: int | None = None,
) -> MemoryPlan:
    """The memory plan for `spec` on its GPUs; `speculate=False` (or `spec.speculation.enabled: false`)
    plans the same target without speculation, as rollback and the Control variant run it.

    `num_speculative_tokens`: the k the engine is started with when a schedule decides it (its largest k,
    planning.schedule): the engine reserves for that one, whatever smaller k the schedule drafts at a batch
    size. None: `spec.speculation.numSpeculativeTokens`."""
    inputs = plan_inputs(spec, target, draft, speculate=speculate)
    if num_speculative_tokens is not None:
        inputs = replace(inputs, num_speculative_tokens=num_speculative_tokens)
    if inputs.gpu_memory_gib is None:
        return _unknown_memory_plan(spec, inputs)
    numbers = compute(inputs)
    baseline = compute(without_speculation(inputs)) if inputs.speculating else numbers
    found = reasons(inputs, numbers)
    if not numbers.fits:
        verdict = Verdict.REJECTED
    elif any(finding.severity == Severity.WARNING for finding in found):
        verdict = Verdict.FITS_WITH_WARNINGS
    else:
        verdict = Verdict.FITS
    return MemoryPlan.model_construct(
        verdict=verdict,
        fits=numbers.fits,
        per_gpu=_per_gpu(numbers),
        kv_bytes_per_token=numbers.kv_bytes_per_token,
        kv_cache_tokens=numbers.kv_cache_tokens,
        max_model_len=inputs.max_model_len,
        max_concurrency=round(numbers.kv_cache_tokens / inputs.max_model_len, 2),
        draft_cost=_draft_cost(inputs, numbers, baseline),
        reasons=found,
        suggestions=[] if numbers.fits else suggest(inputs, numbers),
    )
