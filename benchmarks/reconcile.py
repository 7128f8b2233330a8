"""Reconcile throughput: create N SpeculativeDeployments at once and time the operator.

    python benchmarks/reconcile.py [--count 200] [--nodes N] [--steady-seconds 30] [--unrelated-pods N]
                                   [--without-operator]

Starts its own dev cluster (enough kwok GPU nodes for one pod per SD unless `--nodes` says otherwise),
the operator as a process, creates `--count` SDs in one `kubectl create`, and prints: the time until
every SD has its Deployment and a status for its generation (and so SDs reconciled per second), the
per-object latency from creation (p50/p99), the time until all are Ready, the operator's resident
memory (idle, peak) and its CPU (cores kept busy) over the reconcile phase and over a steady phase
afterwards, when nothing changes (no Prometheus: the analysis loop only lists the SDs), and how many
reconciles failed in the operator's log (kopf retries them after 60 s; those after a child changed wait
for the resync). Targets (issue 4): 200 SDs in under 60 s, RSS under 200 MiB.

`--unrelated-pods N`: before the operator starts, N pods of other workloads run in its namespace (on one
extra kwok node with room for them and no GPUs, Running with kwok's status): what the operator's memory owes
to the cluster rather than to its SDs (issue 30). The RSS once its first listing settled is printed too.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from bench_operator import watching_operator
from process_usage import Mark, apiserver_requests, load_average, machine, percentile, request_deltas, rss_kib

from specdeploy.api.resource import GROUP, PLURAL, VERSION
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.nodes import GpuNodeShape, node_manifest
from specdeploy.devcluster.waiters import wait_established

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
GPUS_PER_NODE = 8
UNRELATED = "bench.specdeploy.io/unrelated"
WORKLOAD_NODE = "workload-node-0"


def _resource(index: int) -> dict[str, object]:
    document = yaml.safe_load((REPO / "examples" / "llama-8b-ngram.yaml").read_text())
    document["metadata"] = {"name": f"sd-{index:04d}", "namespace": NAMESPACE}
    document["spec"]["replicas"] = 1
    document["spec"]["analysis"] = {"baseline": {"mode": "None"}}
    return dict(document)


def _unrelated_pod(index: int) -> dict[str, object]:
    """A pod of another team's web service: labels, a container with env, ports, requests and a probe, as
    many a cluster runs (~3 KiB as listed, with kwok's status), and nothing of specdeploy's."""
    app = f"web-{index % 100:02d}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{app}-{index:05d}", "namespace": NAMESPACE,
                     "labels": {"app": app, "team": f"team-{index % 7}", UNRELATED: "true"}},
        "spec": {"nodeName": WORKLOAD_NODE, "containers": [{
            "name": "web", "image": "registry.example/web:1.0", "ports": [{"containerPort": 8080}],
            "env": [{"name": f"SETTING_{i}", "value": f"value-{i}-{index}"} for i in range(4)],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        }]},
    }


def _run_unrelated_pods(cluster: DevCluster, count: int, timeout: float) -> None:
    """`count` unrelated pods, created in four kubectl processes, on a kwok node of their own (no GPUs, so
    no engine pod is scheduled there; room for all of them), and wait until kwok has them all Running."""
    node = node_manifest(WORKLOAD_NODE, GpuNodeShape(gpus=0, pods=str(count + 10)))
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(node))
    shares = [yaml.safe_dump_all([_unrelated_pod(i) for i in range(start, count, 4)]) for start in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda documents: cluster.kubectl("create", "-f", "-", input=documents, timeout=1800), shares))
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    params = {"labelSelector": UNRELATED, "fieldSelector": "status.phase!=Running", "limit": "1"}
    with cluster.api_client() as api:
        wait_for(lambda: not api.get(path, params=params, timeout=60).raise_for_status().json()["items"],
                 timeout, f"{count} unrelated pods Running")


def _settled_rss(pid: int, quiet_seconds: float = 10, timeout: float = 300) -> int:
    """The operator's RSS (KiB) once it has not grown for `quiet_seconds`: its first listings done."""
    last, since = rss_kib(pid)[0], time.monotonic()
    deadline = since + timeout
    while time.monotonic() - since < quiet_seconds and time.monotonic() < deadline:
        time.sleep(1)
        now = rss_kib(pid)[0]
        if now > last:
            last, since = now, time.monotonic()
    return last


def _created_at(item: dict[str, Any]) -> float:
    return datetime.fromisoformat(item["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()


def run(count: int, nodes: int, timeout: float, steady_seconds: float, poll_seconds: float,
        unrelated_pods: int) -> None:
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=nodes, progress=lambda m: print(m, file=sys.stderr))
        cluster.up(timeout=600)
        try:
            before = (lambda: _run_unrelated_pods(cluster, unrelated_pods, timeout)) if unrelated_pods else None
            with watching_operator(cluster, Path(state), NAMESPACE, "--resync-seconds", "300",
                                   "--metrics-port", "0", before=before) as (operator, log_path):
                idle_rss = _settled_rss(operator.pid)
                documents = yaml.safe_dump_all([_resource(i) for i in range(count)])
                with cluster.api_client() as api:
                    requests_before = apiserver_requests(api)
                components = {c.name: c.pid for c in cluster.status().components if c.pid}
                components_began = {name: Mark.of(pid) for name, pid in components.items()}
                began, began_wall = Mark.of(operator.pid), time.time()
                cluster.kubectl("create", "-f", "-", input=documents, timeout=1800)
                created = time.monotonic() - began.wall
                reconciled: dict[str, float] = {}
                latency: dict[str, float] = {}
                ready: dict[str, float] = {}
                all_reconciled: Mark | None = None
                path = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
                listed_bytes, polls = 0, 0
                with cluster.api_client() as api:
                    while len(ready) < count and time.monotonic() - began.wall < timeout:
                        listed = api.get(path, params={"resourceVersion": "0"}, timeout=60).raise_for_status()
                        listed_bytes, polls = len(listed.content), polls + 1
                        items = listed.json()["items"]
                        now = time.monotonic() - began.wall
                        for item in items:
                            name, status = item["metadata"]["name"], item.get("status") or {}
                            if status.get("observedGeneration") == item["metadata"]["generation"]:
                                if name not in reconciled:
                                    reconciled[name] = now
                                    latency[name] = began_wall + now - _created_at(item)
                                conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
                                if conditions.get("Ready") == "True":
                                    ready.setdefault(name, now)
                        if all_reconciled is None and len(reconciled) == count:
                            all_reconciled = Mark.of(operator.pid)
                            requests_reconciled = apiserver_requests(api)
                        time.sleep(poll_seconds)
                    all_ready = Mark.of(operator.pid)
                    components_ready = {name: Mark.of(pid) for name, pid in components.items()}
                    requests_ready = apiserver_requests(api)
                deployments = cluster.kubectl("get", "deployments", "-n", NAMESPACE, "--no-headers").stdout.count("\n")
                steady_from = Mark.of(operator.pid)
                time.sleep(steady_seconds)   # nothing changes now: what does the operator cost at rest?
                steady_to = Mark.of(operator.pid)
                with cluster.api_client() as api:
                    requests_steady = apiserver_requests(api)
                rss, peak = rss_kib(operator.pid)
                log_text = log_path.read_text(errors="replace")
        finally:
            cluster.down()
    print(f"machine: {machine()}; load average before {load_before}, after {load_average()}")
    unrelated = f", and {unrelated_pods} unrelated pods Running in the SDs' namespace" if unrelated_pods else ""
    print(f"cluster: {nodes} kwok nodes of {GPUS_PER_NODE} GPUs{unrelated}; SDs created: {count} in one kubectl create "
          f"({created:.1f} s, {count / created:.1f} SDs/s); Deployments: {deployments}")
    if reconciled:
        done = max(reconciled.values())
        values = list(latency.values())
        print(f"all {len(reconciled)} with children and status after {done:.1f} s: {len(reconciled) / done:.1f} SDs/s "
              f"(per object from its creation: p50 {percentile(values, 0.5):.1f} s, "
              f"p99 {percentile(values, 0.99):.1f} s)")
    if ready:
        print(f"{len(ready)} Ready after {max(ready.values()):.1f} s")
    print(f"polled the SDs {polls} times, every {poll_seconds:g} s (the last list: {listed_bytes / 1024:.0f} KiB, "
          f"{listed_bytes / max(count, 1) / 1024:.1f} KiB per SD)")
    retried = log_text.count("failed with an exception and will try again")
    dropped = len(re.findall(r"reconciling \S+ after a (?:child|spec) event failed", log_text))
    timeouts = len(re.findall(r"^httpx\d*\.\w*Timeout$", log_text, re.MULTILINE))   # a traceback's last line
    print(f"operator log: {retried} reconciles failed and retried by kopf, {dropped} child-triggered reconciles "
          f"failed (left to the resync); {timeouts} of the failures were client timeouts")
    if all_reconciled is not None:
        print(f"apiserver requests (all clients) from the create until all reconciled:\n"
              f"{request_deltas(requests_before, requests_reconciled)}")
    print(f"apiserver requests (all clients) from the create until all Ready:\n"
          f"{request_deltas(requests_before, requests_ready)}")
    print(f"apiserver requests at rest over {steady_seconds:.0f} s:\n{request_deltas(requests_ready, requests_steady, 6)}")
    busy = ", ".join(f"{name} {components_began[name].cpu_per_wall(components_ready[name]):.2f}"
                     for name in sorted(components, key=lambda n: -components_began[n].cpu_per_wall(components_ready[n])))
    print(f"control plane CPU (cores busy) from the create until all Ready: {busy}")
    print(f"operator RSS: idle (first listings settled) {idle_rss / 1024:.0f} MiB, at the end {rss / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB")
    reconcile_cpu = began.cpu_per_wall(all_reconciled) if all_reconciled else float("nan")
    print(f"operator CPU (cores busy): {reconcile_cpu:.2f} until all reconciled, "
          f"{began.cpu_per_wall(all_ready):.2f} until all Ready ({all_ready.cpu - began.cpu:.0f} CPU-s in all), "
          f"{steady_from.cpu_per_wall(steady_to):.3f} at rest over {steady_seconds:.0f} s")


def create_only(count: int, nodes: int) -> None:
    """The same `kubectl create` with no operator running: what the apiserver's admission and validation of
    the SDs (schema and CEL rules) cost by themselves, the floor under the reconciled time."""
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=nodes, progress=lambda m: print(m, file=sys.stderr))
        cluster.up(timeout=600)
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            wait_established(cluster, "speculativedeployments.specdeploy.io")
            cluster.kubectl("create", "namespace", NAMESPACE)
            documents = yaml.safe_dump_all([_resource(i) for i in range(count)])
            components = {c.name: c.pid for c in cluster.status().components if c.pid}
            began = {name: Mark.of(pid) for name, pid in components.items()}
            with cluster.api_client() as api:
                requests_before = apiserver_requests(api)
            start = time.monotonic()
            cluster.kubectl("create", "-f", "-", input=documents, timeout=1800)
            created = time.monotonic() - start
            ended = {name: Mark.of(pid) for name, pid in components.items()}
            with cluster.api_client() as api:
                requests_after = apiserver_requests(api)
        finally:
            cluster.down()
    print(f"machine: {machine()}; load average before {load_before}, after {load_average()}")
    print(f"no operator: {count} SDs created in one kubectl create in {created:.1f} s ({count / created:.1f} SDs/s)")
    busy = ", ".join(f"{name} {began[name].cpu_per_wall(ended[name]):.2f}"
                     for name in sorted(components, key=lambda n: -began[n].cpu_per_wall(ended[n])))
    print(f"control plane CPU (cores busy) during the create: {busy}")
    print(f"apiserver requests (all clients) during the create:\n{request_deltas(requests_before, requests_after)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=0, help="kwok nodes (8 GPUs each); 0: one GPU per SD, +2")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--steady-seconds", type=float, default=30)
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often the SDs are listed to see which are reconciled and Ready (a list of every SD)")
    parser.add_argument("--unrelated-pods", type=int, default=0,
                        help="pods of other workloads in the SDs' namespace, Running before the operator starts")
    parser.add_argument("--without-operator", action="store_true",
                        help="time only the create, with no operator running (the apiserver's own cost)")
    arguments = parser.parse_args()
    nodes = arguments.nodes or -(-arguments.count // GPUS_PER_NODE) + 2
    if arguments.without_operator:
        create_only(arguments.count, nodes)
    else:
        run(arguments.count, nodes, arguments.timeout, arguments.steady_seconds, arguments.poll_seconds,
            arguments.unrelated_pods)
