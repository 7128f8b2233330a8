"""Engine pods come alive: the pod runner starts a simulator from each Running pod's own command line.

Each test applies rendered engine children (ConfigMap + Deployment, no operator) to its namespace and
watches what a kubelet would show: the simulator answers, Prometheus scrapes it under the PodMonitor's
labels, a crash lands in the pod's status with the log tail, and deleting the Deployment ends it all.
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from specdeploy.api.resource import load_resource
from specdeploy.devcluster import DevCluster, processes, wait_for
from specdeploy.devcluster.cli import endpoints_cmd
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.simregistry import SimulatorEndpoint
from specdeploy.devcluster.waiters import condition, get_json, wait_for_object
from specdeploy.judgment.oom import out_of_memory
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, desired_children

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NGRAM = "llama-8b-ngram"
START_TIMEOUT = 90.0


def _children(example: str, variants: tuple[Variant, ...]) -> list[dict[str, Any]]:
    """The example's ConfigMap and the Deployments of `variants`, one replica each."""
    resource = load_resource((REPO / "examples" / f"{example}.yaml").read_text())
    children = desired_children(resource, make_plan(resource.spec))
    deployments = [copy.deepcopy(children.deployments[v]) for v in variants]
    for deployment in deployments:
        deployment["spec"]["replicas"] = 1
    return [children.config_map, *deployments]


def _apply(cluster: DevCluster, namespace: str, manifests: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(manifests))


def _ready(cluster: DevCluster, namespace: str, sd: str, count: int,
           variant: str | None = None) -> list[SimulatorEndpoint]:
    def check() -> list[SimulatorEndpoint] | None:
        found = [s for s in cluster.simulators(namespace=namespace, sd=sd, variant=variant) if s.ready]
        return found if len(found) == count else None

    return wait_for(check, START_TIMEOUT, f"{count} ready simulators of {namespace}/{sd}",
                    describe=lambda: "registry: " + repr(cluster.simulators(namespace=namespace)))


def _query(cluster: DevCluster, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    return list(response.json()["data"]["result"])


def _pod_url(pod: dict[str, Any]) -> str:
    """Where a client that read the pod from the apiserver connects: its podIP and the engine's port "http"."""
    [port] = [p["containerPort"] for c in pod["spec"]["containers"] if c["name"] == "engine"
              for p in c["ports"] if p["name"] == "http"]
    return f"http://{pod['status']['podIP']}:{port}"


def _engine_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in pod["status"].get("containerStatuses") or [] if s["name"] == "engine")


def _pod_where(cluster: DevCluster, namespace: str, name: str, predicate: Callable[[dict[str, Any]], bool],
               what: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for_object(cluster, ["pod", name], predicate, timeout, f"{name}: {what}", namespace=namespace)


def test_engine_pods_come_alive_and_are_scraped_with_the_podmonitor_labels(
        dev_cluster: DevCluster, namespace: str) -> None:
    _apply(dev_cluster, namespace, _children(NGRAM, (Variant.SPECULATIVE, Variant.CONTROL)))
    sims = _ready(dev_cluster, namespace, NGRAM, 2)
    pods = {p["metadata"]["name"]: p for p in get_json(dev_cluster, "pods", "-l", f"specdeploy.io/name={NGRAM}",
                                                         namespace=namespace)["items"]}
    assert {s.pod for s in sims} == set(pods)
    # Reachable as in a real cluster: at the pod's own IP (a loopback address from kwok), on its container port.
    assert len({pod["status"]["podIP"] for pod in pods.values()}) == 2
    for sim in sims:
        pod_url = _pod_url(pods[sim.pod])
        assert sim.url == pod_url and not pod_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{pod_url}/health", timeout=5).status_code == 200
        assert httpx.get(f"{sim.url}/health", timeout=5).status_code == 200
        models = httpx.get(f"{sim.url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["meta-llama/Llama-3.1-8B-Instruct"]
        metrics = httpx.get(f"{sim.url}{sim.metrics_path}", timeout=5).text
        # The simulator parsed the pod's own command line: only the speculative pod has a speculative config.
        assert ("vllm:spec_decode_num_drafts_total" in metrics) == (sim.variant == "speculative"), sim.variant
        assert sim.pid and processes.alive(sim.pid)

    def scraped() -> list[dict[str, Any]] | None:
        found = _query(dev_cluster, f'up{{namespace="{namespace}",specdeploy_io_name="{NGRAM}"}} == 1')
        return found if len(found) == 2 else None

    series = wait_for(scraped, 30, "Prometheus scraping both simulators")
    labels = {(s["metric"]["pod"], s["metric"]["specdeploy_io_variant"]) for s in series}
    assert {s["metric"]["instance"] for s in series} == {_pod_url(pod).removeprefix("http://") for pod in pods.values()}
    assert labels == {(name, pod["metadata"]["labels"]["specdeploy.io/variant"]) for name, pod in pods.items()}
    engine_series = wait_for(lambda: _query(
        dev_cluster, f'vllm:num_requests_running{{namespace="{namespace}",specdeploy_io_name="{NGRAM}"}}'),
        30, "an engine metric scraped with the SD's labels")
    assert {s["metric"]["specdeploy_io_variant"] for s in engine_series} == {"speculative", "control"}

    # The load generator's and the demo's way in: the Service's endpoints, and knobs per variant.
    control = [s.url for s in sims if s.variant == "control"]
    assert endpoints(dev_cluster, f"{namespace}/{NGRAM}", "control") == control
    cli = CliRunner().invoke(endpoints_cmd, ["--state-dir", str(dev_cluster.state_dir), "--sd", f"{namespace}/{NGRAM}"])
    assert cli.exit_code == 0, cli.output
    assert sorted(cli.output.split()) == sorted(s.url for s in sims)
    results = sim_admin(dev_cluster, f"{namespace}/{NGRAM}", "control", {"acceptance": 0.3})
    assert [r.ok for r in results] == [True], results
    knobs = {s.variant: httpx.get(f"{s.url}/admin/knobs", timeout=5).json() for s in sims}
    assert knobs["control"]["acceptance"] == pytest.approx(0.3)
    assert knobs["speculative"]["acceptance"] != 0.3


def test_a_cuda_oom_shows_in_the_pod_status_as_a_kubelet_reports_it_and_the_engine_comes_back(
        dev_cluster: DevCluster, namespace: str) -> None:
    _apply(dev_cluster, namespace, _children(NGRAM, (Variant.SPECULATIVE,)))
    [sim] = _ready(dev_cluster, namespace, NGRAM, 1)
    sim_admin(dev_cluster, f"{namespace}/{NGRAM}", None, {"oom": True})   # it may die before it answers

    def crashed(pod: dict[str, Any]) -> bool:
        status = _engine_status(pod)
        return status.get("restartCount", 0) >= 1 and "terminated" in (status.get("lastState") or {})

    pod = _pod_where(dev_cluster, namespace, sim.pod, crashed, "restarted after the OOM")
    terminated = _engine_status(pod)["lastState"]["terminated"]
    assert terminated["reason"] == "Error"     # a CUDA OOM is a Python exception, not the kernel's OOMKilled
    assert terminated["exitCode"] != 0
    assert "CUDA out of memory" in terminated["message"]
    assert len(terminated["message"].encode()) <= 2048 and len(terminated["message"].splitlines()) <= 80
    assert terminated["startedAt"] <= terminated["finishedAt"]
    [oom] = out_of_memory([pod])                 # what the operator's analysis reads from the same status
    assert oom.pod == sim.pod and oom.exit_code == terminated["exitCode"]

    [again] = _ready(dev_cluster, namespace, NGRAM, 1)
    assert again.pid != sim.pid and again.address == sim.address and again.restarts >= 1
    assert httpx.get(f"{again.url}/health", timeout=5).status_code == 200
    back = _pod_where(dev_cluster, namespace, sim.pod,
                      lambda p: (condition(p, "Ready") or {}).get("status") == "True", "Ready again")
    status = _engine_status(back)
    assert "running" in status["state"] and status["ready"] is True
    assert status["lastState"]["terminated"]["message"] == terminated["message"]


def test_deleting_the_deployment_stops_the_simulators_and_drops_their_targets(
        dev_cluster: DevCluster, namespace: str) -> None:
    _apply(dev_cluster, namespace, _children(NGRAM, (Variant.SPECULATIVE, Variant.CONTROL)))
    sims = _ready(dev_cluster, namespace, NGRAM, 2)
    targets = {name for name, groups in dev_cluster.scrape_targets().items()
               if groups[0]["labels"].get("namespace") == namespace}
    assert len(targets) == 2
    wait_for(lambda: len(_query(dev_cluster, f'up{{namespace="{namespace}"}} == 1')) == 2, 30,
             "both simulators scraped")

    dev_cluster.kubectl("delete", "deployments", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not dev_cluster.simulators(namespace=namespace), 60, "the simulators to be gone")
    assert not any(processes.alive(s.pid) for s in sims)
    assert not targets & set(dev_cluster.scrape_targets())
    wait_for(lambda: not _query(dev_cluster, f'up{{namespace="{namespace}"}}'), 30,
             "Prometheus to stop scraping them")


def test_an_argv_the_engine_rejects_crash_loops_with_the_rejection_in_last_state(
        dev_cluster: DevCluster, namespace: str) -> None:
    manifests = _children(NGRAM, (Variant.SPECULATIVE,))
    container = manifests[1]["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [*container["args"], "--speculative-model", "meta-llama/Llama-3.2-1B-Instruct"]
    _apply(dev_cluster, namespace, manifests)

    def looping(pod: dict[str, Any]) -> bool:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        return bool(statuses) and _engine_status(pod).get("restartCount", 0) >= 2

    def pod_name() -> str | None:
        items = get_json(dev_cluster, "pods", "-l", f"specdeploy.io/name={NGRAM}", namespace=namespace)["items"]
        return str(items[0]["metadata"]["name"]) if items else None

    pod = _pod_where(dev_cluster, namespace, wait_for(pod_name, 60, "the engine pod"), looping, "in a crash loop")
    status = _engine_status(pod)
    terminated = status["lastState"]["terminated"]
    assert terminated["exitCode"] != 0 and terminated["reason"] == "Error"
    assert "--speculative-model" in terminated["message"], terminated["message"]
    assert status["ready"] is False
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert (condition(pod, "Ready") or {}).get("status") == "False"
    assert not any(s.ready for s in dev_cluster.simulators(namespace=namespace))


def test_trtllm_pods_read_their_yaml_from_the_configmap_and_are_scraped_on_prometheus_metrics(
        dev_cluster: DevCluster, namespace: str) -> None:
    example = "trtllm-llama-8b-eagle3"
    sd = str(load_resource((REPO / "examples" / f"{example}.yaml").read_text()).metadata.name)
    _apply(dev_cluster, namespace, _children(example, (Variant.SPECULATIVE,)))
    [sim] = _ready(dev_cluster, namespace, sd, 1)
    assert sim.engine == "trtllm" and sim.metrics_path == "/prometheus/metrics"
    assert "trtllm_" in httpx.get(f"{sim.url}{sim.metrics_path}", timeout=5).text
    wait_for(lambda: _query(dev_cluster, f'up{{namespace="{namespace}",specdeploy_io_name="{sd}"}} == 1'), 30,
             "Prometheus scraping the TRT-LLM simulator")


def test_down_stops_every_simulator_even_after_the_runner_was_killed(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "runner-killed", nodes=1, monitoring=True)
    try:
        cluster.up()
        cluster.kubectl("create", "namespace", "engines")
        wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", "engines", check=False).returncode == 0, 30,
                 "ServiceAccount engines/default")
        _apply(cluster, "engines", _children(NGRAM, (Variant.SPECULATIVE, Variant.CONTROL)))
        sims = _ready(cluster, "engines", NGRAM, 2)
        runner = next(c for c in cluster.status().components if c.name == "pod-runner")
        os.kill(runner.pid, signal.SIGKILL)         # no chance to clean up
        wait_for(lambda: not processes.alive(runner.pid), 10, "the pod runner to die")
        assert all(processes.alive(s.pid) for s in sims)
        cluster.down()
        assert not any(processes.alive(s.pid) for s in sims)
        assert not cluster.state_dir.exists()
    finally:
        cluster.down()
