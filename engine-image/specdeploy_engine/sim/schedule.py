"""How many tokens an engine drafts per step when it changes k by itself, with no restart.

    steps = vllm_k_steps([[1, 8, 3], [9, 64, 1], [65, 1024, 0]])      # ((1, 3), (9, 1), (65, 0))
    k_at(steps, batch=20, k_max=3)                                    # 1
    schedule = draft_schedule(config)          # one per engine process, from its EngineConfig
    verify = schedule.verify_k(engine.running) # drafts each decoding sequence verifies this step
    draft = schedule.draft_k(batch=14, verify_k=verify)   # drafts proposed this step
    schedule.observe([2, 0, 3])                # accepted drafts of each sequence that verified

Three engines, three rules, each read from the engine's source (docs/simulator.md, "k schedules"):

- vLLM (`num_speculative_tokens_per_batch_size` in --speculative-config; vllm/v1/spec_decode/dynamic/utils.py
  and vllm/v1/core/sched/scheduler.py, vLLM 0.32): after scheduling a step, the scheduler looks up K for the
  number of requests it scheduled (prefills included) and the drafter proposes K tokens; the next step
  verifies them. Inclusive ranges; a gap carries the previous range's K, batches past the last range the
  last K; every K is clamped to num_speculative_tokens.
- TensorRT-LLM (`draft_len_schedule` / `max_concurrency` in speculative_config;
  tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig, tensorrt_llm/_torch/speculative/drafter.py): the
  draft length of a step is that of the smallest threshold ≥ the generation batch size, 0 past the largest;
  `max_concurrency: N` is the schedule {N: max_draft_len}.
- SGLang (`--speculative-adaptive`; sglang/srt/speculative/adaptive_spec_params.py): an EMA of the accepted
  drafts per request moves the number of steps between candidate tiers every update_interval verify
  batches after warmup_batches, with hysteresis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeploy_engine.sim.engines import SIMULATED_ENGINES

if TYPE_CHECKING:
    from specdeploy_engine.sim.argv import EngineConfig
    from specdeploy_engine.sim.engine import SimRequest

# (first batch size, k): from that batch size on, k (until the next entry's first batch size).
KSteps = tuple[tuple[int, int], ...]


def k_at(steps: KSteps, batch: int, k_max: int) -> int:
    """k for a batch of `batch` sequences: the last step whose first batch size is ≤ batch, at most k_max."""
    k = k_max
    for first, value in steps:
        if batch < first:
            break
        k = value
    return min(k, k_max)


def vllm_k_steps(table: object) -> KSteps:
    """vLLM's num_speculative_tokens_per_batch_size as steps, or ValueError with vLLM's message.

    The checks and their order are validate_and_normalize_dynamic_sd_schedule's (vLLM 0.32): entries of
    three integers, positive ranges, start ≤ end, K ≥ 0, no overlap, the first range starting at 1. A K above
    num_speculative_tokens is not refused: build_dynamic_sd_schedule_lookup clamps it (k_at does too).
    """
    if not isinstance(table, list):
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list of "
                         "(range_start, range_end, num_speculative_tokens) entries.")
    if not table:
        raise ValueError("num_speculative_tokens_per_batch_size must not be empty.")
    ranges: list[tuple[int, int, int]] = []
    for entry in table:
        if not isinstance(entry, list) or len(entry) != 3:
            raise ValueError("Each num_speculative_tokens_per_batch_size entry must be a 3-item sequence: "
                             "(range_start, range_end, num_speculative_tokens).")
        start, end, k = (int(item) for item in entry)
        if start <= 0 or end <= 0:
            raise ValueError(f"Batch-size range ({start}, {end}) must be positive.")
        if start > end:
            raise ValueError(f"Batch-size range start must be <= end for ({start}, {end}, {k}).")
        if k < 0:
            raise ValueError("num_speculative_tokens_per_batch_size values must be >= 0.")
        ranges.append((start, end, k))
    ranges.sort(key=lambda item: item[0])
    previous_end = 0
    for start, end, _ in ranges:
        if start <= previous_end:
            raise ValueError("Batch-size ranges must be non-overlapping and sorted.")
        previous_end = end
    if ranges[0][0] != 1:
        raise ValueError("The first batch-size range must start at 1 so every runtime batch size has a "
                         "defined schedule.")
    return tuple((start, k) for start, _, k in ranges)


def trtllm_k_steps(schedule: dict[int, int], max_draft_len: int) -> KSteps:
    """TensorRT-LLM's draft_len_schedule as steps, or ValueError with its validator's message
    (DecodingBaseConfig.validate_draft_len_schedule_and_sort): thresholds ≥ 1, lengths 0 … max_draft_len,
    the smallest threshold's length max_draft_len. {4: 4, 8: 2, 32: 1}: batches 1–4 draft 4, 5–8 draft 2,
    9–32 draft 1, 33 and more draft nothing (the field's documentation)."""
    for batch, length in schedule.items():
        if batch < 1:
            raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {batch}")
        if length < 0:
            raise ValueError(f"draft_len_schedule: draft length must be >= 0, got {length}")
    smallest = min(schedule)
    if schedule[smallest] != max_draft_len:
        raise ValueError(f"draft_len_schedule[{smallest}] must equal max_draft_len because it is the smallest "
                         f"batch-size key. Got schedule[{smallest}]={schedule[smallest]}, but "
                         f"max_draft_len={max_draft_len}.")
    for batch, length in schedule.items():
        if length > max_draft_len:
            raise ValueError(f"draft_len_schedule: all draft lengths must be <= max_draft_len. Got "
                             f"draft_len={length} for batch_size={batch}, but max_draft_len={max_draft_len}.")
    steps: list[tuple[int, int]] = []
    first = 1
    for threshold in sorted(schedule):
        steps.append((first, schedule[threshold]))
        first = threshold + 1
    steps.append((first, 0))
    return tuple(steps)


@dataclass(frozen=True)
class AdaptiveTiers:
    """SGLang's --speculative-adaptive settings: the tiers (numbers of draft steps), where it starts, and
    the EMA and hysteresis that move it. Defaults are AdaptiveSpeculativeParams' (sglang
    adaptive_spec_params.py): candidate_steps [1, 3, 7], ema_alpha 0.2, update_interval 5, warmup_batches 10,
    down_hysteresis −0.25, up_hysteresis 0."""

    candidate_steps: tuple[int, ...]
    initial_steps: int
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0


def next_tier(tiers: AdaptiveTiers, current: int, ema: float) -> int:
    """The tier after an update (AdaptiveSpeculativeParams._recompute_params): step down while the EMA of
    accepted drafts is ≤ the lower tier − 0.5 + down_hysteresis, then up while it is > the current tier − 0.5
    + up_hysteresis. With steps [1, 3, 7] and the defaults, 3 drops to 1 at EMA ≤ 0.25 and rises to 7 above
    2.5."""
    steps = tiers.candidate_steps
    index = steps.index(current)
    while index > 0 and ema <= steps[index - 1] - 0.5 + tiers.down_hysteresis:
        index -= 1
    while index < len(steps) - 1 and ema > steps[index] - 0.5 + tiers.up_hysteresis:
        index += 1
    return steps[index]


class DraftSchedule:
    """A fixed k: every step verifies and drafts k tokens per decoding sequence."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.k_now = k           # the k of the last step planned, which /admin/info reports

    def verify_k(self, running: Sequence[SimRequest]) -> int:
        """Drafts each decoding sequence verifies in the step being planned, given the running requests."""
        return self.k

    def draft_k(self, batch: int, verify_k: int) -> int:
        """Drafts proposed per sequence in the step being planned, which schedules `batch` requests."""
        self.k_now = verify_k
        return verify_k

    def observe(self, accepted: Sequence[int]) -> None:
        """The accepted drafts of each sequence that verified in the step just completed."""

    def describe(self) -> dict[str, object]:
        return {"kind": "fixed", "k": self.k}


class VllmBatchSchedule(DraftSchedule):
    """vLLM's K by batch size: K is looked up for the requests the step scheduled and drafted at its end,
    so a step verifies what the previous one proposed (vllm/v1/core/sched/scheduler.py:
    num_spec_tokens_to_schedule = dynamic_sd_lookup[len(num_scheduled_tokens)])."""

    def __init__(self, k: int, steps: KSteps) -> None:
        super().__init__(k)
        self.steps = steps
        self._proposed = k

    def verify_k(self, running: Sequence[SimRequest]) -> int:
        return self._proposed

    def draft_k(self, batch: int, verify_k: int) -> int:
        self._proposed = self.k_now = k_at(self.steps, batch, self.k)
        return self._proposed

    def describe(self) -> dict[str, object]:
        return {"kind": "num_speculative_tokens_per_batch_size", "k": self.k,
                "fromBatchSize": [list(step) for step in self.steps]}


class TrtllmBatchSchedule(DraftSchedule):
    """TensorRT-LLM's draft length by batch size: the drafter drafts, then the target verifies, in the same
    iteration, for the length of the scheduled generation batch (Drafter._effective_draft_len)."""

    def __init__(self, k: int, steps: KSteps) -> None:
        super().__init__(k)
        self.steps = steps

    def verify_k(self, running: Sequence[SimRequest]) -> int:
        decoding = sum(1 for request in running if request.prefilled >= request.prefill_target)
        return k_at(self.steps, decoding, self.k)

    def describe(self) -> dict[str, object]:
        return {"kind": "draft_len_schedule", "k": self.k, "fromBatchSize": [list(step) for step in self.steps]}


class SglangAdaptiveSchedule(DraftSchedule):
    """SGLang's adaptive tiers: the EMA starts at the first tier − 1 and takes each verify batch's mean
    accepted drafts per request (AdaptiveSpeculativeParams.update); the tier is recomputed on batch
    warmup_batches + n·update_interval."""

    def __init__(self, k: int, tiers: AdaptiveTiers) -> None:
        super().__init__(k)
        self.tiers = tiers
        self.tier = self.k_now = tiers.initial_steps
        self.ema = float(tiers.initial_steps - 1)
        self.batches = 0

    def verify_k(self, running: Sequence[SimRequest]) -> int:
        return self.tier

    def observe(self, accepted: Sequence[int]) -> None:
        if not accepted:
            return
        alpha = self.tiers.ema_alpha
        self.ema = (1 - alpha) * self.ema + alpha * sum(accepted) / len(accepted)
        self.batches += 1
        after_warmup = self.batches - self.tiers.warmup_batches
        if after_warmup > 0 and after_warmup % self.tiers.update_interval == 0:
            self.tier = next_tier(self.tiers, self.tier, self.ema)

    def describe(self) -> dict[str, object]:
        return {"kind": "speculative_adaptive", "candidateSteps": list(self.tiers.candidate_steps),
                "steps": self.tier, "emaAcceptLength": self.ema}


def draft_schedule(config: EngineConfig) -> DraftSchedule:
    """The schedule the engine of `config` follows (a fixed k without one; k 0 without speculation)."""
    speculation = config.speculation
    if speculation is None:
        return DraftSchedule(0)
    k = speculation.num_speculative_tokens
    if speculation.adaptive is not None:
        return SglangAdaptiveSchedule(k, speculation.adaptive)
    if speculation.k_steps and SIMULATED_ENGINES[config.kind].batch_table_drafts_ahead:
        return VllmBatchSchedule(k, speculation.k_steps)
    if speculation.k_steps:
        return TrtllmBatchSchedule(k, speculation.k_steps)
    return DraftSchedule(k)
