"""decide: one pass's actions from plain observations — each transition of the speculation state machine,
one status per pass, the rollback persisted before it acts, its notice once, nothing done when nothing changed."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from analysis_samples import T0, sample

from specdeploy.api import names
from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.status import ConditionStatus, Phase, SpeculativeDeploymentStatus, VerdictKind
from specdeploy.judgment.rollback import RETRY_ANNOTATION
from specdeploy.judgment.samples import DeploymentSample
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import (
    ANNOTATION_SPECULATING,
    LABEL_VARIANT,
    PodMonitoring,
    Variant,
    desired_children,
)
from specdeploy.reconcile.decide import Actions, Observed, decide, noticed, refused
from specdeploy.reconcile.drift import difference, drift
from specdeploy.reconcile.observed import observe_pods
from specdeploy.reconcile.status import (
    STATUS_REFRESH_SECONDS,
    DeploymentState,
    Planned,
    deferrable_sample_write,
    status_refresh_seconds,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME, NAMESPACE = "llama", "ns"


def _body(analysis: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
          status: SpeculativeDeploymentStatus | None = None, generation: int = 1) -> dict[str, Any]:
    document = yaml.safe_load((EXAMPLES / "llama-8b-ngram.yaml").read_text())
    document["metadata"] = {"name": NAME, "namespace": NAMESPACE, "generation": generation, "uid": "u1",
                            "annotations": annotations or {}}
    document["spec"]["analysis"].update({"failureLimit": 2, **(analysis or {})})
    document["status"] = status.to_wire() if status is not None else {}
    return document


def _resource(body: dict[str, Any]) -> SpeculativeDeployment:
    return load_resource(yaml.safe_dump({**body, "status": None}))


def _deployments(body: dict[str, Any], fingerprint: str | None = None) -> tuple[DeploymentState, ...]:
    generation = body["metadata"]["generation"]
    return tuple(DeploymentState(name=name, variant=v, replicas=1, updated_replicas=1, available_replicas=1,
                                 generation=1, observed_generation=1, sd_generation=generation,
                                 children_fingerprint=fingerprint)
                 for name, v in ((names.engine_deployment_name(NAME), Variant.SPECULATIVE),
                                 (names.control_deployment_name(NAME), Variant.CONTROL)))


def _pods(speculating: bool) -> Any:
    """One scheduled, running speculative pod whose ReplicaSet says whether it speculates."""
    pod = {"metadata": {"name": "llama-speculative-1", "labels": {LABEL_VARIANT: "speculative"},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "rs1"}]},
           "spec": {"nodeName": "node-1"}, "status": {"phase": "Running"}}
    replica_set = {"metadata": {"name": "rs1", "annotations": {ANNOTATION_SPECULATING: str(speculating).lower()}}}
    return observe_pods([pod], [replica_set], LABEL_VARIANT, "speculative")


def _observed(body: dict[str, Any], *, sample: DeploymentSample | None = None, pods: Any = None,
              notice_posted: bool = False, applied: bool = True) -> Observed:
    resource = _resource(body)
    planned = Planned(make_plan(resource.spec))
    previous = SpeculativeDeploymentStatus.model_validate(body["status"])
    observed = Observed(body, previous, resource, planned=planned, pods=pods, sample=sample,
                        notice_posted=notice_posted)
    if not applied:
        return dataclasses.replace(observed, deployments=_deployments(body))
    # The Deployments as the last apply left them: the fingerprint of the children the status as read renders.
    assert planned.plan is not None
    children = desired_children(resource.model_copy(update={"status": previous}), planned.plan)
    return dataclasses.replace(observed, deployments=_deployments(body, children.fingerprint(body["metadata"]["generation"])))


def _after(body: dict[str, Any], actions: Actions) -> dict[str, Any]:
    """The SD as the next pass reads it: the status this pass wrote."""
    return {**body, "status": actions.status.to_wire()}


def _failing() -> DeploymentSample:
    return sample(0.8, itl=0.04, control_itl=0.02)   # per-token latency twice the control's


def _speculating(at: datetime = T0) -> tuple[dict[str, Any], Actions]:
    """A new SD's first pass, then a pass with its pods up and speculating."""
    body = _body()
    first = decide(_observed(body, applied=False), at)
    body = _after(body, first)
    second = decide(_observed(body, pods=_pods(True)), at)
    return _after(body, second), second


# -- creation, and passes that change nothing ---------------------------------------------------------

def test_a_new_sd_speculates_applies_its_children_and_writes_status_after_acting() -> None:
    actions = decide(_observed(_body(), applied=False), T0)
    assert actions.children is not None and not actions.write_first
    assert actions.status.speculation is not None and actions.status.speculation.decided
    assert actions.status.observed_generation == 1
    assert actions.notice is None and actions.alert is None and actions.rollback is None


def test_a_pass_that_observes_what_the_last_one_wrote_changes_nothing() -> None:
    body, _ = _speculating()
    again = decide(_observed(body, pods=_pods(True)), T0 + timedelta(minutes=3))
    assert again.status.to_wire() == body["status"]          # nothing to write
    assert again.events == [] and again.notice is None and again.alert is None


def test_an_analysis_sample_with_children_as_applied_applies_nothing() -> None:
    body, _ = _speculating()
    actions = decide(_observed(body, sample=sample(0.8, itl=0.01, control_itl=0.02)), T0 + timedelta(seconds=30))
    assert actions.children is None
    assert actions.status.analysis is not None and actions.status.analysis.verdict == VerdictKind.HEALTHY
    assert actions.status.analysis.verdict_reason is None


# -- rollback: decided, persisted first, acted on, announced once -----------------------------------------

def _rolled_back() -> tuple[dict[str, Any], Actions]:
    body, _ = _speculating()
    first = decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=30))
    assert first.rollback is None and first.status.analysis is not None
    assert (first.status.analysis.verdict, first.status.analysis.verdict_reason) == (
        VerdictKind.FAILING, "InterTokenLatencyRegressed")
    body = _after(body, first)
    second = decide(_observed(body, sample=_failing()), T0 + timedelta(seconds=60))
    return body, second


def test_failure_limit_failing_samples_decide_a_rollback_written_before_anything_acts() -> None:
    _, actions = _rolled_back()
    assert actions.rollback is not None and actions.write_first
    speculation = actions.status.speculation
    assert speculation is not None and not speculation.decided and speculation.rollbacks == 1
    # Decided, not done: the pods still speculate until the rollout replaces them.
    assert speculation.active and actions.status.phase == Phase.ROLLING_BACK
    rolled = next(c for c in actions.status.conditions if c.type == "RolledBack")
    assert (rolled.status, rolled.reason) == (ConditionStatus.FALSE, "RollbackInProgress")
    # The children it applies run without speculation.
    assert actions.children is not None
    deployment = actions.children.deployments[Variant.SPECULATIVE]
    assert deployment["metadata"]["annotations"][ANNOTATION_SPECULATING] == "false"
    assert "--speculative-config" not in str(deployment["spec"]["template"])
    # Its notice, under the name of rollback number 1, not yet marked.
    assert actions.notice is not None and actions.notice.event_name == f"{NAME}.speculation-rolled-back-1"
    assert actions.notice.event.reason == "SpeculationRolledBack" and "endsAt" not in actions.notice.alert
    assert speculation.last_rollback is not None and not speculation.last_rollback.notified


def test_the_next_pass_marks_the_notice_this_operator_posted_without_posting_again() -> None:
    body, decided = _rolled_back()
    body = _after(body, decided)
    actions = decide(_observed(body, pods=_pods(True), notice_posted=True), T0 + timedelta(seconds=61))
    assert actions.notice is None and not actions.write_first
    speculation = actions.status.speculation
    assert speculation is not None and speculation.last_rollback is not None and speculation.last_rollback.notified


def test_after_a_restart_the_notice_goes_out_again_under_the_same_name() -> None:
    body, decided = _rolled_back()
    body = _after(body, decided)
    actions = decide(_observed(body, pods=_pods(True), notice_posted=False), T0 + timedelta(seconds=61))
    assert decided.notice is not None and actions.notice is not None
    assert actions.notice.event_name == decided.notice.event_name and actions.notice.alert == decided.notice.alert
    assert actions.rollback is None and not actions.write_first   # the decision is not taken twice
    marked = noticed(actions).status.speculation
    assert marked is not None and marked.last_rollback is not None and marked.last_rollback.notified


def test_rolled_back_once_no_pod_speculates_and_the_alert_kept_firing_on_each_sample() -> None:
    body, decided = _rolled_back()
    body = _after(body, noticed(decided))
    done = decide(_observed(body, pods=_pods(False)), T0 + timedelta(seconds=90))
    speculation = done.status.speculation
    assert speculation is not None and not speculation.active and done.status.phase == Phase.ROLLED_BACK
    rolled = next(c for c in done.status.conditions if c.type == "RolledBack")
    assert (rolled.status, rolled.reason) == (ConditionStatus.TRUE, "InterTokenLatencyRegressed")
    assert done.alert is None                                   # not a sample: nothing to refresh
    body = _after(body, done)
    sampled = decide(_observed(body, sample=sample(0.0)), T0 + timedelta(seconds=120))
    assert sampled.notice is None and sampled.alert is not None and "endsAt" not in sampled.alert
    assert sampled.rollback is None


def test_an_out_of_memory_death_rolls_back_at_once() -> None:
    body, _ = _speculating()
    pods = _pods(True)
    died = {**pods.speculative[0], "status": {"phase": "Running", "containerStatuses": [{
        "name": "engine", "restartCount": 1,
        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                     "finishedAt": "2026-11-29T10:00:20Z"}}}]}}
    pods = dataclasses.replace(pods, speculative=(died,))
    actions = decide(_observed(body, pods=pods), T0 + timedelta(seconds=30))
    assert actions.rollback is not None and actions.write_first and actions.notice is not None
    assert actions.status.speculation is not None and actions.status.speculation.last_rollback is not None
    assert actions.status.speculation.last_rollback.reason == "SpeculativePodOutOfMemory"


def test_the_retry_annotation_brings_speculation_back_and_resolves_the_alert() -> None:
    body, decided = _rolled_back()
    body = _after(body, noticed(decided))
    body["metadata"]["annotations"] = {RETRY_ANNOTATION: "1"}
    actions = decide(_observed(body, pods=_pods(False)), T0 + timedelta(seconds=90))
    speculation = actions.status.speculation
    assert speculation is not None and speculation.decided
    assert [e.reason for e in actions.events if e.reason == "SpeculationReenabled"] == ["SpeculationReenabled"]
    assert actions.alert is not None and actions.alert["endsAt"] == "2026-11-29T10:01:30Z"
    assert actions.children is not None
    assert actions.children.deployments[Variant.SPECULATIVE]["metadata"]["annotations"][ANNOTATION_SPECULATING] == "true"


def test_the_cooldowns_re_enable_says_it_is_on_trial() -> None:
    body, decided = _rolled_back()
    body = _after(body, noticed(decided))
    body["spec"]["analysis"].update({"reenable": "Auto", "cooldown": "1m"})
    actions = decide(_observed(body, pods=_pods(False)), T0 + timedelta(seconds=121))
    speculation = actions.status.speculation
    assert speculation is not None and speculation.decided and speculation.trial
    rolled = next(c for c in actions.status.conditions if c.type == "RolledBack")
    assert rolled.reason == "Reenabled" and "on trial (re-enabled by the cooldown: until a Healthy sample, the " \
        "first failing one rolls it back)" in rolled.message, rolled.message


# -- refusals --------------------------------------------------------------------------------------------

def test_a_spec_that_does_not_validate_changes_nothing_and_says_why() -> None:
    body, _ = _speculating()
    observed = Observed(body, SpeculativeDeploymentStatus.model_validate(body["status"]), None,
                        invalid="spec.replicas: must be at least 1")
    actions = decide(observed, T0 + timedelta(seconds=30))
    assert actions.children is None and actions.notice is None
    ready = next(c for c in actions.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "InvalidSpec")
    assert "spec.replicas: must be at least 1" in ready.message
    assert [e.reason for e in actions.events] == ["InvalidSpec"]


def test_a_refused_child_is_ready_false_in_the_apiservers_words_with_one_event() -> None:
    body = _body()
    observed = _observed(body, applied=False)
    actions = refused(observed, decide(observed, T0), "services \"llama\" is forbidden: exceeded quota", T0)
    ready = next(c for c in actions.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "ApplyRefused")
    assert "exceeded quota" in ready.message
    assert [e.reason for e in actions.events] == ["ApplyRefused"]
    # Refused again by the next pass: the same status, no second Event.
    body = _after(body, actions)
    again = refused(_observed(body, applied=False), decide(_observed(body, applied=False), T0), ready.message, T0)
    assert again.events == []
    # A pass that finds the Deployments with the refused apply's fingerprint (they went through, the Service
    # after them did not) and did not read the Service — a child event, an analysis sample — applies again.
    for observed in (_observed(body), _observed(body, sample=sample(0.8))):
        assert decide(observed, T0).children is not None


def test_a_legacy_verdict_string_is_read_as_the_structured_fields() -> None:
    status = SpeculativeDeploymentStatus.model_validate(
        {"analysis": {"verdict": "Inconclusive: NotEnoughEvidence", "consecutiveInconclusive": 1}})
    assert status.analysis is not None
    assert (status.analysis.verdict, status.analysis.verdict_reason) == (VerdictKind.INCONCLUSIVE, "NotEnoughEvidence")


# -- drift: what a pass that read every child applies -------------------------------------------------------

def _live(children: Any, generation: int = 1) -> dict[tuple[str, str], dict[str, Any]]:
    """The children as the apiserver would return them: with defaults and status added."""
    live = {}
    for manifest in [children.config_map, *children.deployments.values(), children.service]:
        there = copy.deepcopy(manifest)
        there["metadata"]["uid"] = "x"
        there["status"] = {"observedGeneration": 1}
        live[(manifest["kind"], manifest["metadata"]["name"])] = there
    return live


EVERY_KIND = frozenset({"Deployment", "ConfigMap", "Service"})


def test_children_as_applied_plus_defaults_are_not_drift_and_a_hand_edit_or_deletion_is() -> None:
    body, _ = _speculating()
    observed = dataclasses.replace(_observed(body, pods=_pods(True)), live_kinds=EVERY_KIND)
    wanted = decide(dataclasses.replace(observed, deployments=()), T0).children
    assert wanted is not None
    live = _live(wanted)
    assert decide(dataclasses.replace(observed, live=live), T0).children is None
    edited = copy.deepcopy(live)
    deployment = edited[("Deployment", names.engine_deployment_name(NAME))]
    deployment["spec"]["replicas"] = 5                                        # kubectl scale
    assert drift(wanted, edited, EVERY_KIND) == f"Deployment {NAME} differs at .spec.replicas"
    assert decide(dataclasses.replace(observed, live=edited), T0).children is not None
    gone = {k: v for k, v in live.items() if k[0] != "Service"}               # kubectl delete service
    assert drift(wanted, gone, EVERY_KIND) == f"Service {names.service_name(NAME)} is missing"
    assert decide(dataclasses.replace(observed, live=gone), T0).children is not None


def test_a_pass_compares_only_the_kinds_it_read() -> None:
    """A pass after a Deployment changed reads the Deployments, not the ConfigMap or Service: what it did
    not read is not missing (the next full read — a spec change, the resync — compares those)."""
    body, _ = _speculating()
    observed = _observed(body, pods=_pods(True))
    wanted = decide(dataclasses.replace(observed, deployments=()), T0).children
    assert wanted is not None
    deployments_only = {k: v for k, v in _live(wanted).items() if k[0] == "Deployment"}
    child_pass = dataclasses.replace(observed, live=deployments_only, live_kinds=frozenset({"Deployment"}))
    assert drift(wanted, deployments_only, {"Deployment"}) is None
    assert decide(child_pass, T0).children is None
    scaled = copy.deepcopy(deployments_only)
    scaled[("Deployment", names.engine_deployment_name(NAME))]["spec"]["replicas"] = 5
    assert decide(dataclasses.replace(child_pass, live=scaled), T0).children is not None
    assert drift(wanted, {}, frozenset()) is None                             # an analysis sample reads none


def test_difference_is_a_subset_comparison() -> None:
    assert difference({"a": 1, "b": [{"c": "x"}]}, {"a": 1, "b": [{"c": "x", "d": 2}], "e": 3}) is None
    assert difference({"a": 1}, {"a": 2}) == ".a"
    assert difference({"b": [1, 2]}, {"b": [1]}) == ".b"
    assert difference({"b": [{"c": "x"}]}, {"b": [{"c": "y"}]}) == ".b[0].c"
    assert difference({"a": {"b": 1}}, {"a": "scalar"}) == ".a"


# -- which samples' statuses wait: only a new time and inconclusive count ----------------------------------

def test_a_sample_that_changes_only_its_time_waits_and_any_figure_or_a_minute_is_written() -> None:
    body, _ = _speculating()
    idle = sample(0.0, requests=0)                        # no traffic: Inconclusive, the same words each time
    first = decide(_observed(body, sample=idle), T0 + timedelta(seconds=3))
    assert not deferrable_sample_write(body["status"], first.status.to_wire())   # the first verdict: written
    written = _after(body, first)
    second = decide(_observed(written, sample=idle), T0 + timedelta(seconds=6))
    new = second.status.to_wire()
    assert new != written["status"] and deferrable_sample_write(written["status"], new)
    assert new["analysis"]["consecutiveInconclusive"] == written["status"]["analysis"]["consecutiveInconclusive"] + 1
    late = decide(_observed(written, sample=idle), T0 + timedelta(seconds=3 + STATUS_REFRESH_SECONDS))
    assert not deferrable_sample_write(written["status"], late.status.to_wire())   # a minute stale: written
    busy = decide(_observed(written, sample=sample(0.8, itl=0.01, control_itl=0.02)), T0 + timedelta(seconds=6))
    assert not deferrable_sample_write(written["status"], busy.status.to_wire())   # a verdict and figures
    failing = decide(_observed(_after(written, busy), sample=_failing()), T0 + timedelta(seconds=9))
    assert not deferrable_sample_write(_after(written, busy)["status"], failing.status.to_wire())  # a failure counted


def test_each_sd_refreshes_an_idle_status_within_a_minute_and_not_all_at_once() -> None:
    periods = [status_refresh_seconds("bench", f"idle-{i:04d}") for i in range(1000)]
    assert all(STATUS_REFRESH_SECONDS / 2 <= p < STATUS_REFRESH_SECONDS for p in periods)
    assert status_refresh_seconds("bench", "idle-0001") == periods[1]                     # fixed by its name
    assert max(periods) - min(periods) > STATUS_REFRESH_SECONDS / 3                        # spread over the range


def test_status_says_once_why_no_pod_monitor_is_rendered_where_the_crd_exists() -> None:
    off = PodMonitoring(not_rendered="the operator renders no PodMonitor for this SD (--no-pod-monitors): …")
    actions = decide(dataclasses.replace(_observed(_body(), applied=False), pod_monitoring=off), T0)
    assert actions.status.monitoring == off.not_rendered
    assert actions.children is not None and actions.children.pod_monitor is None
    rendered = decide(dataclasses.replace(_observed(_body(), applied=False), pod_monitoring=PodMonitoring(render=True)), T0)
    assert rendered.status.monitoring is None and rendered.children is not None
    assert rendered.children.pod_monitor is not None
