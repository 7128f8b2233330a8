"""Analysis cost: Prometheus queries per cycle, cycle time, operator CPU and memory, and detection
latency, with 1, 100 and 1000 SDs.

    python benchmarks/analysis.py [--counts 1,100,1000] [--cycles 3]

Starts its own dev cluster with monitoring (Prometheus, Alertmanager, the pod runner) and the operator
as one process reading the dev Prometheus every analysis interval. At each count, in ascending order:

1. SDs are added until there are that many: idle ones (`replicas: 0`, baseline None: no pods, the same
   engine and window, so they all share one query group) and one served SD whose two pods (Control
   baseline) run engine simulators.
2. Cost: after every SD has been sampled once and is Ready, `--cycles` full cycles are timed one by one from the
   operator's own /metrics (`specdeploy_analysis_query_seconds`, `specdeploy_analysis_cycle_seconds`),
   the queries also counted on Prometheus' side (`prometheus_http_requests_total{handler="/api/v1/query"}`),
   the CPU of the operator, kube-apiserver and etcd over those cycles read from /proc, and the apiserver's
   own count of the requests it served meanwhile (`apiserver_request_total`, every client's), by verb.
3. Detection latency: with the new served SD healthy under 4 QPS (acceptance 0.8), acceptance is set
   to 0.3 on its speculative simulators; the time until `status.speculation.active` is false is
   printed, measured from the knob change and also to the rollback's own timestamp.

The analysis tick equals the SDs' interval, so every cycle finds every SD due and queries per cycle =
Δqueries / Δcycles exactly.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from bench_operator import watching_operator
from process_usage import Mark, apiserver_requests, load_average, machine, percentile, request_deltas, rss_kib

from specdeploy.api.resource import GROUP, PLURAL, VERSION
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.processes import free_port
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic

NAMESPACE = "bench"
INTERVAL = 3.0  # seconds; also the operator's analysis tick
ANALYSIS = {
    "interval": f"{INTERVAL:g}s", "window": "20s", "minRequests": 10, "failureLimit": 2,
    "checks": {"minAcceptanceRate": 0.5, "maxPerTokenLatencyRatio": 2.0, "maxInferenceTimeRatio": 3.0,
               "maxPrefillTimeRatio": 5.0},
}
TRAFFIC_QPS = 4
WATCHED = ("kube-apiserver", "etcd")
"""Cluster processes whose CPU is printed beside the operator's: the cost of its API calls."""


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


def _sds(cluster: DevCluster, name: str = "") -> Any:
    """The SDs (or SD `name`) as the apiserver's cache has them: over HTTP, not kubectl, which costs
    more CPU than the operator on this machine."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}" + (f"/{name}" if name else "")
    with cluster.api_client() as api:
        answer = api.get(path, params={"resourceVersion": "0"}, timeout=120).raise_for_status().json()
    return answer if name else answer["items"]


def _sampled_after(item: dict[str, Any], moment: float) -> bool:
    """Whether the SD has a sample from after `moment` (a rolled-back SD keeps its last one: it counts)."""
    status = item.get("status") or {}
    if (status.get("speculation") or {}).get("active") is False:
        return True
    at = (status.get("analysis") or {}).get("lastSampleAt")
    return bool(at) and datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() >= moment


def _ready(item: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (item.get("status") or {}).get("conditions") or [])


def detection_latency(cluster: DevCluster, served: str) -> tuple[float, float, str]:
    """Collapse acceptance on SD `served`; (seconds to seen rolled back, seconds to lastRollback.at, reason)."""
    sd = f"{NAMESPACE}/{served}"
    wait_for(lambda: endpoints(cluster, sd, "speculative") and endpoints(cluster, sd, "control"), 300,
             "both variants' simulators")
    sim_admin(cluster, sd, "speculative", {"acceptance": 0.8})
    traffic = Traffic(cluster, sd, qps=TRAFFIC_QPS, duration=1800).start()

    def status() -> dict[str, Any]:
        return dict(_sds(cluster, served).get("status") or {})

    try:
        wait_for(lambda: (status().get("analysis") or {}).get("verdict") == "Healthy", 900, "a healthy sample")
        began = time.time()
        sim_admin(cluster, sd, "speculative", {"acceptance": 0.3})

        def rolled_back() -> dict[str, Any] | None:
            speculation = status().get("speculation") or {}
            return speculation if speculation.get("active") is False else None

        speculation = wait_for(rolled_back, 900, "the rollback", interval=0.25)
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
    return wait_for(lambda: (c := Counters(metrics_url, prometheus_url)).cycles > cycles and c, 1800,
                    f"analysis cycle {cycles + 1:.0f} to end", interval=0.1)


def _cluster_pids(cluster: DevCluster) -> dict[str, int]:
    return {c.name: c.pid for c in cluster.status().components if c.name in WATCHED}


def measure(cluster: DevCluster, metrics_url: str, operator: int, count: int, cycles: int) -> dict[str, Any]:
    """With `count` SDs, wait until each was sampled, then time `cycles` cycles one by one."""
    moment = time.time()
    wait_for(lambda: (items := _sds(cluster)) and len(items) >= count and all(_sampled_after(i, moment) for i in items),
             1800, f"all {count} SDs sampled", interval=2.0)
    # And their rollouts done (Ready): the cycles timed are those of SDs at rest, not of the creation's tail
    # (the controller-manager's Deployment updates, each a pass of its SD).
    wait_for(lambda: all(_ready(i) for i in _sds(cluster)), 1800, f"all {count} SDs Ready", interval=2.0)
    pids = {"operator": operator, **_cluster_pids(cluster)}
    start = _after_cycle(metrics_url, cluster.prometheus_url, Counters(metrics_url, cluster.prometheus_url).cycles)
    marks = {name: Mark.of(pid) for name, pid in pids.items()}
    with cluster.api_client() as api:
        requests_before = apiserver_requests(api)
    previous, times = start, []
    while previous.cycles < start.cycles + cycles:
        current = _after_cycle(metrics_url, cluster.prometheus_url, previous.cycles)
        done = current.cycles - previous.cycles   # more than 1 only when a read fell between two cycles
        times += [(current.cycle_seconds - previous.cycle_seconds) / done] * int(done)
        previous = current
    end = previous
    busy = {name: marks[name].cpu_per_wall(Mark.of(pid)) for name, pid in pids.items()}
    with cluster.api_client() as api:
        requests_after = apiserver_requests(api)
    done = end.cycles - start.cycles
    return {
        "cycles": done,
        "queries_per_cycle": (end.queries - start.queries) / done,
        "served_per_cycle": (end.served - start.served) / done,
        "cycle_mean": sum(times) / len(times), "cycle_p50": percentile(times, 0.5), "cycle_max": max(times),
        "query_seconds": (end.query_seconds - start.query_seconds) / max(end.queries - start.queries, 1),
        "busy": busy,
        "rss_peak_mib": rss_kib(operator)[1] / 1024,
        "apiserver_requests": request_deltas(requests_before, requests_after, 8),
    }


def run(counts: list[int], cycles: int) -> None:
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-analysis-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=2, monitoring=True,
                             progress=lambda m: print(m, file=sys.stderr))
        cluster.up()
        rows: list[tuple[int, dict[str, Any], tuple[float, float, str]]] = []
        port = free_port()
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        operator_args = ("--resync-seconds", "600", "--metrics-port", str(port), "--prometheus-url",
                         cluster.prometheus_url, "--alertmanager-url", cluster.alertmanager_url,
                         "--analysis-tick-seconds", f"{INTERVAL:g}")
        try:
            with watching_operator(cluster, Path(state), NAMESPACE, *operator_args) as (operator, _):
                present = 0
                for count in counts:
                    served = f"served-{count:04d}"
                    documents = [_sd(f"idle-{i:04d}", 0, {"mode": "None"}) for i in range(present, count - 1)]
                    documents.append(_sd(served, 1, {"mode": "Control", "controlReplicas": 1}))
                    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(documents), timeout=1800)
                    present = count
                    cost = measure(cluster, metrics_url, operator.pid, count, cycles)
                    print(f"  {count} SDs: {cost}", file=sys.stderr)
                    print(f"{count} SDs: apiserver requests over {cost['cycles']:.0f} cycles (every client's):\n"
                          f"{cost['apiserver_requests']}")
                    detection = detection_latency(cluster, served)
                    print(f"  {count} SDs: detection {detection}", file=sys.stderr)
                    rows.append((count, cost, detection))
        finally:
            cluster.down()
    print(f"machine: {machine()}; load average before {load_before}, after {load_average()}")
    print(f"analysis: interval {ANALYSIS['interval']}, window {ANALYSIS['window']}, "
          f"failureLimit {ANALYSIS['failureLimit']}, tick {INTERVAL:g}s; Prometheus scrapes every 2s; "
          f"detection: acceptance 0.8 -> 0.3 at {TRAFFIC_QPS} QPS")
    print("| SDs | queries/cycle (operator / Prometheus) | cycle time mean / p50 / max | per query "
          "| CPU cores busy: operator / apiserver / etcd | operator RSS peak | detection: decided / seen |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count, cost, (seen, decided, reason) in rows:
        busy = cost["busy"]
        print(f"| {count} | {cost['queries_per_cycle']:.1f} / {cost['served_per_cycle']:.1f} "
              f"| {cost['cycle_mean']:.2f} / {cost['cycle_p50']:.2f} / {cost['cycle_max']:.2f} s "
              f"| {cost['query_seconds'] * 1000:.0f} ms "
              f"| {busy['operator']:.2f} / {busy.get('kube-apiserver', float('nan')):.2f} / "
              f"{busy.get('etcd', float('nan')):.2f} | {cost['rss_peak_mib']:.0f} MiB "
              f"| {decided:.1f} s / {seen:.1f} s ({reason}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", default="1,100,1000", help="SD counts, ascending, comma-separated")
    parser.add_argument("--cycles", type=int, default=3, help="cycles timed at each count")
    arguments = parser.parse_args()
    run(sorted(int(c) for c in arguments.counts.split(",")), arguments.cycles)
