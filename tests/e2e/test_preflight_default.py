"""The GPU preflight runs by default, before the engine, with the upstream engine image: an init container runs
the preflight script from the SD's ConfigMap. On the dev cluster the pod runner runs it against a simulated GPU
(gpu_standin's torch) of which the pod's SPECDEPLOY_DEV_GPU_HELD_MIB is held by another process: an empty GPU
passes and the engine starts; a partly held one is refused, the engine never starts, and the SD's status says
why in the preflight's words."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e


def _sd(name: str, env: list[dict[str, str]]) -> str:
    return yaml.safe_dump({
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment", "metadata": {"name": name},
        "spec": {"replicas": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                 "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
                 "serving": {"maxModelLen": 8192, "maxNumSeqs": 32}, "engine": {"env": env},
                 "analysis": {"baseline": {"mode": "None"}}},
    })


def _ready(obj: dict[str, Any]) -> bool:
    return (condition(obj, "Ready") or {}).get("status") == "True"


def _refused(obj: dict[str, Any]) -> bool:
    return "specdeploy preflight refused to start vllm" in (condition(obj, "Ready") or {}).get("message", "")


def test_the_preflight_runs_first_with_the_upstream_image_and_a_partly_held_gpu_is_refused_in_its_words(
    dev_cluster: DevCluster, operator: None, namespace: str
) -> None:
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_sd("free-gpu", []))
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        input=_sd("held-gpu", [{"name": "SPECDEPLOY_DEV_GPU_HELD_MIB", "value": "30720"}]))

    wait_for_object(dev_cluster, ["sd", "free-gpu"], _ready, 90, "free-gpu Ready", namespace=namespace)
    [deployment] = get_json(dev_cluster, "deployments", "-l", "specdeploy.io/name=free-gpu",
                            namespace=namespace)["items"]
    pod = deployment["spec"]["template"]["spec"]
    [preflight], [engine] = pod["initContainers"], pod["containers"]
    assert preflight["image"] == engine["image"] == "vllm/vllm-openai:v0.33.0", "the engine's own, upstream image"
    assert preflight["command"] == ["python3", "/etc/specdeploy/preflight.py", "--check", "/etc/specdeploy/plan.json"]
    config = get_json(dev_cluster, "configmap", "free-gpu-engine", namespace=namespace)["data"]
    assert "def check_plan_file" in config["preflight.py"]

    # 30 GiB of the 80 GiB GPU held: vLLM would ask for 0.9 × 79.65 GiB and exit minutes into loading.
    obj = wait_for_object(dev_cluster, ["sd", "held-gpu"], _refused, 90, "held-gpu refused by the preflight",
                          namespace=namespace)
    message = condition(obj, "Ready")["message"]   # type: ignore[index]
    assert "exited with code 3" in message and "30.00 GiB of it is held by another process" in message, message
    assert "gpuMemoryUtilization` to 0.62" in message, "the preflight's fix"
    [pod_status] = [p["status"] for p in get_json(dev_cluster, "pods", "-l", "specdeploy.io/name=held-gpu",
                                                   namespace=namespace)["items"]]
    [init] = pod_status["initContainerStatuses"]
    assert init["lastState"]["terminated"]["exitCode"] == 3
    assert not any(s.pid or s.ready for s in dev_cluster.simulators(namespace=namespace, sd="held-gpu")), \
        "the engine never started"
