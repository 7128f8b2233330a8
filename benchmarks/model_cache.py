"""How long a rollback's new pod takes to start, with and without a weight cache, on the dev cluster.

    python benchmarks/model_cache.py [--hub-mibps 1000] [--nodes 2]

Starts its own dev cluster (Prometheus and the pod runner included) and the operator. For each
`spec.storage.modelCache` — emptyDir (the default: every new pod downloads again), hostPath and
persistentVolumeClaim — it runs an SD of Llama-3.1-8B-Instruct (15 GiB of weights in BF16) whose pods download
at `--hub-mibps` as the pod runner models it (devcluster/podrunner.py `_download`), makes its speculative pod run
out of memory (an immediate rollback), and prints, for the first speculative pod and for the rollback's pod, the
seconds from the pod's creation to its engine's first health answer. The simulator's own start (about a second)
is in both; a real engine's load of the weights from the cache into the GPU is in neither.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from bench_operator import watching_operator

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.waiters import get_json

NAMESPACE = "bench"
CACHES: dict[str, dict[str, Any]] = {
    "emptyDir": {},
    "hostPath": {"hostPath": {"path": "/var/lib/specdeploy-bench"}},
    "persistentVolumeClaim": {"persistentVolumeClaim": {"claimName": "weights"}},
}


def _sd(name: str, cache: dict[str, Any], hub_mibps: float, node: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1, "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "ngram", "numSpeculativeTokens": 4},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "engine": {"env": [{"name": "SPECDEPLOY_DEV_HUB_MIBPS", "value": f"{hub_mibps:g}"}]},
            "analysis": {"interval": "3s", "window": "20s", "baseline": {"mode": "Control", "controlReplicas": 1}},
            **({"storage": {"modelCache": cache}} if cache else {}),
            "podTemplate": {"spec": {"nodeSelector": {"kubernetes.io/hostname": node}}},
        },
    })


def _claim(cluster: DevCluster, directory: Path) -> None:
    """A PersistentVolume bound to the claim `weights`, as a ReadWriteMany volume would be."""
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "bench-weights"},
         "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "hostPath": {"path": str(directory)}, "claimRef": {"namespace": NAMESPACE, "name": "weights"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights", "namespace": NAMESPACE},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "bench-weights",
                  "resources": {"requests": {"storage": "100Gi"}}}},
    ]))


def _engine_ready_seconds(cluster: DevCluster, name: str, pod: dict[str, Any]) -> float:
    """Seconds from `pod`'s creation to its engine answering its health check (the pod runner's registry, polled
    every 0.1 s; the creation time is the apiserver's, to the second). kwok marks a pod Ready on its own, so the
    pod's Ready condition does not say when the engine is."""
    uid = pod["metadata"]["uid"]
    wait_for(lambda: any(s.uid == uid and s.ready for s in cluster.simulators(NAMESPACE, name)), 300,
             f"{name}: the engine of {pod['metadata']['name']} ready", interval=0.1)
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    return time.time() - created


def _speculative(cluster: DevCluster, name: str, other_than: str = "") -> dict[str, Any] | None:
    listing = get_json(cluster, "pods", "-l", f"specdeploy.io/name={name},specdeploy.io/variant=speculative",
                       namespace=NAMESPACE)
    pods = [p for p in listing["items"] if p["metadata"]["uid"] != other_than
            and not p["metadata"].get("deletionTimestamp")]
    return pods[0] if pods else None


def _measure(cluster: DevCluster, name: str, cache: dict[str, Any], hub_mibps: float, node: str) -> tuple[float, float]:
    """Seconds to a ready engine of the SD's first speculative pod and of its rollback's pod."""
    cluster.kubectl("apply", "-f", "-", input=_sd(name, cache, hub_mibps, node))
    first = wait_for(lambda: _speculative(cluster, name), 60, f"{name}: the first speculative pod", interval=0.1)
    first_seconds = _engine_ready_seconds(cluster, name, first)
    sd = f"{NAMESPACE}/{name}"
    wait_for(lambda: endpoints(cluster, sd, "control"), 300, f"{name}: the control's engine")
    wait_for(lambda: (get_json(cluster, "sd", name, namespace=NAMESPACE).get("status", {}).get("analysis") or {}).get(
        "lastSampleAt"), 120, f"{name}: a first sample")
    sim_admin(cluster, sd, "speculative", {"oom": True})
    rolled = wait_for(lambda: _speculative(cluster, name, other_than=first["metadata"]["uid"]), 120,
                      f"{name}: the rollback's pod", interval=0.1)
    return first_seconds, _engine_ready_seconds(cluster, name, rolled)


def run(hub_mibps: float, nodes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as state:
        cluster = DevCluster(Path(state) / "cluster", nodes=nodes, monitoring=True,
                             progress=lambda m: print(m, file=sys.stderr))
        cluster.up(timeout=600)
        try:
            with watching_operator(cluster, Path(state), NAMESPACE, "--prometheus-url", cluster.prometheus_url,
                                   "--analysis-tick-seconds", "1", "--resync-seconds", "3", "--metrics-port", "0"):
                _claim(cluster, Path(state) / "claim")
                node = get_json(cluster, "nodes")["items"][0]["metadata"]["name"]
                print(f"Llama-3.1-8B-Instruct, 15 GiB of weights, Hub at {hub_mibps:g} MiB/s; seconds from a pod's "
                      "creation to its engine's first health answer")
                print(f"{'modelCache':<24}{'first pod':>12}{'rollback pod':>15}")
                for index, (kind, cache) in enumerate(CACHES.items()):
                    first, rolled = _measure(cluster, f"cache-{index}", cache, hub_mibps, node)
                    print(f"{kind:<24}{first:>12.0f}{rolled:>15.0f}", flush=True)
        finally:
            cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub-mibps", type=float, default=1000.0, help="modelled download bandwidth, MiB/s")
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    run(args.hub_mibps, args.nodes)


if __name__ == "__main__":
    main()
