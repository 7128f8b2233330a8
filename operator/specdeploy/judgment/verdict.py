"""The verdict on one sample: Healthy, Failing(reason, evidence) or Inconclusive(reason, message).

    assessment = assess(sample, Policy(checks, BaselineMode.CONTROL, min_requests=20, floor=floor))
    assessment.verdict
    # Failing(InterTokenLatencyRegressed, "per-token latency +18% (95% interval +9…+27%) vs the control, …")
    assessment.speedup, assessment.diagnosis
    assessment.check(Check.PER_TOKEN_LATENCY)   # CheckResult(outcome=Failed, reason=…, comparison=…, limit=1.10)

A pure function of the measurements and the limits (as Argo Rollouts' evaluate.go): no clock, no I/O. Each check
returns a typed CheckResult; the verdict and the rules between checks read its fields, and its sentence is rendered
from it (`render`) when the verdict's message is put together — never parsed.

What decides (docs/analysis.md "Verdicts"). With a baseline, the measured per-token comparison decides:
the speculative pods' mean latency ÷ the baseline's, from the histograms' `_sum` / `_count` (exact below
vLLM's 10 ms first bucket), with a 95% interval from the window's slices (judgment/comparison.py). A
latency check fails only when the whole interval lies above its limit, passes only when the whole interval
lies at or below it, and otherwise says how many requests would tell — too little evidence is Inconclusive,
never a failure and never healthy. A P99 is shown as the buckets allow (an upper bound inside the first
bucket) and decides nothing. Acceptance explains; it decides alone only where there is no baseline to
compare with (mode None, or Previous without a snapshot at matched load), against `minAcceptanceRate` or,
unset, the break-even floor of the cost model (planning/acceptance_floor.py). Beside a baseline the two together
decide once both are certain: per-token latency slower with its whole interval above 1 while the acceptance's own
interval lies wholly below the floor fails (SlowerBelowAcceptanceFloor), even inside the ratio limit — the limit
tolerates noise, not a loss the acceptance explains.

Which checks count is the objective's (`spec.analysis.objective`, docs/analysis.md "Objectives"). Latency
(the default): per-token latency, and time to first token and end-to-end latency *without the queue* (vLLM's
prefill and inference histograms; elsewhere TTFT / E2E − queue time, slice by slice) — queueing is a matter of
load, which Latency does not judge. Throughput: the load a variant sustains at the same offered load, its mean
queue time (each variant counted at least `queueTimeFloorSeconds`) and its output tokens per second per GPU
against the control's; the per-token checks are computed for status and named as not counting. Both: both
sets. The acceptance floor and the absolute SLO (`maxP99E2ELatencySeconds`, queue included) count under every
objective.

What cannot be measured is never a failure — no series, NaN, fewer than `minRequests` requests, a
Prometheus error: Inconclusive, with the reason. Failing wins over Inconclusive, which wins over
NotDrafting (counters that stopped because the engine drafts nothing at the current batch size), which
wins over Healthy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from specdeploy.api.reasons import FailureReason, InconclusiveReason
from specdeploy.api.spec import BaselineMode, Checks, Objective
from specdeploy.api.status import BaselineName, Bound, MeanLatency, PreviousBaselineStatus, VerdictKind
from specdeploy.judgment import evidence
from specdeploy.judgment.calibration import (
    MIN_DRAFTS,  # the drafts a window counts before its acceptance decides
)
from specdeploy.judgment.comparison import (
    MIN_SLICES,
    Comparison,
    Missing,
    NoComparison,
    Slice,
    estimate,
    paired_ratio,
    rate_interval,
    slices,
    unpaired_ratio,
)
from specdeploy.judgment.comparison import Estimate as _Estimate
from specdeploy.judgment.samples import DeploymentSample, QueryErrorKind, Signal, SignalValues

LOAD_TOLERANCE = 0.30
"""Previous: compare only when the running requests per pod are within ±30% of the snapshot's. Step time grows
with batch size (planning/roofline.py), so a latency measured at another batch size says more about the load
than about speculation; within 30% the batch-size effect on a decode step stays well under the 1.10 limit."""

QUEUE_BOUND_SHARE = 0.5
"""A variant is Queue-bound when waiting is its largest share of the mean end-to-end latency; Prefill- or
Decode-bound likewise. Speculation only speeds up decode."""

P99_FIRST_BUCKET_SECONDS = {
    Signal.P99_INTER_TOKEN_LATENCY: 0.01,
    Signal.P99_TIME_TO_FIRST_TOKEN: 0.001,
    Signal.P99_E2E_LATENCY: 0.3,
}
"""vLLM's first bucket edges (vllm/v1/metrics/loggers.py; FACTS.md): a P99 at or below one is an upper bound.
Used for display only — a P99 decides nothing — and for the other engines' histograms too."""


@dataclass(frozen=True)
class Healthy:
    """Every check held; `summary` lists the numbers."""

    summary: str


@dataclass(frozen=True)
class Failing:
    """A check broke on valid numbers; `evidence` is the measured values and the limits, in one sentence.
    `at_once`: the evidence is not the noise failureLimit guards against, so this sample alone rolls back."""

    reason: FailureReason
    evidence: str
    at_once: bool = False


@dataclass(frozen=True)
class Inconclusive:
    """Nothing can be concluded; `message` says what was missing."""

    reason: InconclusiveReason
    message: str


Verdict = Healthy | Failing | Inconclusive


def kind(result: Verdict) -> VerdictKind:
    """Healthy, Failing or Inconclusive: status.analysis.verdict, and the bounded label of
    specdeploy_analysis_verdicts_total."""
    return VerdictKind(type(result).__name__)


def verdict_reason(result: Verdict) -> str | None:
    """Why, for Failing and Inconclusive (status.analysis.verdictReason); None for Healthy."""
    match result:
        case Healthy():
            return None
        case Failing(reason=why) | Inconclusive(reason=why):
            return why.value


def message(result: Verdict) -> str:
    """The sentence behind the verdict (for the SpeculationHealthy condition)."""
    match result:
        case Healthy(summary=text) | Failing(evidence=text) | Inconclusive(message=text):
            return text


@dataclass(frozen=True)
class Floor:
    """The acceptance floor in force: `rate` (accepted ÷ drafted) and where it comes from, in words. A `fixed`
    floor (minAcceptanceRate written in the spec) is the user's own rule and decides even beside a baseline."""

    rate: float
    basis: str
    fixed: bool = False


@dataclass(frozen=True)
class Policy:
    """What a sample is judged against: the spec's checks and baseline, and the resolved acceptance floor."""

    checks: Checks = field(default_factory=Checks)
    baseline_mode: BaselineMode = BaselineMode.CONTROL
    min_requests: int = 20
    floor: Floor | None = None
    previous: PreviousBaselineStatus | None = None
    objective: Objective = Objective.LATENCY
    gpus_per_pod: int = 1          # spec.resources.gpu.count: output tokens per GPU = per pod ÷ this


@dataclass(frozen=True)
class Assessment:
    """The verdict and what status shows beside it: the speedup and where the time goes."""

    verdict: Verdict
    per_token: Comparison | None = None       # speculative ÷ baseline mean per-token latency
    baseline: BaselineName | None = None
    diagnosis: dict[str, Bound] = field(default_factory=dict)   # variant → where its time goes
    floor: Floor | None = None
    objective: Objective = Objective.LATENCY
    queue: Comparison | None = None             # speculative ÷ control mean queue time, each floored
    output_per_gpu: Comparison | None = None    # speculative ÷ control output tokens per second per GPU
    gpus_per_pod: int = 1
    checks: tuple[CheckResult, ...] = ()          # every check computed, counted or only shown

    def check(self, which: Check) -> CheckResult | None:
        """The outcome of `which` (the counted one where a check was also shown), None when not computed."""
        return next((r for r in sorted(self.checks, key=lambda r: not r.counted) if r.check == which), None)


# -- one check's outcome ---------------------------------------------------------------------------

class Outcome(StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"
    UNDECIDED = "Undecided"      # too little evidence, or nothing measured: the reason says which


class Check(StrEnum):
    """What a check judges (docs/analysis.md "Verdicts")."""

    REQUESTS = "Requests"                  # minRequests, of the speculative pods
    BASELINE = "Baseline"                  # whether there is a baseline to compare with
    ACCEPTANCE = "Acceptance"              # the acceptance floor
    PER_TOKEN_LATENCY = "PerTokenLatency"
    E2E_LATENCY = "E2ELatency"             # without the queue where it is judged
    TIME_TO_FIRST_TOKEN = "TimeToFirstToken"
    QUEUE_TIME = "QueueTime"
    OUTPUT_PER_GPU = "OutputTokensPerGpu"
    SLO = "P99E2ELatencySLO"               # maxP99E2ELatencySeconds


@dataclass(frozen=True)
class Wording:
    """How an interval check is put in words: `subject` ("per-token latency +30% (95% interval …) vs the
    control"), the limit's spec name, the side a failure lies on, `detail` (the means and counts, from "; "),
    whether a pass shows the detail, and `note` (what a failure means, appended)."""

    subject: str
    limit_name: str
    side: str = "above"
    detail: str = ""
    detail_on_pass: bool = False
    note: str = ""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome and the numbers it rests on; `render` makes its sentence, which nothing reads back.

    `reason`: a FailureReason when Failed, an InconclusiveReason when Undecided, None when Passed. Interval checks
    carry their `comparison`, `limit`, the requests per variant that would decide (`needed`) and their `wording`;
    the others their sentence (`text`) and the measured `value`. `kept_up`: an undecided tokens-per-GPU interval
    passed because the queue check passed. `counted`: false for a check the objective shows but does not judge."""

    check: Check
    outcome: Outcome
    reason: FailureReason | InconclusiveReason | None = None
    text: str = ""
    value: float | None = None
    comparison: Comparison | None = None
    limit: float | None = None
    needed: float | None = None
    wording: Wording | None = None
    kept_up: bool = False
    counted: bool = True


def _passed(check: Check, text: str, value: float | None = None) -> CheckResult:
    return CheckResult(check, Outcome.PASSED, text=text, value=value)


def _failed(check: Check, reason: FailureReason, text: str, value: float | None = None) -> CheckResult:
    return CheckResult(check, Outcome.FAILED, reason, text=text, value=value)


def _undecided(check: Check, reason: InconclusiveReason, text: str) -> CheckResult:
    return CheckResult(check, Outcome.UNDECIDED, reason, text=text)


def render(result: CheckResult) -> str:
    """The check's sentence, from its outcome and numbers."""
    words, limit = result.wording, result.limit
    if words is None or limit is None:
        return result.text
    bound = f"{words.limit_name} {evidence.number(limit)}"
    if result.outcome == Outcome.FAILED:
        return f"{words.subject}, {words.side} {bound}{words.detail}{words.note}"
    if result.outcome == Outcome.UNDECIDED:
        more = f"; about {evidence.count(result.needed)} requests per variant would tell" if result.needed else ""
        return f"{words.subject}: the interval holds {bound}{more}{words.detail}"
    if result.kept_up:
        return (f"{words.subject}, undecided, but the speculative pods queue no more than the control: they keep up "
                "with the offered load")
    return words.subject + (words.detail if words.detail_on_pass else "")


_ERROR_REASONS = {
    QueryErrorKind.UNAVAILABLE: InconclusiveReason.PROMETHEUS_UNAVAILABLE,
    QueryErrorKind.REFUSED: InconclusiveReason.PROMETHEUS_REFUSED,
    QueryErrorKind.BAD_QUERY: InconclusiveReason.PROMETHEUS_BAD_QUERY,
    QueryErrorKind.BAD_RESPONSE: InconclusiveReason.PROMETHEUS_BAD_RESPONSE,
    QueryErrorKind.NOT_ALLOWED: InconclusiveReason.PROMETHEUS_URL_NOT_ALLOWED,
}

_WHAT = {
    Signal.ACCEPTANCE_RATE: "acceptance rate",
    Signal.P99_E2E_LATENCY: "P99 end-to-end latency",
    Signal.REQUESTS: "request count",
    Signal.MEAN_INTER_TOKEN_LATENCY: "per-token latency",
    Signal.MEAN_E2E_LATENCY: "end-to-end latency",
    Signal.MEAN_TIME_TO_FIRST_TOKEN: "time to first token",
    Signal.PODS: "pod count",
}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _measured(sample: DeploymentSample, values: SignalValues, signal: Signal, whose: str,
              check: Check) -> float | CheckResult:
    """The value of `signal`, or why there is none (a query error, no series, NaN) as `check` undecided."""
    error = sample.errors.get(signal)
    if error is not None:
        return _undecided(check, _ERROR_REASONS[error.kind], f"the {_WHAT[signal]} query failed: {error.message}")
    value = values.get(signal)
    if value is None:
        return _undecided(check, InconclusiveReason.NO_DATA, f"Prometheus has no {_WHAT[signal]} of the {whose}")
    if not math.isfinite(value):
        return _undecided(check, InconclusiveReason.NOT_A_NUMBER,
                          f"the {_WHAT[signal]} of the {whose} is {evidence.number(value)} (nothing measured)")
    return value


def _request_gate(sample: DeploymentSample, values: SignalValues, min_requests: int, whose: str,
                  too_few: InconclusiveReason, check: Check) -> float | CheckResult:
    requests = _measured(sample, values, Signal.REQUESTS, whose, check)
    if isinstance(requests, CheckResult):
        return requests
    if requests < min_requests:
        return CheckResult(check, Outcome.UNDECIDED, too_few, value=requests,
                           text=f"the {whose} finished {evidence.count(requests)} requests in "
                                f"{evidence.window(sample.window_seconds)}, fewer than minRequests {min_requests}")
    return requests


# -- the latency checks ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _LatencyCheck:
    check: Check
    what: str
    mean: Signal | None      # the query's mean, for display; None: the mean of the check's slices
    p99: Signal | None       # for display only
    sums: Signal
    counts: Signal
    limit: Callable[[Checks], float]
    limit_name: str
    reason: FailureReason
    stored: str              # the PreviousBaselineStatus field of its snapshot
    with_queue: tuple[Signal, Signal] | None = None
    """The series that include the queue: where the engine has no histogram of its own for `sums` (SGLang,
    TensorRT-LLM), each slice's mean queue time is subtracted from them instead."""
    floor: Callable[[Checks], float] | None = None
    """Each variant's mean counted as at least this (prefillTimeFloorSeconds); None: as measured."""


_PER_TOKEN = _LatencyCheck(
    Check.PER_TOKEN_LATENCY, "per-token latency", Signal.MEAN_INTER_TOKEN_LATENCY, Signal.P99_INTER_TOKEN_LATENCY,
    Signal.INTER_TOKEN_LATENCY_SUM_SERIES, Signal.INTER_TOKEN_LATENCY_COUNT_SERIES,
    lambda c: c.per_token_latency_ratio, "maxPerTokenLatencyRatio",
    FailureReason.INTER_TOKEN_LATENCY_REGRESSED, "inter_token_latency")
_E2E = _LatencyCheck(
    Check.E2E_LATENCY, "end-to-end latency", Signal.MEAN_E2E_LATENCY, Signal.P99_E2E_LATENCY, Signal.E2E_LATENCY_SUM_SERIES,
    Signal.E2E_LATENCY_COUNT_SERIES, lambda c: c.inference_time_ratio, "maxInferenceTimeRatio",
    FailureReason.E2E_LATENCY_REGRESSED, "e2e_latency")
_TTFT = _LatencyCheck(
    Check.TIME_TO_FIRST_TOKEN, "time to first token", Signal.MEAN_TIME_TO_FIRST_TOKEN, Signal.P99_TIME_TO_FIRST_TOKEN,
    Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES, Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES,
    lambda c: c.prefill_time_ratio, "maxPrefillTimeRatio",
    FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED, "time_to_first_token")
# What the Latency objective judges: vLLM's TTFT and E2E include the time a request waits for a slot in the
# batch, which is load, not speed — a speculative variant with less KV cache queues first while each of its
# tokens is faster. So the ratio checks keep their names and limits but read the engine's time without the
# queue: vllm:request_prefill_time_seconds (scheduled → first token) and vllm:request_inference_time_seconds
# (scheduled → last token) (vllm/v1/metrics/stats.py).
_ENGINE_E2E = _LatencyCheck(
    Check.E2E_LATENCY, "end-to-end latency without the queue", None, None, Signal.INFERENCE_TIME_SUM_SERIES,
    Signal.INFERENCE_TIME_COUNT_SERIES, lambda c: c.inference_time_ratio, "maxInferenceTimeRatio",
    FailureReason.E2E_LATENCY_REGRESSED, "inference_time",
    (Signal.E2E_LATENCY_SUM_SERIES, Signal.E2E_LATENCY_COUNT_SERIES))
_ENGINE_TTFT = _LatencyCheck(
    Check.TIME_TO_FIRST_TOKEN, "time to first token without the queue", None, None, Signal.PREFILL_TIME_SUM_SERIES,
    Signal.PREFILL_TIME_COUNT_SERIES, lambda c: c.prefill_time_ratio, "maxPrefillTimeRatio",
    FailureReason.TIME_TO_FIRST_TOKEN_REGRESSED, "prefill_time",
    (Signal.TIME_TO_FIRST_TOKEN_SUM_SERIES, Signal.TIME_TO_FIRST_TOKEN_COUNT_SERIES),
    lambda c: c.prefill_time_floor_seconds)
# The prefill floor: a speculative step that completes a prompt also runs the drafter over it and drafts k tokens
# for it, a fixed few to tens of ms (benchmarks/default_checks.py: 23 → 36 ms for Llama-3.1-70B FP8 with an 8B
# draft at k=4, 256-token prompts, while each request finishes 16% sooner). On short prompts that is a ratio
# above 1.50 of times below what a user can tell apart; on long prompts, where a slower prefill is felt, the
# times are above the floor and the ratio is compared as measured (docs/decisions.md).
_LATENCY_CHECKS = (_PER_TOKEN, _ENGINE_E2E, _ENGINE_TTFT)
_QUEUE_SERIES = (Signal.QUEUE_TIME_SUM_SERIES, Signal.QUEUE_TIME_COUNT_SERIES)


def _check_slices(values: SignalValues, check: _LatencyCheck) -> list[Slice]:
    """The slices a check compares: its own histogram's, else (engine time) the queue-inclusive histogram's with
    each slice's mean queue time taken off every request of it."""
    own = slices(values.points(check.sums), values.points(check.counts))
    if own or check.with_queue is None or values.points(check.sums):
        return own
    whole = slices(values.points(check.with_queue[0]), values.points(check.with_queue[1]))
    queue = {part.end: part for part in slices(values.points(_QUEUE_SERIES[0]), values.points(_QUEUE_SERIES[1]))}
    result = []
    for part in whole:
        waited = queue.get(part.end)
        if waited is None:
            continue
        mean_wait = waited.total / waited.count if waited.count > 0 else 0.0
        result.append(Slice(part.end, max(0.0, part.total - mean_wait * part.count), part.count))
    return result


def _slices_mean(parts: list[Slice]) -> float | None:
    count = sum(part.count for part in parts)
    return sum(part.total for part in parts) / count if count > 0 else None


def _check_signals(check: _LatencyCheck, sample: DeploymentSample) -> tuple[Signal, ...]:
    """The queries a check's slices come from in this sample (a failed one leaves it undecided)."""
    if check.with_queue is None or sample.speculative.points(check.sums) or sample.errors.get(check.sums):
        return check.sums, check.counts
    return check.sums, check.counts, *check.with_queue, *_QUEUE_SERIES


def p99_shown(value: float | None, signal: Signal = Signal.P99_INTER_TOKEN_LATENCY) -> str | None:
    """A P99 as bucketed data allows: "< 10 ms" inside the first bucket, "≈ 31 ms" (interpolated) above it."""
    if value is None or not math.isfinite(value):
        return None
    edge = P99_FIRST_BUCKET_SECONDS[signal]
    if value <= edge:
        return f"< {evidence.seconds(edge)}"
    return f"≈ {evidence.seconds(value)}"


def change(ratio: float) -> str:
    """A ratio as a change: 1.18 → "+18%", 0.62 → "−38%"."""
    percent = (ratio - 1.0) * 100
    if abs(percent) < 0.05:
        return "±0%"
    shown = f"{abs(percent):.0f}%" if abs(percent) >= 1 else f"{abs(percent):.1f}%"
    return ("+" if percent >= 0 else "−") + shown


def interval(comparison: Comparison) -> str:
    return f"{change(comparison.ratio)} (95% interval {change(comparison.low)}…{change(comparison.high)})"


def _mean_latency(values: SignalValues, check: _LatencyCheck) -> MeanLatency | None:
    found = estimate(_check_slices(values, check))
    if found is None:
        return None
    return MeanLatency(mean_seconds=found.mean, log_standard_error=found.log_standard_error, slices=found.slices,
                       requests=found.requests)


@dataclass(frozen=True)
class _Baseline:
    values: SignalValues | None      # the control's signals (None: a Previous snapshot)
    snapshot: PreviousBaselineStatus | None
    name: BaselineName
    whose: str                       # "the control" / "the Previous baseline"
    requests: float | None = None


def _compare(sample: DeploymentSample, check: _LatencyCheck, baseline: _Baseline,
             checks: Checks) -> Comparison | NoComparison:
    floor = _floor(check, checks)
    spec = _floored(_check_slices(sample.speculative, check), floor)
    if baseline.values is not None:
        return paired_ratio(spec, _floored(_check_slices(baseline.values, check), floor))
    stored: MeanLatency | None = getattr(baseline.snapshot, check.stored, None)
    if stored is None:
        return NoComparison(Missing.NO_BASELINE_MEAN)
    now = estimate(spec)
    if now is None:
        return NoComparison(Missing.TOO_FEW_SLICES)
    then = _Estimate(max(stored.mean_seconds, floor), stored.log_standard_error, stored.slices, stored.requests)
    return unpaired_ratio(now, then)


def _floor(check: _LatencyCheck, checks: Checks) -> float:
    return check.floor(checks) if check.floor is not None else 0.0


def _no_comparison(missing: NoComparison, counted: str = "requests") -> str:
    """Why there is no interval, in words; `counted`: what a slice holds (requests, output tokens)."""
    match missing.why:
        case Missing.TOO_FEW_PAIRED_SLICES:
            return (f"only {missing.slices} of the window's slices hold {counted} of both variants "
                    f"(at least {MIN_SLICES} are needed for an interval)")
        case Missing.TOO_FEW_SLICES:
            return f"too few of the window's slices hold {counted}"
        case Missing.NO_BASELINE_MEAN:
            return "the Previous baseline has no mean of it"
        case Missing.ZERO_MEAN:
            return "a variant's mean latency is 0"


def _interval_check(check: Check, found: Comparison, limit: float, reason: FailureReason, wording: Wording,
                    higher_is_better: bool = False) -> CheckResult:
    """Failed when the whole interval is on the wrong side of `limit`, passed when it is wholly on the right side,
    else undecided with the requests per variant that would tell."""
    wrong = found.high < limit if higher_is_better else found.low > limit
    right = found.low >= limit if higher_is_better else found.high <= limit
    if wrong:
        return CheckResult(check, Outcome.FAILED, reason, comparison=found, limit=limit, wording=wording)
    if right:
        return CheckResult(check, Outcome.PASSED, comparison=found, limit=limit, wording=wording)
    return CheckResult(check, Outcome.UNDECIDED, InconclusiveReason.NOT_ENOUGH_EVIDENCE, comparison=found,
                       limit=limit, needed=found.requests_to_decide(limit), wording=wording)


def _latency(sample: DeploymentSample, check: _LatencyCheck, baseline: _Baseline, checks: Checks) -> CheckResult:
    what = check.what
    error = next((failed for signal in _check_signals(check, sample) if (failed := sample.errors.get(signal))), None)
    if error is not None:
        return _undecided(check.check, _ERROR_REASONS[error.kind], f"the {what} query failed: {error.message}")
    found = _compare(sample, check, baseline, checks)
    if isinstance(found, NoComparison):
        return _undecided(check.check, InconclusiveReason.NOT_ENOUGH_EVIDENCE,
                          f"{what} vs {baseline.whose}: {_no_comparison(found)}")
    floor = _floor(check, checks)
    raised = floor if _below_floor(sample, check, baseline, floor) else 0.0
    wording = Wording(f"{what} {interval(found)} vs {baseline.whose}", check.limit_name,
                      detail=_detail(sample, check, baseline, found, raised), detail_on_pass=raised > 0)
    return _interval_check(check.check, found, check.limit(checks), check.reason, wording)


def _below_floor(sample: DeploymentSample, check: _LatencyCheck, baseline: _Baseline, floor: float) -> bool:
    """Whether a variant's mean is below the check's floor: the comparison is then not of the times as measured,
    and the evidence says so even when the check passes."""
    if floor <= 0:
        return False
    means = [_slices_mean(_check_slices(sample.speculative, check))]
    if baseline.values is not None:
        means.append(_slices_mean(_check_slices(baseline.values, check)))
    elif (stored := getattr(baseline.snapshot, check.stored, None)) is not None:
        means.append(stored.mean_seconds)
    return any(mean is not None and mean < floor for mean in means)


def _detail(sample: DeploymentSample, check: _LatencyCheck, baseline: _Baseline, found: Comparison,
            floor: float = 0.0) -> str:
    """"; mean 5.9 ms vs 5.0 ms, P99 < 10 ms vs < 10 ms; 412 vs 198 requests in 10 slices"; a floor that raised a
    mean (else 0): "mean 45 ms vs 27 ms (each counted as at least prefillTimeFloorSeconds 100 ms)"."""
    def mean_of(values: SignalValues) -> float | None:
        if check.mean is not None:
            return _finite(values.get(check.mean))
        return _slices_mean(_check_slices(values, check))

    spec_mean = mean_of(sample.speculative)
    base_p99: str | None = None
    if baseline.values is not None:
        base_mean = mean_of(baseline.values)
        if check.p99 is not None:
            base_p99 = p99_shown(baseline.values.get(check.p99), check.p99)
    else:
        stored: MeanLatency | None = getattr(baseline.snapshot, check.stored, None)
        base_mean = stored.mean_seconds if stored is not None else None
        if check.p99 is not None:
            base_p99 = p99_shown(getattr(baseline.snapshot, check.p99.value), check.p99)
    parts = []
    if spec_mean is not None and base_mean is not None:
        floored = f" (each counted as at least prefillTimeFloorSeconds {evidence.seconds(floor)})" if floor > 0 else ""
        parts.append(f"mean {evidence.seconds(spec_mean)} vs {evidence.seconds(base_mean)}{floored}")
    spec_p99 = p99_shown(sample.speculative.get(check.p99), check.p99) if check.p99 is not None else None
    if spec_p99 and base_p99:
        parts.append(f"P99 {spec_p99} vs {base_p99}")
    counts = (f"{evidence.count(found.requests)} vs {evidence.count(found.baseline_requests)} requests "
              f"in {found.slices} slices")
    return "; " + ", ".join(parts) + "; " + counts if parts else "; " + counts


def _baseline(sample: DeploymentSample, policy: Policy) -> _Baseline | CheckResult | None:
    """What the latency checks compare with, why there is nothing to compare with, or None (mode None)."""
    mode = policy.baseline_mode
    if mode == BaselineMode.NONE:
        return None
    if mode == BaselineMode.CONTROL:
        requests = sample.control.requests
        if requests is None and not sample.errors.get(Signal.REQUESTS):
            return _undecided(Check.BASELINE, InconclusiveReason.NO_CONTROL_DATA,
                              "Prometheus has no series of the control pods (specdeploy_io_variant=\"control\")")
        gate = _request_gate(sample, sample.control, policy.min_requests, "control pods",
                             InconclusiveReason.CONTROL_TOO_FEW_REQUESTS, Check.BASELINE)
        if isinstance(gate, CheckResult):
            return gate
        return _Baseline(sample.control, None, BaselineName.CONTROL, "the control", gate)
    previous = policy.previous
    if previous is None:
        return _undecided(Check.BASELINE, InconclusiveReason.NO_PREVIOUS_BASELINE,
                          "no Previous baseline yet: the pods have not been measured without speculation")
    now, then = sample.speculative.running_per_pod, previous.running_per_pod
    if now is None or then is None or then <= 0 or abs(now / then - 1.0) > LOAD_TOLERANCE:
        shown_now = "unknown" if now is None else f"{now:.1f}"
        shown_then = "unknown" if then is None else f"{then:.1f}"
        return _undecided(Check.BASELINE, InconclusiveReason.LOAD_DIFFERS_FROM_PREVIOUS,
                          f"{shown_now} running requests per pod differs from the Previous baseline's {shown_then} "
                          f"(taken at {previous.taken_at}) by more than {LOAD_TOLERANCE:.0%}: not matched load")
    return _Baseline(None, previous, BaselineName.PREVIOUS, "the Previous baseline")


# -- acceptance ------------------------------------------------------------------------------------

def _acceptance(sample: DeploymentSample, floor: Floor | None) -> CheckResult:
    """The acceptance against the floor; undecided NotDrafting when the draft counters did not move."""
    error = sample.errors.get(Signal.ACCEPTANCE_RATE)
    value = sample.speculative.acceptance_rate
    if error is None and value is not None and math.isnan(value):
        return _undecided(Check.ACCEPTANCE, InconclusiveReason.NOT_DRAFTING,
                          "not drafting now: the draft counters did not move in the window (the engine drafts "
                          "nothing at this batch size)")
    measured = _measured(sample, sample.speculative, Signal.ACCEPTANCE_RATE, "speculative pods", Check.ACCEPTANCE)
    if isinstance(measured, CheckResult):
        return measured
    if floor is None:
        return _passed(Check.ACCEPTANCE, f"acceptance rate {evidence.number(measured)} (no floor: set "
                                         "minAcceptanceRate)", measured)
    shown, limit = evidence.compared(measured, floor.rate)
    if measured < floor.rate:
        rule = f"minAcceptanceRate {limit}" if floor.fixed else f"the acceptance floor {limit} ({floor.basis})"
        return CheckResult(Check.ACCEPTANCE, Outcome.FAILED, FailureReason.ACCEPTANCE_BELOW_MINIMUM,
                           f"acceptance rate {shown} < {rule}", measured, limit=floor.rate)
    return CheckResult(Check.ACCEPTANCE, Outcome.PASSED, None, f"acceptance rate {shown} (floor {limit})", measured,
                       limit=floor.rate)


@dataclass(frozen=True)
class AcceptanceInterval:
    """The speculative pods' acceptance rate over the window, its 95% interval and the drafts behind it."""

    rate: float
    low: float
    high: float
    drafts: float


def acceptance_interval(values: SignalValues) -> AcceptanceInterval | None:
    """The acceptance rate (accepted ÷ drafted tokens) with its 95% interval; None without a rate or without drafts
    counted (SGLang exports no counts: its acceptance has no interval).

    Each draft is one unit, not each token: a draft's tokens are not independent (the first rejection ends it), and
    a draft's accepted fraction, in [0, 1] with mean r, varies at most r(1 − r) (the Bhatia–Davis bound) — as much
    as one yes-or-no outcome. So a Wilson interval over the drafts holds however a draft's tokens correlate."""
    rate = _finite(values.acceptance_rate)
    counts = values.position_counts
    if rate is None or counts is None:
        return None
    low, high = rate_interval(rate, counts.drafts)
    return AcceptanceInterval(rate, low, high, counts.drafts)


def _explained_loss(sample: DeploymentSample, baseline: _Baseline, per_token: CheckResult,
                    policy: Policy) -> CheckResult | None:
    """Slower, and explained: the per-token comparison's whole interval above 1 while the acceptance's whole interval
    lies below the Auto floor — Failing SlowerBelowAcceptanceFloor, though the interval may hold or pass
    maxPerTokenLatencyRatio. The limit tolerates changes the operator cannot tell from noise; this one is
    measured, and the acceptance says why (the drafts cost more than they save), under any k: Fixed, Table or
    Auto. None where either part lacks its evidence (the interval reaches 1, the acceptance's reaches the floor,
    fewer than MIN_DRAFTS drafts, no counts), where per-token latency failed on its own, and for a Fixed floor
    (minAcceptanceRate decides alone). The result's `value` is the acceptance and its `limit` the floor."""
    floor, found = policy.floor, per_token.comparison
    if found is None or per_token.outcome == Outcome.FAILED or floor is None or floor.fixed or found.low <= 1.0:
        return None
    acceptance = acceptance_interval(sample.speculative)
    if acceptance is None or acceptance.drafts < MIN_DRAFTS or acceptance.high >= floor.rate:
        return None
    limit = evidence.compared(acceptance.high, floor.rate)[1]
    rate, low, high = (evidence.number(value, 3) for value in (acceptance.rate, acceptance.low, acceptance.high))
    tolerance = evidence.number(_PER_TOKEN.limit(policy.checks))
    return CheckResult(Check.PER_TOKEN_LATENCY, Outcome.FAILED, FailureReason.SLOWER_BELOW_ACCEPTANCE_FLOOR,
                       comparison=found, limit=floor.rate, value=acceptance.rate, text=(
        f"per-token latency {interval(found)} vs {baseline.whose}, slower beyond noise (the ratio limit "
        f"{_PER_TOKEN.limit_name} {tolerance} tolerates noise, not a loss), and the acceptance rate {rate} (95% "
        f"interval {low}…{high}, {evidence.count(acceptance.drafts)} drafts) is below the acceptance floor {limit} "
        f"({floor.basis}): the drafts cost more than they save{_detail(sample, _PER_TOKEN, baseline, found)}"))


def _slo(sample: DeploymentSample, checks: Checks) -> CheckResult | None:
    limit = checks.max_p99_e2e_latency_seconds
    if limit is None:
        return None
    value = _measured(sample, sample.speculative, Signal.P99_E2E_LATENCY, "speculative pods", Check.SLO)
    if isinstance(value, CheckResult):
        return value
    if value > limit:
        return _failed(Check.SLO, FailureReason.E2E_LATENCY_ABOVE_SLO,
                       f"P99 end-to-end latency {evidence.seconds(value)} > maxP99E2ELatencySeconds "
                       f"{evidence.seconds(limit)}", value)
    return _passed(Check.SLO, f"P99 end-to-end latency {evidence.seconds(value)} within the SLO", value)


# -- the throughput checks (objectives Throughput and Both) ------------------------------------------

def times(comparison: Comparison) -> str:
    """A ratio with its interval as multiples: "5.87× (95% interval 4.10×…8.31×)"."""
    return (f"{evidence.number(comparison.ratio)}× (95% interval {evidence.number(comparison.low)}×…"
            f"{evidence.number(comparison.high)}×)")


def _floored(parts: list[Slice], floor: float) -> list[Slice]:
    """Each slice's mean counted as at least `floor`: queue waits below queueTimeFloorSeconds are noise (a step or
    two of scheduling), prefill times below prefillTimeFloorSeconds no user tells apart, so two variants that both
    stay below compare as equal, and a control that never waits does not make any wait of the speculative pods an
    infinite ratio."""
    return [Slice(part.end, max(part.total, floor * part.count), part.count) for part in parts]


def _series_error(sample: DeploymentSample, signals: tuple[Signal, ...], what: str, check: Check) -> CheckResult | None:
    error = next((failed for signal in signals if (failed := sample.errors.get(signal))), None)
    if error is None:
        return None
    return _undecided(check, _ERROR_REASONS[error.kind], f"the {what} query failed: {error.message}")


def _per_pod_text(values: SignalValues, value: float | None, digits: int) -> str | None:
    shown = values.per_pod(value)
    return None if shown is None else f"{shown:.{digits}f}"


def _queue_check(sample: DeploymentSample, control: SignalValues, checks: Checks) -> CheckResult:
    """Speculative ÷ control mean queue time over the window's slices, each variant at least the floor."""
    what = "queue time"
    failed = _series_error(sample, _QUEUE_SERIES, what, Check.QUEUE_TIME)
    if failed is not None:
        return failed
    floor = checks.queue_time_floor_seconds
    spec_parts = slices(sample.speculative.points(_QUEUE_SERIES[0]), sample.speculative.points(_QUEUE_SERIES[1]))
    base_parts = slices(control.points(_QUEUE_SERIES[0]), control.points(_QUEUE_SERIES[1]))
    found = paired_ratio(_floored(spec_parts, floor), _floored(base_parts, floor))
    if isinstance(found, NoComparison):
        return _undecided(Check.QUEUE_TIME, InconclusiveReason.NOT_ENOUGH_EVIDENCE,
                          f"{what} vs the control: {_no_comparison(found)}")
    spec_mean = _finite(sample.speculative.mean_queue_time_seconds) or _slices_mean(spec_parts)
    base_mean = _finite(control.mean_queue_time_seconds) or _slices_mean(base_parts)
    parts = []
    if spec_mean is not None and base_mean is not None:
        parts.append(f"mean {evidence.seconds(spec_mean)} vs {evidence.seconds(base_mean)} "
                     f"(each counted as at least queueTimeFloorSeconds {evidence.seconds(floor)})")
    waiting = (_per_pod_text(sample.speculative, sample.speculative.waiting, 1),
               _per_pod_text(control, control.waiting, 1))
    if waiting[0] is not None and waiting[1] is not None:
        parts.append(f"{waiting[0]} vs {waiting[1]} requests waiting per pod")
    counts = f"{evidence.count(found.requests)} vs {evidence.count(found.baseline_requests)} requests in " \
             f"{found.slices} slices"
    wording = Wording(f"{what} {times(found)} the control's", "maxQueueTimeRatio",
                      detail="; " + ", ".join([*parts, counts]), detail_on_pass=True,
                      note=": the speculative pods queue first at the same load (fewer sequences fit beside the "
                           "draft, or each takes longer)")
    return _interval_check(Check.QUEUE_TIME, found, checks.max_queue_time_ratio, FailureReason.QUEUE_TIME_REGRESSED,
                           wording)


def _gpu_seconds(points: tuple[tuple[float, float], ...], gpus: float) -> tuple[tuple[float, float], ...]:
    """Cumulative GPU-seconds at the instants of `points`: the denominator that makes a token count a rate."""
    start = points[0][0] if points else 0.0
    return tuple((at, (at - start) * gpus) for at, _ in points)


def _output_check(sample: DeploymentSample, control: SignalValues, checks: Checks,
                  gpus_per_pod: int) -> CheckResult:
    """Speculative ÷ control output tokens per second per GPU, paired by slice (generation tokens ÷ pods ÷ GPUs
    per pod): at the same offered load a variant that sustains it serves the same tokens per GPU."""
    what = "output tokens per second per GPU"
    failed = _series_error(sample, (Signal.OUTPUT_TOKENS_SERIES, Signal.PODS), what, Check.OUTPUT_PER_GPU)
    if failed is not None:
        return failed
    spec, gpus = sample.speculative, max(gpus_per_pod, 1)
    for values, whose in ((spec, "speculative pods"), (control, "control pods")):
        pods = _finite(values.pods)
        if not pods:
            return _undecided(Check.OUTPUT_PER_GPU, InconclusiveReason.NO_DATA,
                              f"Prometheus has no pod count of the {whose}")
    assert spec.pods and control.pods
    spec_points, base_points = spec.points(Signal.OUTPUT_TOKENS_SERIES), control.points(Signal.OUTPUT_TOKENS_SERIES)
    found = paired_ratio(slices(spec_points, _gpu_seconds(spec_points, spec.pods * gpus)),
                         slices(base_points, _gpu_seconds(base_points, control.pods * gpus)))
    if isinstance(found, NoComparison):
        return _undecided(Check.OUTPUT_PER_GPU, InconclusiveReason.NOT_ENOUGH_EVIDENCE,
                          f"{what} vs the control: {_no_comparison(found, 'output tokens')}")
    found = dataclasses.replace(found, requests=_finite(spec.requests) or 0.0,
                                baseline_requests=_finite(control.requests) or 0.0)
    rates = (spec.per_pod(spec.output_tokens_per_second), control.per_pod(control.output_tokens_per_second))
    parts = []
    if rates[0] is not None and rates[1] is not None:
        parts.append(f"{rates[0] / gpus:,.0f} vs {rates[1] / gpus:,.0f} tokens/s per GPU")
    parts.append(f"{evidence.count(spec.pods)} vs {evidence.count(control.pods)} pods of {gpus} GPU"
                 f"{'s' if gpus > 1 else ''}")
    wording = Wording(f"{what} {times(found)} the control's", "minOutputTokensPerGpuRatio", side="below",
                      detail="; " + ", ".join(parts), detail_on_pass=True)
    return _interval_check(Check.OUTPUT_PER_GPU, found, checks.min_output_tokens_per_gpu_ratio,
                           FailureReason.OUTPUT_THROUGHPUT_REGRESSED, wording, higher_is_better=True)


def _kept_up(output: CheckResult, queue: CheckResult) -> CheckResult:
    """An undecided tokens-per-GPU interval beside a passed queue check passes. Below saturation both variants
    serve what arrives, so their token rates differ only by the arrival noise of each pod's share (at low load
    the interval stays wide however long one waits); a variant that does not queue more than the control keeps
    up with the offered load, which is what the tokens check asks."""
    if (output.outcome == Outcome.UNDECIDED and output.comparison is not None
            and output.reason == InconclusiveReason.NOT_ENOUGH_EVIDENCE and queue.outcome == Outcome.PASSED):
        return dataclasses.replace(output, outcome=Outcome.PASSED, reason=None, needed=None, kept_up=True)
    return output


# -- where the time goes ---------------------------------------------------------------------------

def diagnose(values: SignalValues) -> Bound | None:
    """Queue-bound, Prefill-bound or Decode-bound: the largest part of a request's mean end-to-end latency."""
    ttft, e2e = _finite(values.mean_time_to_first_token_seconds), _finite(values.mean_e2e_latency_seconds)
    if ttft is None or e2e is None or e2e <= 0:
        return None
    queue = _finite(values.mean_queue_time_seconds) or 0.0
    parts = {Bound.QUEUE: queue, Bound.PREFILL: max(0.0, ttft - queue), Bound.DECODE: max(0.0, e2e - ttft)}
    return max(parts, key=lambda name: parts[name])


def _queue_note(values: SignalValues) -> str:
    queue, e2e = _finite(values.mean_queue_time_seconds), _finite(values.mean_e2e_latency_seconds)
    if queue is None or e2e is None or e2e <= 0:
        return ""
    return (f"; the speculative pods are Queue-bound (waiting {queue / e2e:.0%} of end-to-end latency): "
            "the load exceeds what they serve, speculation only speeds up decode")


# -- the verdict -----------------------------------------------------------------------------------

def _context(sample: DeploymentSample, requests: float, baseline: _Baseline | None, objective: Objective) -> str:
    extra = f"; control {evidence.count(baseline.requests)}" if baseline and baseline.requests is not None else ""
    return f"over {evidence.window(sample.window_seconds)} ({evidence.count(requests)} requests{extra}), " \
           f"objective {objective.value}"


LATENCY_OBJECTIVES = (Objective.LATENCY, Objective.BOTH)
THROUGHPUT_OBJECTIVES = (Objective.THROUGHPUT, Objective.BOTH)


def _not_counted(results: list[CheckResult], objective: Objective, what: str) -> str:
    """The checks another objective would judge, shown as information: "; not counted under objective …: …"."""
    texts = [render(r) for r in results if r.outcome != Outcome.UNDECIDED]
    if not texts:
        return ""
    return f"; not counted under objective {objective.value} ({what}): " + "; ".join(texts)


def _uncounted(results: list[CheckResult]) -> list[CheckResult]:
    return [dataclasses.replace(r, counted=False) for r in results]


def assess(sample: DeploymentSample, policy: Policy) -> Assessment:
    """The verdict on `sample` under `policy`, with the per-token comparison and the diagnosis."""
    objective = policy.objective
    diagnosis = {name: bound for name, values in (("speculative", sample.speculative), ("control", sample.control))
                 if (bound := diagnose(values)) is not None}
    requests = _request_gate(sample, sample.speculative, policy.min_requests, "speculative pods",
                             InconclusiveReason.TOO_FEW_REQUESTS, Check.REQUESTS)
    if isinstance(requests, CheckResult):
        assert isinstance(requests.reason, InconclusiveReason)
        return Assessment(Inconclusive(requests.reason, render(requests) + f", objective {objective.value}"),
                          diagnosis=diagnosis, floor=policy.floor, objective=objective,
                          gpus_per_pod=policy.gpus_per_pod, checks=(requests,))
    counted: list[CheckResult] = []
    shown: list[CheckResult] = []        # computed, shown, not counted under this objective
    not_counted = ""
    baseline = _baseline(sample, policy)
    per_token: Comparison | None = None
    queue: Comparison | None = None
    output: Comparison | None = None
    explained: CheckResult | None = None
    if isinstance(baseline, _Baseline):
        latency: list[CheckResult] = []
        for check in _LATENCY_CHECKS:
            result = _latency(sample, check, baseline, policy.checks)
            if check is _PER_TOKEN:
                per_token = result.comparison
                explained = _explained_loss(sample, baseline, result, policy)
                result = explained or result
            latency.append(result)
        throughput: list[CheckResult] = []
        if baseline.values is not None:
            queue_result = _queue_check(sample, baseline.values, policy.checks)
            output_result = _output_check(sample, baseline.values, policy.checks, policy.gpus_per_pod)
            queue, output = queue_result.comparison, output_result.comparison
            throughput = [queue_result, _kept_up(output_result, queue_result)]
        elif objective in THROUGHPUT_OBJECTIVES:
            throughput = [_undecided(Check.BASELINE, InconclusiveReason.NO_CONTROL_DATA,
                                     f"objective {objective.value} compares queueing and tokens per GPU with the "
                                     "control pods; the Previous baseline has none (set baseline mode Control)")]
        if objective in LATENCY_OBJECTIVES:
            counted += latency
        else:
            shown += _uncounted(latency)
            not_counted += _not_counted(latency, objective, "latency checks")
        if objective in THROUGHPUT_OBJECTIVES:
            counted += throughput
        else:
            shown += _uncounted(throughput)
            not_counted += _not_counted([r for r in throughput if r.outcome == Outcome.FAILED], objective,
                                        "queueing and throughput: objective Throughput or Both judges them")
    elif baseline is not None:
        counted.append(baseline)
    elif objective in THROUGHPUT_OBJECTIVES:
        counted.append(_undecided(Check.BASELINE, InconclusiveReason.NO_CONTROL_DATA,
                                  f"objective {objective.value} compares queueing and tokens per GPU with the control "
                                  "pods; baseline mode None has none (set baseline mode Control)"))
    acceptance = _acceptance(sample, policy.floor)
    not_drafting = acceptance.reason == InconclusiveReason.NOT_DRAFTING
    compared = isinstance(baseline, _Baseline) or (
        isinstance(baseline, CheckResult) and baseline.reason in (InconclusiveReason.NO_CONTROL_DATA,
                                                                  InconclusiveReason.CONTROL_TOO_FEW_REQUESTS))
    explanation = ""
    if acceptance.outcome == Outcome.FAILED and compared and not (policy.floor and policy.floor.fixed):
        # With a baseline the measured comparison decides; acceptance below the Auto floor explains it (a loss it
        # explains with certainty has said so already).
        explanation = "" if explained is not None and objective in LATENCY_OBJECTIVES else f"; {render(acceptance)}"
        shown.append(dataclasses.replace(acceptance, counted=False))
    elif not not_drafting:
        counted.insert(0, acceptance)
    slo = _slo(sample, policy.checks)
    if slo is not None:
        counted.append(slo)
    context = _context(sample, requests, baseline if isinstance(baseline, _Baseline) else None, objective)
    explanation += not_counted
    name = baseline.name if isinstance(baseline, _Baseline) else None
    checks = tuple(counted + shown + ([acceptance] if not_drafting else []))

    def assessment(result: Verdict) -> Assessment:
        return Assessment(result, per_token, name, diagnosis, policy.floor, objective, queue, output,
                          policy.gpus_per_pod, checks)

    failures = [r for r in counted if r.outcome == Outcome.FAILED]
    if failures:
        queued = ""
        if diagnosis.get("speculative") == Bound.QUEUE and objective not in THROUGHPUT_OBJECTIVES:
            queued = _queue_note(sample.speculative)
        text = "; ".join(render(f) for f in failures) + f" {context}" + explanation + queued
        assert isinstance(failures[0].reason, FailureReason)
        return assessment(Failing(failures[0].reason, text))
    undecided = [r for r in counted if r.outcome == Outcome.UNDECIDED]
    if undecided:
        text = "; ".join(render(u) for u in undecided) + f" {context}" + explanation
        assert isinstance(undecided[0].reason, InconclusiveReason)
        return assessment(Inconclusive(undecided[0].reason, text))
    passed = "; ".join(render(r) for r in counted)
    if not_drafting:
        text = render(acceptance) + (f"; {passed}" if passed else "") + f" {context}"
        return assessment(Inconclusive(InconclusiveReason.NOT_DRAFTING, text))
    return assessment(Healthy(passed + f" {context}" + explanation))


def verdict(sample: DeploymentSample, policy: Policy) -> Verdict:
    """The verdict alone (see `assess`)."""
    return assess(sample, policy).verdict


def previous_baseline(sample: DeploymentSample, min_requests: int, now: datetime) -> PreviousBaselineStatus | None:
    """A snapshot of a sample taken without speculation; None when it has too few requests to stand for anything."""
    requests = _finite(sample.speculative.requests)
    rate = sample.requests_per_second
    if requests is None or rate is None or requests < max(min_requests, 1):
        return None
    values = sample.speculative
    itl, e2e, ttft, inference, prefill = (_mean_latency(values, check)
                                          for check in (_PER_TOKEN, _E2E, _TTFT, _ENGINE_E2E, _ENGINE_TTFT))
    return PreviousBaselineStatus(
        taken_at=evidence.rfc3339(now),
        requests_per_second=rate,
        running_per_pod=values.running_per_pod,
        inter_token_latency=itl, e2e_latency=e2e, time_to_first_token=ttft,
        inference_time=inference, prefill_time=prefill,
        p99_inter_token_latency_seconds=_finite(values.p99_inter_token_latency_seconds),
        p99_e2e_latency_seconds=_finite(values.p99_e2e_latency_seconds),
        p99_time_to_first_token_seconds=_finite(values.p99_time_to_first_token_seconds),
    )


def objective_checks(objective: Objective, checks: Checks) -> dict[str, float | None]:
    """The limits that decide under `objective`, by their spec names (for `specdeploy plan`); the acceptance
    floor and rollbackOnOOM count under every objective and are shown elsewhere."""
    counted: dict[str, float | None] = {}
    if objective in LATENCY_OBJECTIVES:
        counted.update(maxPerTokenLatencyRatio=checks.per_token_latency_ratio,
                       maxPrefillTimeRatio=checks.prefill_time_ratio,
                       prefillTimeFloorSeconds=checks.prefill_time_floor_seconds,
                       maxInferenceTimeRatio=checks.inference_time_ratio)
    if objective in THROUGHPUT_OBJECTIVES:
        counted.update(maxQueueTimeRatio=checks.max_queue_time_ratio,
                       queueTimeFloorSeconds=checks.queue_time_floor_seconds,
                       minOutputTokensPerGpuRatio=checks.min_output_tokens_per_gpu_ratio)
    counted["maxP99E2ELatencySeconds"] = checks.max_p99_e2e_latency_seconds
    return counted


OBJECTIVE_MEANING = {
    Objective.LATENCY: "per-token latency, and time to first token and end-to-end latency without the queue, "
                       "against the baseline; queueing is not judged",
    Objective.THROUGHPUT: "the load the speculative pods sustain beside the control: queue time and output tokens "
                          "per second per GPU; per-token latency is shown, not counted",
    Objective.BOTH: "the Latency checks and the Throughput checks together",
}
"""What each objective judges, in words (plan output, docs)."""
