"""The operator learns its hardware on the dev cluster (issue 28 point 4): simulators whose GPUs are 25% slower than
their profile in every step (the `hardwareSlowdown` knob, set in the pods' environment so a rolled pod keeps it).

Within 150 s of traffic starting, status.analysis.hardwareFit has a factor the judgment applies (its interval
narrower than the prior's ± 9%), the fitted base step at the control pods' batch within 5% of the per-token latency
the control simulators measure, and the Auto table the fitted model derives moves the k step the prior puts at its
first range's end. The judgment prices with it from then on; the pods' table follows at calibration's next change
that pays at the running load, which at this batch (the same k under both tables) does not come
(docs/analysis.md, "The GPUs the SD really got"; tests/unit/test_recalibration.py shows the change)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import get_json

pytestmark = pytest.mark.e2e

NAME = "llama-slow-gpu"
FIT_SECONDS = 150
KNOBS = json.dumps({"hardwareSlowdown": 1.25})
SD = f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {NAME}}}
spec:
  replicas: 1
  engine:
    env: [{{name: SPECDEPLOY_SIM_KNOBS, value: '{KNOBS}'}}]
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation:
    method: draft_model
    draft: {{name: meta-llama/Llama-3.2-1B-Instruct}}
    numSpeculativeTokens: 3
    schedule: {{mode: Auto}}
  resources: {{gpu: {{product: H100-80GB, count: 1}}}}
  serving: {{maxModelLen: 4096, maxNumSeqs: 64}}
  analysis:
    interval: 5s
    window: 30s
    minRequests: 10
    baseline: {{mode: Control, controlReplicas: 1}}
"""
TABLES = re.compile(r"schedule \[([^\]]*)\] → \[([^\]]*)\]")


def _table(text: str) -> list[list[int]]:
    """"1–32: k 2, 33–64: k 1" → [[1, 32, 2], [33, 64, 1]]."""
    rows = []
    for part in text.split(", "):
        batches, k = part.split(": k ")
        low, _, high = batches.partition("–")
        rows.append([int(low), int(high or low), int(k)])
    return rows


def _engine_table(cluster: DevCluster, namespace: str) -> list[list[int]]:
    args = get_json(cluster, "deployment", NAME, namespace=namespace)["spec"]["template"]["spec"]["containers"][0]["args"]
    config = next(arg.split("=", 1)[1] if arg.startswith("--speculative-config=") else args[i + 1]
                  for i, arg in enumerate(args) if arg.split("=", 1)[0] == "--speculative-config")
    return list(json.loads(config)["num_speculative_tokens_per_batch_size"])


def test_a_gpu_25_percent_slower_than_its_profile_is_fitted_and_moves_the_auto_schedule(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]
) -> None:
    analysing_operator()
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)
    sd = f"{namespace}/{NAME}"
    wait_for(lambda: endpoints(dev_cluster, sd, "speculative") and endpoints(dev_cluster, sd, "control"), 120,
             "both variants' simulators")
    prior = _engine_table(dev_cluster, namespace)
    assert prior[0][2] >= 2 and len(prior) >= 2, prior        # the prior's table: k 2 first, a step down later
    traffic = Traffic(dev_cluster, sd, qps=4, duration=FIT_SECONDS + 60, chunk_seconds=600,
                      prompt_tokens="50-150", output_tokens="300-500", temperature="0", stream=False).start()
    found: dict[str, Any] = {}
    started = time.monotonic()

    def fitted() -> bool:
        fit = (get_json(dev_cluster, "sd", NAME, namespace=namespace).get("status", {}).get("analysis")
               or {}).get("hardwareFit")
        if not fit or fit.get("appliedFactor") is None or not (tables := TABLES.search(fit["message"])):
            return False
        found.update(fit=fit, before=_table(tables[1]), after=_table(tables[2]))
        return True

    try:
        wait_for(fitted, FIT_SECONDS, "a fit better than the prior, with the schedule it would derive",
                 interval=1.0, describe=lambda: json.dumps(found.get("fit") or {}))
    finally:
        traffic.stop()
    fit = found["fit"]
    print(f"fit after {time.monotonic() - started:.0f} s of traffic: {fit['message']}")
    assert fit["factorHalfWidth"] < fit["priorError"] == 0.09, fit
    assert abs(fit["fittedStepSeconds"] / fit["measuredStepSeconds"] - 1) < 0.05, fit
    assert fit["fittedStepSeconds"] > 1.15 * fit["priorStepSeconds"], fit       # the slower GPU, seen
    assert found["before"] == prior and found["after"] != prior, found        # the k step moved
    first_step = found["after"][0][1]
    assert first_step > prior[0][1], found       # a slower GPU: k 2 pays to a larger batch (CPU overhead's share falls)
    assert _engine_table(dev_cluster, namespace) == prior      # the same k at the pods' batch: no roll for the fit
