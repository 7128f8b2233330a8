"""spec.podTemplate: typed by the Kubernetes types, merged under what the operator renders, conflicts refused
with the field named; the default CPU and memory requests."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.kube import kube_schema
from specdeploy.api.resource import InvalidResource, SpeculativeDeployment, load_resource
from specdeploy.api.spec import OPERATOR_MOUNT_PATHS, OPERATOR_POD_LABELS, OPERATOR_VOLUMES
from specdeploy.engines.base import default_host_requests
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, desired_children

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-ngram.yaml"

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "search"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "nodeSelector": {"pool": "gpu-a"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "priorityClassName": "inference",
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccountName": "engine",
        "runtimeClassName": "nvidia",
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
    },
    "engineContainer": {
        "resources": {"requests": {"cpu": 6}, "limits": {"memory": "64Gi", "ephemeral-storage": "50Gi"}},
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HF_HOME", "value": "/models/hf"}],
        "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
    },
}


def _resource(template: dict[str, Any], **spec: Any) -> SpeculativeDeployment:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"].update(spec, podTemplate=template)
    return load_resource(yaml.safe_dump(document))


def _refusal(template: dict[str, Any], **spec: Any) -> str:
    with pytest.raises(InvalidResource) as refused:
        _resource(template, **spec)
    return str(refused.value)


def test_every_setting_reaches_both_variants_beside_the_operators_own() -> None:
    resource = _resource(TEMPLATE)
    plan = make_plan(resource.spec)
    children = desired_children(resource, plan)
    assert set(children.deployments) == {Variant.SPECULATIVE, Variant.CONTROL}
    for deployment in children.deployments.values():
        template = deployment["spec"]["template"]
        pod, [container] = template["spec"], template["spec"]["containers"]
        assert template["metadata"]["labels"]["team"] == "search"
        assert template["metadata"]["labels"]["specdeploy.io/name"] == resource.metadata.name
        assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert "specdeploy.io/config-hash" in template["metadata"]["annotations"]
        assert pod["nodeSelector"] == {"pool": "gpu-a", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert [t["key"] for t in pod["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
        assert pod["affinity"] == TEMPLATE["spec"]["affinity"]
        assert (pod["priorityClassName"], pod["serviceAccountName"], pod["runtimeClassName"]) == (
            "inference", "engine", "nvidia")
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["automountServiceAccountToken"] is False, "the engine's ServiceAccount token stays unmounted"
        assert pod["volumes"][-1] == {"name": "certs", "secret": {"secretName": "ca"}}
        assert container["volumeMounts"][-1] == {"name": "certs", "mountPath": "/etc/certs", "readOnly": True}
        # The user's cpu request; memory has only a limit (Kubernetes requests as much); the GPUs the operator's.
        assert container["resources"] == {
            "requests": {"cpu": 6, "nvidia.com/gpu": "1"},
            "limits": {"memory": "64Gi", "ephemeral-storage": "50Gi", "nvidia.com/gpu": "1"},
        }
        names = [variable["name"] for variable in container["env"]]
        assert len(names) == len(set(names)), "one entry per name"
        assert container["env"][-2:] == TEMPLATE["engineContainer"]["env"], "the template's HF_HOME replaces the default"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= container.keys()


def test_without_a_template_the_pods_request_cpu_and_memory_by_the_rule() -> None:
    resource = _resource({}, resources={"gpu": {"product": "H100-80GB", "count": 2}, "tensorParallelSize": 2})
    plan = make_plan(resource.spec)
    children = desired_children(resource, plan)
    speculative = children.deployments[Variant.SPECULATIVE]["spec"]["template"]["spec"]
    requests = speculative["containers"][0]["resources"]["requests"]
    per_gpu = plan.memory.per_gpu
    weights = (per_gpu.target_weights_gib + per_gpu.draft_weights_gib) * 2
    assert 14 < weights < 16, "Llama-3.1-8B in BF16: ~15 GiB"
    assert requests == {"cpu": "4", "memory": "23Gi", "nvidia.com/gpu": "2"}
    assert "cpu" not in speculative["containers"][0]["resources"]["limits"], "no default limit"
    assert "affinity" not in speculative and "priorityClassName" not in speculative


def test_default_requests_grow_with_the_gpus_and_the_weights() -> None:
    assert default_host_requests(1, 15.0) == {"cpu": "3", "memory": "23Gi"}
    assert default_host_requests(8, 131.4) == {"cpu": "10", "memory": "140Gi"}


@pytest.mark.parametrize(("template", "field"), [
    ({"metadata": {"labels": {OPERATOR_POD_LABELS[-1]: "x"}}}, "spec.podTemplate.metadata.labels"),
    ({"metadata": {"annotations": {"specdeploy.io/config-hash": "x"}}}, "spec.podTemplate.metadata.annotations"),
    ({"spec": {"nodeSelector": {"nvidia.com/gpu.product": "x"}}}, "spec.podTemplate.spec.nodeSelector"),
    ({"spec": {"volumes": [{"name": OPERATOR_VOLUMES[0], "emptyDir": {}}]}}, "spec.podTemplate.spec.volumes"),
    ({"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}},
     "spec.podTemplate.spec.volumes"),
    ({"engineContainer": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
     "spec.podTemplate.engineContainer.resources"),
    ({"engineContainer": {"volumeMounts": [{"name": "a", "mountPath": OPERATOR_MOUNT_PATHS[0]}]}},
     "spec.podTemplate.engineContainer.volumeMounts"),
    ({"engineContainer": {"env": [{"name": "A"}, {"name": "A"}]}}, "spec.podTemplate.engineContainer.env"),
])
def test_a_conflict_with_the_operator_is_refused_with_its_field(template: dict[str, Any], field: str) -> None:
    assert f"`{field}` must not" in _refusal(template)


def test_env_set_twice_across_engine_env_and_the_template_is_refused() -> None:
    template = {"engineContainer": {"env": [{"name": "A", "value": "1"}]}}
    message = _refusal(template, engine={"env": [{"name": "A", "value": "2"}]})
    assert "`spec.podTemplate.engineContainer.env` must not set a variable that `spec.engine.env` sets" in message


def test_hf_token_in_the_template_is_refused_beside_a_token_secret() -> None:
    template = {"engineContainer": {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "mine", "key": "token"}}}]}}
    document = yaml.safe_load(EXAMPLE.read_text())
    assert "must not set HF_TOKEN" in _refusal(template, model={**document["spec"]["model"], "tokenSecretRef": "hf"})
    _resource(template)   # without a tokenSecretRef it is the user's


@pytest.mark.parametrize(("template", "problem"), [
    ({"spec": {"tolerations": [{"key": "a", "tolerationSecond": 5}]}}, "`Toleration.tolerationSecond`: unknown field"),
    ({"spec": {"tolerations": [{"tolerationSeconds": "5"}]}}, "`Toleration.tolerationSeconds`: must be a integer"),
    ({"spec": {"volumes": [{"emptyDir": {}}]}}, "`Volume.name`: required field is missing"),
    ({"engineContainer": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}},
     "`EnvVar.valueFrom.secretKeyRef.key`: required field is missing"),
    ({"spec": {"volumes": [{"name": "x" * 64, "emptyDir": {}}]}}, "`Volume.name`: at most 63 characters"),
])
def test_the_kubernetes_types_are_checked_as_the_crd_checks_them(template: dict[str, Any], problem: str) -> None:
    assert problem in _refusal(template)


def test_the_kubernetes_schemas_come_from_the_api_types() -> None:
    volume = kube_schema("Volume")
    assert volume["required"] == ["name"]
    assert {"persistentVolumeClaim", "hostPath", "emptyDir", "csi", "secret"} <= volume["properties"].keys()
    assert volume["properties"]["emptyDir"]["properties"]["sizeLimit"] == {"x-kubernetes-int-or-string": True}
    requests = kube_schema("ResourceRequirements")["properties"]["requests"]
    assert requests["additionalProperties"] == {"x-kubernetes-int-or-string": True}


def test_the_operators_reserved_names_are_the_ones_it_renders() -> None:
    """The CRD refuses these names; a volume or mount the operator adds without listing it would be a clash the
    apiserver finds only when the Deployment is applied."""
    resource = _resource({})
    deployment = desired_children(resource, make_plan(resource.spec)).deployments[Variant.SPECULATIVE]
    pod = deployment["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} <= set(OPERATOR_VOLUMES)
    assert {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]} <= set(OPERATOR_MOUNT_PATHS)
    assert set(deployment["spec"]["template"]["metadata"]["labels"]) <= set(OPERATOR_POD_LABELS)


def test_the_kube_types_the_resource_reads_are_lightkube_models_own() -> None:
    """api/kube_types.json is data so that the pure core loads no client; it must stay what lightkube-models says
    (after an upgrade of lightkube-models: `python -m specdeploy.clients.kube_types`)."""
    from specdeploy.clients import kube_types

    assert json.loads(kube_types.SCHEMAS.read_text()) == kube_types.derive()
