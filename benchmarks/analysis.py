"""Analysis cost: Prometheus queries per cycle, cycle time and detection latency, with 1, 100 and 1000 SDs.

    python benchmarks/analysis.py [--counts 1,100,1000] [--cycles 3]

Starts its own dev cluster with monitoring (Prometheus, Alertmanager, the pod runner), the operator as
one process reading the dev Prometheus every analysis interval, and one SD whose two pods run engine
simulators under steady traffic. Then:

1. Detection latency: with that one SD healthy (acceptance 0.8), acceptance is set to 0.3 on the
   speculative simulators; the time until `status.speculation.active` is false is printed, measured
   from the knob change and also to the rollback's own timestamp.
2. Cost: more SDs are added (`replicas: 0`, baseline None: no pods, the same engine and window, so
   they share the first SD's query group) until there are 1, 100, 1000; at each count, after every SD
   has been sampled once, `--cycles` full cycles are timed from the operator's own /metrics
   (`specdeploy_analysis_query_seconds_count`, `specdeploy_analysis_cycle_seconds`), and the queries
   are also counted on Prometheus' side (`prometheus_http_requests_total{handler="/api/v1/query"}`).

The analysis tick equals the SDs' interval, so every cycle finds every SD due and queries per cycle =
Δqueries / Δcycles exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic

NAMESPACE = "bench"
INTERVAL = 3.0  # seconds; also the operator's analysis tick
ANALYSIS = {
    "interval": f"{INTERVAL:g}s", "window": "20s", "minRequests": 10, "failureLimit": 2,
    "checks": {"minAcceptanceRate": 0.5, "maxP99InterTokenLatencyRatio": 2.0, "maxP99E2ELatencyRatio": 3.0,
               "maxP99TimeToFirstTokenRatio": 5.0},
}
SERVED = "served"


def _sd(name: str, replicas: int, baseline: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "analysis": {**ANALYSIS, "baseline": baseline},
        },
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _metric_sum(text: str, name: str, label_part: str = "") -> float:
    """Sum of every sample of `name` (whose labels contain `label_part`) in a text exposition."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match.group(1) == name and label_part in (match.group(2) or ""):
            total += float(match.group(3))
    return total


class Counters:
    """The operator's and Prometheus' counters at one moment."""

    def __init__(self, operator_metrics: str, prometheus_url: str) -> None:
        text = httpx.get(operator_metrics, timeout=10).text
        self.queries = _metric_sum(text, "specdeploy_analysis_query_seconds_count")
        self.query_seconds = _metric_sum(text, "specdeploy_analysis_query_seconds_sum")
        self.cycles = _metric_sum(text, "specdeploy_analysis_cycle_seconds_count")
        self.cycle_seconds = _metric_sum(text, "specdeploy_analysis_cycle_seconds_sum")
        prometheus = httpx.get(f"{prometheus_url}/metrics", timeout=10).text
        self.served = _metric_sum(prometheus, "prometheus_http_requests_total", 'handler="/api/v1/query"')


def _sds(cluster: DevCluster) -> list[dict[str, Any]]:
    listing = json.loads(cluster.kubectl("get", "sd", "-n", NAMESPACE, "-o", "json", timeout=300).stdout)
    return list(listing["items"])


def _sampled_after(item: dict[str, Any], moment: float) -> bool:
    """Whether the SD has a sample from after `moment` (a rolled-back SD keeps its last one: it counts)."""
    status = item.get("status") or {}
    if (status.get("speculation") or {}).get("active") is False:
        return True
    at = (status.get("analysis") or {}).get("lastSampleAt")
    return bool(at) and datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() >= moment


def detection_latency(cluster: DevCluster) -> tuple[float, float, str]:
    """Collapse acceptance on the served SD; (seconds to seen rolled back, seconds to lastRollback.at, reason)."""
    sd = f"{NAMESPACE}/{SERVED}"
    wait_for(lambda: endpoints(cluster, sd, "speculative") and endpoints(cluster, sd, "control"), 120,
             "both variants' simulators")
    sim_admin(cluster, sd, "speculative", {"acceptance": 0.8})
    traffic = Traffic(cluster, sd, qps=4, duration=300).start()
    try:
        def healthy() -> bool:
            item = json.loads(cluster.kubectl("get", "sd", SERVED, "-n", NAMESPACE, "-o", "json").stdout)
            return ((item.get("status") or {}).get("analysis") or {}).get("verdict") == "Healthy"

        wait_for(healthy, 120, "a healthy sample")
        began = time.time()
        sim_admin(cluster, sd, "speculative", {"acceptance": 0.3})

        def rolled_back() -> dict[str, Any] | None:
            item = json.loads(cluster.kubectl("get", "sd", SERVED, "-n", NAMESPACE, "-o", "json").stdout)
            speculation = (item.get("status") or {}).get("speculation") or {}
            return speculation if speculation.get("active") is False else None

        speculation = wait_for(rolled_back, 180, "the rollback", interval=0.25)
        seen = time.time() - began
    finally:
        traffic.stop()
    record = speculation["lastRollback"]
    decided = datetime.fromisoformat(record["at"].replace("Z", "+00:00")).timestamp() - began
    return seen, decided, record["reason"]


def _after_cycle(metrics_url: str, prometheus_url: str, cycles: float) -> Counters:
    """The counters just after the operator's cycle count passed `cycles`.

    A cycle counts its queries when they return and itself when it ends, and the next one starts a tick
    later: read between the two, queries and cycles belong to the same cycles.
    """
    return wait_for(lambda: (c := Counters(metrics_url, prometheus_url)).cycles > cycles and c, 900,
                    f"analysis cycle {cycles + 1:.0f} to end", interval=0.1)


def measure(cluster: DevCluster, metrics_url: str, count: int, cycles: int) -> dict[str, float]:
    """With `count` SDs, wait until each was sampled, then time `cycles` cycles."""
    moment = time.time()
    wait_for(lambda: (items := _sds(cluster)) and len(items) >= count and all(_sampled_after(i, moment) for i in items),
             900, f"all {count} SDs sampled", interval=2.0)
    start = _after_cycle(metrics_url, cluster.prometheus_url, Counters(metrics_url, cluster.prometheus_url).cycles)
    end = _after_cycle(metrics_url, cluster.prometheus_url, start.cycles + cycles - 1)
    done = end.cycles - start.cycles
    return {
        "cycles": done,
        "queries_per_cycle": (end.queries - start.queries) / done,
        "served_per_cycle": (end.served - start.served) / done,
        "cycle_seconds": (end.cycle_seconds - start.cycle_seconds) / done,
        "query_seconds": (end.query_seconds - start.query_seconds) / max(end.queries - start.queries, 1),
    }


def run(counts: list[int], cycles: int) -> None:
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-analysis-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=2, monitoring=True,
                             progress=lambda m: print(m, file=sys.stderr))
        cluster.up()
        operator = None
        rows: list[tuple[int, dict[str, float]]] = []
        try:
            repo = Path(__file__).resolve().parents[1]
            cluster.kubectl("apply", "--server-side", "-f", str(repo / "crds"))
            cluster.kubectl("wait", "--for", "condition=established", "crd/speculativedeployments.specdeploy.io")
            cluster.kubectl("create", "namespace", NAMESPACE)
            port = _free_port()
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            log_path = Path(state) / "operator.log"
            log = log_path.open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "specdeploy.cli", "run", "--namespace", NAMESPACE, "--lease-namespace",
                 NAMESPACE, "--liveness", "", "--log-format", "plain", "--resync-seconds", "600",
                 "--metrics-port", str(port), "--prometheus-url", cluster.prometheus_url,
                 "--alertmanager-url", cluster.alertmanager_url, "--analysis-tick-seconds", f"{INTERVAL:g}"],
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
            )
            wait_for(lambda: "acquired lease" in log_path.read_text(errors="replace"), 60, "the operator's lease")
            cluster.kubectl("apply", "-f", "-",
                            input=yaml.safe_dump(_sd(SERVED, 1, {"mode": "Control", "controlReplicas": 1})))
            seen, decided, reason = detection_latency(cluster)
            present = 1
            for count in counts:
                if count > present:
                    documents = [_sd(f"idle-{i:04d}", 0, {"mode": "None"}) for i in range(present, count)]
                    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents), timeout=600)
                    present = count
                rows.append((count, measure(cluster, metrics_url, count, cycles)))
                print(f"  {count} SDs: {rows[-1][1]}", file=sys.stderr)
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(timeout=30)
            cluster.down()
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs ({platform.processor() or 'unknown CPU'}), "
          f"Python {platform.python_version()}")
    print(f"analysis: interval {ANALYSIS['interval']}, window {ANALYSIS['window']}, "
          f"failureLimit {ANALYSIS['failureLimit']}, tick {INTERVAL:g}s; Prometheus scrapes every 2s")
    print(f"detection latency (acceptance 0.8 -> 0.3 at 4 QPS): rolled back ({reason}) {decided:.1f} s after "
          f"the change, seen in status after {seen:.1f} s")
    print("| SDs | queries/cycle (operator) | queries/cycle (Prometheus) | cycle time | per query |")
    print("| --- | --- | --- | --- | --- |")
    for count, row in rows:
        print(f"| {count} | {row['queries_per_cycle']:.1f} | {row['served_per_cycle']:.1f} | "
              f"{row['cycle_seconds']:.2f} s | {row['query_seconds'] * 1000:.0f} ms |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", default="1,100,1000", help="SD counts, ascending, comma-separated")
    parser.add_argument("--cycles", type=int, default=3, help="cycles timed at each count")
    arguments = parser.parse_args()
    run(sorted(int(c) for c in arguments.counts.split(",")), arguments.cycles)
