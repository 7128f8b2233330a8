"""The probe's pure part: which requests it sends within its budget, and what their per-request speculative
metrics say per temperature × workload (docs/analysis.md "The probe").

    requests = probe_requests({"code": CODE, "support": SUPPORT}, DEFAULT_TEMPERATURES, ProbeBudget())
    outcomes = [ProbeOutcome(r, SpecDecodeCounts.from_response(body)) for r, body in answered]
    cells = probe_cells(outcomes, k=3, break_even=0.31)
    not_paying(cells)    # ["support at temperature 1: acceptance 0.22 is below the break-even 0.31 …"]

Why per request: live traffic mixes every workload and temperature into one acceptance number, and the
seeds' advice is to measure each load apart before deciding. vLLM returns each request's own drafted and
accepted tokens in the response with `--per-request-spec-decode-metrics` (0.32+), so a probe can be told
apart from the traffic beside it. No I/O here: whoever runs the probe sends the requests and reads the answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml

from specdeploy.api.spec import Probe, SpeculativeDeploymentSpec
from specdeploy.api.status import CountsFrom, ProbeCellStatus, ProbeFailure, ProbeStatus, ProbeTrigger
from specdeploy.judgment import evidence
from specdeploy.judgment.plan_view import PlanView

DEFAULT_TEMPERATURES = (0.0, 0.7, 1.0)
NEUTRAL_WORKLOAD = "neutral"
NEUTRAL_PROMPTS = (
    "Explain in a few sentences how a refrigerator keeps food cold.",
    "Write a short, friendly email asking a colleague to reschedule a meeting.",
    "List three things to check before a long drive, with one sentence on each.",
    "Summarise the water cycle for a ten-year-old.",
)
"""The built-in prompt set when the SD names none: everyday prose, neither code nor a template."""


@dataclass(frozen=True)
class ProbeBudget:
    """How much a probe may take from serving: requests per cell, tokens per request, and its request rate
    (the probe sends one request at a time, and no faster than `requests_per_second`)."""

    requests_per_cell: int = 8
    max_tokens: int = 64
    requests_per_second: float = 1.0

    def __post_init__(self) -> None:
        if self.requests_per_cell < 1 or self.max_tokens < 1 or not self.requests_per_second > 0:
            raise ValueError(f"a probe budget needs at least one request and token and a positive rate: {self}")

    def requests(self, cells: int) -> int:
        return cells * self.requests_per_cell

    def tokens(self, cells: int) -> int:
        """The most output tokens the probe asks for."""
        return self.requests(cells) * self.max_tokens

    def shortest_seconds(self, cells: int) -> float:
        """The probe's duration at its rate limit (longer when the engine is slower than the rate)."""
        return self.requests(cells) / self.requests_per_second


@dataclass(frozen=True)
class ProbeRequest:
    workload: str
    temperature: float
    prompt: str


def probe_requests(workloads: Mapping[str, Sequence[str]], temperatures: Sequence[float],
                   budget: ProbeBudget) -> list[ProbeRequest]:
    """Every cell's requests, interleaved: the i-th request of every cell before the (i+1)-th of any, so a
    probe cut short (a pod gone, its time bound) has measured every cell a little rather than some fully.
    A workload's prompts are used in turn; an empty set is refused."""
    for name, prompts in workloads.items():
        if not prompts:
            raise ValueError(f"workload {name!r} has no prompts")
    return [ProbeRequest(name, temperature, prompts[i % len(prompts)])
            for i in range(budget.requests_per_cell)
            for name, prompts in workloads.items()
            for temperature in temperatures]


@dataclass(frozen=True)
class SpecDecodeCounts:
    """One request's verify steps, drafted tokens and accepted drafted tokens (or a sum of them)."""

    steps: int
    drafted: int
    accepted: int

    @classmethod
    def from_response(cls, body: Mapping[str, Any]) -> SpecDecodeCounts | None:
        """From a completion response's `metrics.speculative_decoding` (vLLM 0.32:
        RequestSpecDecodeMetrics.to_dict in vllm/v1/metrics/stats.py — `num_spec_steps`, `num_draft_tokens`,
        `num_accepted_draft_tokens`); None when the response has none (the flag off, n > 1, no speculation)."""
        metrics = body.get("metrics")
        found = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
        if not isinstance(found, Mapping):
            return None
        try:
            counts = cls(int(found["num_spec_steps"]), int(found["num_draft_tokens"]),
                         int(found["num_accepted_draft_tokens"]))
        except (KeyError, TypeError, ValueError):
            return None
        if min(counts.steps, counts.drafted, counts.accepted) < 0 or counts.accepted > counts.drafted:
            return None
        return counts

    def __add__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        return SpecDecodeCounts(self.steps + other.steps, self.drafted + other.drafted, self.accepted + other.accepted)

    def __sub__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        return SpecDecodeCounts(self.steps - other.steps, self.drafted - other.drafted, self.accepted - other.accepted)


@dataclass(frozen=True)
class ProbeOutcome:
    """What one probe request returned: its counts, or why there are none."""

    request: ProbeRequest
    counts: SpecDecodeCounts | None = None
    error: str | None = None
    from_counters: bool = False   # the engine's counters around the request, not the answer's own figures


@dataclass(frozen=True)
class ProbeCell:
    """One temperature × workload: the requests measured, the acceptance they show, and what the cost model
    predicts of it (`pays` None: no break-even known)."""

    workload: str
    temperature: float
    requests: int                          # answered with counts
    failed: int                            # errors and answers without counts
    acceptance_rate: float | None          # accepted ÷ drafted tokens, as vllm:spec_decode_* count them
    mean_acceptance_length: float | None   # 1 + accepted ÷ verify steps (the bonus token counted)
    predicted_speedup: float | None = None
    pays: bool | None = None


def predicted_speedup(acceptance_rate: float, k: int, break_even: float) -> float:
    """The cost model's speedup at `acceptance_rate`, from its break-even rate at the same batch size.

    The cost model's speedup is (1 + k·rate) × baseline step ÷ speculative step (planning/acceptance_floor.py),
    and at the break-even it is 1, so the step ratio is 1 ÷ (1 + k·break_even).
    """
    return (1.0 + k * acceptance_rate) / (1.0 + k * break_even)


def probe_cells(outcomes: Iterable[ProbeOutcome], k: int, break_even: float | None) -> list[ProbeCell]:
    """Cells in the order their first request was sent."""
    sums: dict[tuple[str, float], SpecDecodeCounts] = {}
    answered: dict[tuple[str, float], int] = {}
    failed: dict[tuple[str, float], int] = {}
    for outcome in outcomes:
        key = (outcome.request.workload, outcome.request.temperature)
        sums.setdefault(key, SpecDecodeCounts(0, 0, 0))
        answered.setdefault(key, 0)
        failed.setdefault(key, 0)
        if outcome.counts is None:
            failed[key] += 1
            continue
        sums[key] = sums[key] + outcome.counts
        answered[key] += 1
    cells = []
    for (workload, temperature), total in sums.items():
        rate = total.accepted / total.drafted if total.drafted else None
        length = 1.0 + total.accepted / total.steps if total.steps else None
        speedup = predicted_speedup(rate, k, break_even) if rate is not None and break_even is not None else None
        cells.append(ProbeCell(workload, temperature, answered[(workload, temperature)],
                               failed[(workload, temperature)], rate, length, speedup,
                               None if speedup is None else speedup > 1.0))
    return cells


def not_paying(cells: Iterable[ProbeCell], break_even: float | None) -> list[str]:
    """One sentence per cell whose measured acceptance is below the break-even, by name."""
    found = []
    for cell in cells:
        if cell.pays is False and cell.acceptance_rate is not None and break_even is not None:
            speedup = cell.predicted_speedup if cell.predicted_speedup is not None else math.nan
            found.append(f"{cell.workload} at temperature {cell.temperature:g}: acceptance {cell.acceptance_rate:.2f} "
                         f"is below the break-even {break_even:.2f} ({cell.requests} requests): speculation "
                         f"would not pay (predicted {speedup:.2f}×)")
    return found


class UnusableWorkloads(ValueError):
    """Prompt sets that are not a mapping of workload name to a non-empty list of prompts."""


def workloads_from(loaded: object, where: str) -> dict[str, list[str]]:
    """Workload name → prompts, from parsed YAML (`specdeploy probe --workloads FILE`)."""
    if not isinstance(loaded, Mapping) or not loaded or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(p, str) for p in v)
            for k, v in loaded.items()):
        raise UnusableWorkloads(f"{where}: expected a mapping of workload name to a non-empty list of prompts")
    return {str(k): list(v) for k, v in loaded.items()}


def workloads_from_config_map(data: Mapping[str, str], where: str) -> dict[str, list[str]]:
    """Workload name → prompts from a ConfigMap's data: each key a workload, each value a YAML list."""
    parsed: dict[str, object] = {}
    for key, text in data.items():
        try:
            parsed[key] = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise UnusableWorkloads(f"{where}: key {key!r} is not YAML: {error}") from error
    return workloads_from(parsed, where)


def probe_result(spec: SpeculativeDeploymentSpec, plan: PlanView | None, outcomes: Sequence[ProbeOutcome],
                 budget: ProbeBudget, cells_count: int, model: str, url: str, taken_at: datetime, trigger: ProbeTrigger,
                 batch_size: int = 1) -> ProbeStatus:
    """status.probe for a probe's outcomes: the cells, the break-even they are judged by (the plan's cost model's
    at `batch_size` running sequences; none without a plan), and what was sent against what the budget allowed."""
    floor = plan.acceptance_floor(batch_size) if plan is not None else None
    break_even = floor.break_even if floor is not None else None
    cells = probe_cells(outcomes, spec.speculation.num_speculative_tokens, break_even)
    described = (f"{spec.speculation.enabled_method.value} k={spec.speculation.num_speculative_tokens}, model "
                 f"{model}; {len(outcomes)} of {budget.requests(cells_count)} requests sent (budget: "
                 f"{budget.requests_per_cell} per cell, ≤ {budget.tokens(cells_count)} tokens, "
                 f"≤ {budget.requests_per_second:g}/s)")
    return ProbeStatus(
        taken_at=evidence.rfc3339(taken_at), trigger=trigger, url=url,
        counts_from=CountsFrom.COUNTERS if any(o.from_counters for o in outcomes) else CountsFrom.ANSWERS,
        budget=described,
        break_even=break_even, break_even_basis=floor.describe() if floor is not None else None,
        cells=[ProbeCellStatus(workload=c.workload, temperature=c.temperature, requests=c.requests, failed=c.failed,
                               acceptance_rate=c.acceptance_rate, mean_acceptance_length=c.mean_acceptance_length,
                               predicted_speedup=c.predicted_speedup, pays=c.pays) for c in cells],
        not_paying=not_paying(cells, break_even))


RETRY_AFTER_FAILURE_SECONDS = 300.0
"""A probe that measured nothing is tried again after this long (a pod not ready, an engine error), not on
every tick."""


@dataclass(frozen=True)
class ProbeTarget:
    """What the probe of one SD can run on: the speculative Deployment's rollout and whether it speculates."""

    speculating: bool            # status.speculation decided and active: the pods run a speculative config
    rolled_out: bool             # the speculative Deployment's pods are all of its current generation
    deployment_generation: int


def probe_due(probe: Probe, last: ProbeStatus | None, target: ProbeTarget | None,
              now: datetime) -> ProbeTrigger | None:
    """Why the operator probes now (NewGeneration or Interval), or None. Only a speculating, rolled-out
    speculative Deployment is probed: a rollout in progress mixes generations, and a rolled-back one has
    nothing to measure."""
    if target is None or not target.speculating or not target.rolled_out:
        return None
    failure = last.last_failure if last is not None else None
    if (failure is not None and failure.deployment_generation == target.deployment_generation
            and (now - evidence.parse_rfc3339(failure.at)).total_seconds() < RETRY_AFTER_FAILURE_SECONDS):
        return None   # the same pods again in a few minutes; new pods at once
    if probe.on_new_generation and (last is None or last.deployment_generation != target.deployment_generation):
        return ProbeTrigger.NEW_GENERATION
    if probe.interval is not None:
        if last is None or last.taken_at is None:
            return ProbeTrigger.INTERVAL
        if (now - evidence.parse_rfc3339(last.taken_at)).total_seconds() >= probe.interval:
            return ProbeTrigger.INTERVAL
    return None


def probe_failed(last: ProbeStatus | None, reason: str, message: str, now: datetime,
                 deployment_generation: int | None = None) -> ProbeStatus:
    """status.probe after a probe of `deployment_generation` that measured nothing: the cells (and generation)
    of the last one that did, and why this one did not — so the same trigger is due again after
    RETRY_AFTER_FAILURE_SECONDS, or at once for a new generation."""
    failure = ProbeFailure(at=evidence.rfc3339(now), reason=reason, message=message,
                           deployment_generation=deployment_generation)
    return (last if last is not None else ProbeStatus()).model_copy(update={"last_failure": failure})
