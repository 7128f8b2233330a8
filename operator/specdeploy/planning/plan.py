"""One plan for one spec: the models resolved, the memory plan, compatibility and predicted speedup.

Everything the operator decides before it touches a cluster comes from `make_plan`; the CLI prints it,
the reconciler writes its memory plan to status and renders children from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import EngineKind, SpeculativeDeploymentSpec
from specdeploy.api.status import Compatibility, MemoryPlan, Verdict
from specdeploy.planning.catalog import resolve_draft, resolve_target
from specdeploy.planning.compat import check_compatibility
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.memory import gpu_memory_gib, plan_memory, trtllm_free_gpu_memory_fraction
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.speedup import SpeedupEstimate, estimate_speedup


@dataclass(frozen=True)
class Plan:
    spec: SpeculativeDeploymentSpec
    target: ModelInfo
    draft: ModelInfo | None
    memory: MemoryPlan
    memory_without_speculation: MemoryPlan   # what the same pods get after a rollback, or as Control
    compatibility: Compatibility
    speedup: SpeedupEstimate | None

    @property
    def accepted(self) -> bool:
        """The spec may be deployed: it fits and nothing is incompatible."""
        return self.memory.fits and self.compatibility.compatible

    @property
    def verdict(self) -> Verdict:
        return self.memory.verdict if self.compatibility.compatible else Verdict.REJECTED

    @property
    def max_model_len(self) -> int:
        return self.memory.max_model_len

    def trtllm_free_gpu_memory_fraction(self, speculate: bool) -> float | None:
        """TensorRT-LLM's KV fraction that gives its pods the planned KV cache; None for other engines."""
        memory_gib = gpu_memory_gib(self.spec)
        if self.spec.engine.kind != EngineKind.TRTLLM or memory_gib is None:
            return None
        memory = self.memory if speculate else self.memory_without_speculation
        return trtllm_free_gpu_memory_fraction(memory, memory_gib)


def make_plan(spec: SpeculativeDeploymentSpec) -> Plan:
    """The plan for `spec` as written (with speculation unless `spec.speculation.enabled` is false).

    Raises `UnknownModel` when a model is neither in the catalog nor described by an architecture.
    """
    target = resolve_target(spec)
    draft = resolve_draft(spec)
    speculate = spec.speculation.enabled
    memory = plan_memory(spec, target, draft, speculate=speculate)
    memory_without_speculation = plan_memory(spec, target, draft, speculate=False) if speculate else memory
    compatibility = check_compatibility(spec, target, draft)
    gpu = find_gpu(spec.resources.gpu.product)
    speedup = estimate_speedup(spec, target, draft, gpu) if speculate else None
    return Plan(spec, target, draft, memory, memory_without_speculation, compatibility, speedup)


def plan_document(plan: Plan, engine_command: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `specdeploy plan -o json` prints: status.memoryPlan's JSON, with compatibility,
    engineCommand and speedup beside it.

    `verdict` stays the memory plan's own (status.memoryPlan.verdict is the same field); `outcome` is the
    plan's as a whole — Rejected also for a compatibility error — and agrees with the exit code and the
    text output's "Verdict:" line, so a pipeline reads `.outcome`.
    """
    document = {"outcome": plan.verdict.value, **plan.memory.to_wire()}
    document["compatibility"] = plan.compatibility.to_wire()
    document["engineCommand"] = engine_command
    document["speedup"] = plan.speedup.to_wire() if plan.speedup is not None else None
    return document
