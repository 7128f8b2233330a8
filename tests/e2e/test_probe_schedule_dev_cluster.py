"""spec.analysis.probe on the dev cluster: the operator probes each new speculative generation by its pod IP,
writes status.probe, the Probed condition and an Event, and a probe that cannot run is a condition, not a rollback.

The SD: EAGLE-3 on Llama-3.1-8B whose simulator accepts the two workloads of the ConfigMap differently
(`workloadAcceptance`, set from the start through the pod's SPECDEPLOY_SIM_KNOBS, so no probe can run before it)
and, as the engine does, less at higher temperature. Defaults everywhere but what keeps the test short: two
temperatures, 4 requests per cell at 10 per second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from specdeploy.devcluster import DevCluster
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = "chat"
KNOBS = json.dumps({"workloadAcceptance": {"[code]": 0.85, "[support]": 0.03}})
SD = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: chat}}
spec:
  replicas: 1
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {{method: eagle3, draft: {{name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}}, numSpeculativeTokens: 3}}
  engine:
    env: [{{name: SPECDEPLOY_SIM_KNOBS, value: '{KNOBS}'}}]
  analysis:
    interval: 3s
    window: 20s
    baseline: {{mode: None}}
    probe:
      workloadsConfigMap: prompts
      temperatures: [0, 1.0]
      requestsPerCell: 4
      requestsPerSecond: 10
"""
PROMPTS = """
apiVersion: v1
kind: ConfigMap
metadata: {name: prompts}
data:
  code: "['[code] def parse(text):', '[code] class Cache:']"
  support: "['[support] Where is my refund?']"
"""


def _probed(obj: dict[str, Any]) -> dict[str, Any]:
    return condition(obj, "Probed") or {}


def _events(cluster: DevCluster, namespace: str) -> list[tuple[str, str]]:
    listing = get_json(cluster, "events", "--field-selector", f"involvedObject.name={NAME}", namespace=namespace)
    return [(e["type"], e["reason"]) for e in listing["items"]]


def test_the_operator_probes_each_generation_and_a_probe_that_cannot_run_is_a_condition(
        dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]) -> None:
    analysing_operator()
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=PROMPTS)
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)

    obj = wait_for_object(dev_cluster, ["sd", NAME], lambda o: _probed(o).get("status") == "True", 150,
                          "Probed=True after the first rollout", namespace=namespace)
    probe = obj["status"]["probe"]
    assert probe["trigger"] == "NewGeneration" and probe["countsFrom"] == "answers"
    pod = get_json(dev_cluster, "pod", probe["pod"], namespace=namespace)
    assert probe["url"] == f"http://{pod['status']['podIP']}:8000"
    assert probe["podTemplateHash"] == pod["metadata"]["labels"]["pod-template-hash"]
    cells = {(c["workload"], c["temperature"]): c for c in probe["cells"]}
    assert set(cells) == {(w, t) for w in ("code", "support") for t in (0.0, 1.0)}
    assert all(c["requests"] == 4 for c in cells.values())
    assert cells[("code", 0.0)]["acceptanceRate"] > cells[("code", 1.0)]["acceptanceRate"]
    assert all(cells[("code", t)]["pays"] for t in (0.0, 1.0))
    assert not any(cells[("support", t)]["pays"] for t in (0.0, 1.0))
    assert [s.split(":")[0] for s in probe["notPaying"]] == ["support at temperature 0", "support at temperature 1"]
    assert "support at temperature 0" in _probed(obj)["message"]
    assert ("Normal", "Probed") in _events(dev_cluster, namespace)
    args = get_json(dev_cluster, "deployment", NAME, namespace=namespace)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--per-request-spec-decode-metrics" in args

    # New pods (a second replica) with the prompt set gone: the probe cannot run. A condition says so, the
    # last cells stay, and speculation goes on.
    dev_cluster.kubectl("delete", "configmap", "prompts", "-n", namespace)
    dev_cluster.kubectl("patch", "sd", NAME, "-n", namespace, "--type", "merge", "-p", '{"spec": {"replicas": 2}}')
    obj = wait_for_object(dev_cluster, ["sd", NAME], lambda o: _probed(o).get("reason") == "WorkloadsUnreadable",
                          150, "Probed=False WorkloadsUnreadable after the second rollout", namespace=namespace)
    assert _probed(obj)["status"] == "False" and "prompts" in _probed(obj)["message"]
    assert obj["status"]["probe"]["cells"] == probe["cells"]
    assert obj["status"]["speculation"]["active"] is True and obj["status"]["speculation"].get("rollbacks", 0) == 0
    assert ("Warning", "ProbeFailed") in _events(dev_cluster, namespace)
