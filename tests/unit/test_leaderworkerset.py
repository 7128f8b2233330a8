"""A layout across nodes renders LeaderWorkerSets instead of Deployments (issue 33 point 2): groups of one pod per
node, the engine's multi-node flags per role, probes and the Service on the leaders, rollback without speculation;
the live reconciler runs them where the cluster has LeaderWorkerSets and it may write them, refuses with the fix
where not, observes the groups (their status, what their pods run) and names a member that died (point 4)."""

from __future__ import annotations

import asyncio
import datetime
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from lightkube import ALL_NS

from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.spec import Probe
from specdeploy.api.status import (
    Condition,
    ConditionStatus,
    ProbeTrigger,
    SpeculationStatus,
    SpeculativeDeploymentStatus,
)
from specdeploy.clients.kube import deployment_state
from specdeploy.controller.probe_loop import Prober, probe_target, ready_speculative_pod, speculative_kind
from specdeploy.controller.reconciler import plan_resource
from specdeploy.controller.watched import DEPLOYMENT, Watched
from specdeploy.controller.watched import SD as SD_KIND
from specdeploy.engines import EngineRenderError, NodeRank, node_args
from specdeploy.judgment.oom import out_of_memory
from specdeploy.judgment.probe import ProbeTarget, probe_due
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import LABEL_NAME, LABEL_VARIANT, PodMonitoring, Variant, desired_children
from specdeploy.reconcile.decide import already_applied
from specdeploy.reconcile.leaderworkerset import (
    ANNOTATION_SPECULATING,
    LABEL_ROLE,
    LWS_API_VERSION,
    LWS_KIND,
    LeaderWorkerSets,
)
from specdeploy.reconcile.observed import StuckPod, failed_group_members, observe_pods, speculative_pods_state
from specdeploy.reconcile.status import DeploymentState, Planned, next_status, with_scale

SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: big, namespace: team}}
spec:
  model: {{name: {model}}}
  engine: {{kind: {engine}}}
  speculation: {speculation}
  resources: {{gpu: {{product: H100-80GB}}, tensorParallelSize: 8, pipelineParallelSize: {pp}}}
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  analysis: {{baseline: {{mode: Control, controlReplicas: 1}}}}
"""
LLAMA_405B = ("meta-llama/Llama-3.1-405B-Instruct",
              "{method: draft_model, numSpeculativeTokens: 4, draft: {name: meta-llama/Llama-3.1-8B-Instruct}}")
DEEPSEEK_R1 = ("deepseek-ai/DeepSeek-R1", "{method: mtp, numSpeculativeTokens: 1}")
DEEPSEEK_R1_PLAIN = ("deepseek-ai/DeepSeek-R1", "{enabled: false}")   # SGLang runs no speculation across stages


def load(engine: str = "vllm", models: tuple[str, str] = LLAMA_405B, pp: int = 2) -> SpeculativeDeployment:
    model, speculation = models
    return load_resource(SD.format(model=model, engine=engine, speculation=speculation, pp=pp))


def templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    group = lws["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"], group["workerTemplate"]


def engine(template: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == "engine")


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("engine_kind", ["vllm", "sglang"])
def test_a_layout_across_nodes_renders_a_leader_worker_set_per_variant(engine_kind: str) -> None:
    resource = load(engine_kind, DEEPSEEK_R1_PLAIN if engine_kind == "sglang" else LLAMA_405B)
    plan = make_plan(resource.spec)
    assert plan.accepted
    children = desired_children(resource, plan)
    assert set(children.deployments) == ({Variant.SPECULATIVE} if engine_kind == "sglang"
                                         else {Variant.SPECULATIVE, Variant.CONTROL})
    for variant, lws in children.deployments.items():
        assert (lws["apiVersion"], lws["kind"]) == (LWS_API_VERSION, LWS_KIND)
        assert lws["metadata"]["name"].startswith("big")
        group = lws["spec"]["leaderWorkerTemplate"]
        assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
        assert lws["spec"]["replicas"] == 1
        leader, worker = templates(lws)
        for template, role in ((leader, "leader"), (worker, "worker")):
            labels = template["metadata"]["labels"]
            assert labels[LABEL_NAME] == "big" and labels[LABEL_VARIANT] == variant.value
            assert labels[LABEL_ROLE] == role
            container = engine(template)
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"   # one node's GPUs per pod
            assert flag(container["args"], "--nnodes") == "2"
        assert flag(engine(leader)["args"], "--node-rank") == "0"
        assert flag(engine(worker)["args"], "--node-rank") == "$(LWS_WORKER_INDEX)"
        assert {"startupProbe", "readinessProbe", "livenessProbe", "ports"} <= engine(leader).keys()
        assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & engine(worker).keys()


def test_vllm_workers_run_headless_and_join_the_leader() -> None:
    resource = load("vllm")
    lws = desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]
    leader, worker = (engine(t)["args"] for t in templates(lws))
    assert flag(leader, "--pipeline-parallel-size") == "2" and flag(leader, "--tensor-parallel-size") == "8"
    assert flag(worker, "--master-addr") == flag(leader, "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert "--headless" in worker and "--headless" not in leader


def test_sglang_ranks_meet_at_the_leader() -> None:
    resource = load("sglang", DEEPSEEK_R1_PLAIN)
    lws = desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]
    leader, worker = (engine(t)["args"] for t in templates(lws))
    assert flag(leader, "--dist-init-addr") == flag(worker, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    assert flag(leader, "--pp-size") == "2"


def test_the_service_and_pod_monitor_select_the_leaders() -> None:
    resource = load()
    children = desired_children(resource, make_plan(resource.spec), pod_monitoring=PodMonitoring(render=True))
    assert children.service["spec"]["selector"] == {LABEL_NAME: "big", LABEL_ROLE: "leader"}
    assert children.pod_monitor is not None
    assert children.pod_monitor["spec"]["selector"]["matchLabels"] == {LABEL_NAME: "big", LABEL_ROLE: "leader"}


def test_no_group_service_takes_the_name_of_the_sds_service() -> None:
    """LeaderWorkerSet's default (Shared) headless Service is named after the LeaderWorkerSet — the speculative
    variant's name, which is the SD's Service's — and owned by it: the apiserver then refuses the operator's Service
    (two controller owners). Per group, its Service is named after the leader pod."""
    resource = load()
    children = desired_children(resource, make_plan(resource.spec))
    assert children.service["metadata"]["name"] == children.deployments[Variant.SPECULATIVE]["metadata"]["name"]
    for lws in children.deployments.values():
        assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}


def test_a_layout_within_a_node_still_renders_deployments_selected_as_before() -> None:
    resource = load(pp=1, models=("meta-llama/Llama-3.1-70B-Instruct", "{method: ngram}"))
    children = desired_children(resource, make_plan(resource.spec))
    assert {d["kind"] for d in children.deployments.values()} == {"Deployment"}
    assert children.service["spec"]["selector"] == {LABEL_NAME: "big"}


def test_rollback_re_renders_the_group_without_speculation() -> None:
    resource = load()
    plan = make_plan(resource.spec)
    rolled_back = resource.model_copy(update={"status": SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(active=False, rollbacks=1))})
    before = desired_children(resource, plan).deployments
    after = desired_children(rolled_back, plan).deployments
    assert "--speculative-config" in engine(templates(before[Variant.SPECULATIVE])[0])["args"]
    for role in (0, 1):
        speculative = engine(templates(after[Variant.SPECULATIVE])[role])["args"]
        assert "--speculative-config" not in speculative
        assert speculative == engine(templates(after[Variant.CONTROL])[role])["args"]
    assert after[Variant.SPECULATIVE]["metadata"]["annotations"]["specdeploy.io/speculating"] == "false"


def test_tensorrt_llm_has_no_multi_node_launch() -> None:
    with pytest.raises(EngineRenderError, match="MPI"):
        node_args(load("trtllm").spec.engine.kind, NodeRank(2, "0", "leader"))


def test_without_leader_worker_sets_a_layout_across_nodes_is_refused_with_the_fix() -> None:
    no_crd = LeaderWorkerSets(why_not="the cluster has no LeaderWorkerSet CRD (…): install the controller")
    planned = plan_resource(load(), groups=no_crd)
    assert planned.plan is None and planned.error is not None
    assert planned.error.code == "LeaderWorkerSetsUnavailable"
    assert "spans 2 nodes" in planned.error.message and "install the controller" in planned.error.message
    status = next_status(SpeculativeDeploymentStatus(), load().spec, 1, planned, [], "2026-12-06T03:00:00Z",
                         SpeculationStatus(decided=True), None)
    compatible = next(c for c in status.conditions if c.type == "Compatible")
    assert (compatible.status, compatible.reason) == (ConditionStatus.FALSE, "LeaderWorkerSetsUnavailable")
    # one node's layout needs none; where the operator may run them, the layout across nodes is planned
    assert plan_resource(load(pp=1, models=("meta-llama/Llama-3.1-70B-Instruct", "{method: ngram}"))).plan is not None
    assert plan_resource(load(), groups=LeaderWorkerSets(usable=True, why_not="")).accepted


def test_each_pod_of_a_group_says_whether_it_speculates_and_the_observation_reads_it() -> None:
    resource = load()
    plan = make_plan(resource.spec)
    speculating = desired_children(resource, plan).deployments[Variant.SPECULATIVE]
    rolled_back = desired_children(resource.model_copy(update={"status": SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(decided=False, active=True))}), plan).deployments[Variant.SPECULATIVE]
    for lws, said in ((speculating, "true"), (rolled_back, "false")):
        assert {t["metadata"]["annotations"][ANNOTATION_SPECULATING] for t in templates(lws)} == {said}
    # the pods of a group are a StatefulSet's: their own annotation decides, whatever ReplicaSet is listed
    old, new = group_pod("big-0", "leader", "true"), group_pod("big-0-1", "worker", "false")
    state = speculative_pods_state([old, new], [])
    assert state.speculating == ("big-0",) and state.without_speculation == ("big-0-1",)


def lws_body(ready: int, updated: int, replicas: int = 1, kind: str = LWS_KIND) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "big", "generation": 3, "labels": {LABEL_NAME: "big",
                                       LABEL_VARIANT: "speculative"}},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready,
                                                       "updatedReplicas": updated}}


def test_a_group_is_available_when_every_pod_of_it_is_ready() -> None:
    state = deployment_state(lws_body(ready=1, updated=1), "big")
    assert state is not None and state.kind == LWS_KIND
    assert state.rolled_out and state.available_replicas == 1
    rolling = deployment_state(lws_body(ready=1, updated=0), "big")
    assert rolling is not None and rolling.rolling and not rolling.rolled_out
    down = deployment_state(lws_body(ready=0, updated=1), "big")
    assert down is not None and not down.rolled_out and down.available_replicas == 0


def test_the_scale_subresource_counts_groups_and_selects_their_leaders() -> None:
    speculative = deployment_state(lws_body(ready=2, updated=2, replicas=2), "big")
    assert speculative is not None
    scaled = with_scale(SpeculativeDeploymentStatus(), "big", load().spec, [speculative])
    assert scaled.replicas == 2 and scaled.ready == "2/3"   # and one control group not there yet
    assert scaled.selector == "specdeploy.io/name=big,specdeploy.io/variant=speculative,specdeploy.io/role=leader"


def test_a_deployment_left_from_a_single_node_layout_is_not_what_was_applied() -> None:
    resource = load()
    children = desired_children(resource, make_plan(resource.spec))
    fingerprint = children.fingerprint(1)

    def state(variant: Variant, kind: str) -> DeploymentState:
        return DeploymentState(name=children.deployments[variant]["metadata"]["name"], variant=variant, replicas=1,
                               updated_replicas=1, available_replicas=1, generation=1, observed_generation=1,
                               sd_generation=1, children_fingerprint=fingerprint, kind=kind)

    groups = [state(Variant.SPECULATIVE, LWS_KIND), state(Variant.CONTROL, LWS_KIND)]
    assert already_applied(children, 1, tuple(groups))
    # the same names as Deployments: the layout moved, so they are applied as groups and the Deployments pruned
    assert not already_applied(children, 1, tuple(state(v, "Deployment") for v in Variant))
    assert not already_applied(children, 1, (*groups, state(Variant.SPECULATIVE, "Deployment")))


def group_pod(name: str, role: str, speculating: str = "true", *, terminated: dict[str, Any] | None = None,
              last: dict[str, Any] | None = None, deleting: bool = False, phase: str = "Running") -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name, "labels": {LABEL_NAME: "big", LABEL_VARIANT: "speculative", LABEL_ROLE: role},
        "annotations": {ANNOTATION_SPECULATING: speculating},
        "ownerReferences": [{"kind": "StatefulSet", "name": "big"}]}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-06T03:00:00Z"
    container: dict[str, Any] = {"name": "engine", "state": {"terminated": terminated} if terminated else
                                 {"running": {}}, "lastState": {"terminated": last} if last else {}}
    return {"metadata": metadata, "spec": {"nodeName": "gpu-node-2"},
            "status": {"phase": phase, "containerStatuses": [container]}}


OOM_KILLED = {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-12-06T03:00:00Z"}


def test_a_worker_that_died_is_a_group_failure_the_ready_condition_names() -> None:
    died = group_pod("big-0-1", "worker", last={"exitCode": 1, "reason": "Error", "finishedAt": "2026-12-06T03:00:00Z",
                                               "message": "NCCL error: remote process exited\n"})
    pods = [group_pod("big-0", "leader"), died,
            # killed by a rollout's deletion: not a death of its own
            group_pod("big-1-1", "worker", terminated={"exitCode": 143, "reason": "Error"}, deleting=True)]
    failed = failed_group_members(pods)
    assert [p.name for p in failed] == ["big-0-1"]
    assert failed[0].reason == "GroupMemberFailed"
    assert "worker's engine container exited with code 1 (Error): NCCL error: remote process exited" in \
        failed[0].message
    # named once though its container also waits in a crash loop; pods of one node (no role) are as before
    looping = {**died, "status": {**died["status"], "containerStatuses": [{
        **died["status"]["containerStatuses"][0], "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    single = {"metadata": {"name": "small-1", "labels": {LABEL_VARIANT: "speculative"}}, "status": {
        "phase": "Running", "containerStatuses": [{"name": "engine", "lastState": {"terminated": OOM_KILLED}}]}}
    assert [p.name for p in observe_pods([looping, single], [], LABEL_VARIANT, "speculative").stuck] == ["big-0-1"]

    ready = ready_of_groups(speculative_ready=0, stuck=failed)
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "GroupMemberFailed")
    assert "pod big-0-1 GroupMemberFailed" in ready.message and "kubectl logs --previous" in ready.message
    assert "0/1 speculative groups available" in ready.message


def test_a_death_is_named_before_the_leader_worker_set_counts_the_group_down() -> None:
    died = group_pod("big-0-1", "worker", last={"exitCode": 137, "reason": "Error",
                                               "finishedAt": "2026-12-06T03:00:00Z"})
    failed = failed_group_members([group_pod("big-0", "leader"), died])
    ready = ready_of_groups(speculative_ready=1, stuck=failed)
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "GroupMemberFailed")
    assert "1/1 speculative groups available" in ready.message and "a group is recreated: pod big-0-1" in ready.message
    assert ready_of_groups(speculative_ready=1, stuck=()).status == ConditionStatus.TRUE


def ready_of_groups(speculative_ready: int, stuck: tuple[StuckPod, ...]) -> Condition:
    """The Ready condition of the 405B SD whose speculative group has `speculative_ready` ready groups (of 1) and
    whose control group is up, with `stuck` the pods a listing found stuck."""
    resource = load()
    speculative = deployment_state(lws_body(ready=speculative_ready, updated=1), "big")
    control = deployment_state({**lws_body(ready=1, updated=1), "metadata": {
        "name": "big-control", "generation": 3, "labels": {LABEL_NAME: "big", LABEL_VARIANT: "control"}}}, "big")
    assert speculative is not None and control is not None
    status = next_status(SpeculativeDeploymentStatus(), resource.spec, 1, Planned(make_plan(resource.spec)),
                         [speculative, control], "2026-12-06T03:00:00Z", SpeculationStatus(decided=True), None,
                         stuck)
    return next(c for c in status.conditions if c.type == "Ready")


def test_an_out_of_memory_death_of_any_member_counts() -> None:
    pods = [group_pod("big-0", "leader"), group_pod("big-0-1", "worker", last=OOM_KILLED)]
    observed = observe_pods(pods, [], LABEL_VARIANT, "speculative")
    assert [death.pod for death in out_of_memory(observed.speculative)] == ["big-0-1"]


def test_the_probe_asks_a_leader_never_a_worker_ready_without_a_server() -> None:
    def ready(pod: dict[str, Any], ip: str) -> dict[str, Any]:
        return {**pod, "status": {**pod["status"], "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}

    worker = ready(group_pod("a-0-1", "worker"), "10.0.0.2")   # first by name
    leader = ready(group_pod("big-0", "leader"), "10.0.0.1")
    assert ready_speculative_pod([worker, leader]) is leader
    assert ready_speculative_pod([worker]) is None


SPECULATING = SpeculativeDeploymentStatus(speculation=SpeculationStatus(decided=True, active=True))
NOW = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)


def test_the_probe_starts_from_the_speculative_leader_worker_set_once_its_groups_are_ready() -> None:
    assert speculative_kind(load().spec) == LWS_KIND
    assert speculative_kind(load(pp=1).spec) == DEPLOYMENT   # TP 8 on one node of 8
    target = probe_target(lws_body(ready=1, updated=1), "big", SPECULATING)
    assert target == ProbeTarget(speculating=True, rolled_out=True, deployment_generation=3)
    assert probe_due(Probe(), None, target, NOW) is ProbeTrigger.NEW_GENERATION
    rolling = probe_target(lws_body(ready=0, updated=1), "big", SPECULATING)   # a member not ready yet
    assert rolling is not None and probe_due(Probe(), None, rolling, NOW) is None
    rolled_back = probe_target(lws_body(ready=1, updated=1), "big", SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(decided=False, active=False)))
    assert rolled_back is not None and probe_due(Probe(), None, rolled_back, NOW) is None
    assert probe_target(None, "big", SPECULATING) is None                       # not delivered by the watch yet
    assert probe_target(lws_body(ready=1, updated=1), "other", SPECULATING) is None


def test_the_probe_loop_probes_an_sd_across_nodes_from_its_watched_leader_worker_set() -> None:
    """An SD across nodes whose speculative Deployment never exists: the watched LeaderWorkerSet starts its probe."""
    sd = yaml.safe_load(SD.format(model=LLAMA_405B[0], engine="vllm", speculation=LLAMA_405B[1], pp=2))
    sd["spec"]["analysis"]["probe"] = {"temperatures": [0.0]}
    sd["status"] = SPECULATING.to_wire()
    watched = Watched()
    watched.seen(SD_KIND, sd)
    prober = Prober(SimpleNamespace(watched=watched))  # type: ignore[arg-type]

    async def started() -> list[tuple[str, str]]:
        try:
            return prober.start_due([ALL_NS], NOW)
        finally:
            await prober.stop()   # the probe itself (requests to the leader) is not this test's

    assert asyncio.run(started()) == []                                   # no group delivered yet
    watched.seen(DEPLOYMENT, {**lws_body(ready=1, updated=1, kind="Deployment"),
                              "metadata": {**lws_body(1, 1)["metadata"], "namespace": "team"}})
    assert asyncio.run(started()) == []                                   # a Deployment is not what it runs
    watched.seen(LWS_KIND, {**lws_body(ready=1, updated=1), "metadata": {**lws_body(1, 1)["metadata"],
                                                                          "namespace": "team"}})
    assert asyncio.run(started()) == [("team", "big")]
