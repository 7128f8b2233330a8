"""spec.analysis.objective on the dev cluster: the same SD under rising load, judged by Throughput and by Latency.

The SD: Llama-3.1-8B with a 1B draft proposing 5 tokens on an H100 at gpuMemoryUtilization 0.25, maxNumSeqs 16.
The draft's weights, KV layers and CUDA graphs leave the speculative pod 6,736 KV tokens against the control's
29,792 (the memory plan): with ~2,000-token prompts it holds 3 sequences to the control's 13, so under load it
queues first while each of its tokens is twice as fast (acceptance 0.6). On the simulator's virtual clock (measured
at 6,976 and 28,912 tokens, before the plan counted speculation's CUDA graphs as vLLM captures them; 10 seeds of
200 s, cut into 20 s windows, queue times counted as at least 50 ms): at 0.75 requests/s per pod 79 of 80
windows have a queue ratio of 1.00 and one 2.57; at 4 requests/s the speculative pod serves at most ~3.6 and every
window's ratio is above 20 (median 366), at 4.2 ms per token against 9.0 ms. Its prefill (scheduled → first
token) is 1.3–1.6× the control's — the draft's own prefill and the verify tokens of the batch — so this SD allows
maxPrefillTimeRatio 2.0: the test is about queueing.

The simulators run 2× slower than real time (SPECDEPLOY_SIM_OPTIONS), so 4 requests/s per pod are 2 on this
machine, and every latency they export is 2× longer: queueTimeFloorSeconds is the product's 50 ms × 2.

Phases, each bounded: low load under Throughput (healthy: nothing queues); high load under Latency (samples in
which the speculative pod queues more than maxQueueTimeRatio × the control, with a speedup whose interval is
above 1: no failure, no rollback); the same load under Throughput (a rollback on QueueTimeRegressed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from e2e_resources import serve_scenario

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = "llama-queue"
SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: llama-queue}
spec:
  replicas: 1
  engine:
    env: [{name: SPECDEPLOY_SIM_OPTIONS, value: "--time-scale 2"}]
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: draft_model, draft: {name: meta-llama/Llama-3.2-1B-Instruct}, numSpeculativeTokens: 5}
  resources: {gpu: {product: H100-80GB, count: 1}, gpuMemoryUtilization: 0.25}
  serving: {maxModelLen: 4096, maxNumSeqs: 16}
  analysis:
    objective: Throughput
    interval: 5s
    window: 40s
    minRequests: 10
    failureLimit: 2
    baseline: {mode: Control, controlReplicas: 1}
    checks: {queueTimeFloorSeconds: 0.1, maxPrefillTimeRatio: 2.0}
"""
TIME_SCALE = 2
LOW_QPS = 2 * 0.75 / TIME_SCALE     # requests/s over both pods: 0.75 per pod on the simulators' clock
HIGH_QPS = 2 * 4 / TIME_SCALE       # 4 per pod


def _sd(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "sd", NAME, namespace=namespace)


def _analysis(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("analysis") or {})


def _rolled_back(obj: dict[str, Any]) -> bool:
    speculation = obj.get("status", {}).get("speculation") or {}
    return bool(speculation.get("lastRollback"))


def _traffic(cluster: DevCluster, sd: str, qps: float) -> Traffic:
    """Whole answers at temperature 0 (the acceptance knob is then the measured rate), ~2,000-word prompts."""
    return Traffic(cluster, sd, qps=qps, duration=300, chunk_seconds=300, prompt_tokens="1500-2500",
                   output_tokens="128-256", temperature="0", stream=False).start()


def _set_objective(cluster: DevCluster, namespace: str, objective: str) -> None:
    patch = json.dumps({"spec": {"analysis": {"objective": objective}}})
    cluster.kubectl("patch", "sd", NAME, "-n", namespace, "--type", "merge", "-p", patch)


def _samples(cluster: DevCluster, namespace: str, objective: str, wanted: Callable[[dict[str, Any]], bool],
             count: int, timeout: float, what: str) -> list[dict[str, Any]]:
    """Wait for `count` distinct samples judged by `objective` for which `wanted` holds; never a rollback or a
    Failing sample meanwhile."""
    seen: dict[str, dict[str, Any]] = {}

    def enough() -> bool:
        obj = _sd(cluster, namespace)
        assert not _rolled_back(obj), obj["status"]["speculation"]
        analysis = _analysis(obj)
        if analysis.get("objective") == objective and analysis.get("lastSampleAt"):
            assert analysis.get("verdict") != "Failing", analysis
            if wanted(analysis):
                seen[analysis["lastSampleAt"]] = analysis
        return len(seen) >= count

    def last() -> str:
        return json.dumps(_analysis(_sd(cluster, namespace)))[:3000]

    wait_for(enough, timeout, what, interval=1.0, fatal=(AssertionError,), describe=last)
    return list(seen.values())


def test_throughput_rolls_back_when_the_speculative_pods_queue_first_and_latency_does_not(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]
) -> None:
    started = time.monotonic()
    analysing_operator()
    sd = serve_scenario(dev_cluster, namespace, SD, NAME, acceptance=0.6)

    # Low load under Throughput: both pods wait less than the floor, nothing fails.
    low = _traffic(dev_cluster, sd, LOW_QPS)
    try:
        quiet = _samples(dev_cluster, namespace, "Throughput", lambda a: a.get("verdict") == "Healthy", 2, 150,
                         "two healthy samples under Throughput at low load")
    finally:
        low.stop()
    assert all(a["queueTimeRatio"] <= 2.0 for a in quiet), quiet
    assert "objective Throughput" in quiet[-1]["message"] and "not counted" in quiet[-1]["message"]

    # High load under Latency: the speculative pod queues first, its tokens are still faster: no failure.
    _set_objective(dev_cluster, namespace, "Latency")
    high = _traffic(dev_cluster, sd, HIGH_QPS)
    try:
        def queues_first(analysis: dict[str, Any]) -> bool:
            """The queue check would fail under Throughput (the verdict names it as not counted), and the
            speculative pod is faster per token with confidence."""
            return ("not counted under objective Latency" in analysis.get("message", "")
                    and (analysis.get("speedup") or {}).get("low", 0) > 1)

        queued = _samples(dev_cluster, namespace, "Latency", queues_first, 3, 180,
                          "three samples under Latency in which the speculative pod queues first")
        last = queued[-1]
        assert last["queueTimeRatio"] > 2.0 and last["meanQueueTimeSeconds"] > 2 * last["baselineMeanQueueTimeSeconds"]
        assert "queue time" in last["message"] and "above maxQueueTimeRatio 2.00" in last["message"], last

        # The same load under Throughput: it rolls back on queueing.
        _set_objective(dev_cluster, namespace, "Throughput")
        obj = wait_for_object(dev_cluster, ["sd", NAME], _rolled_back, 90, "the rollback under Throughput",
                              namespace=namespace)
    finally:
        high.stop()
    record = obj["status"]["speculation"]["lastRollback"]
    assert record["reason"] == "QueueTimeRegressed", record
    assert "above maxQueueTimeRatio 2.00" in record["evidence"] and "objective Throughput" in record["evidence"]
    assert "the speculative pods queue first" in record["evidence"]
    print(f"objective scenario: {time.monotonic() - started:.0f} s; rollback: {record['evidence']}")
