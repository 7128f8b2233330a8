"""The next status of a SpeculativeDeployment: a pure function of the plan, the observed Deployments,
the previous status and the clock. The reconciler is its only caller and the status' only writer."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import (
    AnalysisStatus,
    ArchitectureSource,
    Condition,
    ConditionStatus,
    DeployRecord,
    EngineRecord,
    Finding,
    ModelRecord,
    Phase,
    ProbeStatus,
    Severity,
    SpeculationStatus,
    SpeculativeDeploymentStatus,
    VerdictKind,
    set_condition,
)
from specdeploy.engines import image_for
from specdeploy.judgment import evidence
from specdeploy.modelsource.resolve import Origin
from specdeploy.planning.plan import Plan
from specdeploy.reconcile.children import Variant, pod_selector, variant_replicas, variants
from specdeploy.reconcile.conditions import ConditionType, Reason, condition
from specdeploy.reconcile.leaderworkerset import LWS_KIND, leaders_only
from specdeploy.reconcile.observed import StuckPod

STATUS_REFRESH_SECONDS = 60.0
"""The most `status.analysis.lastSampleAt` may lag while samples change nothing else: a sample whose status
differs from the written one only in that time and the inconclusive count waits until the SD's own refresh
period (`status_refresh_seconds`: between half this and this) has passed since the written sample (with a
thousand SDs every sample's write was the whole analysis cycle's cost: docs/performance.md)."""
QUIET_ANALYSIS_FIELDS = frozenset({"lastSampleAt", "consecutiveInconclusive"})


def status_refresh_seconds(namespace: str, name: str) -> float:
    """The SD's own refresh period, between half and all of STATUS_REFRESH_SECONDS and fixed by its name: a
    thousand SDs created together otherwise rewrite their idle status in the same cycle, which took 25 s
    while the others took 4 s (docs/performance.md)."""
    spread = zlib.crc32(f"{namespace}/{name}".encode()) / 2**32
    return STATUS_REFRESH_SECONDS * (0.5 + 0.5 * spread)


def deferrable_sample_write(written: Mapping[str, Any], new: Mapping[str, Any],
                            refresh_seconds: float = STATUS_REFRESH_SECONDS) -> bool:
    """Whether a sample's status `new` (wire form) may wait instead of being written over `written`: it
    differs only in QUIET_ANALYSIS_FIELDS, and its sample is less than `refresh_seconds` after the written
    one. A verdict, a number, a condition or a count of failures that changes is written at once."""
    old_analysis, new_analysis = written.get("analysis") or {}, new.get("analysis") or {}
    old_at, new_at = old_analysis.get("lastSampleAt"), new_analysis.get("lastSampleAt")
    if not old_at or not new_at:
        return False

    def loud(status: Mapping[str, Any], analysis: Mapping[str, Any]) -> dict[str, Any]:
        return {**status, "analysis": {k: v for k, v in analysis.items() if k not in QUIET_ANALYSIS_FIELDS}}

    if loud(written, old_analysis) != loud(new, new_analysis):
        return False
    elapsed = evidence.parse_rfc3339(new_at) - evidence.parse_rfc3339(old_at)
    return elapsed.total_seconds() < refresh_seconds


@dataclass(frozen=True)
class Planned:
    """The outcome of planning one generation: a plan, or the finding that stopped planning."""

    plan: Plan | None
    error: Finding | None = None
    transient: bool = False   # the error may pass by itself (the Hub unreachable): the last good plan stands

    @property
    def accepted(self) -> bool:
        return self.plan is not None and self.plan.accepted


def deploy_record(spec: SpeculativeDeploymentSpec, plan: Plan) -> DeployRecord:
    """The record of what `plan` runs: where each model's numbers came from, the commit the args pin (the
    revision is the one the spec asks for, not the pin), the engine and its image."""
    def model(origin: Origin | None, name: str, revision: str | None) -> ModelRecord:
        if origin is None:
            return ModelRecord(source=ArchitectureSource.SPEC, name=name, revision=revision)
        return ModelRecord(source=origin.source, name=origin.name, revision=revision, commit=origin.commit_sha,
                           location=origin.location or None, warnings=list(origin.warnings))

    draft = spec.speculation.draft
    return DeployRecord(
        target=model(plan.target_origin, spec.model.name, spec.model.revision),
        draft=model(plan.draft_origin, draft.name, draft.revision) if draft is not None else None,
        engine=EngineRecord(kind=spec.engine.kind, image=image_for(spec)),
    )


def pinned_to_record(spec: SpeculativeDeploymentSpec, record: DeployRecord | None) -> SpeculativeDeploymentSpec:
    """`spec` with each model's revision replaced by the commit `record` pinned, while the spec still asks for
    the same model and revision: a branch that moves on the Hub does not change the pods under a running
    plan; a new `revision` in the spec resolves again (and rolls the pods to it)."""
    if record is None:
        return spec
    model = spec.model
    if record.target.commit and record.target.name == model.name and record.target.revision == model.revision:
        spec = spec.model_copy(update={"model": model.model_copy(update={"revision": record.target.commit})})
    draft = spec.speculation.draft
    if (draft is not None and record.draft is not None and record.draft.commit and record.draft.name == draft.name
            and record.draft.revision == draft.revision):
        speculation = spec.speculation.model_copy(
            update={"draft": draft.model_copy(update={"revision": record.draft.commit})})
        spec = spec.model_copy(update={"speculation": speculation})
    return spec


@dataclass(frozen=True)
class DeploymentState:
    """What the apiserver says about one child Deployment, or the LeaderWorkerSet that stands for it when the
    layout spans nodes (`kind`; its replicas are groups)."""

    name: str
    variant: Variant
    replicas: int
    updated_replicas: int
    available_replicas: int
    generation: int
    observed_generation: int
    sd_generation: int | None   # the SpeculativeDeployment generation it was last rendered from
    children_fingerprint: str | None = None   # Children.fingerprint of the apply that last wrote it
    ready_replicas: int = 0
    current_replicas: int = 0   # its status.replicas: pods that exist, of any ReplicaSet
    replicas_manager: str | None = None   # another field manager that set spec.replicas after the operator did
    rendered_replicas: int | None = None  # the replicas the operator last rendered for it from the SD
    kind: str = "Deployment"    # or LeaderWorkerSet

    @property
    def replicas_held_elsewhere(self) -> bool:
        """Someone other than the operator set its replicas since the operator last rendered them (an HPA or
        `kubectl scale` on the Deployment itself)."""
        return self.replicas_manager is not None

    @property
    def rolled_out(self) -> bool:
        return (
            self.observed_generation >= self.generation
            and self.updated_replicas >= self.replicas
            and self.available_replicas >= self.replicas
        )

    @property
    def rolling(self) -> bool:
        return self.observed_generation < self.generation or self.updated_replicas < self.replicas

    def summary(self) -> str:
        held = f" (replicas set by {self.replicas_manager})" if self.replicas_manager else ""
        units = "pods" if self.kind == "Deployment" else "groups"   # a LeaderWorkerSet's replicas
        return f"{self.available_replicas}/{self.replicas} {self.variant.value} {units} available{held}"


def _first_error(findings: list[Finding]) -> Finding | None:
    return next((f for f in findings if f.severity == Severity.ERROR), None)


def _memory_condition(planned: Planned) -> tuple[ConditionStatus, str, str]:
    if planned.plan is None:
        error = planned.error
        assert error is not None
        return ConditionStatus.UNKNOWN, error.code, error.message
    memory = planned.plan.memory
    if not memory.fits:
        first = _first_error(memory.reasons)
        fixes = "; ".join(f"set `{s.field}: {s.value}` ({s.message})" for s in memory.suggestions[:3])
        message = (first.message if first else "the plan does not fit") + (f". What would fit: {fixes}" if fixes else "")
        return ConditionStatus.FALSE, first.code if first else Reason.REJECTED, message
    summary = (
        f"{memory.per_gpu.kv_cache_gib:.2f} GiB KV cache per GPU: {memory.kv_cache_tokens:,} tokens, "
        f"{memory.max_concurrency:.2f} sequences of {memory.max_model_len:,}; speculation costs "
        f"{memory.draft_cost.kv_cache_tokens:,} tokens"
    )
    warnings = [f.message for f in memory.reasons if f.severity == Severity.WARNING]
    message = summary + ("; " + "; ".join(warnings) if warnings else "")
    return ConditionStatus.TRUE, memory.verdict.value, message


def _compatible_condition(planned: Planned) -> tuple[ConditionStatus, str, str]:
    if planned.plan is None:
        error = planned.error
        assert error is not None
        if error.code in (Reason.ENGINE_CANNOT_RUN, Reason.LEADER_WORKER_SETS_UNAVAILABLE):
            return ConditionStatus.FALSE, error.code, error.message
        return ConditionStatus.UNKNOWN, error.code, error.message
    compatibility = planned.plan.compatibility
    first = _first_error(compatibility.findings)
    if first is not None:
        return ConditionStatus.FALSE, first.code, first.message
    notes = [f"{f.code}: {f.message}" for f in compatibility.findings]
    return ConditionStatus.TRUE, Reason.COMPATIBLE, "; ".join(notes) or "target, draft, method and engine work together"


_STUCK_FIXES = {
    "Unschedulable": "free a GPU of that product, or keep spec.rollout.maxSurge at 0 so that a rollout needs no "
                     "spare GPU",
    "ErrImagePull": "check spec.engine.image and the pull secret",
    "ImagePullBackOff": "check spec.engine.image and the pull secret",
    "InvalidImageName": "check spec.engine.image",
    "CrashLoopBackOff": "see `kubectl logs --previous` of the pod and its lastState",
    "CreateContainerConfigError": "see `kubectl describe pod`",
    Reason.GROUP_MEMBER_FAILED: "see `kubectl logs --previous` of the pod, or its lastState: one pod's death "
                                "restarts its whole group",
}
STUCK_SHOWN = 3


def _stuck_message(summary: str, stuck: tuple[StuckPod, ...]) -> str:
    fixes = sorted({_STUCK_FIXES[p.reason] for p in stuck if p.reason in _STUCK_FIXES})
    shown = "; ".join(p.describe() for p in stuck[:STUCK_SHOWN])
    more = f" (and {len(stuck) - STUCK_SHOWN} more)" if len(stuck) > STUCK_SHOWN else ""
    return f"{summary}; the rollout cannot progress: {shown}{more}" + (f" — {'; '.join(fixes)}" if fixes else "")


def _ready_condition(
    planned: Planned, expected: tuple[Variant, ...], deployments: list[DeploymentState], generation: int,
    stuck: tuple[StuckPod, ...] | None, previous_ready: Condition | None,
) -> tuple[ConditionStatus, str, str]:
    """Ready, and RolloutStuck when a rollout waits on pods that cannot come (GroupMemberFailed when one is a
    group's pod that died, also while its LeaderWorkerSet still counts that group available): seen in the pods
    (`stuck`) on every pass that lists them — all but analysis samples, which keep what the last listing saw."""
    found = _rollout_condition(planned, expected, deployments, generation)
    died = tuple(p for p in stuck or () if p.reason == Reason.GROUP_MEMBER_FAILED)
    if died and found[0] == ConditionStatus.TRUE:
        # Its LeaderWorkerSet still counts the group (it has not seen the death yet) but deletes it now: say what
        # runs — a group going down — rather than wait for the count, which a recreated group may never lower.
        return ConditionStatus.FALSE, Reason.GROUP_MEMBER_FAILED, (
            f"{found[2]}; a group is recreated: {'; '.join(p.describe() for p in died[:STUCK_SHOWN])} — "
            f"{_STUCK_FIXES[Reason.GROUP_MEMBER_FAILED]}")
    if found[0] == ConditionStatus.TRUE or found[1] not in (Reason.PROGRESSING, Reason.UNAVAILABLE):
        return found
    if stuck:
        failed = any(p.reason == Reason.GROUP_MEMBER_FAILED for p in stuck)
        return (ConditionStatus.FALSE, Reason.GROUP_MEMBER_FAILED if failed else Reason.ROLLOUT_STUCK,
                _stuck_message(found[2], stuck))
    if stuck is None and previous_ready is not None and previous_ready.observed_generation == generation \
            and previous_ready.reason in (Reason.ROLLOUT_STUCK, Reason.GROUP_MEMBER_FAILED):
        return ConditionStatus.FALSE, previous_ready.reason, previous_ready.message
    return found


def _rollout_condition(
    planned: Planned, expected: tuple[Variant, ...], deployments: list[DeploymentState], generation: int
) -> tuple[ConditionStatus, str, str]:
    by_variant = {d.variant: d for d in deployments}
    if not planned.accepted:
        running = [d for d in deployments if d.available_replicas > 0]
        if not running:
            return ConditionStatus.FALSE, Reason.REJECTED, (
                f"nothing runs: generation {generation} is rejected (see the MemoryFits and Compatible conditions)"
            )
        served = sorted({d.sd_generation for d in running if d.sd_generation is not None})
        kept = f" of generation {served[-1]}" if served else ""
        status = ConditionStatus.TRUE if all(d.rolled_out for d in deployments) else ConditionStatus.FALSE
        summary = ", ".join(d.summary() for d in deployments)
        return status, Reason.AVAILABLE if status == ConditionStatus.TRUE else Reason.UNAVAILABLE, (
            f"generation {generation} is rejected, so nothing was changed: the pods{kept} keep serving ({summary})"
        )
    missing = [v for v in expected if v not in by_variant]
    states = [by_variant[v] for v in expected if v in by_variant]
    summary = ", ".join(d.summary() for d in states)
    if not missing and all(d.rolled_out for d in states):
        return ConditionStatus.TRUE, Reason.AVAILABLE, summary
    kind = "LeaderWorkerSet" if planned.plan is not None and planned.plan.layout.spans_nodes else "Deployment"
    if missing or any(d.rolling or d.sd_generation != generation for d in states):
        created = f"creating the {', '.join(v.value for v in missing)} {kind}" if missing else ""
        return ConditionStatus.FALSE, Reason.PROGRESSING, (
            f"rolling out generation {generation}: " + "; ".join(p for p in (summary, created) if p)
        )
    names = ", ".join(d.name for d in states if not d.rolled_out)
    return ConditionStatus.FALSE, Reason.UNAVAILABLE, (
        f"{summary}; see `kubectl describe {kind.lower()} {names}` and its pods' events"
    )


def _measured_since(analysis: AnalysisStatus, speculation: SpeculationStatus) -> bool:
    """Whether the last sample was taken after speculation (last) started."""
    if analysis.last_sample_at is None:
        return False
    if speculation.since is None:
        return True
    return evidence.parse_rfc3339(analysis.last_sample_at) >= evidence.parse_rfc3339(speculation.since)


def _speculation_healthy(spec: SpeculativeDeploymentSpec, speculation: SpeculationStatus,
                         analysis: AnalysisStatus | None) -> tuple[ConditionStatus, str, str]:
    if not speculation.decided:
        if speculation.last_rollback is not None and spec.speculation.enabled:
            return ConditionStatus.UNKNOWN, Reason.ROLLED_BACK, "speculation was rolled back; see RolledBack"
        return ConditionStatus.UNKNOWN, Reason.SPECULATION_DISABLED, "the pods run without speculation"
    if analysis is None or analysis.verdict is None or not _measured_since(analysis, speculation):
        return ConditionStatus.UNKNOWN, Reason.NOT_MEASURED, "no analysis sample since speculation started"
    reason = analysis.verdict_reason or analysis.verdict.value
    text = analysis.message or reason
    if analysis.verdict == VerdictKind.HEALTHY:
        return ConditionStatus.TRUE, Reason.HEALTHY, text
    if analysis.verdict == VerdictKind.FAILING:
        count = f" ({analysis.consecutive_failures} of failureLimit {spec.analysis.failure_limit} in a row)"
        return ConditionStatus.FALSE, reason, text + count
    return ConditionStatus.UNKNOWN, reason, text


def _rolled_back(speculation: SpeculationStatus) -> tuple[ConditionStatus, str, str]:
    record = speculation.last_rollback
    if record is None:
        return ConditionStatus.FALSE, Reason.NOT_ROLLED_BACK, "speculation has not been rolled back"
    if speculation.decided:
        trial = (" on trial (re-enabled by the cooldown: until a Healthy sample, the first failing one rolls it "
                 "back)" if speculation.trial else "")
        return ConditionStatus.FALSE, Reason.REENABLED, (
            f"speculating again since {speculation.since}{trial}; the last rollback ({record.reason}, {record.at}): "
            f"{record.evidence}"
        )
    if speculation.active:
        pods = speculation.speculating_pods
        return ConditionStatus.FALSE, Reason.ROLLBACK_IN_PROGRESS, (
            f"rollback decided at {record.at} ({record.reason}: {record.evidence}); {pods} speculative "
            f"pod{'s' if pods != 1 else ''} still run{'s' if pods == 1 else ''} with speculation until the "
            "rollout replaces them (see Ready)")
    return ConditionStatus.TRUE, record.reason, (
        f"{record.evidence}. Speculation comes back when `spec.speculation` changes, when the annotation "
        f"specdeploy.io/retry-speculation is set to a new value, or after the cooldown with `reenable: Auto`"
    )


def _probed(probe: ProbeStatus | None) -> tuple[ConditionStatus, str, str]:
    """The Probed condition (with spec.analysis.probe) from the last probe: its cells, or why it measured
    nothing. A failure is told here, never acted on: the analysis of live traffic decides rollbacks."""
    if probe is None or (probe.taken_at is None and probe.last_failure is None):
        return ConditionStatus.UNKNOWN, Reason.NOT_PROBED_YET, (
            "not probed yet: the operator probes a speculative generation once its rollout completes, and "
            "again every spec.analysis.probe.interval")
    if probe.last_failure is not None:
        failure = probe.last_failure
        before = f"; the cells below are those of {probe.taken_at}" if probe.taken_at else ""
        return ConditionStatus.FALSE, failure.reason, (
            f"the probe at {failure.at} measured nothing: {failure.message}{before}; it is tried again in a "
            "few minutes, and speculation is not rolled back for it")
    cells = [c for c in probe.cells if c.requests]
    verdict = "; ".join(probe.not_paying) if probe.not_paying else "every cell measured pays"
    return ConditionStatus.TRUE, Reason.MEASURED, (
        f"{len(cells)} of {len(probe.cells)} workload × temperature cells measured at {probe.taken_at} on "
        f"{probe.pod or probe.url} ({probe.trigger or 'Manual'}): {verdict}")


def _phase(planned: Planned, ready: ConditionStatus, ready_reason: str, previous_ready: Condition | None,
           speculation: SpeculationStatus, healthy: ConditionStatus, previous_phase: Phase | None) -> Phase:
    if not planned.accepted:
        return previous_phase if planned.transient and previous_phase is not None else Phase.REJECTED
    if not speculation.decided and speculation.last_rollback is not None and planned.plan is not None \
            and planned.plan.spec.speculation.enabled:
        return Phase.ROLLING_BACK if speculation.active else Phase.ROLLED_BACK
    if ready != ConditionStatus.TRUE:
        was_ready = previous_ready is not None and previous_ready.status == ConditionStatus.TRUE
        return Phase.DEGRADED if was_ready and ready_reason == Reason.UNAVAILABLE else Phase.DEPLOYING
    if not speculation.decided:   # serving without speculation once no pod speculates any more
        return Phase.DEPLOYING if speculation.active else Phase.SERVING
    return Phase.SPECULATING if healthy == ConditionStatus.TRUE else Phase.MEASURING


def _in_type_order(conditions: list[Condition]) -> list[Condition]:
    """Conditions in ConditionType's order (unknown types last), so `kubectl describe` reads the same."""
    order = {t.value: i for i, t in enumerate(ConditionType)}
    return sorted(conditions, key=lambda c: order.get(c.type, len(order)))


def refused_status(
    previous: SpeculativeDeploymentStatus, generation: int, reason: Reason, message: str, now: str
) -> SpeculativeDeploymentStatus:
    """`previous` with Ready=False for a generation the operator cannot act on although the CRD admitted it
    (reason InvalidSpec or ApplyRefused, the message saying why and what to do); phase Rejected, the
    generation observed, the other conditions kept."""
    conditions = set_condition(list(previous.conditions), condition(
        ConditionType.READY, ConditionStatus.FALSE, reason, message, now, generation))
    conditions = _in_type_order(conditions)
    return previous.model_copy(update={"observed_generation": generation, "phase": Phase.REJECTED,
                                       "conditions": conditions})


def next_status(
    previous: SpeculativeDeploymentStatus,
    spec: SpeculativeDeploymentSpec,
    generation: int,
    planned: Planned,
    deployments: list[DeploymentState],
    now: str,
    speculation: SpeculationStatus,
    analysis: AnalysisStatus | None,
    stuck: tuple[StuckPod, ...] | None = None,
    probe: ProbeStatus | None = None,
) -> SpeculativeDeploymentStatus:
    """The status to write after reconciling `generation` of `spec`, with the speculation step's result;
    `stuck`: the pods a rollout waits on in vain, None when the pods were not listed this pass; `probe`: the
    probe this pass carries, if any (else the last one stays)."""
    # A transient planning error (the Hub unreachable) leaves the last good plan in status, as in the pods.
    kept = planned.plan is None and planned.transient
    memory_plan = planned.plan.memory if planned.plan is not None else (previous.memory_plan if kept else None)
    compatibility = (planned.plan.compatibility if planned.plan is not None
                     else (previous.compatibility if kept else None))
    previous_ready = next((c for c in previous.conditions if c.type == ConditionType.READY), None)
    ready = _ready_condition(planned, variants(spec), deployments, generation, stuck, previous_ready)
    speculation_healthy = _speculation_healthy(spec, speculation, analysis)
    rolled_back = _rolled_back(speculation)
    conditions = list(previous.conditions)
    for type_, (status, reason, message) in (
        (ConditionType.MEMORY_FITS, _memory_condition(planned)),
        (ConditionType.COMPATIBLE, _compatible_condition(planned)),
        (ConditionType.READY, ready),
        (ConditionType.SPECULATION_HEALTHY, speculation_healthy),
        (ConditionType.ROLLED_BACK, rolled_back),
    ):
        conditions = set_condition(conditions, condition(type_, status, reason, message, now, generation))
    probe = probe if probe is not None else previous.probe
    if spec.analysis.probe is not None:
        conditions = set_condition(conditions, condition(ConditionType.PROBED, *_probed(probe), now, generation))
    else:
        conditions = [c for c in conditions if c.type != ConditionType.PROBED]
    phase = _phase(planned, ready[0], ready[1], previous_ready, speculation, speculation_healthy[0],
                   previous.phase)
    conditions = _in_type_order(conditions)
    record = deploy_record(spec, planned.plan) if planned.plan is not None else previous.deploy_record
    return previous.model_copy(update={
        "observed_generation": generation,
        "phase": phase,
        "deploy_record": record,
        "memory_plan": memory_plan,
        "compatibility": compatibility,
        "speculation": speculation,
        "analysis": analysis,
        "probe": probe,
        "conditions": conditions,
    })


def with_scale(status: SpeculativeDeploymentStatus, name: str, spec: SpeculativeDeploymentSpec,
               deployments: list[DeploymentState]) -> SpeculativeDeploymentStatus:
    """`status` with what the scale subresource and `kubectl get` read: the speculative pods that exist and their
    selector, and READY — ready pods ÷ the pods wanted (each Deployment's replicas; the SD's count for one not
    there yet), over both variants. Across nodes a replica is a group: the selector picks its leader."""
    by_variant = {d.variant: d for d in deployments}
    wanted = sorted(set(variants(spec)) | set(by_variant))
    desired = sum(by_variant[v].replicas if v in by_variant else variant_replicas(spec, v) for v in wanted)
    ready = sum(d.ready_replicas for d in deployments)
    speculative = by_variant.get(Variant.SPECULATIVE)
    pods = pod_selector(name, Variant.SPECULATIVE)
    if speculative is not None and speculative.kind == LWS_KIND:
        pods = leaders_only(pods)   # one pod per group, as the LeaderWorkerSet's own hpaPodSelector
    selector = ",".join(f"{key}={value}" for key, value in pods.items())
    return status.model_copy(update={"replicas": speculative.current_replicas if speculative is not None else 0,
                                     "selector": selector, "ready": f"{ready}/{desired}"})
