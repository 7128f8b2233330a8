"""The SpeculativeDeployment status: what the operator observed and decided. Only the operator writes it.

`memoryPlan` is the same JSON `specdeploy plan -o json` prints; rollback state lives here, never in
spec, so Git stays the source of truth and GitOps tools see no drift.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from specdeploy.api.base import WireModel
from specdeploy.api.reasons import CalibrationReason, FailureReason, InconclusiveReason, RollbackReason
from specdeploy.api.spec import EngineKind, Objective


class StatusModel(WireModel):
    """Status parts are read back from the apiserver: unknown fields (a newer operator's) are ignored."""

    model_config = ConfigDict(extra="ignore")


class Severity(StrEnum):
    ERROR = "Error"
    WARNING = "Warning"
    INFO = "Info"


class Verdict(StrEnum):
    FITS = "Fits"
    FITS_WITH_WARNINGS = "FitsWithWarnings"
    REJECTED = "Rejected"


class VerdictKind(StrEnum):
    """The analysis verdict on the last sample (judgment/verdict.py)."""

    HEALTHY = "Healthy"
    FAILING = "Failing"
    INCONCLUSIVE = "Inconclusive"


class ArchitectureSource(StrEnum):
    """Where a model's architecture came from (modelsource/resolve.py)."""

    SPEC = "Spec"
    CONFIG_MAP = "ConfigMap"
    PATH = "Path"
    HUB = "Hub"
    CATALOG = "Catalog"


class PositionSource(StrEnum):
    """Where the acceptance used for a draft position comes from (judgment/calibration.py)."""

    MEASURED = "Measured"          # its own counts, every draft counted having proposed it
    EXTRAPOLATED = "Extrapolated"  # the last measured position's conditional acceptance, continued


class CalibrationKind(StrEnum):
    CHANGED = "Changed"
    KEPT = "Kept"


class BaselineName(StrEnum):
    """What a speedup is measured against: the control pods in the same window, or the Previous snapshot."""

    CONTROL = "control"
    PREVIOUS = "Previous"


class Bound(StrEnum):
    """Where most of a request's mean end-to-end latency goes: waiting for a slot, prefill or decode."""

    QUEUE = "Queue-bound"
    PREFILL = "Prefill-bound"
    DECODE = "Decode-bound"


VERDICT_REASONS = [reason.value for reason in (*FailureReason, *InconclusiveReason)]
"""status.analysis.verdictReason: a FailureReason when Failing, an InconclusiveReason when Inconclusive."""


class ProbeTrigger(StrEnum):
    """Why a probe ran."""

    MANUAL = "Manual"                 # specdeploy probe --sd
    NEW_GENERATION = "NewGeneration"  # spec.analysis.probe.onNewGeneration: new speculative pods
    INTERVAL = "Interval"             # spec.analysis.probe.interval


class CountsFrom(StrEnum):
    """Where a probe's drafted and accepted tokens were read."""

    ANSWERS = "answers"      # each answer's metrics.speculative_decoding
    COUNTERS = "counters"    # the engine's counters around each request


class Phase(StrEnum):
    """A one-word summary for `kubectl get`; no logic reads it back."""

    PENDING = "Pending"
    REJECTED = "Rejected"
    DEPLOYING = "Deploying"
    MEASURING = "Measuring"
    SPECULATING = "Speculating"
    SERVING = "Serving"          # ready, without speculation because the spec turns it off
    ROLLING_BACK = "RollingBack"  # decided, while speculative pods still run with speculation
    ROLLED_BACK = "RolledBack"
    DEGRADED = "Degraded"


class Finding(StatusModel):
    """One reason behind a verdict: a stable code, how serious it is, and what to do."""

    code: str = Field(description="Stable CamelCase identifier, e.g. KVCacheTooSmall")
    severity: Severity = Field(description="Error rejects; Warning and Info only inform")
    message: str = Field(description="What was found and what to do about it")


class Suggestion(StatusModel):
    """A concrete change to the spec that would make a rejected plan fit."""

    field: str = Field(description="Spec field to change, e.g. spec.model.quantization")
    value: str = Field(description="The value to set, as it would be written in YAML")
    message: str = Field(description="What the change gives, in numbers")


class PerGpuMemory(StatusModel):
    """Memory per GPU, in GiB, after tensor-parallel sharding."""

    budget_gib: float = Field(description="memoryGiB × gpuMemoryUtilization (or the engine's own fraction)")
    target_weights_gib: float
    draft_weights_gib: float
    overhead_gib: float = Field(description="activation peak + non-torch + CUDA graphs")
    activation_peak_gib: float = 0.0
    non_torch_gib: float = 0.0
    cuda_graph_gib: float = 0.0
    kv_cache_gib: float = Field(description="What is left for the KV cache (negative: does not fit)")


class DraftCost(StatusModel):
    """What speculation costs in KV cache compared with the same target without it."""

    kv_cache_gib: float = Field(description="KV cache GiB per GPU lost to draft weights and draft KV layers")
    kv_cache_tokens: int = Field(description="KV cache tokens lost")
    concurrent_sequences: float = Field(description="Sequences at maxModelLen lost")


class MemoryPlan(StatusModel):
    """Does target + draft + KV cache fit, and what does the draft cost."""

    verdict: Verdict
    fits: bool
    per_gpu: PerGpuMemory
    kv_bytes_per_token: int = Field(description="Per GPU after sharding, target and draft layers together")
    kv_cache_tokens: int = Field(description="KV cache capacity in tokens, whole 16-token blocks")
    max_model_len: int = Field(0, description="The context length the plan was made for")
    max_concurrency: float = Field(description="kvCacheTokens ÷ maxModelLen")
    draft_cost: DraftCost
    reasons: list[Finding] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)


class Compatibility(StatusModel):
    """Whether target, draft, method and engine work together."""

    compatible: bool
    findings: list[Finding] = Field(default_factory=list)


class Rollback(StatusModel):
    at: str = Field(description="RFC 3339 time of the rollback")
    reason: RollbackReason = Field(description="CamelCase reason, e.g. AcceptanceBelowMinimum")
    evidence: str = Field(description="The numbers that decided it")
    speculation_hash: str | None = Field(
        None, description="Digest of spec.speculation at the rollback; a change re-enables speculation"
    )
    notified: bool = Field(False, description="The Event and the alert for this rollback were posted")


class PositionAcceptance(StatusModel):
    """One draft position's acceptance as the schedule in force was derived from it (judgment/calibration.py)."""

    position: int = Field(description="The draft position, from 1")
    rate: float = Field(description="The acceptance the schedule is derived from: measured, made non-increasing "
                        "across positions, or extrapolated")
    source: PositionSource = Field(description="Measured or Extrapolated (no draft counted proposed it)")
    drafted: float = Field(0.0, description="Drafts counted for the position in the window measured")
    accepted: float = Field(0.0, description="Drafts whose positions 1..position were all accepted")
    standard_error: float | None = Field(None, description="Binomial standard error of accepted ÷ drafted")


class ScheduleEntry(StatusModel):
    """k for the batch sizes minBatch..maxBatch (both included)."""

    min_batch: int
    max_batch: int
    k: int


class CalibrationDecisionStatus(StatusModel):
    """The last calibration of an Auto schedule: changed, or kept and why, with the predicted speedups at the
    batch the pods ran (running requests per pod over the window)."""

    kind: CalibrationKind = Field(description="Changed or Kept")
    reason: CalibrationReason = Field(description="ScheduleRecalibrated, or why kept: TooFewDrafts, SameSchedule, "
                                      "NeverPays, LosesAtLoad, GainBelowMinimum, WithinMinimumPeriod, NoPositionCounts")
    message: str = Field("", description="The decision in a sentence, with the numbers")
    batch: int | None = Field(None, description="The observed batch the speedups are predicted at")
    speedup_before: float | None = Field(None, description="The running table's predicted speedup at batch")
    speedup_after: float | None = Field(None, description="The table derived from the measurement, at batch")
    earliest_change_at: str | None = Field(None, description="WithinMinimumPeriod: when the change may roll")


class ScheduleCalibration(StatusModel):
    """The measured acceptance per draft position an Auto schedule is derived from, and its last decision.

    Planning derives the table from `positions` (while `key` is the spec's), so a restart renders the same table;
    the positions change only with the schedule."""

    key: str | None = Field(None, description="Digest of the models and speculation the positions were measured for")
    positions: list[PositionAcceptance] = Field(default_factory=list, max_length=32,
                                                description="Empty: the method's prior is in force")
    schedule: list[ScheduleEntry] = Field(default_factory=list, max_length=256,
                                          description="The table derived from positions")
    hardware_factor: float | None = Field(
        None, description="The GPU time, × the prior cost model's, the table was derived under: the control pods' "
        "fit (analysis.hardwareFit.appliedFactor) when calibration changed the schedule; unset: the prior's")
    measured_at: str | None = Field(None, description="The end of the window the positions were measured over")
    changes: int = Field(0, description="Schedule changes made by calibration")
    last_change_at: str | None = Field(None, description="When calibration last changed the schedule")
    last_decision: CalibrationDecisionStatus | None = None


class SpeculationStatus(StatusModel):
    """What the operator decided, and what runs: the two differ while a rollout (a rollback) is under way."""

    decided: bool = Field(
        description="What the operator decided the pods run: true speculates; false after a rollback or with "
        "enabled false"
    )
    active: bool = Field(
        False, description="A speculative pod runs with a speculative config now (read from the pods, not the "
        "decision): a rollback is done when this is false"
    )
    speculating_pods: int = Field(0, description="Scheduled speculative pods that run with a speculative config")
    since: str | None = Field(None, description="When the decision last changed")
    rollbacks: int = 0
    last_rollback: Rollback | None = None
    retry_annotation_seen: str | None = Field(
        None, description="The specdeploy.io/retry-speculation value already acted on"
    )
    trial: bool = Field(
        False, description="Re-enabled by `reenable: Auto` after the cooldown and not yet judged Healthy: the first "
        "failing sample rolls it back, not failureLimit in a row"
    )
    calibration: ScheduleCalibration | None = Field(
        None, description="Auto schedules: the acceptance per draft position the schedule follows")

    @model_validator(mode="before")
    @classmethod
    def _decided_from_active(cls, data: Any) -> Any:
        """A status written before `decided` existed held the decision in `active`."""
        if isinstance(data, dict) and "decided" not in data and "active" in data:
            return {**data, "decided": data["active"]}
        return data


class MeanLatency(StatusModel):
    """A variant's mean latency over a window (from the histogram's `_sum` ÷ `_count`) and how sure it is."""

    mean_seconds: float
    log_standard_error: float = Field(description="Standard error of ln(mean), from the window's slices")
    slices: int
    requests: float


class PreviousBaselineStatus(StatusModel):
    """What the pods measured without speculation: the yardstick of `baseline.mode: Previous`."""

    taken_at: str
    requests_per_second: float
    running_per_pod: float | None = Field(None, description="Requests in one pod's batch: the load it was taken at")
    inter_token_latency: MeanLatency | None = None
    e2e_latency: MeanLatency | None = None
    time_to_first_token: MeanLatency | None = None
    inference_time: MeanLatency | None = Field(None, description="End-to-end latency without the queue")
    prefill_time: MeanLatency | None = Field(None, description="Time to first token without the queue")
    p99_inter_token_latency_seconds: float | None = None
    p99_e2e_latency_seconds: float | None = None
    p99_time_to_first_token_seconds: float | None = None


class Speedup(StatusModel):
    """Baseline ÷ speculative mean per-token latency: above 1 speculation helps. With its 95% interval."""

    value: float
    low: float
    high: float
    baseline: BaselineName = Field(description="What it is measured against: control or Previous")
    requests: float = Field(description="Speculative requests behind it")
    baseline_requests: float


class Diagnosis(StatusModel):
    """Where a request's time goes, per variant: Queue-bound, Prefill-bound or Decode-bound."""

    speculative: Bound | None = None
    control: Bound | None = None
    message: str | None = None


class AnalysisStatus(StatusModel):
    last_sample_at: str | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_floor: float | None = Field(None, description="The minAcceptanceRate in force (Auto: from the cost model)")
    acceptance_floor_basis: str | None = Field(None, description="Where the floor comes from")
    mean_inter_token_latency_seconds: float | None = Field(None, description="Speculative pods, from _sum ÷ _count")
    baseline_mean_inter_token_latency_seconds: float | None = None
    p99_inter_token_latency: str | None = Field(
        None, description="Speculative pods' P99 per-token latency as the buckets allow: \"< 10 ms\" inside the first")
    baseline_p99_inter_token_latency: str | None = None
    per_token_latency: str | None = Field(None, description="Mean per-token latency, speculative vs baseline, in words")
    speedup: Speedup | None = None
    diagnosis: Diagnosis | None = None
    requests: float | None = None
    objective: Objective | None = Field(
        None, description="The spec.analysis.objective that judged the last sample: Latency, Throughput or Both")
    mean_queue_time_seconds: float | None = Field(None, description="Speculative pods' mean queue time")
    baseline_mean_queue_time_seconds: float | None = None
    queue_time_ratio: float | None = Field(
        None, description="Speculative ÷ control mean queue time, each at least queueTimeFloorSeconds")
    output_tokens_per_second_per_gpu: float | None = Field(
        None, description="Speculative pods' output tokens per second ÷ pods ÷ GPUs per pod")
    baseline_output_tokens_per_second_per_gpu: float | None = None
    verdict: VerdictKind | None = Field(None, description="Healthy, Failing or Inconclusive")
    verdict_reason: str | None = Field(
        None, description="Why, for Failing and Inconclusive: e.g. InterTokenLatencyRegressed, NotEnoughEvidence",
        json_schema_extra={"enum": VERDICT_REASONS})
    message: str | None = Field(None, description="The verdict in a sentence, with the numbers")
    consecutive_failures: int = 0
    consecutive_inconclusive: int = 0
    previous_baseline: PreviousBaselineStatus | None = None
    hardware_fit: HardwareFit | None = None

    @model_validator(mode="before")
    @classmethod
    def _reason_from_verdict(cls, data: Any) -> Any:
        """A status written before `verdictReason` existed held both as "Failing: <Reason>"."""
        if isinstance(data, dict) and isinstance(data.get("verdict"), str) and ": " in data["verdict"]:
            kind, reason = data["verdict"].split(": ", 1)
            return {**data, "verdict": kind, "verdictReason": data.get("verdictReason") or reason}
        return data


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A Kubernetes condition: lastTransitionTime moves only when `status` changes."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class ModelRecord(StatusModel):
    """Where one model's architecture came from, and the commit the pods are pinned to."""

    source: ArchitectureSource = Field(description="Spec, ConfigMap, Path, Hub or Catalog")
    name: str
    revision: str | None = Field(None, description="The revision the spec asks for (a branch, tag or commit)")
    commit: str | None = Field(None, description="The Hub commit it resolved to; the rendered args pin it")
    location: str | None = Field(None, description="The config.json's URL, path or ConfigMap; the catalog entry")
    warnings: list[str] = Field(default_factory=list, description="e.g. the Hub error the catalog stood in for")


class EngineRecord(StatusModel):
    kind: EngineKind
    image: str


class DeployRecord(StatusModel):
    """What the pods of the observed generation run: the models as resolved, the engine and its image."""

    target: ModelRecord
    draft: ModelRecord | None = None
    engine: EngineRecord


class ProbeCellStatus(StatusModel):
    """One workload at one temperature of the last probe."""

    workload: str
    temperature: float
    requests: int = Field(description="Requests whose drafted and accepted tokens were measured")
    failed: int = Field(0, description="Requests that measured nothing (an engine error, no counts)")
    acceptance_rate: float | None = Field(None, description="Accepted ÷ drafted tokens")
    mean_acceptance_length: float | None = Field(None, description="1 + accepted ÷ verify steps")
    predicted_speedup: float | None = Field(None, description="The cost model's speedup at this acceptance")
    pays: bool | None = Field(None, description="Above the break-even (unset: no break-even known)")


class ProbeFailure(StatusModel):
    """Why the last probe the operator started measured nothing (the cells stay those of the one before)."""

    at: str
    reason: str = Field(description="PodNotReady, WorkloadsUnreadable, EngineUnreachable or NothingMeasured")
    message: str
    deployment_generation: int | None = Field(None, description="The speculative Deployment's generation it tried")


class ProbeStatus(StatusModel):
    """The last probe of this SD (`specdeploy probe --sd`, or the operator's with `spec.analysis.probe`):
    acceptance per workload and temperature on a live pod."""

    taken_at: str | None = Field(None, description="When the cells were measured; unset: never yet")
    trigger: ProbeTrigger | None = Field(None, description="Manual (specdeploy probe --sd), NewGeneration or Interval")
    url: str | None = Field(None, description="The engine the requests went to")
    pod: str | None = Field(None, description="The pod probed (the operator's probe)")
    pod_template_hash: str | None = Field(
        None, description="The pod's pod-template-hash: the speculative generation the cells describe"
    )
    deployment_generation: int | None = Field(
        None, description="The speculative Deployment's generation when it was probed"
    )
    counts_from: CountsFrom | None = Field(None, description="answers (each answer's metrics.speculative_decoding) or "
                                    "counters (the engine's counters around each request)")
    budget: str | None = Field(None, description="What the probe sent and was allowed to send")
    break_even: float | None = Field(None, description="The acceptance where the predicted speedup is 1")
    break_even_basis: str | None = None
    cells: list[ProbeCellStatus] = Field(default_factory=list, max_length=256)
    not_paying: list[str] = Field(default_factory=list, max_length=256,
                                  description="The cells below the break-even, in words")
    last_failure: ProbeFailure | None = Field(None, description="Set while the last probe measured nothing")


class SpeculativeDeploymentStatus(StatusModel):
    observed_generation: int | None = None
    phase: Phase | None = None
    replicas: int | None = Field(
        None, description="Speculative pods that exist now (the speculative Deployment's status.replicas): the scale "
        "subresource's status.replicas, which an HPA reads")
    selector: str | None = Field(
        None, description="Label selector of the speculative pods, as text: the scale subresource's selector, by which "
        "an HPA finds the pods whose metrics it reads")
    ready: str | None = Field(
        None, description="Ready pods ÷ the pods wanted, speculative and control together (kubectl get's READY)")
    monitoring: str | None = Field(
        None, description="Set when the cluster has prometheus-operator's PodMonitor CRD but the operator renders no "
        "PodMonitor for this SD: why, and what must scrape its engine pods instead")
    deploy_record: DeployRecord | None = None
    memory_plan: MemoryPlan | None = None
    compatibility: Compatibility | None = None
    speculation: SpeculationStatus | None = None
    analysis: AnalysisStatus | None = None
    probe: ProbeStatus | None = None
    conditions: list[Condition] = Field(default_factory=list)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """`conditions` with `new` in place of its type; the old transition time kept when status is unchanged."""
    result: list[Condition] = []
    replaced = False
    for existing in conditions:
        if existing.type != new.type:
            result.append(existing)
            continue
        replaced = True
        if existing.status == new.status:
            result.append(new.model_copy(update={"last_transition_time": existing.last_transition_time}))
        else:
            result.append(new)
    if not replaced:
        result.append(new)
    return result


class HardwareFit(StatusModel):
    """The GPUs this SD really got, fitted from its control pods (judgment/hardware.py, docs/analysis.md)."""

    factor: float = Field(description="Measured GPU time of a step ÷ the prior cost model's, at the control's batch")
    factor_half_width: float = Field(description="The factor's 95% interval, ± this fraction of it")
    prior_error: float = Field(description="The prior model's stated error (± this fraction, docs/speedup-model.md)")
    applied_factor: float | None = Field(
        None, description="The fitted factor kept (the first better than the prior); None: none yet")
    batch: float = Field(description="Running sequences per control pod over the window")
    measured_step_seconds: float
    prior_step_seconds: float
    fitted_step_seconds: float
    slices: int = Field(description="Slices of the window the factor was fitted from")
    message: str = Field(description="Prior vs fitted step time and what the fit changed, in a sentence")


AnalysisStatus.model_rebuild()
