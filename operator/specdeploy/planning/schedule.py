"""k per batch size: the schedule the engine follows every step (`spec.speculation.schedule`).

    schedule = speculation_schedule(spec, target, cost)   # cost: the plan's, `schedule_cost`
    schedule.ranges          # (ScheduleRange(1, 21, 4, …), ScheduleRange(22, 75, 3, …), …)
    schedule.k_at(48)        # the k drafted at 48 running sequences
    schedule.engine_table()  # what the renderers put in the engine's config; None for mode Fixed

The fast loop of speculation lives in the engine: it reads the batch size each step and drafts the k the
schedule gives it, without a restart (vLLM `num_speculative_tokens_per_batch_size`, SGLang's adaptive tiers,
TensorRT-LLM `max_concurrency` / `draft_len_schedule`). Mode Auto derives that schedule here from the
roofline (planning.speedup's `SpeculationCost`) and the acceptance of each draft position: at every batch
size the k in 1..numSpeculativeTokens with the best predicted speedup, or 0 where that speedup is below what
a step at k = 0 gives. The acceptance is the catalog's prior per method until a measured one is passed in
(`position_acceptance`, as vLLM's per-position counters give it). docs/schedules.md explains the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from specdeploy.api.spec import Quantization, ScheduleMode, SpeculativeDeploymentSpec
from specdeploy.api.status import ScheduleCalibration
from specdeploy.engines import engine_profile
from specdeploy.engines.base import BatchK
from specdeploy.engines.profile import ScheduleExpression
from specdeploy.planning.acceptance import (
    acceptance_quantization,
    expected_tokens_from_positions,
    prior_position_acceptance,
)
from specdeploy.planning.gpus import GPU_PRODUCTS, GpuProduct
from specdeploy.planning.modelinfo import ModelInfo
from specdeploy.planning.speedup import REFERENCE_GPU, SpeculationCost, batch_grid, knee, speculation_cost

ZERO_K_SLOWDOWN = 0.20
"""What a step costs at k = 0 inside a schedule, as a share of the same step without speculation: vLLM still
runs the drafter's forward pass to keep its KV cache in step (vllm#49548) and the speculative bookkeeping,
and vllm#49986 measured 20–31% against no speculation at all. The low end is taken: a schedule then drafts 0
as soon as the best k loses more than the mildest measured k = 0 cost. Turning speculation off altogether
(1.0) needs a restart, which the schedule cannot do; that is the rollback's job."""

ZERO_K_SPEEDUP = 1.0 - ZERO_K_SLOWDOWN
"""The k = 0 speed of a cost built without an engine; each engine's own is its profile's
`schedules.zero_k_speedup` (vLLM's and SGLang's are this one, TensorRT-LLM's 1.0)."""


@dataclass(frozen=True)
class ScheduleRange:
    """k for the batch sizes min_batch..max_batch (both included), with the predicted speedup at each end."""

    min_batch: int
    max_batch: int
    k: int
    speedup_at_min_batch: float     # tokens per second ÷ without speculation, at min_batch running sequences
    speedup_at_max_batch: float

    def to_wire(self) -> dict[str, Any]:
        """One entry of `speculationSchedule` in `specdeploy plan -o json`."""
        return {
            "minBatch": self.min_batch,
            "maxBatch": self.max_batch,
            "k": self.k,
            "predictedSpeedup": round(self.speedup_at_min_batch, 3),
            "predictedSpeedupAtMaxBatch": round(self.speedup_at_max_batch, 3),
        }


@dataclass(frozen=True)
class SpeculationSchedule:
    """The schedule of one spec: its mode and ranges covering 1..maxNumSeqs in ascending order."""

    mode: ScheduleMode
    ranges: tuple[ScheduleRange, ...]
    acceptance_measured: bool       # False: the method's prior per position (planning.acceptance)

    @property
    def largest_k(self) -> int:
        """The most any batch size drafts: what the engine is started with and the memory plan reserves for."""
        return max(r.k for r in self.ranges)

    def k_at(self, batch: int) -> int:
        """The k drafted at `batch` (`k_at`)."""
        return k_at(self.ranges, batch)

    def engine_table(self) -> tuple[BatchK, ...] | None:
        """The ranges for the engine renderers; None for mode Fixed, which renders no schedule at all."""
        if self.mode == ScheduleMode.FIXED:
            return None
        return tuple(BatchK(r.min_batch, r.max_batch, r.k) for r in self.ranges)

    def to_wire(self) -> list[dict[str, Any]]:
        """`speculationSchedule` of `specdeploy plan -o json`."""
        return [r.to_wire() for r in self.ranges]


def k_at(ranges: Sequence[ScheduleRange], batch: int) -> int:
    """The k a table drafts at `batch`; past its last range, the last range's (as vLLM reads a table)."""
    return next((r.k for r in ranges if r.min_batch <= batch <= r.max_batch), ranges[-1].k)


def step_speedup(cost: SpeculationCost, position_acceptance: Sequence[float], batch: int, k: int) -> float:
    """The predicted speedup at `batch` running sequences drafting `k` tokens; at k = 0 the engine's cost of a step
    that drafts nothing (`zero_k_speedup`)."""
    if k == 0:
        return zero_k_speedup(cost)
    return cost.speedup_for_tokens(batch, expected_tokens_from_positions(position_acceptance, cost.accepted_depth(k)), k)


def zero_k_speedup(cost: SpeculationCost) -> float:
    """A step drafting 0 tokens inside a schedule ÷ the same step without speculation, for the cost's engine."""
    return cost.zero_k_speedup if cost.zero_k_speedup is not None else ZERO_K_SPEEDUP


def best_k_at(cost: SpeculationCost, position_acceptance: Sequence[float], batch: int, max_k: int) -> int:
    """The k a schedule drafts at `batch`: 0 when no k in 1..max_k is predicted above a step at k = 0, else the
    knee of the speedup (planning.speedup.knee: the smallest k within 1% of the best)."""
    def speedup_at(k: int) -> float:
        return step_speedup(cost, position_acceptance, batch, k)

    if max(speedup_at(k) for k in range(1, max_k + 1)) <= zero_k_speedup(cost):
        return 0
    return knee(speedup_at, max_k)


def _starts(choose: Callable[[int], int], max_batch: int) -> list[tuple[int, int]]:
    """(first batch size, k) of each run of equal k over 1..max_batch.

    `choose` is evaluated on planning.speedup's batch grid (every size to 4, then about 25% apart) and
    bisected wherever two neighbouring grid points differ, so a change of k is found at its exact batch size
    wherever k changes monotonically between two grid points (the speedup curves are smooth in the batch).
    """
    starts = [(1, choose(1))]
    for low, high in zip(grid := batch_grid(max_batch), grid[1:], strict=False):
        k_high = choose(high)
        while starts[-1][1] != k_high:
            k_low, below, above = starts[-1][1], max(low, starts[-1][0]), high
            while above - below > 1:
                middle = (below + above) // 2
                below, above = (middle, above) if choose(middle) == k_low else (below, middle)
            starts.append((above, choose(above)))
    return starts


def _ranges(starts: list[tuple[int, int]], max_batch: int, speedup: Callable[[int, int], float]
            ) -> tuple[ScheduleRange, ...]:
    ends = [start - 1 for start, _ in starts[1:]] + [max_batch]
    return tuple(ScheduleRange(start, end, k, speedup(start, k), speedup(end, k))
                 for (start, k), end in zip(starts, ends, strict=True))


def derive_schedule(
    cost: SpeculationCost, position_acceptance: Sequence[float], max_k: int, max_num_seqs: int
) -> tuple[ScheduleRange, ...]:
    """Mode Auto: the best k at every batch size 1..max_num_seqs, adjacent sizes of equal k merged.

    `position_acceptance[i]` is the share of drafts whose position i+1 is accepted (non-increasing; the prior
    of `prior_position_acceptance` or vLLM's per-position counters); k goes up to the smaller of `max_k` and
    the positions given. For an engine that drafts its largest k first (`cost.largest_k_first`) each batch size
    drafts the most the best k reaches at it or any larger size: a drafter with a fixed cost per pass can be worth
    more tokens at a larger batch (docs/schedules.md), and such an engine can only run that k from batch 1 up.
    """
    top = min(max_k, len(position_acceptance))
    choose = cache(lambda batch: best_k_at(cost, position_acceptance, batch, top))
    starts = _starts(choose, max_num_seqs)
    if cost.largest_k_first:
        starts = _never_rising(starts)
    return _ranges(starts, max_num_seqs, lambda batch, k: step_speedup(cost, position_acceptance, batch, k))


def _never_rising(starts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`starts` with each run's k raised to the largest k of any later run, equal neighbours merged."""
    raised: list[tuple[int, int]] = []
    largest = 0
    for start, k in reversed(starts):
        largest = max(largest, k)
        if raised and raised[-1][1] == largest:
            raised[-1] = (start, largest)
        else:
            raised.append((start, largest))
    return raised[::-1]


def table_schedule(
    cost: SpeculationCost, position_acceptance: Sequence[float], table: Sequence[BatchK], max_num_seqs: int
) -> tuple[ScheduleRange, ...]:
    """Mode Table: the user's ranges over 1..max_num_seqs with their predicted speedups. As vLLM reads a
    table, the last range's k holds up to max_num_seqs; ranges past it are dropped."""
    starts = [(entry.min_batch, entry.k) for entry in table if entry.min_batch <= max_num_seqs]
    return _ranges(starts, max_num_seqs, lambda batch, k: step_speedup(cost, position_acceptance, batch, k))


def schedule_cost(spec: SpeculativeDeploymentSpec, target: ModelInfo, draft: ModelInfo | None,
                  gpu: GpuProduct | None, *, context_tokens: int | None = None) -> SpeculationCost:
    """The roofline's costs of `spec`'s speculation on `gpu` (None: REFERENCE_GPU), with its engine's cost of a step
    that drafts nothing and whether its table drafts its largest k first: the cost model the plan builds once and
    derives its schedule, acceptance floor and the judgment's predictions from (planning/plan.py).
    `context_tokens`: the pods' measured mean context per sequence; None assumes one from maxModelLen
    (planning.speedup.context_tokens_for)."""
    cost = speculation_cost(spec, target, draft, gpu if gpu is not None else GPU_PRODUCTS[REFERENCE_GPU],
                            context_tokens=context_tokens)
    # An engine whose k = 0 costs nothing (TensorRT-LLM) drafts 0 as soon as no k beats no speculation at all; one
    # whose table drafts its largest k first gets a table whose k never rises with the batch (`derive_schedule`), so
    # the table it renders is the one it derived.
    schedules = engine_profile(spec.engine.kind).schedules
    return dataclasses.replace(
        cost, zero_k_speedup=schedules.zero_k_speedup,
        largest_k_first=schedules.expression == ScheduleExpression.LARGEST_K_FIRST_TABLE)


def calibration_key(spec: SpeculativeDeploymentSpec) -> str:
    """A digest of what the acceptance per draft position depends on: the engine (what it counts), the target,
    and spec.speculation (method, draft, k, schedule …), revisions left out (the reconciler plans with the
    revisions pinned to commits, the judgment sees them as written). A measurement made under another key is not
    used: a changed drafter or k starts again from the prior."""
    speculation = spec.speculation.to_wire()
    if isinstance(speculation.get("draft"), dict):
        speculation["draft"] = {k: v for k, v in speculation["draft"].items() if k != "revision"}
    text = json.dumps({"engine": spec.engine.kind.value, "model": spec.model.name,
                       "quantization": spec.model.quantization.value, "speculation": speculation},
                      sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def calibrated_acceptance(spec: SpeculativeDeploymentSpec, calibration: ScheduleCalibration | None
                          ) -> tuple[float, ...] | None:
    """The measured acceptance per position an Auto schedule follows (status.speculation.calibration), or None
    (the prior): for mode Auto only, measured for this spec (`calibration_key`) at its numSpeculativeTokens."""
    if calibration is None or not calibration.positions or spec.speculation.schedule_mode != ScheduleMode.AUTO:
        return None
    if calibration.key != calibration_key(spec) or len(calibration.positions) != spec.speculation.num_speculative_tokens:
        return None
    return tuple(p.rate for p in sorted(calibration.positions, key=lambda p: p.position))


def calibrated_hardware_factor(spec: SpeculativeDeploymentSpec, calibration: ScheduleCalibration | None
                               ) -> float | None:
    """The GPU time, × the prior's, that the calibrated table was derived under (the control pods' fit when
    calibration last changed the schedule), or None (the prior): only while its positions are in force."""
    if calibrated_acceptance(spec, calibration) is None:
        return None
    assert calibration is not None
    return calibration.hardware_factor


def speculation_schedule(
    spec: SpeculativeDeploymentSpec,
    target: ModelInfo,
    cost: SpeculationCost,
    *,
    position_acceptance: Sequence[float] | None = None,
) -> SpeculationSchedule:
    """The schedule of `spec`'s speculation (which must be enabled), priced by `cost` (`schedule_cost`).

    `position_acceptance`: measured acceptance per draft position (see `derive_schedule`); None assumes the
    method's prior, for a separate draft by its size (`cost.draft_size_ratio`), lowered for a quantised target (the
    spec's quantisation or the checkpoint's) or draft, as the speedup estimate does.
    """
    speculation = spec.speculation
    k_max = speculation.num_speculative_tokens
    acceptance = position_acceptance if position_acceptance is not None else prior_position_acceptance(
        speculation.enabled_method, k_max,
        target_quantization=acceptance_quantization(spec.model.quantization, target),
        draft_quantization=speculation.draft.quantization if speculation.draft is not None else Quantization.NONE,
        mtp_layers=target.architecture.num_nextn_predict_layers,
        draft_size_ratio=cost.draft_size_ratio,
    )
    max_num_seqs, mode = spec.serving.max_num_seqs, speculation.schedule_mode
    if mode == ScheduleMode.AUTO:
        ranges = derive_schedule(cost, acceptance, k_max, max_num_seqs)
    elif mode == ScheduleMode.TABLE and speculation.schedule is not None and speculation.schedule.table:
        table = [BatchK(r.min_batch, r.max_batch, r.k) for r in speculation.schedule.table]
        ranges = table_schedule(cost, acceptance, table, max_num_seqs)
    else:
        ranges = table_schedule(cost, acceptance, [BatchK(1, max_num_seqs, k_max)], max_num_seqs)
    return SpeculationSchedule(mode, ranges, acceptance_measured=position_acceptance is not None)
