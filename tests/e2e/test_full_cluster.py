"""A rollback on a GPU cluster with no free GPU: 3 speculative + 1 control pods of 8 GPUs each take all
4 nodes of the dev cluster. With a surge the rollback cannot progress, and status says so; with the
default rollout (maxSurge 0, maxUnavailable 1) it completes. At every step, status.speculation.active
(the SPECULATING column) is false only when no scheduled speculative pod runs with a speculative config,
and a rollout that waits on a pod no node can take says so in Ready (RolloutStuck)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import condition, get_json

pytestmark = pytest.mark.e2e

NAME = "llama-full"
FULL_CLUSTER_SD = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {NAME}}}
spec:
  replicas: 3
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {{method: ngram, numSpeculativeTokens: 4}}
  resources: {{gpu: {{product: H100-80GB, count: 8}}}}
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  rollout: {{maxSurge: 1, maxUnavailable: 0}}
  analysis:
    interval: 3s
    window: 20s
    minRequests: 10
    failureLimit: 2
    baseline: {{mode: Control, controlReplicas: 1}}
    checks: {{minAcceptanceRate: 0.5}}
"""


def _speculating_pods(cluster: DevCluster, namespace: str) -> list[str]:
    """Scheduled, unfinished speculative pods whose engine runs with --speculative-config: read from the
    pods themselves, not from anything the operator wrote."""
    listing = get_json(cluster, "pods", "-l", f"specdeploy.io/name={NAME},specdeploy.io/variant=speculative",
                       namespace=namespace)
    return sorted(
        pod["metadata"]["name"] for pod in listing["items"]
        if pod["spec"].get("nodeName") and pod["status"].get("phase") not in ("Succeeded", "Failed")
        and "--speculative-config" in pod["spec"]["containers"][0].get("args", [])
    )


class Watch:
    """Status and pods read together, over and over: every read of `active: false` is checked against the
    pods read after it (pods read later can only have fewer speculating pods once the rollback is decided)."""

    def __init__(self, cluster: DevCluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.phases: list[str] = []

    def until(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            obj = get_json(self.cluster, "sd", NAME, namespace=self.namespace)
            status = obj.get("status") or {}
            speculation = status.get("speculation") or {}
            if status.get("phase") and (not self.phases or self.phases[-1] != status["phase"]):
                self.phases.append(status["phase"])
            if speculation.get("active") is False:
                still = _speculating_pods(self.cluster, self.namespace)
                assert not still, f"SPECULATING false while {still} run with a speculative config: {speculation}"
            if predicate(obj):
                return obj
            assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s; phases {self.phases}, {status}"
            time.sleep(0.5)


def test_a_rollback_on_a_full_cluster_is_truthful_while_stuck_and_completes_with_the_default_rollout(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]
) -> None:
    analysing_operator()
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=FULL_CLUSTER_SD)
    serving = f"{namespace}/{NAME}"
    wait_for(lambda: len(endpoints(dev_cluster, serving, "speculative")) == 3
             and len(endpoints(dev_cluster, serving, "control")) == 1, 180, "all 32 GPUs' simulators")
    assert all(result.ok for result in sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.8}))
    watch = Watch(dev_cluster, namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=300).start()
    try:
        watch.until(lambda o: o["status"]["speculation"].get("active") is True
                    and o["status"]["speculation"].get("speculatingPods") == 3, 120, "3 pods speculating")
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.05})
        stuck = watch.until(lambda o: o["status"]["speculation"].get("decided") is False, 120, "the rollback decided")

        # maxSurge 1 on a full cluster: the first new pod has no GPU, no old pod is stopped.
        def pending_and_said(obj: dict[str, Any]) -> bool:
            listing = get_json(dev_cluster, "pods", "-l", f"specdeploy.io/name={NAME}", namespace=namespace)
            pending = [p for p in listing["items"] if not p["spec"].get("nodeName")]
            return bool(pending) and obj["status"]["phase"] == "RollingBack"

        watch.until(pending_and_said, 60, "a Pending pod and phase RollingBack")
        # Within one resync (3 s here, 30 s by default) Ready says the rollout is stuck, in the scheduler's words.
        stuck = watch.until(lambda o: (condition(o, "Ready") or {}).get("reason") == "RolloutStuck", 30,
                            "Ready=False RolloutStuck")
        assert "Insufficient nvidia.com/gpu" in condition(stuck, "Ready")["message"]  # type: ignore[index]
        assert stuck["status"]["phase"] == "RollingBack"
        rolled = condition(stuck, "RolledBack")
        assert rolled is not None and rolled["status"] == "False" and rolled["reason"] == "RollbackInProgress"
        assert "3 speculative pods still run with speculation" in rolled["message"]
        assert stuck["status"]["speculation"]["active"] is True
        deadline = time.monotonic() + 10          # it stays stuck, and status stays truthful
        watch.until(lambda o: time.monotonic() > deadline, 20, "ten seconds stuck")
        assert len(_speculating_pods(dev_cluster, namespace)) == 3

        # The default rollout needs no spare GPU: it stops one pod, then starts its replacement.
        dev_cluster.kubectl("patch", "sd", NAME, "-n", namespace, "--type", "json",
                            "-p", '[{"op": "remove", "path": "/spec/rollout"}]')
        done = watch.until(lambda o: o["status"].get("phase") == "RolledBack", 180, "the rollback completed")
    finally:
        traffic.stop()
    assert done["status"]["speculation"]["active"] is False and done["status"]["speculation"]["speculatingPods"] == 0
    assert _speculating_pods(dev_cluster, namespace) == []
    assert condition(done, "RolledBack")["status"] == "True"  # type: ignore[index]
    assert "RollingBack" in watch.phases and watch.phases[-1] == "RolledBack", watch.phases
