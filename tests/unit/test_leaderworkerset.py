"""A layout across nodes renders LeaderWorkerSets instead of Deployments (issue 33 point 2): groups of one pod per
node, the engine's multi-node flags per role, probes and the Service on the leaders, rollback without speculation;
and the live reconciler refuses such an SD with the reason until it can watch a group."""

from __future__ import annotations

from typing import Any

import pytest

from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specdeploy.controller.reconciler import plan_resource
from specdeploy.engines import EngineRenderError, NodeRank, node_args
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import LABEL_NAME, LABEL_VARIANT, PodMonitoring, Variant, desired_children
from specdeploy.reconcile.leaderworkerset import LABEL_ROLE, LWS_API_VERSION, LWS_KIND

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


def test_the_live_reconciler_refuses_a_layout_across_nodes_with_the_reason() -> None:
    planned = plan_resource(load())
    assert planned.plan is None and planned.error is not None
    assert planned.error.code == "EngineCannotRun"
    assert "spans 2 nodes" in planned.error.message and "specdeploy render" in planned.error.message
    assert plan_resource(load(pp=1, models=("meta-llama/Llama-3.1-70B-Instruct", "{method: ngram}"))).plan is not None
