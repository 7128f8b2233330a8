"""One plan for one spec: the models resolved, the memory plan, compatibility, the cost model and what it predicts.

    plan = make_plan(spec)                                   # spec architecture or catalog, no I/O
    plan = make_plan(spec, resolve_models(spec, hub=hub))    # configs from a ConfigMap, a path or the Hub
    plan.acceptance_floor(batch_size=12)                     # what the judgment asks (judgment/plan_view.py)

Everything the operator decides before it touches a cluster comes from `make_plan`; the CLI prints it,
the reconciler writes its memory plan to status and renders children from it. Resolving the models is
I/O and happens before (specdeploy.modelsource); the plan only takes its result, so it stays pure.

The plan is the one holder of numbers derived from the models: it builds the cost model once, from the
models as they were resolved, and the schedule, the acceptance floor and the judgment's predictions all come
from it. The judgment reads the plan through `judgment.plan_view.PlanView` and imports nothing from planning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import Architecture, ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.api.status import Compatibility, MemoryPlan, ScheduleCalibration, Verdict
from specdeploy.engines import engine_profile
from specdeploy.engines.base import BatchK
from specdeploy.modelsource.resolve import (
    ArchitectureSource,
    Origin,
    ResolvedModel,
    ResolvedModels,
    head_findings,
)
from specdeploy.planning.acceptance_floor import AcceptanceFloor, acceptance_floor
from specdeploy.planning.catalog import resolve_draft, resolve_target
from specdeploy.planning.compat import check_compatibility
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.memory import gpu_memory_gib, plan_memory, trtllm_free_gpu_memory_fraction
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.schedule import (
    SpeculationSchedule,
    calibrated_acceptance,
    calibration_key,
    derive_schedule,
    schedule_cost,
    speculation_schedule,
    step_speedup,
)
from specdeploy.planning.speedup import SpeculationCost, SpeedupEstimate, estimate_speedup
from specdeploy.planning.topology import NodeLayout, node_layout

MEASURED_GPU = "H100-80GB"
"""The GPU of the measured step-time table the model is held to (docs/speedup-model.md)."""
MEASURED_MODEL_ERROR = 0.09
"""The model's error against that table after one factor per model: ≤ 8.4% per cell, ≤ 7.4% on the speedup at the
schedule's k (docs/speedup-model.md, tests/unit/test_step_cost_table.py); a fit from the control pods is that
one factor, so a fitted model is held to the same error on any GPU."""
DATASHEET_MODEL_ERROR = 0.20
"""A prior for a GPU scaled from its datasheet (no table measured there): its efficiencies are the H100's, which a
GPU need not reach; a stated allowance, not a measurement."""


def model_error(gpu: str | None, *, fitted: bool) -> float:
    """The stated error of a step time or a speedup predicted on `gpu`, ± this fraction (docs/speedup-model.md)."""
    return MEASURED_MODEL_ERROR if fitted or gpu == MEASURED_GPU else DATASHEET_MODEL_ERROR


def speedup_interval(speedup: float, error: float) -> tuple[float, float]:
    """A predicted speedup's interval under the model's stated error: speedup × (1 ± error)."""
    return speedup * (1 - error), speedup * (1 + error)


def _interval_wire(speedup: float, error: float) -> list[float]:
    return [round(end, 3) for end in speedup_interval(speedup, error)]


@dataclass(frozen=True)
class HardwareScaledCost(SpeculationCost):
    """The cost model with every forward pass (the GPU's time) `hardware_factor` × the prior's; the engine's own
    step and drafting overheads (CPU time) as they were. The factor is fitted from the control pods
    (judgment/hardware.py): the GPUs the SD really got."""

    hardware_factor: float = 1.0

    def target_pass_seconds(self, batch: int, tokens_per_sequence: int) -> float:
        return self.hardware_factor * super().target_pass_seconds(batch, tokens_per_sequence)

    def draft_pass_seconds(self, batch: int) -> float:
        if self.draft is None:
            return 0.0
        pass_s = super().draft_pass_seconds(batch) - self.draft_pass_overhead_s
        return self.hardware_factor * pass_s + self.draft_pass_overhead_s


def hardware_scaled(cost: SpeculationCost, factor: float | None) -> SpeculationCost:
    """`cost` (the prior's, or an earlier fit's) with its GPU time `factor` × the prior's; None: the prior."""
    fields = {f.name: getattr(cost, f.name) for f in dataclasses.fields(SpeculationCost)}
    return SpeculationCost(**fields) if factor is None else HardwareScaledCost(**fields, hardware_factor=factor)


@dataclass(frozen=True)
class Plan:
    spec: SpeculativeDeploymentSpec          # as written, each revision pinned to the commit it resolved to
    target: ModelInfo
    draft: ModelInfo | None
    memory: MemoryPlan
    memory_without_speculation: MemoryPlan   # what the same pods get after a rollback, or as Control
    compatibility: Compatibility
    speedup: SpeedupEstimate | None
    target_origin: Origin                    # where the target's architecture came from
    draft_origin: Origin | None              # the draft's or EAGLE head's; None without one
    schedule: SpeculationSchedule | None = None   # k per batch range; None without speculation
    cost: SpeculationCost | None = None     # the cost model of the speculation; None without speculation
    calibration: ScheduleCalibration | None = None   # the measured acceptance an Auto schedule follows
    hardware_factor: float | None = None    # the GPU time fitted from the control pods; None: the prior's

    @property
    def layout(self) -> NodeLayout:
        """Where one replica's ranks run: nodes × GPUs, TP × PP (planning.topology)."""
        return node_layout(self.spec)

    def acceptance_floor(self, batch_size: float | None = None, k: int | None = None) -> AcceptanceFloor | None:
        """The acceptance floor at `batch_size` running sequences per pod (None: batch 1) drafting `k` (None:
        numSpeculativeTokens), from the plan's cost model (planning/acceptance_floor.py); None without
        speculation."""
        return acceptance_floor(self.spec, self.cost, batch_size, k) if self.cost is not None else None

    def predicted_speedup(self, position_acceptance: Sequence[float], batch: int, k: int) -> float:
        """Tokens per second ÷ without speculation at `batch` drafting `k`, under an acceptance per draft position
        (at k = 0, the engine's cost of a step that drafts nothing)."""
        return step_speedup(self._speculating(), position_acceptance, batch, k)

    def derive_schedule(self, position_acceptance: Sequence[float]) -> SpeculationSchedule:
        """The Auto schedule under a measured acceptance per draft position, over 1..maxNumSeqs."""
        speculation = self.spec.speculation
        ranges = derive_schedule(self._speculating(), position_acceptance, speculation.num_speculative_tokens,
                                 self.spec.serving.max_num_seqs)
        return SpeculationSchedule(ScheduleMode.AUTO, ranges, acceptance_measured=True)

    def base_step_seconds(self, batch: int, hardware_factor: float | None = None) -> float:
        """One step without speculation at `batch` on GPUs `hardware_factor` × the prior's time (None: the prior),
        whatever factor the plan itself uses: what a control pod's per-token latency is held against."""
        return hardware_scaled(self._speculating(), hardware_factor).baseline_step_seconds(max(1, batch))

    @property
    def prediction_source(self) -> str:
        """"fitted" when the cost model's GPU time was fitted from the control pods, else "prior"."""
        return "fitted" if self.hardware_factor is not None else "prior"

    @property
    def model_error(self) -> float:
        """The predictions' stated error, ± this fraction: the measured table's for an H100 or a fitted model, the
        datasheet allowance for a prior on any other GPU (docs/speedup-model.md)."""
        return model_error(self.cost.gpu.name if self.cost is not None else None, fitted=self.hardware_factor is not None)

    def with_hardware_factor(self, factor: float | None) -> Plan:
        """The plan with its cost model's GPU time `factor` × the prior's (None: the prior's): the acceptance floor
        and every prediction are that model's. The schedule stays the one the pods run (a fitted table reaches them
        through calibration, judgment/recalibration.py: only where it pays at the running load); the memory plan
        stays this plan's."""
        if self.cost is None:
            return dataclasses.replace(self, hardware_factor=factor)
        return dataclasses.replace(self, cost=hardware_scaled(self.cost, factor), hardware_factor=factor)

    def derived_schedule(self) -> SpeculationSchedule | None:
        """The table this plan's cost model derives under the acceptance in force (measured per position, else the
        method's prior); None without speculation. Differs from `schedule` when the cost model has been refitted."""
        if self.cost is None:
            return None
        return speculation_schedule(self.spec, self.target, self.cost, position_acceptance=calibrated_acceptance(
            self.spec, self.calibration))

    @property
    def calibration_key(self) -> str:
        """What a measured acceptance per draft position is valid for (planning.schedule.calibration_key)."""
        return calibration_key(self.spec)

    def _speculating(self) -> SpeculationCost:
        if self.cost is None:
            raise ValueError("the plan has no speculation to predict")
        return self.cost

    @property
    def engine_schedule(self) -> tuple[BatchK, ...] | None:
        """The schedule the engine renderers take: None for mode Fixed (and without speculation)."""
        return self.schedule.engine_table() if self.schedule is not None else None

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
        if not engine_profile(self.spec.engine.kind).memory.kv_fraction_of_free or memory_gib is None:
            return None
        memory = self.memory if speculate else self.memory_without_speculation
        return trtllm_free_gpu_memory_fraction(memory, memory_gib)


def _origin_without_io(name: str, revision: str | None, architecture: Architecture | None, spec_field: str,
                       info: ModelInfo) -> Origin:
    if architecture is not None:
        return Origin(ArchitectureSource.SPEC, name, revision, location=f"{spec_field}.architecture")
    return Origin(ArchitectureSource.CATALOG, name, revision, location=info.source)


def models_without_io(spec: SpeculativeDeploymentSpec) -> ResolvedModels:
    """The target and draft from `architecture` in the spec or the built-in catalog alone.

    Raises `UnknownModel` when a model is neither in the catalog nor described by an architecture.
    """
    model, draft_spec = spec.model, spec.speculation.draft
    target = resolve_target(spec)
    resolved_target = ResolvedModel(
        target, _origin_without_io(model.name, model.revision, model.architecture, "spec.model", target))
    draft = resolve_draft(spec)
    if draft is None or draft_spec is None:
        return ResolvedModels(resolved_target, None)
    origin = _origin_without_io(draft_spec.name, draft_spec.revision, draft_spec.architecture,
                                "spec.speculation.draft", draft)
    return ResolvedModels(resolved_target, ResolvedModel(draft, origin))


def pin_revisions(spec: SpeculativeDeploymentSpec, models: ResolvedModels) -> SpeculativeDeploymentSpec:
    """`spec` with each revision the Hub resolved replaced by its commit sha, for the engine args.

    A branch moves; the pods must load the commit that was planned, not whatever the branch names when
    they start. Models from the spec, a ConfigMap, a path or the catalog keep the revision as written.
    """
    update: dict[str, Any] = {}
    target_sha = models.target.origin.commit_sha
    if target_sha:
        update["model"] = spec.model.model_copy(update={"revision": target_sha})
    draft, draft_spec = models.draft, spec.speculation.draft
    if draft is not None and draft.origin.commit_sha and draft_spec is not None:
        pinned_draft = draft_spec.model_copy(update={"revision": draft.origin.commit_sha})
        update["speculation"] = spec.speculation.model_copy(update={"draft": pinned_draft})
    return spec.model_copy(update=update) if update else spec


def make_plan(spec: SpeculativeDeploymentSpec, models: ResolvedModels | None = None, *,
              calibration: ScheduleCalibration | None = None, hardware_factor: float | None = None) -> Plan:
    """The plan for `spec` as written (with speculation unless `spec.speculation.enabled` is false).

    `models`: the target and draft as `specdeploy.modelsource.resolve_models` resolved them (from a
    ConfigMap, a path, the Hub or the catalog); None resolves from the spec's `architecture` and the
    catalog only, without I/O. Raises `UnknownModel` then when a model is in neither. The plan's `spec`
    is `spec` with the commits the Hub resolved pinned (`pin_revisions`): what the engines render.
    `calibration`: status.speculation.calibration; an Auto schedule follows the acceptance per draft position
    measured there (`planning.schedule.calibrated_acceptance`) instead of the method's prior.
    `hardware_factor`: the GPU time, × the prior's, that `calibration`'s table was derived under
    (`planning.schedule.calibrated_hardware_factor`; `HardwareScaledCost`), so the Auto schedule the pods run and
    the acceptance floor are that model's.
    """
    resolved = models if models is not None else models_without_io(spec)
    target = resolved.target.info
    draft = resolved.draft.info if resolved.draft is not None else None
    speculate = spec.speculation.enabled
    gpu = find_gpu(spec.resources.gpu.product)
    cost = hardware_scaled(schedule_cost(spec, target, draft, gpu), hardware_factor) if speculate else None
    schedule = speculation_schedule(spec, target, cost, position_acceptance=calibrated_acceptance(
        spec, calibration)) if cost is not None else None
    largest_k = schedule.largest_k if schedule is not None and schedule.largest_k > 0 else None
    memory = plan_memory(spec, target, draft, speculate=speculate, num_speculative_tokens=largest_k)
    memory_without_speculation = plan_memory(spec, target, draft, speculate=False) if speculate else memory
    compatibility = check_compatibility(spec, target, draft, head_findings(spec, resolved), schedule)
    speedup = estimate_speedup(spec, target, draft, gpu) if speculate else None
    return Plan(pin_revisions(spec, resolved), target, draft, memory, memory_without_speculation, compatibility,
                speedup, resolved.target.origin, resolved.draft.origin if resolved.draft is not None else None,
                schedule, cost, calibration, hardware_factor)


def plan_document(plan: Plan, engine_command: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `specdeploy plan -o json` prints: status.memoryPlan's JSON, with layout (`NodeLayout.to_wire`), compatibility,
    engineCommand, speedup, speculationSchedule (`SpeculationSchedule.to_wire`: minBatch, maxBatch, k and the
    predicted speedup per batch range; each predicted speedup with modelSource — prior or fitted — and an interval
    from the model's stated error, `model_error`), acceptanceFloor (at batch 1, `AcceptanceFloor.to_wire`) and models (where each architecture came from, `Origin.to_wire`) beside it.

    `verdict` stays the memory plan's own (status.memoryPlan.verdict is the same field); `outcome` is the
    plan's as a whole — Rejected also for a compatibility error — and agrees with the exit code and the
    text output's "Verdict:" line, so a pipeline reads `.outcome`.
    """
    document = {"outcome": plan.verdict.value, **plan.memory.to_wire()}
    document["layout"] = plan.layout.to_wire()
    document["compatibility"] = plan.compatibility.to_wire()
    document["engineCommand"] = engine_command
    document["speedup"] = None
    if (estimate := plan.speedup) is not None:     # estimated on the prior's GPU, fitted or not
        error = model_error(estimate.gpu, fitted=False)
        document["speedup"] = {**estimate.to_wire(), "modelSource": "prior", "modelError": error,
                               "speedupAtBatch1Interval": _interval_wire(estimate.speedup_at_batch_1, error),
                               "speedupAtMaxBatchInterval": _interval_wire(estimate.speedup_at_max_batch, error)}
    document["speculationSchedule"] = None
    if plan.schedule is not None:
        error = plan.model_error
        document["speculationSchedule"] = [
            {**wire, "modelSource": plan.prediction_source, "modelError": error,
             "predictedSpeedupInterval": _interval_wire(entry.speedup_at_min_batch, error),
             "predictedSpeedupAtMaxBatchInterval": _interval_wire(entry.speedup_at_max_batch, error)}
            for entry, wire in zip(plan.schedule.ranges, plan.schedule.to_wire(), strict=True)]
    document["models"] = {
        "target": plan.target_origin.to_wire(),
        "draft": plan.draft_origin.to_wire() if plan.draft_origin is not None else None,
    }
    floor = plan.acceptance_floor()
    document["acceptanceFloor"] = floor.to_wire() if floor is not None else None
    return document
