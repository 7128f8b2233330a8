"""desired_children: what each SpeculativeDeployment runs, from spec + status, as plain manifests."""

from pathlib import Path
from typing import Any

import pytest

from specdeploy.api.resource import SpeculativeDeployment, load_resource
from specdeploy.api.spec import EnvVar
from specdeploy.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import (
    ANNOTATION_CONFIG_HASH,
    LABEL_NAME,
    LABEL_VARIANT,
    PodMonitoring,
    Variant,
    desired_children,
    engine_command,
)
from specdeploy.reconcile.decide import already_applied
from specdeploy.reconcile.status import DeploymentState

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
ACCEPTED_EXAMPLES = [path for path in EXAMPLES if "rejected" not in path.stem]


def _load(name: str, **metadata: Any) -> SpeculativeDeployment:
    resource = load_resource((EXAMPLES[0].parent / name).read_text())
    return resource.model_copy(update={"metadata": resource.metadata.model_copy(update=metadata)})


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0]


@pytest.mark.parametrize("path", ACCEPTED_EXAMPLES, ids=lambda p: p.stem)
def test_every_accepted_example_renders_labelled_children(path: Path) -> None:
    resource = load_resource(path.read_text())
    plan = make_plan(resource.spec)
    assert plan.accepted
    children = desired_children(resource, plan)
    for manifest in children.all():
        assert manifest["metadata"]["labels"][LABEL_NAME] == resource.metadata.name
        assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "specdeploy"
    for variant, deployment in children.deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector == {LABEL_NAME: resource.metadata.name, LABEL_VARIANT: variant.value}
        template_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template_labels.items()
        container = _container(deployment)
        gpus = str(resource.spec.resources.gpu_count)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= container.keys()
    assert children.service["spec"]["selector"] == {LABEL_NAME: resource.metadata.name}


def test_deployment_args_are_the_rendered_engine_command() -> None:
    resource = _load("llama-70b-fp8-tp2.yaml")
    plan = make_plan(resource.spec)
    children = desired_children(resource, plan)
    speculative = _container(children.deployments[Variant.SPECULATIVE])
    command = engine_command(plan, Variant.SPECULATIVE, speculate=True)
    assert speculative["command"] + speculative["args"] == command.argv()
    assert "--speculative-config" in speculative["args"]
    control = _container(children.deployments[Variant.CONTROL])
    assert "--speculative-config" not in control["args"]
    assert children.deployments[Variant.CONTROL]["spec"]["replicas"] == 1
    assert children.deployments[Variant.SPECULATIVE]["spec"]["replicas"] == 2
    assert children.deployments[Variant.SPECULATIVE]["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }


def test_spec_engine_env_reaches_the_container_once_in_order() -> None:
    resource = _load("llama-8b-ngram.yaml")
    resource.spec.engine.env = [EnvVar(name="B", value="2"), EnvVar(name="A", value="1")]
    children = desired_children(resource, make_plan(resource.spec))
    for variant in (Variant.SPECULATIVE, Variant.CONTROL):
        env = [(e["name"], e["value"]) for e in _container(children.deployments[variant])["env"]]
        assert [pair for pair in env if pair[0] in ("A", "B")] == [("B", "2"), ("A", "1")]


def test_rollback_in_status_renders_the_target_without_speculation() -> None:
    resource = _load("llama-70b-fp8-tp2.yaml")
    rolled_back = resource.model_copy(update={"status": SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(active=False, rollbacks=1))})
    plan = make_plan(resource.spec)
    before = desired_children(resource, plan).deployments[Variant.SPECULATIVE]
    after = desired_children(rolled_back, plan).deployments[Variant.SPECULATIVE]
    assert "--speculative-config" not in _container(after)["args"]
    assert _container(after)["args"] == _container(desired_children(rolled_back, plan).deployments[Variant.CONTROL])[
        "args"
    ]
    assert before["spec"]["selector"] == after["spec"]["selector"]
    hashes = {d["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] for d in (before, after)}
    assert len(hashes) == 2, "the plan mounted in the pods changes with speculation"


def test_status_only_changes_leave_the_pod_template_alone() -> None:
    resource = _load("qwen3-4b-draft.yaml")
    plan = make_plan(resource.spec)
    measured = resource.model_copy(update={"status": SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(active=True, rollbacks=3), observed_generation=7)})
    assert desired_children(resource, plan) == desired_children(measured, plan)


def test_replicas_change_only_replicas() -> None:
    resource = _load("qwen3-4b-draft.yaml")
    scaled = resource.model_copy(update={"spec": resource.spec.model_copy(update={"replicas": 5})})
    before = desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]
    after = desired_children(scaled, make_plan(scaled.spec)).deployments[Variant.SPECULATIVE]
    assert after["spec"]["replicas"] == 5
    assert before["spec"]["template"] == after["spec"]["template"]


def test_owner_reference_when_the_resource_has_a_uid() -> None:
    resource = _load("llama-8b-ngram.yaml", uid="1234", namespace="serving")
    children = desired_children(resource, make_plan(resource.spec))
    for manifest in children.all():
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == "1234" and owner["controller"] is True
        assert manifest["metadata"]["namespace"] == "serving"


def test_speculation_disabled_renders_one_deployment_without_speculation() -> None:
    resource = _load("llama-8b-ngram.yaml")
    spec = resource.spec.model_copy(update={"speculation": resource.spec.speculation.model_copy(
        update={"enabled": False})})
    disabled = resource.model_copy(update={"spec": spec})
    children = desired_children(disabled, make_plan(spec))
    assert list(children.deployments) == [Variant.SPECULATIVE]
    assert "--speculative-config" not in _container(children.deployments[Variant.SPECULATIVE])["args"]


def test_pod_monitor_carries_the_labels_the_analysis_groups_by() -> None:
    resource = _load("llama-8b-ngram.yaml")
    children = desired_children(resource, make_plan(resource.spec), pod_monitoring=PodMonitoring(render=True))
    assert children.pod_monitor is not None
    assert children.pod_monitor["spec"]["podTargetLabels"] == [LABEL_NAME, LABEL_VARIANT]


def test_pod_monitor_takes_the_configured_labels_and_keeps_the_operators_own() -> None:
    resource = _load("llama-8b-ngram.yaml")
    monitoring = PodMonitoring(render=True, labels={"release": "kube-prometheus-stack", LABEL_NAME: "other"})
    monitor = desired_children(resource, make_plan(resource.spec), pod_monitoring=monitoring).pod_monitor
    assert monitor is not None
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"][LABEL_NAME] == resource.metadata.name   # the prune finds it by this
    assert desired_children(resource, make_plan(resource.spec), pod_monitoring=PodMonitoring(
        not_rendered="switched off")).pod_monitor is None


def test_trtllm_yaml_is_mounted_per_variant() -> None:
    resource = _load("trtllm-llama-8b-eagle3.yaml")
    children = desired_children(resource, make_plan(resource.spec))
    data = children.config_map["data"]
    assert "speculative_config" in data["speculative.trtllm.yaml"]
    assert "speculative_config" not in data["control.trtllm.yaml"]
    for variant, deployment in children.deployments.items():
        volume = deployment["spec"]["template"]["spec"]["volumes"][0]
        assert {"key": f"{variant.value}.trtllm.yaml", "path": "trtllm.yaml"} in volume["configMap"]["items"]


def test_specdeploy_engine_images_get_the_argv_as_args_for_their_launcher() -> None:
    resource = _load("llama-8b-ngram.yaml")
    engine = resource.spec.engine.model_copy(update={"image": "ghcr.io/specdeploy/specdeploy-engine-vllm:0.1.0"})
    resource = resource.model_copy(update={"spec": resource.spec.model_copy(update={"engine": engine})})
    plan = make_plan(resource.spec)
    container = _container(desired_children(resource, plan).deployments[Variant.SPECULATIVE])
    assert "command" not in container
    assert container["args"] == engine_command(plan, Variant.SPECULATIVE, speculate=True).argv()


def test_the_fingerprint_changes_with_the_children_and_the_generation_only() -> None:
    resource = _load("llama-8b-ngram.yaml")
    plan = make_plan(resource.spec)
    children = desired_children(resource, plan)
    rolled_back = desired_children(resource.model_copy(update={"status": SpeculativeDeploymentStatus(
        speculation=SpeculationStatus(active=False, rollbacks=1))}), plan)
    assert children.fingerprint(1) == desired_children(resource, plan).fingerprint(1)   # stable
    assert len({children.fingerprint(1), children.fingerprint(2), rolled_back.fingerprint(1)}) == 3


def test_already_applied_means_every_wanted_deployment_from_this_apply_and_no_other() -> None:
    resource = _load("llama-8b-ngram.yaml")
    children = desired_children(resource, make_plan(resource.spec))

    def state(variant: Variant, fingerprint: str | None) -> DeploymentState:
        return DeploymentState(name=children.deployments[variant]["metadata"]["name"], variant=variant,
                               replicas=1, updated_replicas=1, available_replicas=1, generation=1,
                               observed_generation=1, sd_generation=1, children_fingerprint=fingerprint)

    current = children.fingerprint(1)
    both = [state(Variant.SPECULATIVE, current), state(Variant.CONTROL, current)]
    assert already_applied(children, 1, both)
    assert not already_applied(children, 2, both)                                  # a new generation
    assert not already_applied(children, 1, both[:1])                              # one is missing
    assert not already_applied(children, 1, [both[0], state(Variant.CONTROL, None)])  # before fingerprints
    assert not already_applied(children, 1, [*both, DeploymentState(
        name="llama-8b-ngram-old", variant=Variant.CONTROL, replicas=1, updated_replicas=1, available_replicas=1,
        generation=1, observed_generation=1, sd_generation=1, children_fingerprint=current)])   # one too many


def test_by_default_a_rollout_needs_no_spare_gpu() -> None:
    """maxSurge 0: a full cluster can roll (a rollback included); one pod at a time is out of service."""
    resource = _load("llama-8b-ngram.yaml")
    for deployment in desired_children(resource, make_plan(resource.spec)).deployments.values():
        assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                                  "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_spec_rollout_reaches_both_deployments_and_restarts_nothing() -> None:
    resource = _load("llama-8b-ngram.yaml")
    surging = load_resource(
        (EXAMPLES[0].parent / "llama-8b-ngram.yaml").read_text() + "  rollout: {maxSurge: 1, maxUnavailable: 0}\n")
    before = desired_children(resource, make_plan(resource.spec)).deployments
    after = desired_children(surging, make_plan(surging.spec)).deployments
    assert set(after) == {Variant.SPECULATIVE, Variant.CONTROL}
    for variant, deployment in after.items():
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        assert deployment["spec"]["template"] == before[variant]["spec"]["template"]


def test_a_rollout_that_could_neither_add_nor_stop_a_pod_is_refused() -> None:
    text = (EXAMPLES[0].parent / "llama-8b-ngram.yaml").read_text() + "  rollout: {maxSurge: 0, maxUnavailable: 0}\n"
    with pytest.raises(ValueError, match="must not both be 0"):
        load_resource(text)
