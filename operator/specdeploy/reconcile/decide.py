"""One pass's decision: everything a reconcile does, as a pure function of what it observed.

    actions = decide(observed, now)

`Observed` is what the reconciler read in one go (the SD, its Deployments, its pods, this cycle's analysis
sample, the plan); `Actions` is all it will do about it — the status to hold, the children to apply and
prune, the Events, the rollback's notice and the alert. The reconciler then acts, writing status once
(controller/reconciler.py). No I/O and no clock here: tests/unit/test_decide.py drives each transition of
the speculation state machine with plain values.

The rollback's notice (its Event, under a fixed name, and its alert) is posted once per rollback: the
status records `notified` when both went out. The pass that decides a rollback writes status before it
acts on it (so a crash never takes the decision twice), so its own notice is marked by the next pass,
from the operator's memory of what it posted; after a restart the memory is empty and the notice is posted
again, which finds the Event there (same name) and refreshes the same alert (same labels).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specdeploy.api.reasons import CalibrationReason
from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.spec import AnalysisMode, SpeculativeDeploymentSpec
from specdeploy.api.status import Condition, ProbeStatus, SpeculativeDeploymentStatus
from specdeploy.judgment import evidence
from specdeploy.judgment.alerts import rollback_alert
from specdeploy.judgment.oom import out_of_memory
from specdeploy.judgment.rollback import Rollback
from specdeploy.judgment.samples import DeploymentSample
from specdeploy.judgment.speculation import SpeculationStep, step_speculation
from specdeploy.judgment.verdict import Verdict
from specdeploy.reconcile.children import Children, PodMonitoring, Variant, desired_children, variant_replicas
from specdeploy.reconcile.conditions import ConditionType, Event, Reason, transition_events
from specdeploy.reconcile.drift import drift
from specdeploy.reconcile.observed import PodsObserved
from specdeploy.reconcile.status import DeploymentState, Planned, next_status, refused_status, with_scale

ROLLBACK_EVENT_REASON = "SpeculationRolledBack"
PAUSED_ANNOTATION = "specdeploy.io/paused"
"""Any non-empty value but "false" pauses the judgment's actions on the SD (`specdeploy pause`)."""


@dataclass(frozen=True)
class Observed:
    """What one pass read about one SD."""

    body: Mapping[str, Any]                      # the SD as the apiserver returned it
    previous: SpeculativeDeploymentStatus        # its status, as read
    resource: SpeculativeDeployment | None       # None: the spec does not validate (`invalid` says why)
    invalid: str | None = None
    planned: Planned | None = None
    deployments: tuple[DeploymentState, ...] = ()
    live: Mapping[tuple[str, str], Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # by kind and name
    live_kinds: frozenset[str] = frozenset()     # the kinds of child read into `live` (none on an analysis sample)
    pods: PodsObserved | None = None             # None: not listed this pass (an analysis sample)
    sample: DeploymentSample | None = None       # this cycle's analysis sample, if one was taken
    probe: ProbeStatus | None = None             # a probe the operator just ran (controller/probe_loop.py)
    notice_posted: bool = False                  # this operator posted the last rollback's notice already
    pod_monitoring: PodMonitoring = PodMonitoring()   # a PodMonitor per SD, or why not

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation") or 0)


@dataclass(frozen=True)
class Notice:
    """A rollback's Event, under a name fixed by the rollback's number (posting it again finds it), and
    its alert; `rollbacks` says which rollback it announces."""

    event_name: str
    event: Event
    alert: dict[str, Any]
    rollbacks: int


@dataclass(frozen=True)
class Actions:
    """All one pass does, in the order the reconciler does it: write `status` first when `write_first` (a
    rollback decided: persisted before anything acts on it); apply `children` and prune what they lack;
    post `notice`; write `status` (when it differs from what was read or written first); post `events`
    and the transitions' Events; send `alert` (keeping a rollback's alert firing, or resolving it)."""

    status: SpeculativeDeploymentStatus
    previous_conditions: tuple[Condition, ...] = ()   # as read: their transitions raise Events
    write_first: bool = False
    children: Children | None = None
    own_events: tuple[Event, ...] = ()                # speculation re-enabled, the schedule recalibrated
    notice: Notice | None = None
    alert: dict[str, Any] | None = None
    rollback: Rollback | None = None             # decided in this pass: for the log and the metric
    would_roll_back: Rollback | None = None      # held back (Observe, paused) in this pass: for the metric
    verdict: Verdict | None = None               # on this pass's sample: for the metrics

    @property
    def events(self) -> list[Event]:
        """The step's Events and those the conditions' transitions raise."""
        return [*self.own_events, *transition_events(list(self.previous_conditions), self.status.conditions)]


def already_applied(children: Children, generation: int, existing: tuple[DeploymentState, ...]) -> bool:
    """Whether the last apply wrote exactly `children` of `generation`: every wanted Deployment (or
    LeaderWorkerSet) exists with their fingerprint and no other does. (The ConfigMap and Service are in the
    fingerprint, but only a pass other than an analysis sample, which always applies, restores them when deleted
    by hand.)"""
    wanted = {(manifest["kind"], manifest["metadata"]["name"]) for manifest in children.deployments.values()}
    fingerprint = children.fingerprint(generation)
    return {(state.kind, state.name) for state in existing} == wanted and all(
        state.children_fingerprint == fingerprint for state in existing)


def replicas_held(spec: SpeculativeDeploymentSpec, deployments: tuple[DeploymentState, ...]) -> frozenset[Variant]:
    """The variants whose Deployment's replicas are left to whoever set them: another writer (an HPA or `kubectl
    scale` on the Deployment) set them after the operator's last apply, and the SD still asks for the count the
    operator rendered then. A new count asked of the SD (`kubectl scale sd`, an HPA on the SD) is applied."""
    return frozenset(d.variant for d in deployments
                     if d.replicas_held_elsewhere and d.rendered_replicas == variant_replicas(spec, d.variant))


def _step(observed: Observed, resource: SpeculativeDeployment, planned: Planned, now: datetime) -> SpeculationStep:
    """The speculation step, with the OOM deaths of the speculative pods since speculation started and
    what the pods run now (`speculation.active`: a rollback is done when no pod speculates).

    Pods are listed on every trigger but an analysis sample: a restart is a pod event and a pod that
    comes or goes changes its Deployment's status, each of which reconciles at once, and the resync
    looks again; a label list is the costliest read of a cycle with many SDs (~90 ms right after a
    write, docs/performance.md). An analysis sample keeps the last observation."""
    previous, pods = observed.previous, observed.pods
    deaths = []
    speculation = previous.speculation
    if pods is not None and speculation is not None and speculation.decided:
        since = evidence.parse_rfc3339(speculation.since) if speculation.since else None
        deaths = out_of_memory(list(pods.speculative), since)
    step = step_speculation(resource, previous.speculation, previous.analysis, planned.accepted,
                            observed.sample, deaths, now, plan=planned.plan)
    if pods is None:
        return step
    return dataclasses.replace(step, speculation=step.speculation.model_copy(update={
        "active": pods.running.active, "speculating_pods": len(pods.running.speculating)}))


def _notified(status: SpeculativeDeploymentStatus) -> SpeculativeDeploymentStatus:
    speculation = status.speculation
    assert speculation is not None and speculation.last_rollback is not None
    record = speculation.last_rollback.model_copy(update={"notified": True})
    return status.model_copy(update={"speculation": speculation.model_copy(update={"last_rollback": record})})


def _notices(observed: Observed, step: SpeculationStep, status: SpeculativeDeploymentStatus,
             now: datetime) -> tuple[SpeculativeDeploymentStatus, Notice | None, dict[str, Any] | None]:
    """The rollback's notice (once), its alert kept firing on each analysis sample while rolled back, and
    resolved when speculation comes back; `status` marked notified when this operator posted it already."""
    speculation = status.speculation
    record = speculation.last_rollback if speculation is not None else None
    if speculation is None or record is None:
        return status, None, None
    started = evidence.parse_rfc3339(record.at)

    def alert(ends_at: datetime | None) -> dict[str, Any]:
        return rollback_alert(observed.namespace, observed.name, record.reason, record.evidence, "", started, ends_at)

    if step.reenabled is not None:
        return status, None, alert(ends_at=now)
    if speculation.decided:
        return status, None, None
    if not record.notified:
        if observed.notice_posted:
            return _notified(status), None, None
        event = Event.warning(ROLLBACK_EVENT_REASON, f"{record.reason}: {record.evidence}")
        name = f"{observed.name}.speculation-rolled-back-{speculation.rollbacks}"
        return status, Notice(name, event, alert(ends_at=None), speculation.rollbacks), None
    # Alertmanager resolves an alert that is not sent again: each analysis cycle keeps it firing.
    return status, None, alert(ends_at=None) if observed.sample is not None else None


def decide(observed: Observed, now: datetime) -> Actions:
    """Everything one pass does about `observed` at `now`."""
    at = evidence.rfc3339(now)
    previous, generation = observed.previous, observed.generation
    resource, planned = observed.resource, observed.planned
    if resource is None or planned is None:
        # The CRD admitted it (an older CRD, or a rule only Python checks): say so, change nothing.
        status = refused_status(previous, generation, Reason.INVALID_SPEC, (
            f"generation {generation} does not validate, so nothing was changed: {observed.invalid}; fix the spec "
            "(the CRD installed may be older than the operator: apply this version's CRD)"), at)
        return Actions(status, tuple(previous.conditions))
    step = _step(observed, resource, planned, now)
    step, would_roll_back = _held_back(observed, resource, step, now)
    stuck = observed.pods.stuck if observed.pods is not None else None
    status = next_status(previous, resource.spec, generation, planned, list(observed.deployments), at,
                         step.speculation, step.analysis, stuck, observed.probe)
    status = with_scale(status, observed.name, resource.spec, list(observed.deployments))
    status = status.model_copy(update={"monitoring": observed.pod_monitoring.not_rendered})
    status = _deprecations_said(status, resource.spec)
    children = None
    if planned.plan is not None and planned.accepted:
        wanted = desired_children(resource.model_copy(update={"status": status}), planned.plan,
                                  pod_monitoring=observed.pod_monitoring,
                                  replicas_held=replicas_held(resource.spec, observed.deployments))
        # Apply only what would change something: children that are not those of the last apply, or (of
        # the kinds this pass read in full) that differ from it, by hand or deleted, or after an apply the
        # apiserver refused part of (the Deployments carry its fingerprint, a child after them is missing;
        # every pass tries again, and the status stays refused until one succeeds). A pass that would
        # change nothing writes nothing.
        if not already_applied(wanted, generation, observed.deployments) or _apply_refused(previous) or (
                drift(wanted, observed.live, observed.live_kinds) is not None):
            children = wanted
    status, notice, alert = _notices(observed, step, status, now)
    if would_roll_back is not None and alert is None:
        alert = _would_roll_back_alert(observed, would_roll_back, now)
    reenabled = (Event.normal("SpeculationReenabled", step.reenabled.message),) if step.reenabled else ()
    # The new table is rendered by the next pass, whose plan reads the positions this status records.
    recalibrated = (Event.normal(CalibrationReason.SCHEDULE_RECALIBRATED, step.recalibrated.message),) if step.recalibrated else ()
    return Actions(status, tuple(previous.conditions), write_first=step.rollback is not None, children=children,
                   own_events=reenabled + recalibrated + _probe_events(observed.probe, status), notice=notice,
                   alert=alert,
                   rollback=step.rollback, would_roll_back=would_roll_back,
                   verdict=step.verdict)


def paused(body: Mapping[str, Any]) -> bool:
    """Whether the SD's annotation pauses the judgment's actions."""
    value = (body.get("metadata", {}).get("annotations") or {}).get(PAUSED_ANNOTATION)
    return bool(value) and str(value).lower() != "false"


def observing(observed: Observed) -> bool:
    """Whether the judgment only says what it would do (Observe, or paused): the metrics' `observe` label."""
    return observed.resource is not None and _holder(observed, observed.resource) is not None


def _holder(observed: Observed, resource: SpeculativeDeployment) -> str | None:
    """Why the judgment may not act on this SD now, in words; None: it acts."""
    if paused(observed.body):
        return f"the judgment is paused (annotation {PAUSED_ANNOTATION}; `specdeploy resume` lifts it)"
    if resource.spec.analysis.mode == AnalysisMode.OBSERVE:
        return "spec.analysis.mode is Observe"
    return None


def _held_back(observed: Observed, resource: SpeculativeDeployment, step: SpeculationStep,
               now: datetime) -> tuple[SpeculationStep, Rollback | None]:
    """The step with its rollback held back under Observe or a pause: speculation stays as it was, the counters
    and the verdict stay (so a switch to Act decides on them at the next sample), and the analysis message
    says what the judgment would have done. Without a rollback only the message says that nothing acts."""
    holder = _holder(observed, resource)
    if holder is None or step.analysis is None:
        return step, None
    analysis = step.analysis
    rollback = step.rollback
    if rollback is None:
        if step.verdict is None:
            return step, None
        note = f"{holder}: nothing is rolled back. "
        return dataclasses.replace(step, analysis=analysis.model_copy(
            update={"message": note + (analysis.message or "")})), None
    before = observed.previous.speculation
    assert before is not None
    kept = step.speculation.model_copy(update={
        "decided": True,
        "since": evidence.rfc3339(now) if step.reenabled is not None else before.since,
        "rollbacks": before.rollbacks, "last_rollback": before.last_rollback,
        "retry_annotation_seen": before.retry_annotation_seen, "trial": before.trial})
    note = f"would roll back ({rollback.reason.value}): {rollback.evidence}; not done: {holder}"
    return dataclasses.replace(step, speculation=kept, rollback=None,
                               analysis=analysis.model_copy(update={"message": note})), rollback


def _would_roll_back_alert(observed: Observed, would: Rollback, now: datetime) -> dict[str, Any]:
    """The rollback alert as it would fire, labelled observe="true" (a route can send it elsewhere); sent on
    each sample that would roll back, so Alertmanager resolves it when they stop."""
    alert = rollback_alert(observed.namespace, observed.name, would.reason.value, would.evidence, "", now)
    alert["labels"]["observe"] = "true"
    alert["annotations"]["summary"] = (f"Speculative decoding of {observed.namespace}/{observed.name} would have "
                                       f"been rolled back ({would.reason.value}); nothing was rolled back")
    return alert


def _deprecations_said(status: SpeculativeDeploymentStatus, spec: SpeculativeDeploymentSpec) -> SpeculativeDeploymentStatus:
    """The SpeculationHealthy condition's message with a sentence per deprecated check name the spec sets."""
    said = spec.analysis.checks.deprecated_names()
    if not said:
        return status
    conditions = [c.model_copy(update={"message": f"{c.message}. Warning: {'; '.join(said)}"})
                  if c.type == ConditionType.SPECULATION_HEALTHY else c for c in status.conditions]
    return status.model_copy(update={"conditions": conditions})


def _probe_events(probe: ProbeStatus | None, status: SpeculativeDeploymentStatus) -> tuple[Event, ...]:
    """An Event for each probe the operator ran (every one is news, also when Probed does not change): its
    result in the Probed condition's words, a Warning when it measured nothing."""
    if probe is None or probe.taken_at is None and probe.last_failure is None:
        return ()
    probed = next((c for c in status.conditions if c.type == ConditionType.PROBED), None)
    message = probed.message if probed is not None else ""
    if probe.last_failure is not None:
        return (Event.warning("ProbeFailed", message),)
    return (Event.normal("Probed", message),)


def _apply_refused(status: SpeculativeDeploymentStatus) -> bool:
    return any(c.type == ConditionType.READY and c.reason == Reason.APPLY_REFUSED for c in status.conditions)


def refused(observed: Observed, actions: Actions, refusal: str, now: datetime) -> Actions:
    """`actions` after the apiserver refused a child (a refusal retrying cannot change): Ready=False
    ApplyRefused in the apiserver's words (its transition raises the Event)."""
    generation = observed.generation
    status = refused_status(actions.status, generation, Reason.APPLY_REFUSED, (
        f"the apiserver refused a child of generation {generation}: {refusal}; change the spec "
        "so that its children are valid (names, sizes), or grant the operator what it lacks"), evidence.rfc3339(now))
    return dataclasses.replace(actions, status=status)


def noticed(actions: Actions) -> Actions:
    """`actions` once the notice went out: the status records it, so it is not posted again."""
    return dataclasses.replace(actions, status=_notified(actions.status), notice=None)
