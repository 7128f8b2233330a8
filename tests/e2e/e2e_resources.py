"""Resources several e2e modules apply, and the step that serves the scenario SD: one copy each."""

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin

#: A stand-in for prometheus-operator's PodMonitor CRD (the operator renders PodMonitors when it exists).
POD_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: PodMonitor, listKind: PodMonitorList, plural: podmonitors, singular: podmonitor}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""

SCENARIO_NAME = "llama-ngram"
#: The rollback scenarios' analysis (under `spec:`). Short windows so a scenario takes a minute, not an hour
#: (Prometheus scrapes every 2 s); loose latency ratios because a 20 s window's P99s sit on coarse buckets.
SCENARIO_ANALYSIS = """
  analysis:
    interval: 3s
    window: 20s
    minRequests: 10
    failureLimit: 2
    baseline: {mode: Control, controlReplicas: 1}
    checks: {minAcceptanceRate: 0.5, maxPerTokenLatencyRatio: 2.0, maxInferenceTimeRatio: 3.0,
             maxPrefillTimeRatio: 5.0}
"""
#: The rollback scenarios' SD.
SCENARIO_SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: llama-ngram}
spec:
  replicas: 1
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: ngram, numSpeculativeTokens: 4}
  serving: {maxModelLen: 8192, maxNumSeqs: 32}""" + SCENARIO_ANALYSIS


def serve_scenario(cluster: DevCluster, namespace: str, manifest: str = SCENARIO_SD, name: str = SCENARIO_NAME,
                   acceptance: float = 0.8) -> str:
    """Apply `manifest` (an operator runs), wait for both variants' simulators, set the speculative ones'
    acceptance; returns NAMESPACE/NAME."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    sd = f"{namespace}/{name}"
    wait_for(lambda: endpoints(cluster, sd, "speculative") and endpoints(cluster, sd, "control"), 120,
             "both variants' simulators")
    assert all(result.ok for result in sim_admin(cluster, sd, "speculative", {"acceptance": acceptance}))
    return sd
