"""`specdeploy probe NAME -n NS --url URL` on the dev cluster: an EAGLE-3 SD whose engine answers with vLLM's per-request
speculative metrics (`engine.extraArgs`), two workloads the simulator accepts differently (its
`workloadAcceptance` knob), three temperatures; the result in the SD's status.probe, kept by the operator's
own status writes after it, in `kubectl describe sd`, and on the operator's /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.waiters import get_json

pytestmark = pytest.mark.e2e

NAME = "chat"
SD = """
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {name: chat}
spec:
  replicas: 1
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  speculation: {method: eagle3, draft: {name: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B}, numSpeculativeTokens: 3}
  engine: {extraArgs: ["--per-request-spec-decode-metrics", "summary"]}
  analysis: {interval: 3s, window: 20s, baseline: {mode: None}}
"""
WORKLOADS = "code: ['[code] def parse(text):', '[code] class Cache:']\nsupport: ['[support] Where is my refund?']\n"


def _status(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return dict(get_json(cluster, "sd", NAME, namespace=namespace).get("status") or {})


def test_the_probe_fills_status_probe_and_the_operator_keeps_it(
        dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any],
        tmp_path: Path) -> None:
    operator = analysing_operator(metrics=True)
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=SD)
    sd = f"{namespace}/{NAME}"
    [url] = wait_for(lambda: endpoints(dev_cluster, sd, "speculative"), 120, "the speculative simulator")
    knobs = {"workloadAcceptance": {"[code]": 0.85, "[support]": 0.03}}   # the Auto break-even is 0.09
    assert all(result.ok for result in sim_admin(dev_cluster, sd, "speculative", knobs))
    (tmp_path / "workloads.yaml").write_text(WORKLOADS)

    probe = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "probe", NAME, "-n", namespace, "--url", url, "--workloads",
         str(tmp_path / "workloads.yaml"), "--requests-per-cell", "6", "--rate", "20", "-o", "json"],
        env={**os.environ, "KUBECONFIG": str(dev_cluster.kubeconfig), "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    assert "deprecated" not in probe.stderr
    printed = json.loads(probe.stdout)

    written = _status(dev_cluster, namespace)["probe"]
    assert written["cells"] == printed["cells"] and written["countsFrom"] == "answers"
    cells = {(c["workload"], c["temperature"]): c for c in written["cells"]}
    assert set(cells) == {(w, t) for w in ("code", "support") for t in (0.0, 0.7, 1.0)}
    assert all(c["requests"] == 6 for c in cells.values())
    assert cells[("code", 0.0)]["acceptanceRate"] > cells[("code", 1.0)]["acceptanceRate"]
    assert all(cells[("code", t)]["pays"] for t in (0.0, 0.7, 1.0))
    assert not any(cells[("support", t)]["pays"] for t in (0.0, 0.7, 1.0))
    assert len(written["notPaying"]) == 3 and all(s.startswith("support at temperature") for s in written["notPaying"])

    # The operator's samples go on writing status (a sample that changes nothing but its time at least once
    # a minute: STATUS_REFRESH_SECONDS); the probe stays.
    sampled = _status(dev_cluster, namespace).get("analysis", {}).get("lastSampleAt")
    wait_for(lambda: _status(dev_cluster, namespace).get("analysis", {}).get("lastSampleAt") not in (None, sampled),
             90, "a sample written after the probe")
    assert _status(dev_cluster, namespace)["probe"] == written
    described = dev_cluster.kubectl("describe", "sd", NAME, "-n", namespace).stdout
    assert "Probe:" in described and "Not Paying:" in described
    # And on the operator's /metrics, one series per cell (the dashboard's "Last probe" table).
    series = f'specdeploy_probe_predicted_speedup{{name="{NAME}",namespace="{namespace}",temperature="0",workload="support"}}'
    line = wait_for(lambda: next((row for row in httpx.get(operator.metrics_url).text.splitlines()
                                  if row.startswith(series)), None), 30, "the probe's series on the operator's /metrics")
    assert float(line.split()[-1]) < 1.0
