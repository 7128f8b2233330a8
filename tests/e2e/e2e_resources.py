"""Resources several e2e modules apply: one copy each."""

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
#: The rollback scenarios' SD. Short windows so a scenario takes a minute, not an hour (Prometheus
#: scrapes every 2 s); loose latency ratios because a 20 s window's P99s sit on coarse buckets.
SCENARIO_SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: llama-ngram}
spec:
  replicas: 1
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: ngram, numSpeculativeTokens: 4}
  serving: {maxModelLen: 8192, maxNumSeqs: 32}
  analysis:
    interval: 3s
    window: 20s
    minRequests: 10
    failureLimit: 2
    baseline: {mode: Control, controlReplicas: 1}
    checks: {minAcceptanceRate: 0.5, maxP99InterTokenLatencyRatio: 2.0, maxP99E2ELatencyRatio: 3.0,
             maxP99TimeToFirstTokenRatio: 5.0}
"""
