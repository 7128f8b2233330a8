"""planning/roofline.py held to measured hardware: every cell of tests/data/h100-step-times.json (one H100, provenance
in h100-step-times.md beside it), and the speedup the Auto schedule predicts at its own k against the speedup the
measured passes give at that k.

The one stated factor, the same for all four models of the table and for all their batches and token counts: the
table's plain PyTorch forward pays KERNEL_FACTOR = 2 times the kernel time per layer an engine's fused layer pays
(about 20 kernels per layer against about 10: unfused RMSNorm, SiLU·mul, KV-cache and layout copies against fused
add+RMSNorm, rotary, cache write, attention, SiLU·mul and the four GEMMs). It is counted from the two forwards, not
fitted: with it the table's 54 µs per layer is the model's 27 µs, which gives Llama-3.1-8B on one H100 within 5% of
SGLang's published 158 tok/s (test_speedup.py). The table has no all-reduce (one GPU): the TP-4 rank is compared
without it, and the speedups take the model's all-reduce on both sides.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.planning.catalog import lookup
from specdeploy.planning.gpus import GPU_PRODUCTS
from specdeploy.planning.roofline import LAYER_OVERHEAD_S, ForwardCost, allreduce_seconds, forward_seconds
from specdeploy.planning.schedule import k_at, schedule_cost, speculation_schedule, step_speedup
from specdeploy.planning.speedup import SpeculationCost

TABLE: dict[str, Any] = json.loads((Path(__file__).parent.parent / "data" / "h100-step-times.json").read_text())
H100 = GPU_PRODUCTS["H100-80GB"]
KERNEL_FACTOR = 2.0
CONTEXT = TABLE["context"]
K_MAX = 4                       # the table verifies at most 5 tokens per sequence
ACCEPTANCES = (0.3, 0.5, 0.7)   # α, each draft position accepted with probability α after the one before


def spec(target: str, method: str, draft: str, *, tp: int = 1, draft_tp: int | None = None) -> SpeculativeDeploymentSpec:
    drafter: dict[str, Any] = {"name": draft}
    if draft_tp is not None:
        drafter["tensorParallelSize"] = draft_tp
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"name": target},
        "speculation": {"method": method, "numSpeculativeTokens": K_MAX, "draft": drafter, "schedule": {"mode": "Auto"}},
        "resources": {"tensorParallelSize": tp, "gpu": {"product": "H100-80GB"}},
        "serving": {"maxNumSeqs": 256},
    })


LLAMA_8B, LLAMA_70B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"
LLAMA_1B, EAGLE3_8B = "meta-llama/Llama-3.2-1B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
# The three pairs the table allows: (label, spec, the table's target, the table's drafter). The 1B draft of the
# 70B runs on one GPU, as the table measured it.
PAIRS = (
    ("8B + 1B draft", spec(LLAMA_8B, "draft_model", LLAMA_1B), "llama8b", "llama1b"),
    ("8B + EAGLE-3", spec(LLAMA_8B, "eagle3", EAGLE3_8B), "llama8b", "eagle3_8b"),
    ("70B TP4 + 1B draft", spec(LLAMA_70B, "draft_model", LLAMA_1B, tp=4, draft_tp=1), "llama70b_tp4", "llama1b"),
)


def plan_cost(pair_spec: SpeculativeDeploymentSpec) -> SpeculationCost:
    """The costs the plan derives the pair's Auto schedule from."""
    draft = pair_spec.speculation.draft
    assert draft is not None
    target, drafter = lookup(pair_spec.model.name), lookup(draft.name)
    assert target is not None and drafter is not None
    return schedule_cost(pair_spec, target, drafter, H100, context_tokens=CONTEXT)


def table_models() -> dict[str, ForwardCost]:
    """Each model of the table as the plan builds its pass (target or drafter of a pair)."""
    models: dict[str, ForwardCost] = {}
    for _, pair_spec, target, drafter in PAIRS:
        cost = plan_cost(pair_spec)
        assert cost.draft is not None
        models[target], models[drafter] = cost.target, cost.draft
    return models


MODELS = table_models()
CELLS = [(name, int(cell.split("x")[0]), int(cell.split("x")[1]), ms)
         for name, model in TABLE["models"].items() for cell, ms in model["ms"].items()]


def predicted_gpu_ms(name: str, batch: int, tokens: int) -> float:
    """The model's pass as the table measured it: its kernel time per layer × KERNEL_FACTOR, no all-reduce."""
    cost = MODELS[name]
    seconds = forward_seconds(cost, H100, batch=batch, tokens_per_sequence=tokens, context_tokens=CONTEXT,
                              layer_overhead_s=KERNEL_FACTOR * LAYER_OVERHEAD_S)
    return (seconds - allreduce_seconds(cost)) * 1e3


def test_the_table_covers_four_models_at_1024_cached_tokens() -> None:
    assert CONTEXT == 1024 and TABLE["device"] == "NVIDIA H100 80GB HBM3"
    assert sorted(MODELS) == sorted(TABLE["models"]) and len(CELLS) == 2 * 45 + 2 * 9


@pytest.mark.parametrize(("name", "batch", "tokens", "measured_ms"), CELLS,
                         ids=[f"{name}-{batch}x{tokens}" for name, batch, tokens, _ in CELLS])
def test_every_cell_is_predicted_within_10_percent(name: str, batch: int, tokens: int, measured_ms: float) -> None:
    assert predicted_gpu_ms(name, batch, tokens) == pytest.approx(measured_ms, rel=0.10)


def test_verify_grows_smoothly_with_the_batch_as_measured() -> None:
    # Llama-3.1-8B, 5 tokens ÷ 1 per sequence: measured 1.05 at batch 1, 1.14 at 32, 1.41 at 64, 1.86 at 128; a
    # max(memory, compute) roofline held 1.00 up to its knee and 1.10 at 64.
    for batch in (1, 32, 64, 128, 256):
        measured = TABLE["models"]["llama8b"]["ms"][f"{batch}x5"] / TABLE["models"]["llama8b"]["ms"][f"{batch}x1"]
        assert predicted_gpu_ms("llama8b", batch, 5) / predicted_gpu_ms("llama8b", batch, 1) == pytest.approx(
            measured, rel=0.10)


@dataclasses.dataclass(frozen=True)
class MeasuredPasses(SpeculationCost):
    """The project's step costs with the table's passes in place of the roofline's: the engine's step and
    drafting-pass overheads and the model's all-reduce added to both sides alike."""

    target_name: str = ""
    drafter_name: str = ""

    def target_pass_seconds(self, batch: int, tokens_per_sequence: int) -> float:
        measured = TABLE["models"][self.target_name]["ms"][f"{batch}x{tokens_per_sequence}"] / 1e3
        return float(measured) + allreduce_seconds(self.target)

    def draft_pass_seconds(self, batch: int) -> float:
        return float(TABLE["models"][self.drafter_name]["ms"][f"{batch}x1"]) / 1e3 + self.draft_pass_overhead_s


def measured(cost: SpeculationCost, target: str, drafter: str) -> MeasuredPasses:
    fields = {field.name: getattr(cost, field.name) for field in dataclasses.fields(SpeculationCost)}
    return MeasuredPasses(**fields, target_name=target, drafter_name=drafter)


SCHEDULE_CASES = [(label, alpha, batch) for label, *_ in PAIRS for alpha in ACCEPTANCES for batch in (16, 32, 64, 128, 256)]


def speedups_at_schedule_k(label: str, alpha: float, batch: int) -> tuple[int, float, float, float]:
    """(k, predicted as planned, predicted with the table's kernel time, from the measured passes) at the Auto
    schedule's own k for `batch` running sequences."""
    _, pair_spec, target, drafter = next(pair for pair in PAIRS if pair[0] == label)
    positions = [alpha**position for position in range(1, K_MAX + 1)]
    target_model = lookup(pair_spec.model.name)
    assert target_model is not None
    planned = plan_cost(pair_spec)
    schedule = speculation_schedule(pair_spec, target_model, planned, position_acceptance=positions)
    k = k_at(schedule.ranges, batch)
    as_table = dataclasses.replace(planned, layer_overhead_s=KERNEL_FACTOR * LAYER_OVERHEAD_S)
    return (k, step_speedup(planned, positions, batch, k), step_speedup(as_table, positions, batch, k),
            step_speedup(measured(planned, target, drafter), positions, batch, k))


@pytest.mark.parametrize(("label", "alpha", "batch"), SCHEDULE_CASES,
                         ids=[f"{label}-a{alpha}-b{batch}" for label, alpha, batch in SCHEDULE_CASES])
def test_speedup_at_the_schedules_k_matches_the_measured_passes(label: str, alpha: float, batch: int) -> None:
    k, planned, as_table, from_table = speedups_at_schedule_k(label, alpha, batch)
    assert 0 < k <= K_MAX
    assert as_table == pytest.approx(from_table, rel=0.10)
    assert planned == pytest.approx(from_table, rel=0.10)
