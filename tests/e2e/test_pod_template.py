"""spec.podTemplate on the real apiserver, scheduler and controllers: the settings platform teams set reach the
engine pods — scheduled by them onto the one node they allow — beside the operator's own, and a setting that
conflicts with the operator's, or that is not a Kubernetes type, is refused by `kubectl apply` with its field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object, wait_for_pods

pytestmark = pytest.mark.e2e

NAME = "templated"


def _sd(name: str, template: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                 "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
                 "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
                 "analysis": {"baseline": {"mode": "Control", "controlReplicas": 1}},
                 "podTemplate": template},
    })


@pytest.fixture
def pool(dev_cluster: DevCluster, namespace: str) -> Iterator[tuple[str, str]]:
    """One node labelled for this test, and the cluster-scoped PriorityClass and RuntimeClass the pods name;
    removed afterwards."""
    node = get_json(dev_cluster, "nodes")["items"][-1]["metadata"]["name"]
    label = f"e2e.specdeploy.io/pool={namespace}"
    dev_cluster.kubectl("label", "node", node, label)
    cluster_scoped = yaml.safe_dump_all([
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": namespace},
         "value": 1000},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": namespace}, "handler": "nvidia"},
    ])
    dev_cluster.kubectl("apply", "-f", "-", input=cluster_scoped)
    dev_cluster.kubectl("create", "serviceaccount", "engine", "-n", namespace)
    try:
        yield node, namespace
    finally:
        dev_cluster.kubectl("label", "node", node, "e2e.specdeploy.io/pool-", check=False)
        dev_cluster.kubectl("delete", "-f", "-", "--ignore-not-found", check=False, input=cluster_scoped)


def _ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return (status.get("observedGeneration") == obj["metadata"]["generation"]
            and (condition(obj, "Ready") or {}).get("status") == "True" and status.get("ready") == "2/2")


def test_pod_template_settings_reach_the_pods_and_a_conflict_is_refused_with_its_field(
    dev_cluster: DevCluster, operator: None, namespace: str, pool: tuple[str, str]
) -> None:
    node, scoped = pool
    template = {
        "metadata": {"labels": {"team": "search"}, "annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": {
            "nodeSelector": {"e2e.specdeploy.io/pool": scoped},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "priorityClassName": scoped,
            "imagePullSecrets": [{"name": "registry"}],
            "serviceAccountName": "engine",
            "runtimeClassName": scoped,
            "volumes": [{"name": "extra", "configMap": {"name": "extra", "optional": True}}],
        },
        "engineContainer": {
            "resources": {"requests": {"cpu": 6}, "limits": {"ephemeral-storage": "50Gi"}},
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "volumeMounts": [{"name": "extra", "mountPath": "/etc/extra", "readOnly": True}],
        },
    }
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_sd(NAME, template))
    wait_for_object(dev_cluster, ["sd", NAME], _ready, 90, "1 + 1 pods ready", namespace=namespace)

    pods = wait_for_pods(dev_cluster, namespace, f"specdeploy.io/name={NAME}", 2, 30)
    for pod in pods:
        spec, [container] = pod["spec"], pod["spec"]["containers"]
        assert spec["nodeName"] == node, "scheduled by the template's nodeSelector and affinity"
        assert pod["metadata"]["labels"]["team"] == "search"
        assert pod["metadata"]["labels"]["specdeploy.io/name"] == NAME
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert spec["priorityClassName"] == scoped and spec["priority"] == 1000, "admitted with the class's value"
        assert (spec["serviceAccountName"], spec["runtimeClassName"]) == ("engine", scoped)
        assert spec["imagePullSecrets"] == [{"name": "registry"}]
        assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", "the operator's kept"
        assert {"name": "extra", "mountPath": "/etc/extra", "readOnly": True} in container["volumeMounts"]
        assert container["env"][-1]["name"] == "POD_IP", "after the operator's"
        assert container["env"][-1]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        # the user's cpu; memory by the rule (8B in BF16: 15 + 8 GiB); ephemeral-storage as its limit (Kubernetes)
        assert container["resources"]["requests"] == {"cpu": "6", "memory": "23Gi", "ephemeral-storage": "50Gi",
                                                      "nvidia.com/gpu": "1"}
        assert container["resources"]["limits"] == {"ephemeral-storage": "50Gi", "nvidia.com/gpu": "1"}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False

    # Conflicts with what the operator renders are refused at apply, each naming its field; so is a field that is
    # not in the Kubernetes type. Nothing running changes.
    refusals = {
        "`spec.podTemplate.engineContainer.resources` must not set nvidia.com/gpu":
            {"engineContainer": {"resources": {"limits": {"nvidia.com/gpu": 2}}}},
        "`spec.podTemplate.spec.volumes` must not name a volume engine-config":
            {"spec": {"volumes": [{"name": "engine-config", "emptyDir": {}}]}},
        "`spec.podTemplate.metadata.labels` must not set":
            {"metadata": {"labels": {"specdeploy.io/variant": "x"}}},
        'unknown field "spec.podTemplate.spec.tolerations[0].tolerationSecond"':
            {"spec": {"tolerations": [{"key": "a", "tolerationSecond": 5}]}},
    }
    for words, conflicting in refusals.items():
        refused = dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                                      input=_sd(NAME, {**template, **conflicting}))
        assert refused.returncode != 0 and words in refused.stderr, refused.stderr
    assert {p["metadata"]["uid"] for p in wait_for_pods(dev_cluster, namespace, f"specdeploy.io/name={NAME}", 2,
                                                       10)} == {p["metadata"]["uid"] for p in pods}
