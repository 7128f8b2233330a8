"""Gated weights: SDs that name a token Secret — a vLLM target's, an SGLang draft's, a TensorRT-LLM pair's — wait,
with a condition naming the Secret, until it exists; then every engine container takes HF_TOKEN from it by
`secretKeyRef`, and the token is found nowhere a reader of the namespace (but for the Secret) or the operator's
log could see it. Deleting the Secret later stops nothing that runs."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

SECRET = "hf-token"
BASE = {"replicas": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "serving": {"maxModelLen": 8192, "maxNumSeqs": 32}, "analysis": {"baseline": {"mode": "Control"}}}
EAGLE3 = {"method": "eagle3", "numSpeculativeTokens": 3, "draft": {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}
SDS: dict[str, dict[str, Any]] = {
    "gated-vllm": {**BASE, "model": {**BASE["model"], "tokenSecretRef": SECRET},
                   "speculation": {"method": "ngram", "numSpeculativeTokens": 4}},
    "gated-sglang": {**BASE, "engine": {"kind": "sglang"},
                     "speculation": {**EAGLE3, "draft": {**EAGLE3["draft"], "tokenSecretRef": SECRET}}},
    "gated-trtllm": {**BASE, "engine": {"kind": "trtllm"}, "model": {**BASE["model"], "tokenSecretRef": SECRET},
                     "speculation": {**EAGLE3, "draft": {**EAGLE3["draft"], "tokenSecretRef": SECRET}}},
}


def _manifest(name: str, spec: dict[str, Any]) -> str:
    return yaml.safe_dump({"apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
                           "metadata": {"name": name}, "spec": spec})


def _token_unreadable(obj: dict[str, Any]) -> bool:
    fits = condition(obj, "MemoryFits") or {}
    return fits.get("reason") == "ModelTokenUnreadable" and obj["status"].get("observedGeneration") == 1


def _ready(obj: dict[str, Any]) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


def _pods(cluster: DevCluster, namespace: str) -> set[str]:
    listing = get_json(cluster, "pods", "-l", "app.kubernetes.io/managed-by=specdeploy", namespace=namespace)
    return {p["metadata"]["uid"] for p in listing["items"] if not p["metadata"].get("deletionTimestamp")}


def test_the_token_reaches_every_engine_by_reference_and_its_value_nowhere_else(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any]
) -> None:
    token = f"hf_{secrets.token_hex(16)}"
    operator = operator_processes("operator")
    for name, spec in SDS.items():
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_manifest(name, spec))

    # No Secret yet: a condition naming it, and nothing created.
    for name in SDS:
        obj = wait_for_object(dev_cluster, ["sd", name], _token_unreadable, 60, f"{name}: ModelTokenUnreadable",
                              namespace=namespace)
        message = condition(obj, "MemoryFits")["message"]   # type: ignore[index]
        assert f"Secret {namespace}/{SECRET}" in message and "--from-literal=token=" in message
        assert (condition(obj, "Ready") or {}).get("reason") == "Rejected"
    assert get_json(dev_cluster, "deployments", namespace=namespace)["items"] == []

    # The Secret appears: the resync plans, and every engine container refers to it.
    dev_cluster.kubectl("create", "secret", "generic", SECRET, "-n", namespace, f"--from-literal=token={token}")
    for name in SDS:
        wait_for_object(dev_cluster, ["sd", name], _ready, 90, f"{name}: Ready", namespace=namespace)
    deployments = get_json(dev_cluster, "deployments", namespace=namespace)["items"]
    assert len(deployments) == 2 * len(SDS)
    for deployment in deployments:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert [v for v in container["env"] if v["name"] == "HF_TOKEN"] == [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}}}
        ], deployment["metadata"]["name"]

    # Two different Secrets are refused at apply, with what to do.
    refused = dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=_manifest("two-tokens", {
        **SDS["gated-trtllm"], "speculation": {**EAGLE3, "draft": {**EAGLE3["draft"], "tokenSecretRef": "other"}}}))
    assert refused.returncode != 0 and "must be unset or name the same Secret" in refused.stderr

    # The Secret goes: the pods that run keep running, and status says why nothing can be re-planned.
    running = _pods(dev_cluster, namespace)
    assert len(running) == 2 * len(SDS)
    dev_cluster.kubectl("delete", "secret", SECRET, "-n", namespace)
    obj = wait_for_object(dev_cluster, ["sd", "gated-vllm"], _token_unreadable, 60, "ModelTokenUnreadable again",
                          namespace=namespace)
    assert "keep serving" in (condition(obj, "Ready") or {}).get("message", "")
    assert _pods(dev_cluster, namespace) == running

    # The value, or its base64, is nowhere but in the (deleted) Secret.
    readable = {
        "the SDs": dev_cluster.kubectl("get", "sd", "-n", namespace, "-o", "yaml").stdout,
        "events": json.dumps(get_json(dev_cluster, "events", namespace=namespace)),
        "children": json.dumps(get_json(dev_cluster, "deployments,replicasets,pods,configmaps,services",
                                        namespace=namespace)),
        "operator log": operator.output(),
    }
    for place, text in readable.items():
        for form in (token, base64.b64encode(token.encode()).decode()):
            assert form not in text, f"the token is in {place}"
