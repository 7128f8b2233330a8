"""Condition types, reasons and messages in one place, and the Events their transitions raise.

Reasons are one CamelCase word; messages say what was observed and what to do. A condition's
lastTransitionTime moves only when its status changes (`api.status.set_condition`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from specdeploy.api.status import Condition, ConditionStatus


class ConditionType(StrEnum):
    MEMORY_FITS = "MemoryFits"
    COMPATIBLE = "Compatible"
    READY = "Ready"
    SPECULATION_HEALTHY = "SpeculationHealthy"
    ROLLED_BACK = "RolledBack"
    PROBED = "Probed"


class Reason(StrEnum):
    # MemoryFits (its True reasons are the plan's verdicts, api.status.Verdict: Fits, FitsWithWarnings)
    UNKNOWN_MODEL = "UnknownModel"
    # Compatible
    COMPATIBLE = "Compatible"
    ENGINE_CANNOT_RUN = "EngineCannotRun"
    LEADER_WORKER_SETS_UNAVAILABLE = "LeaderWorkerSetsUnavailable"   # a layout across nodes, and no LWS to run it
    # Ready
    AVAILABLE = "Available"
    PROGRESSING = "Progressing"
    UNAVAILABLE = "Unavailable"
    ROLLOUT_STUCK = "RolloutStuck"
    GROUP_MEMBER_FAILED = "GroupMemberFailed"   # a pod of a LeaderWorkerSet's group died: the group is recreated
    REJECTED = "Rejected"
    INVALID_SPEC = "InvalidSpec"        # admitted by the CRD installed, refused by the operator's own model
    APPLY_REFUSED = "ApplyRefused"      # the apiserver refused a child (400/403/413/422)
    # SpeculationHealthy (False and Unknown reasons come from the analysis: AcceptanceBelowMinimum, NoData …)
    HEALTHY = "Healthy"
    NOT_MEASURED = "NotMeasured"
    SPECULATION_DISABLED = "SpeculationDisabled"
    ROLLED_BACK = "RolledBack"
    # RolledBack (True reasons are the rollback reasons)
    NOT_ROLLED_BACK = "NotRolledBack"
    ROLLBACK_IN_PROGRESS = "RollbackInProgress"
    REENABLED = "Reenabled"
    # Probed (spec.analysis.probe): the last probe's outcome; a failure is never a rollback
    MEASURED = "Measured"
    NOT_PROBED_YET = "NotProbedYet"
    POD_NOT_READY = "PodNotReady"
    WORKLOADS_UNREADABLE = "WorkloadsUnreadable"
    ENGINE_UNREACHABLE = "EngineUnreachable"
    NOTHING_MEASURED = "NothingMeasured"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the SpeculativeDeployment."""

    type: EventType
    reason: str
    message: str

    @classmethod
    def normal(cls, reason: str, message: str) -> Event:
        return cls(EventType.NORMAL, reason, message)

    @classmethod
    def warning(cls, reason: str, message: str) -> Event:
        return cls(EventType.WARNING, reason, message)


def condition(
    type_: ConditionType, status: ConditionStatus, reason: str, message: str, now: str, generation: int | None
) -> Condition:
    return Condition(
        type=type_.value, status=status, reason=reason, message=message,
        last_transition_time=now, observed_generation=generation,
    )


# (condition type, new status) -> the Event reason raised when a condition enters that status.
_TRANSITION_EVENTS: dict[tuple[str, ConditionStatus], tuple[EventType, str]] = {
    (ConditionType.MEMORY_FITS, ConditionStatus.FALSE): (EventType.WARNING, "MemoryPlanRejected"),
    (ConditionType.MEMORY_FITS, ConditionStatus.TRUE): (EventType.NORMAL, "MemoryPlanAccepted"),
    (ConditionType.COMPATIBLE, ConditionStatus.FALSE): (EventType.WARNING, "Incompatible"),
    (ConditionType.READY, ConditionStatus.TRUE): (EventType.NORMAL, "Ready"),
    (ConditionType.READY, ConditionStatus.FALSE): (EventType.WARNING, "NotReady"),
}

#: Ready=False reasons that are refusals: each raises its own Warning Event, also when Ready was never True.
REFUSALS = frozenset({Reason.INVALID_SPEC, Reason.APPLY_REFUSED})


def transition_events(previous: list[Condition], current: list[Condition]) -> list[Event]:
    """Events for conditions whose status or reason changed (a new message alone raises nothing)."""
    before = {c.type: c for c in previous}
    events = []
    for now in current:
        old = before.get(now.type)
        if old is not None and (old.status, old.reason) == (now.status, now.reason):
            continue
        key = (now.type, now.status)
        if key not in _TRANSITION_EVENTS:
            continue
        if now.type == ConditionType.READY and now.reason in REFUSALS:
            events.append(Event.warning(now.reason, now.message))
            continue
        if (now.type, now.status) == (ConditionType.READY, ConditionStatus.FALSE) and (
            old is None or old.status != ConditionStatus.TRUE or now.reason == Reason.PROGRESSING
        ):
            continue  # only losing readiness is news, and a rollout in progress is not a loss
        if now.type == ConditionType.MEMORY_FITS and now.status == ConditionStatus.TRUE and old is None:
            continue  # the first plan of an accepted object is not news; Ready will be
        event_type, reason = _TRANSITION_EVENTS[key]
        events.append(Event(event_type, reason, now.message))
    return events
