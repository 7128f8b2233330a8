"""next_status and transition_events: conditions, phase and Events as pure functions of observations."""

import math
from datetime import UTC, datetime
from pathlib import Path

from analysis_samples import sample

from specdeploy.api.resource import ObjectMeta, SpeculativeDeployment, load_resource
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import (
    Condition,
    ConditionStatus,
    DeployRecord,
    EngineRecord,
    Finding,
    ModelRecord,
    Phase,
    Severity,
    SpeculationStatus,
    SpeculativeDeploymentStatus,
)
from specdeploy.api.status import Rollback as RollbackRecord
from specdeploy.devcluster.fakehub import FakeHub
from specdeploy.judgment.samples import DeploymentSample
from specdeploy.judgment.speculation import step_speculation
from specdeploy.modelsource.hub import HubClient, RetryPolicy
from specdeploy.modelsource.resolve import resolve_models
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant
from specdeploy.reconcile.conditions import Reason, transition_events
from specdeploy.reconcile.observed import StuckPod
from specdeploy.reconcile.status import DeploymentState, Planned, pinned_to_record, refused_status
from specdeploy.reconcile.status import next_status as next_status_with

T_DATES = {"2026-11-29T10:00:00Z": datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
           "2026-11-29T10:05:00Z": datetime(2026, 11, 29, 10, 5, tzinfo=UTC)}


def next_status(previous: SpeculativeDeploymentStatus, spec: SpeculativeDeploymentSpec, generation: int,
                planned: Planned, deployments: list[DeploymentState], now: str) -> SpeculativeDeploymentStatus:
    """The reconciler's composition without a sample: the speculation step, then the status."""
    resource = SpeculativeDeployment(metadata=ObjectMeta(name="x", namespace="ns"), spec=spec)
    step = step_speculation(resource, previous.speculation, previous.analysis, planned.accepted, None, [],
                            T_DATES[now])
    return next_status_with(previous, spec, generation, planned, deployments, now, step.speculation, step.analysis)

def sampled_status(previous: SpeculativeDeploymentStatus, spec: SpeculativeDeploymentSpec,
                   deployments: list[DeploymentState], the_sample: DeploymentSample,
                   now: str) -> SpeculativeDeploymentStatus:
    """The reconciler's composition with an analysis sample."""
    resource = SpeculativeDeployment(metadata=ObjectMeta(name="x", namespace="ns"), spec=spec)
    planned = Planned(make_plan(spec))
    step = step_speculation(resource, previous.speculation, previous.analysis, planned.accepted, the_sample, [],
                            T_DATES[now])
    return next_status_with(previous, spec, 1, planned, deployments, now, step.speculation, step.analysis)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HUB_FIXTURES = Path(__file__).parent.parent / "fixtures" / "hub"
T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T10:05:00Z"


def _spec(name: str) -> SpeculativeDeploymentSpec:
    return load_resource((EXAMPLES / name).read_text()).spec


def _deployment(variant: Variant, replicas: int, available: int, updated: int | None = None,
                generation: int = 1, observed: int = 1, sd_generation: int = 1) -> DeploymentState:
    return DeploymentState(
        name=f"x-{variant.value}", variant=variant, replicas=replicas,
        updated_replicas=replicas if updated is None else updated, available_replicas=available,
        generation=generation, observed_generation=observed, sd_generation=sd_generation,
    )


def _condition(status: SpeculativeDeploymentStatus, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


def test_accepted_and_available_is_measuring_and_ready() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    deployments = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    status = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), deployments, T0)
    assert status.phase == Phase.MEASURING
    assert _condition(status, "Ready").status == ConditionStatus.TRUE
    assert _condition(status, "MemoryFits").reason == "Fits"
    assert status.observed_generation == 1
    assert status.speculation is not None and status.speculation.decided


def test_missing_control_is_progressing() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    status = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)),
                         [_deployment(Variant.SPECULATIVE, 2, 2)], T0)
    ready = _condition(status, "Ready")
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "Progressing")
    assert "control" in ready.message
    assert status.phase == Phase.DEPLOYING


def test_rejected_with_nothing_running_says_so_and_does_not_speculate() -> None:
    spec = _spec("llama-70b-bf16-h100-rejected.yaml")
    status = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), [], T0)
    assert status.phase == Phase.REJECTED
    assert _condition(status, "MemoryFits").status == ConditionStatus.FALSE
    assert "What would fit" in _condition(status, "MemoryFits").message
    assert _condition(status, "Ready").reason == "Rejected"
    assert status.speculation is not None and not status.speculation.decided


def test_rejected_update_keeps_serving_and_keeps_speculation_state() -> None:
    good, bad = _spec("llama-8b-ngram.yaml"), _spec("llama-70b-bf16-h100-rejected.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    first = next_status(SpeculativeDeploymentStatus(), good, 1, Planned(make_plan(good)), running, T0)
    second = next_status(first, bad, 2, Planned(make_plan(bad)), running, T1)
    ready = _condition(second, "Ready")
    assert ready.status == ConditionStatus.TRUE and "keep serving" in ready.message
    assert second.speculation == first.speculation
    assert second.phase == Phase.REJECTED


def test_transition_time_moves_only_when_status_changes() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    first = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), running, T0)
    same = next_status(first, spec, 1, Planned(make_plan(spec)), running, T1)
    assert same == first, "an unchanged world writes an identical status"
    degraded = next_status(first, spec, 1, Planned(make_plan(spec)),
                           [_deployment(Variant.SPECULATIVE, 2, 1), _deployment(Variant.CONTROL, 1, 1)], T1)
    assert _condition(degraded, "Ready").last_transition_time == T1
    assert _condition(degraded, "MemoryFits").last_transition_time == T0
    assert degraded.phase == Phase.DEGRADED


def test_events_only_on_transitions() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    progressing = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), [], T0)
    assert transition_events([], progressing.conditions) == []
    ready = next_status(progressing, spec, 1, Planned(make_plan(spec)), running, T1)
    assert [e.reason for e in transition_events(progressing.conditions, ready.conditions)] == ["Ready"]
    assert transition_events(ready.conditions, ready.conditions) == []
    lost = next_status(ready, spec, 1, Planned(make_plan(spec)),
                       [_deployment(Variant.SPECULATIVE, 2, 0), _deployment(Variant.CONTROL, 1, 1)], T1)
    assert [(e.type.value, e.reason) for e in transition_events(ready.conditions, lost.conditions)] == [
        ("Warning", "NotReady")
    ]
    bad = _spec("llama-70b-bf16-h100-rejected.yaml")
    rejected = next_status(SpeculativeDeploymentStatus(), bad, 1, Planned(make_plan(bad)), [], T0)
    assert [e.reason for e in transition_events([], rejected.conditions)] == ["MemoryPlanRejected"]


def test_a_refused_generation_is_ready_false_rejected_with_one_warning_per_refusal() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    ready = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), running, T0)
    refused = refused_status(ready, 2, Reason.APPLY_REFUSED, "the apiserver refused a child: exceeded quota", T1)
    assert refused.phase == Phase.REJECTED and refused.observed_generation == 2
    assert (_condition(refused, "Ready").status, _condition(refused, "Ready").reason) == (
        ConditionStatus.FALSE, "ApplyRefused")
    assert _condition(refused, "MemoryFits") == _condition(ready, "MemoryFits")   # the rest is kept
    assert [c.type for c in refused.conditions] == [c.type for c in ready.conditions]
    assert [(e.type.value, e.reason, e.message) for e in transition_events(ready.conditions, refused.conditions)] \
        == [("Warning", "ApplyRefused", "the apiserver refused a child: exceeded quota")]
    assert transition_events(refused.conditions, refused.conditions) == []     # once, not every resync
    # A refusal is news even for a resource that was never Ready; another refusal raises its own Event.
    invalid = refused_status(SpeculativeDeploymentStatus(), 1, Reason.INVALID_SPEC, "does not validate", T0)
    assert [e.reason for e in transition_events([], invalid.conditions)] == ["InvalidSpec"]
    assert [e.reason for e in transition_events(invalid.conditions, refused.conditions)] == ["ApplyRefused"]


# -- with analysis samples -------------------------------------------------------------------------

def _measuring() -> tuple[SpeculativeDeploymentSpec, list[DeploymentState], SpeculativeDeploymentStatus]:
    spec = _spec("llama-8b-ngram.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    return spec, running, next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), running, T0)


def test_a_measured_speedup_is_speculating_with_the_interval_in_the_condition() -> None:
    spec, running, first = _measuring()
    assert first.phase == Phase.MEASURING
    status = sampled_status(first, spec, running, sample(0.8, itl=0.012, control_itl=0.02), T1)
    assert status.phase == Phase.SPECULATING
    healthy = _condition(status, "SpeculationHealthy")
    assert (healthy.status, healthy.reason) == (ConditionStatus.TRUE, "Healthy")
    assert "per-token latency −40% (95% interval" in healthy.message and "vs the control" in healthy.message
    wire = status.to_wire()["analysis"]
    assert wire["speedup"]["value"] == 1.67 and wire["speedup"]["baseline"] == "control"
    assert wire["perTokenLatency"] == "12 ms vs 20 ms"
    assert wire["p99InterTokenLatency"] == "≈ 24 ms" and "p99InterTokenLatencySeconds" not in wire
    assert wire["diagnosis"]["speculative"] == "Decode-bound"


def test_a_regression_is_failing_with_the_count_towards_failure_limit() -> None:
    spec, running, first = _measuring()
    status = sampled_status(first, spec, running, sample(0.8, itl=0.05, control_itl=0.02), T1)
    healthy = _condition(status, "SpeculationHealthy")
    assert (healthy.status, healthy.reason) == (ConditionStatus.FALSE, "InterTokenLatencyRegressed")
    assert "95% interval" in healthy.message and healthy.message.endswith("(1 of failureLimit 3 in a row)")
    assert status.phase == Phase.MEASURING


def test_not_drafting_and_too_little_evidence_are_unknown_with_their_reason() -> None:
    spec, running, first = _measuring()
    idle = sampled_status(first, spec, running, sample(math.nan), T1)
    condition_ = _condition(idle, "SpeculationHealthy")
    assert (condition_.status, condition_.reason) == (ConditionStatus.UNKNOWN, "NotDrafting")
    assert condition_.message.startswith("not drafting now")
    assert idle.phase == Phase.MEASURING and idle.analysis is not None
    assert idle.analysis.consecutive_inconclusive == 0
    close = sampled_status(first, spec, running, sample(0.8, itl=0.0219, control_itl=0.02), T1)
    condition_ = _condition(close, "SpeculationHealthy")
    assert (condition_.status, condition_.reason) == (ConditionStatus.UNKNOWN, "NotEnoughEvidence")
    assert "requests per variant would tell" in condition_.message


def _rolled_back_status(pods_speculating: int) -> tuple[SpeculativeDeploymentSpec, SpeculativeDeploymentStatus]:
    spec = _spec("llama-8b-ngram.yaml")
    speculation = SpeculationStatus(
        decided=False, active=pods_speculating > 0, speculating_pods=pods_speculating, since=T0, rollbacks=1,
        last_rollback=RollbackRecord(at=T0, reason="AcceptanceBelowMinimum", evidence="acceptance 0.02 < 0.11"))
    return spec, SpeculativeDeploymentStatus(speculation=speculation)


def test_a_rollback_decided_while_pods_still_speculate_is_rolling_back_not_rolled_back() -> None:
    spec, previous = _rolled_back_status(pods_speculating=3)
    stuck = [_deployment(Variant.SPECULATIVE, 3, 3, updated=0, sd_generation=1), _deployment(Variant.CONTROL, 1, 1)]
    status = next_status(previous, spec, 1, Planned(make_plan(spec)), stuck, T1)
    assert status.phase == Phase.ROLLING_BACK
    assert status.speculation is not None and status.speculation.active and not status.speculation.decided
    rolled = _condition(status, "RolledBack")
    assert (rolled.status, rolled.reason) == (ConditionStatus.FALSE, "RollbackInProgress")
    assert "3 speculative pods still run with speculation" in rolled.message
    assert "AcceptanceBelowMinimum" in rolled.message


def test_a_rollback_is_rolled_back_once_no_pod_speculates() -> None:
    spec, previous = _rolled_back_status(pods_speculating=0)
    done = [_deployment(Variant.SPECULATIVE, 3, 3), _deployment(Variant.CONTROL, 1, 1)]
    status = next_status(previous, spec, 1, Planned(make_plan(spec)), done, T1)
    assert status.phase == Phase.ROLLED_BACK
    rolled = _condition(status, "RolledBack")
    assert (rolled.status, rolled.reason) == (ConditionStatus.TRUE, "AcceptanceBelowMinimum")


def test_a_status_from_before_decided_existed_reads_its_decision_from_active() -> None:
    old = SpeculationStatus.model_validate({"active": False, "rollbacks": 1})
    assert (old.decided, old.active) == (False, False)
    assert SpeculationStatus.model_validate({"decided": False, "active": True}).active


def test_a_rollout_waiting_on_a_pod_no_node_can_take_is_rollout_stuck_with_the_fix() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    rolling = [_deployment(Variant.SPECULATIVE, 2, 2, updated=1), _deployment(Variant.CONTROL, 1, 1)]
    words = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    stuck = (StuckPod("x-speculative-7b9c-a", "Unschedulable", words),)
    status = next_status_with(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), rolling, T0,
                              SpeculationStatus(decided=True), None, stuck)
    ready = _condition(status, "Ready")
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "RolloutStuck")
    assert f"pod x-speculative-7b9c-a Unschedulable: {words}" in ready.message
    assert "spec.rollout.maxSurge at 0" in ready.message

    # an analysis sample lists no pods: it keeps what the last listing saw, rather than flap to Progressing
    sampled = next_status_with(status, spec, 1, Planned(make_plan(spec)), rolling, T1,
                               SpeculationStatus(decided=True), None, None)
    assert _condition(sampled, "Ready").reason == "RolloutStuck"
    assert _condition(sampled, "Ready").last_transition_time == T0
    # a listing that finds nothing stuck clears it; a finished rollout is Available
    listed = next_status_with(sampled, spec, 1, Planned(make_plan(spec)), rolling, T1,
                              SpeculationStatus(decided=True), None, ())
    assert _condition(listed, "Ready").reason == "Progressing"
    done = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    available = next_status_with(status, spec, 1, Planned(make_plan(spec)), done, T1,
                                 SpeculationStatus(decided=True), None, None)
    assert _condition(available, "Ready").reason == "Available"


def test_the_deploy_record_and_the_pins_follow_the_spec_revision() -> None:
    spec = _spec("qwen3-4b-draft.yaml")
    sha = "a" * 40
    record = DeployRecord(target=ModelRecord(source="Hub", name=spec.model.name, revision=None, commit=sha),
                          engine=EngineRecord(kind="vllm", image="vllm/vllm-openai"))
    pinned = pinned_to_record(spec, record)
    assert pinned.model.revision == sha                     # the branch asked for stays at the planned commit
    moved = spec.model_copy(update={"model": spec.model.model_copy(update={"revision": "v2"})})
    assert pinned_to_record(moved, record).model.revision == "v2"   # a new revision resolves again
    assert pinned_to_record(spec, None) == spec

    status = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)),
                         [_deployment(Variant.SPECULATIVE, 1, 1), _deployment(Variant.CONTROL, 1, 1)], T0)
    assert status.deploy_record is not None
    assert (status.deploy_record.target.source, status.deploy_record.target.commit) == ("Catalog", None)
    assert status.deploy_record.draft is not None and status.deploy_record.draft.name == "Qwen/Qwen3-0.6B"
    assert status.deploy_record.engine.kind == "vllm" and status.deploy_record.engine.image


def test_a_hub_resolved_draft_records_its_commit_next_to_the_target_s(tmp_path: Path) -> None:
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-4B-Thinking-2507"}, "resources": {"gpu": {"product": "H100-80GB", "count": 1}},
        "speculation": {"method": "draft_model", "draft": {"name": "Qwen/Qwen3-0.6B"}, "numSpeculativeTokens": 5},
        "serving": {"maxModelLen": 32768, "maxNumSeqs": 32}})
    with FakeHub.from_fixtures(HUB_FIXTURES) as hub:
        client = HubClient(tmp_path, endpoint=hub.url, retry=RetryPolicy(attempts=1))
        plan = make_plan(spec, resolve_models(spec, hub=client))
        target_sha, draft_sha = hub.sha("Qwen/Qwen3-4B-Thinking-2507"), hub.sha("Qwen/Qwen3-0.6B")
    status = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(plan),
                         [_deployment(Variant.SPECULATIVE, 1, 1), _deployment(Variant.CONTROL, 1, 1)], T0)
    record = status.deploy_record
    assert record is not None and record.draft is not None
    assert (record.target.source, record.target.commit) == ("Hub", target_sha)
    assert (record.draft.source, record.draft.name, record.draft.commit) == ("Hub", "Qwen/Qwen3-0.6B", draft_sha)
    assert record.draft.revision is None   # as the spec asks; the commit is the pin


def test_a_transient_planning_error_keeps_the_last_good_plan_and_phase() -> None:
    spec = _spec("llama-8b-ngram.yaml")
    running = [_deployment(Variant.SPECULATIVE, 2, 2), _deployment(Variant.CONTROL, 1, 1)]
    good = next_status(SpeculativeDeploymentStatus(), spec, 1, Planned(make_plan(spec)), running, T0)
    outage = Planned(None, Finding(code="HubUnreachable", severity=Severity.ERROR, message="the Hub …"),
                     transient=True)
    kept = next_status(good, spec, 2, outage, running, T1)
    assert kept.phase == good.phase and kept.memory_plan == good.memory_plan
    assert kept.deploy_record == good.deploy_record
    memory = _condition(kept, "MemoryFits")
    assert (memory.status, memory.reason) == (ConditionStatus.UNKNOWN, "HubUnreachable")
    assert "keep serving" in _condition(kept, "Ready").message
