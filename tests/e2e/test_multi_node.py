"""A model bigger than a node, end to end: Llama-3.1-405B (bf16) with an 8B draft on H100-80GB nodes of 8 GPUs
runs as two LeaderWorkerSets (speculative and control), each group a leader and a worker on two kwok nodes, under
the real LeaderWorkerSet controller (sigs.k8s.io/lws, its webhooks on loopback); it is Ready as its groups' own
events arrive (not at a resync) and probed on its speculative leader; it is sampled from its leaders, rolls back on
an acceptance collapse with one Event and one alert, and a worker killed later is named in status."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from e2e_resources import SCENARIO_ANALYSIS

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.audit import audit_entries, statuses_written
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = "llama-405b"
#: The Done-when's plan (docs/operator.md "Multi-node layouts"): TP 8 within a node × 2 pipeline stages across
#: nodes; the analysis of the other rollback scenarios and a probe of two short requests.
SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: llama-405b}
spec:
  replicas: 1
  model: {name: meta-llama/Llama-3.1-405B-Instruct}
  speculation: {method: draft_model, numSpeculativeTokens: 4, draft: {name: meta-llama/Llama-3.1-8B-Instruct}}
  resources: {gpu: {product: H100-80GB}, tensorParallelSize: 8, pipelineParallelSize: 2}
  serving: {maxModelLen: 8192, maxNumSeqs: 32}""" + SCENARIO_ANALYSIS + """
    probe: {temperatures: [0], requestsPerCell: 2, maxTokens: 16, requestsPerSecond: 10}
"""


def _sd(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "sd", NAME, namespace=namespace)


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == "Ready"), {})


def _rolled_back(obj: dict[str, Any]) -> bool:
    speculation = obj.get("status", {}).get("speculation") or {}
    return speculation.get("active") is False and bool(speculation.get("lastRollback"))


def _groups_ready(cluster: DevCluster, namespace: str) -> bool:
    """Both variants' leaders serve and Ready holds (each group's two pods Running on their nodes)."""
    sd = f"{namespace}/{NAME}"
    return bool(endpoints(cluster, sd, "speculative") and endpoints(cluster, sd, "control")
                and _ready(_sd(cluster, namespace)).get("status") == "True")


def _status_patches(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    return [entry for entry in audit_entries(cluster.audit_log, 0)
            if entry["verb"] == "patch" and (entry.get("objectRef") or {}).get("namespace") == namespace
            and entry["objectRef"].get("subresource") == "status"
            and entry["objectRef"]["resource"] == "speculativedeployments"]


def test_a_model_bigger_than_a_node_runs_as_groups_is_judged_and_rolled_back_as_one(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any],
    analysing_operator: Callable[..., Any]
) -> None:
    # First an operator with no analysis and no resync within the test: only the groups' own watch events (and
    # the probe they start) can make the SD Ready.
    watching = operator_processes("events-only", "--resync-seconds", "3600")
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)
    sd = f"{namespace}/{NAME}"
    wait_for(lambda: _groups_ready(dev_cluster, namespace), 120, "both groups' leaders serving and Ready",
             describe=lambda: dev_cluster.kubectl("get", "lws,pods", "-n", namespace, "-o", "wide").stdout)
    # The probe starts from the speculative LeaderWorkerSet and asks its leader.
    probed = wait_for_object(dev_cluster, ["sd", NAME], lambda o: (condition(o, "Probed") or {}).get("status") == "True",
                             60, "Probed=True on the speculative leader", namespace=namespace)
    leader = get_json(dev_cluster, "pod", probed["status"]["probe"]["pod"], namespace=namespace)
    assert leader["metadata"]["labels"]["specdeploy.io/role"] == "leader"
    assert leader["metadata"]["labels"]["specdeploy.io/variant"] == "speculative"
    assert probed["status"]["probe"]["url"] == f"http://{leader['status']['podIP']}:8000"
    watching.stop()
    analysing_operator()

    # Two LeaderWorkerSets, no Deployment; four pods on four nodes, a leader and a worker per group.
    groups = get_json(dev_cluster, "leaderworkersets", namespace=namespace)["items"]
    assert sorted(g["metadata"]["name"] for g in groups) == [NAME, f"{NAME}-control"]
    assert get_json(dev_cluster, "deployments", namespace=namespace)["items"] == []
    pods = get_json(dev_cluster, "pods", "-l", f"specdeploy.io/name={NAME}", namespace=namespace)["items"]
    roles = sorted((p["metadata"]["labels"]["specdeploy.io/variant"], p["metadata"]["labels"]["specdeploy.io/role"])
                   for p in pods)
    assert roles == [("control", "leader"), ("control", "worker"), ("speculative", "leader"),
                     ("speculative", "worker")]
    assert len({p["spec"]["nodeName"] for p in pods}) == 4
    assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8" for p in pods)
    # The Service sends traffic to the leaders only; a worker has no scrape target (it serves nothing).
    service = get_json(dev_cluster, "service", NAME, namespace=namespace)
    assert service["spec"]["selector"]["specdeploy.io/role"] == "leader"
    sims = dev_cluster.simulators(namespace=namespace, sd=NAME)
    assert sorted((s.role, bool(s.address)) for s in sims) == [("leader", True)] * 2 + [("worker", False)] * 2

    assert all(result.ok for result in sim_admin(dev_cluster, sd, "speculative", {"acceptance": 0.8}))
    traffic = Traffic(dev_cluster, sd, qps=4, duration=240).start()
    try:
        sampled = wait_for_object(dev_cluster, ["sd", NAME],
                                  lambda o: (o["status"].get("analysis") or {}).get("verdict") == "Healthy", 120,
                                  "a healthy sample from the leaders", namespace=namespace)
        assert sampled["status"]["speculation"]["active"] is True
        sim_admin(dev_cluster, sd, "speculative", {"acceptance": 0.3})
        obj = wait_for_object(dev_cluster, ["sd", NAME], _rolled_back, 90, "the rollback", namespace=namespace)
    finally:
        traffic.stop()
    assert obj["status"]["speculation"]["lastRollback"]["reason"] == "AcceptanceBelowMinimum"
    # The group rolls as one: the speculative LeaderWorkerSet's leader and worker lose the speculative config.
    wait_for(lambda: all("--speculative-config" not in get_json(dev_cluster, "lws", NAME, namespace=namespace)[
        "spec"]["leaderWorkerTemplate"][template]["spec"]["containers"][0]["args"]
        for template in ("leaderTemplate", "workerTemplate")), 30, "both templates without a speculative config")
    events = [e for e in get_json(dev_cluster, "events", "--field-selector", f"involvedObject.name={NAME}",
                                  namespace=namespace)["items"] if e["reason"] == "SpeculationRolledBack"]
    assert len(events) == 1 and "AcceptanceBelowMinimum" in events[0]["message"]

    def alerts() -> list[dict[str, Any]]:
        response = httpx.get(f"{dev_cluster.alertmanager_url}/api/v2/alerts",
                             params={"filter": f'namespace="{namespace}"'})
        response.raise_for_status()
        return [a for a in response.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]

    assert len(wait_for(alerts, 30, "the Alertmanager alert")) == 1

    # A worker of the rolled-out group dies: its LeaderWorkerSet recreates the group, the status names the pod.
    wait_for(lambda: _groups_ready(dev_cluster, namespace), 120, "the rolled-back groups Ready")
    [worker] = [s for s in dev_cluster.simulators(namespace=namespace, sd=NAME, variant="speculative")
                if s.role == "worker" and s.pid]
    os.killpg(worker.pid, signal.SIGKILL)

    def named_in_status() -> bool:
        readies = [_ready({"status": status}) for status in statuses_written(_status_patches(dev_cluster, namespace))]
        return any(r.get("reason") == "GroupMemberFailed" and f"pod {worker.pod} " in r["message"] for r in readies)

    wait_for(named_in_status, 60, f"Ready=False GroupMemberFailed naming {worker.pod} in a status written")
    wait_for(lambda: _groups_ready(dev_cluster, namespace), 120, "the recreated group Ready again")
