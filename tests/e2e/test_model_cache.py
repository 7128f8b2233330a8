"""The weight cache through a rollback: with `spec.storage.modelCache` a hostPath or a PersistentVolumeClaim, the
first pods download the weights into it (the pod runner models the download at a stated Hub bandwidth), and the
pod a rollback starts mounts the same cache and finds them there. The start times are measured by
benchmarks/model_cache.py, not here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_resources import serve_scenario

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = "cached"
CLAIM = "weights"
DOWNLOADING, CACHED = "specdeploy dev-cluster: downloading ", "is in the model cache"


def _sd(cache: dict[str, Any], node: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment", "metadata": {"name": NAME},
        "spec": {
            "replicas": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            # 15 GiB of weights at 4 GiB/s: ~4 s per download
            "engine": {"env": [{"name": "SPECDEPLOY_DEV_HUB_MIBPS", "value": "4096"}]},
            "analysis": {"interval": "3s", "window": "20s", "baseline": {"mode": "Control", "controlReplicas": 1}},
            "storage": {"modelCache": cache},
            # one node: a hostPath cache is the node's
            "podTemplate": {"spec": {"nodeSelector": {"kubernetes.io/hostname": node}}},
        },
    })


def _log(cluster: DevCluster, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    path = Path(cluster.state_dir) / "logs" / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "engine.log"
    return path.read_text() if path.exists() else ""


def _speculative_pods(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    listing = get_json(cluster, "pods", "-l", f"specdeploy.io/name={NAME},specdeploy.io/variant=speculative",
                       namespace=namespace)
    return [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def claim(dev_cluster: DevCluster, namespace: str, tmp_path: Path) -> Iterator[None]:
    """A PersistentVolume bound to the claim `weights` (ReadWriteMany), removed afterwards."""
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": namespace},
              "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                       "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(tmp_path)},
                       "claimRef": {"namespace": namespace, "name": CLAIM}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": namespace,
                      "resources": {"requests": {"storage": "100Gi"}}}}
    dev_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(volume))
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(claim))
    try:
        yield
    finally:
        dev_cluster.kubectl("delete", "pv", namespace, "--wait=false", "--ignore-not-found", check=False)


@pytest.mark.parametrize("cache", [{"hostPath": {"path": "/var/lib/specdeploy-e2e"}},
                                   {"persistentVolumeClaim": {"claimName": CLAIM}}],
                         ids=["hostPath", "persistentVolumeClaim"])
def test_a_rollbacks_new_pod_finds_the_weights_in_the_same_cache(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any], claim: None,
    cache: dict[str, Any],
) -> None:
    node = get_json(dev_cluster, "nodes")["items"][0]["metadata"]["name"]
    if "hostPath" in cache:   # a fresh directory for each session: the node's cache starts empty
        cache = {"hostPath": {"path": f"/var/lib/specdeploy-e2e/{namespace}"}}
    analysing_operator()
    serving = serve_scenario(dev_cluster, namespace, manifest=_sd(cache, node), name=NAME)
    [first] = _speculative_pods(dev_cluster, namespace)
    control = get_json(dev_cluster, "pods", "-l", f"specdeploy.io/name={NAME},specdeploy.io/variant=control",
                       namespace=namespace)["items"]
    logs = [_log(dev_cluster, pod) for pod in [first, *control]]
    # The two first pods share the empty cache: one downloads, the other waits for it and finds the weights.
    assert sum(DOWNLOADING in log for log in logs) == 1 and sum(CACHED in log for log in logs) == 1, logs

    wait_for_object(dev_cluster, ["sd", NAME], lambda o: (o.get("status", {}).get("analysis") or {}).get(
        "lastSampleAt"), 60, "a first sample", namespace=namespace)
    sim_admin(dev_cluster, serving, "speculative", {"oom": True})
    wait_for_object(dev_cluster, ["sd", NAME],
                    lambda o: bool((o.get("status", {}).get("speculation") or {}).get("lastRollback")), 60,
                    "the OOM rollback", namespace=namespace)

    def rolled_engine_ready() -> dict[str, Any] | None:
        """The rollback's pod once its engine answers (the pod runner's registry: kwok marks a pod Ready itself)."""
        pods = _speculative_pods(dev_cluster, namespace)
        if len(pods) != 1 or pods[0]["metadata"]["uid"] == first["metadata"]["uid"]:
            return None
        uid = pods[0]["metadata"]["uid"]
        ready = any(s.uid == uid and s.ready for s in dev_cluster.simulators(namespace=namespace, sd=NAME))
        return pods[0] if ready else None

    rolled = wait_for(rolled_engine_ready, 60, "the rollback's engine ready")
    assert "--speculative-config" not in rolled["spec"]["containers"][0]["args"], "the rollback's pod"
    [volume] = [v for v in rolled["spec"]["volumes"] if v["name"] == "model-cache"]
    [source] = cache
    assert volume[source] == {**cache[source], **({"type": "DirectoryOrCreate"} if source == "hostPath" else {})}
    log = _log(dev_cluster, rolled)
    assert CACHED in log and DOWNLOADING not in log, log
