"""Scaling an SD the Kubernetes way, against the real apiserver and kube-controller-manager: `kubectl scale sd`
and an HPA write `spec.replicas` through the SD's scale subresource, the operator renders it, READY follows; a
writer of the engine Deployment's own replicas keeps them until the SD asks for a new count.

The dev cluster has no metrics-server, so the HPA here scales by its bounds alone: kube-controller-manager's HPA
(pkg/controller/podautoscaler/horizontal.go, reconcileAutoscaler) raises a target below minReplicas to
minReplicas before it asks for any metric. What is exercised is the HPA finding the SD through its scale
subresource and writing it; scaling on a metric is not."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = "scaled"
CONTROL = f"{NAME}-control"
SD = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {NAME}}}
spec:
  replicas: 2
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {{method: ngram, numSpeculativeTokens: 4}}
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  analysis: {{baseline: {{mode: Control, controlReplicas: 1}}}}
"""
HPA = f"""
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {NAME}}}
spec:
  scaleTargetRef: {{apiVersion: specdeploy.io/v1alpha1, kind: SpeculativeDeployment, name: {NAME}}}
  minReplicas: 4
  maxReplicas: 6
  metrics:
  - type: Resource
    resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 80}}}}
"""


def _settled(replicas: int, ready: str) -> Any:
    """The SD reconciled at its current generation, Ready, with `replicas` speculative pods and READY `ready`."""
    def check(obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        return (status.get("observedGeneration") == obj["metadata"]["generation"]
                and (condition(obj, "Ready") or {}).get("status") == "True"
                and status.get("replicas") == replicas and status.get("ready") == ready)
    return check


def _replicas(cluster: DevCluster, namespace: str, name: str) -> int:
    return int(get_json(cluster, "deployment", name, namespace=namespace)["spec"]["replicas"])


def _new_generation(cluster: DevCluster, namespace: str, max_unavailable: int) -> None:
    """A spec change that makes the operator apply the Deployments again (a new generation, same pods)."""
    cluster.kubectl("patch", "sd", NAME, "-n", namespace, "--type", "merge",
                    "-p", json.dumps({"spec": {"rollout": {"maxUnavailable": max_unavailable}}}))


def test_kubectl_scale_and_an_hpa_scale_the_sd_and_the_operator_leaves_what_others_set(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)
    wait_for_object(dev_cluster, ["sd", NAME], _settled(2, "3/3"), 90, "2 + 1 pods ready", namespace=namespace)
    printed = dev_cluster.kubectl("get", "sd", NAME, "-n", namespace).stdout.splitlines()
    assert printed[0].split()[:3] == ["NAME", "PHASE", "READY"] and printed[1].split()[2] == "3/3"

    # kubectl scale sd: the speculative pods only; the control keeps controlReplicas.
    dev_cluster.kubectl("scale", "sd", NAME, "-n", namespace, "--replicas", "3")
    wait_for_object(dev_cluster, ["sd", NAME], _settled(3, "4/4"), 60, "3 + 1 pods ready", namespace=namespace)
    assert (_replicas(dev_cluster, namespace, NAME), _replicas(dev_cluster, namespace, CONTROL)) == (3, 1)
    scale = json.loads(dev_cluster.kubectl(
        "get", "--raw", f"/apis/specdeploy.io/v1alpha1/namespaces/{namespace}/speculativedeployments/{NAME}/scale").stdout)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (3, 3)
    assert scale["status"]["selector"] == f"specdeploy.io/name={NAME},specdeploy.io/variant=speculative"
    # Below controlReplicas is refused through the scale subresource too.
    refused = dev_cluster.kubectl("scale", "sd", NAME, "-n", namespace, "--replicas", "0", check=False)
    assert refused.returncode != 0 and "controlReplicas" in refused.stderr

    # An HPA on the SD: below minReplicas, kube-controller-manager scales it to minReplicas (no metrics needed).
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=HPA)
    wait_for_object(dev_cluster, ["sd", NAME], _settled(4, "5/5"), 90, "the HPA's 4 + 1 pods ready",
                    namespace=namespace)
    hpa = wait_for_object(dev_cluster, ["hpa", NAME], lambda h: (h.get("status") or {}).get("currentReplicas") == 4,
                          60, "the HPA sees 4 replicas", namespace=namespace)
    assert hpa["status"]["desiredReplicas"] == 4
    assert yaml.safe_load(dev_cluster.kubectl("get", "sd", NAME, "-n", namespace, "-o", "yaml").stdout)[
        "spec"]["replicas"] == 4

    # Someone scales the engine Deployment itself: the operator leaves that count — also when a new generation
    # of the SD is applied — and says who holds it.
    dev_cluster.kubectl("scale", "deployment", NAME, "-n", namespace, "--replicas", "5")
    _new_generation(dev_cluster, namespace, 2)
    obj = wait_for_object(dev_cluster, ["sd", NAME], _settled(5, "6/6"), 90, "5 + 1 pods ready, kept",
                          namespace=namespace)
    assert "replicas set by kubectl" in condition(obj, "Ready")["message"]   # type: ignore[index]
    deployment = get_json(dev_cluster, "deployment", NAME, namespace=namespace)
    assert deployment["spec"]["replicas"] == 5
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 2, "the new generation was applied"

    # A new count asked of the SD is applied: it takes the replicas back.
    dev_cluster.kubectl("delete", "hpa", NAME, "-n", namespace)
    dev_cluster.kubectl("scale", "sd", NAME, "-n", namespace, "--replicas", "2")
    obj = wait_for_object(dev_cluster, ["sd", NAME], _settled(2, "3/3"), 90, "2 + 1 pods again", namespace=namespace)
    assert "replicas set by" not in condition(obj, "Ready")["message"]   # type: ignore[index]
    assert _replicas(dev_cluster, namespace, NAME) == 2
