"""Reconcile throughput: apply N SpeculativeDeployments at once and time the operator.

    python benchmarks/reconcile.py [--count 200] [--nodes 26]

Starts its own dev cluster (enough kwok GPU nodes for one pod per SD), the operator as a process,
applies `--count` SDs in one `kubectl apply`, and prints the time until every SD has its Deployment and
a status for its generation, the per-object latency (p50/p99), the time until all are Ready, and the
operator's resident memory (now and peak). Target (issue 4): 200 SDs in under 60 s, RSS under 200 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from specdeploy.devcluster import DevCluster

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"


def _resource(index: int) -> dict[str, object]:
    document = yaml.safe_load((REPO / "examples" / "llama-8b-ngram.yaml").read_text())
    document["metadata"] = {"name": f"sd-{index:04d}", "namespace": NAMESPACE}
    document["spec"]["replicas"] = 1
    document["spec"]["analysis"] = {"baseline": {"mode": "None"}}
    return dict(document)


def _rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def run(count: int, nodes: int, timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=nodes, progress=lambda m: print(m, file=sys.stderr))
        cluster.up()
        operator = None
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            cluster.kubectl("wait", "--for", "condition=established", "crd/speculativedeployments.specdeploy.io")
            cluster.kubectl("create", "namespace", NAMESPACE)
            env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
            log = open(Path(state) / "operator.log", "wb")  # noqa: SIM115 - closed with the process
            operator = subprocess.Popen(
                [sys.executable, "-m", "specdeploy.cli", "run", "--namespace", NAMESPACE, "--lease-namespace",
                 NAMESPACE, "--liveness", "", "--log-format", "plain", "--resync-seconds", "300", "--metrics-port", "0"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 60
            while "acquired lease" not in (Path(state) / "operator.log").read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the operator did not start")
                time.sleep(0.2)
            idle_rss, _ = _rss_kib(operator.pid)
            documents = yaml.safe_dump_all([_resource(i) for i in range(count)])
            started = time.monotonic()
            cluster.kubectl("apply", "-f", "-", input=documents)
            applied = time.monotonic() - started
            reconciled: dict[str, float] = {}
            ready: dict[str, float] = {}
            while len(ready) < count and time.monotonic() - started < timeout:
                listing = json.loads(cluster.kubectl("get", "sd", "-n", NAMESPACE, "-o", "json").stdout)
                now = time.monotonic() - started
                for item in listing["items"]:
                    name, status = item["metadata"]["name"], item.get("status") or {}
                    if status.get("observedGeneration") == item["metadata"]["generation"]:
                        reconciled.setdefault(name, now)
                        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
                        if conditions.get("Ready") == "True":
                            ready.setdefault(name, now)
                time.sleep(0.5)
            deployments = json.loads(cluster.kubectl("get", "deployments", "-n", NAMESPACE, "-o", "json").stdout)
            rss, peak = _rss_kib(operator.pid)
        finally:
            if operator is not None:
                operator.terminate()
                operator.wait(timeout=30)
            cluster.down()
    latencies = list(reconciled.values())
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"SDs applied: {count} (kubectl apply took {applied:.1f} s); Deployments: {len(deployments['items'])}")
    if latencies:
        print(f"all {len(latencies)} with children and status after {max(latencies):.1f} s "
              f"(p50 {_percentile(latencies, 0.5):.1f} s, p99 {_percentile(latencies, 0.99):.1f} s per object)")
    if ready:
        print(f"{len(ready)} Ready after {max(ready.values()):.1f} s")
    print(f"operator RSS: idle {idle_rss / 1024:.0f} MiB, after {rss / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=26, help="kwok nodes (8 GPUs each)")
    parser.add_argument("--timeout", type=float, default=300)
    arguments = parser.parse_args()
    run(arguments.count, arguments.nodes, arguments.timeout)
