"""Faults where production would break the operator: the kube-apiserver restarted under it, Prometheus
killed mid-analysis, the operator SIGKILLed at random points of a rollback, the SD deleted during one.

These restart cluster components, so they want the session's own dev cluster (leave
SPECDEPLOY_E2E_CLUSTER_DIR unset). SPECDEPLOY_FAULT_RUNS (default 1; `make test-long`: 20) is how many
seeded random SIGKILL runs of the rollback scenario to make; SPECDEPLOY_FAULT_SEED (default 7) seeds them.
Each test prints what it measured (`FAULTS ...` lines, seen with `pytest -s`); docs/reliability.md
records them.
"""

from __future__ import annotations

import datetime
import os
import random
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2e_resources import POD_MONITOR_CRD, SCENARIO_NAME, SCENARIO_SD

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import endpoints, sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import condition, get_json, wait_for_absent, wait_for_object

pytestmark = pytest.mark.e2e

NAME = SCENARIO_NAME
FAULT_RUNS = int(os.environ.get("SPECDEPLOY_FAULT_RUNS", "1"))
FAULT_SEED = int(os.environ.get("SPECDEPLOY_FAULT_SEED", "7"))
DECISION_LOGGED = re.compile(rf"{NAME} rolled back: ")
LEASE = "specdeploy-operator"


def _measured(what: str, **figures: object) -> None:
    """One line of figures for docs/reliability.md (printed; `pytest -s` shows it)."""
    print(f"FAULTS {what}: " + " ".join(f"{key}={value}" for key, value in figures.items()), file=sys.stderr,
          flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def analysing_operator(dev_cluster: DevCluster, operator_processes: Callable[..., Any]) -> Callable[..., Any]:
    """Start an operator that samples Prometheus every second and alerts the dev Alertmanager."""

    def start(label: str = "operator") -> Any:
        port = _free_port()
        process = operator_processes(
            label, "--prometheus-url", dev_cluster.prometheus_url, "--alertmanager-url",
            dev_cluster.alertmanager_url, "--analysis-tick-seconds", "1", "--metrics-port", str(port))
        process.metrics_url = f"http://127.0.0.1:{port}/metrics"
        return process

    return start


@pytest.fixture
def apiserver_restored(dev_cluster: DevCluster) -> Iterator[None]:
    """Whatever the test does to the kube-apiserver, the session's cluster gets it back."""
    yield
    dev_cluster.start_component("kube-apiserver")


@pytest.fixture
def prometheus_restored(dev_cluster: DevCluster) -> Iterator[None]:
    yield
    dev_cluster.start_component("prometheus")


# --- reading the cluster ------------------------------------------------------------------------------

def _sd(cluster: DevCluster, namespace: str, name: str = NAME) -> dict[str, Any]:
    return get_json(cluster, "sd", name, namespace=namespace)


def _analysis(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("analysis") or {})


def _speculation(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status", {}).get("speculation") or {})


def _rolled_back(obj: dict[str, Any]) -> bool:
    return _speculation(obj).get("active") is False and bool(_speculation(obj).get("lastRollback"))


def _events(cluster: DevCluster, namespace: str, name: str = NAME) -> list[dict[str, Any]]:
    listing = get_json(cluster, "events", "--field-selector", f"involvedObject.name={name}", namespace=namespace)
    return list(listing["items"])


def _rollback_events(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    return [e for e in _events(cluster, namespace) if e["reason"] == "SpeculationRolledBack"]


def _alerts(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.alertmanager_url}/api/v2/alerts", params={"filter": f'namespace="{namespace}"'},
                         timeout=10)
    response.raise_for_status()
    return [a for a in response.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]


def _deployments(cluster: DevCluster, namespace: str, name: str = NAME) -> dict[str, dict[str, Any]]:
    listing = get_json(cluster, "deployments", "-l", f"specdeploy.io/name={name}", namespace=namespace)
    return {d["metadata"]["name"]: d for d in listing["items"]}


def _args(deployment: dict[str, Any]) -> list[str]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _rendered_from(deployment: dict[str, Any] | None, generation: int) -> bool:
    """The Deployment exists and was applied from SD generation `generation`."""
    annotations = (deployment or {}).get("metadata", {}).get("annotations") or {}
    return annotations.get("specdeploy.io/generation") == str(generation)


def _serve(cluster: DevCluster, namespace: str, resource: str = SCENARIO_SD) -> str:
    """Apply the scenario SD (an operator runs), wait for both variants' simulators, set acceptance 0.8;
    returns NAMESPACE/NAME."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=resource)
    sd = f"{namespace}/{NAME}"
    wait_for(lambda: endpoints(cluster, sd, "speculative") and endpoints(cluster, sd, "control"), 120,
             "both variants' simulators")
    assert all(result.ok for result in sim_admin(cluster, sd, "speculative", {"acceptance": 0.8}))
    return sd


def _healthy(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return wait_for_object(cluster, ["sd", NAME], lambda o: _analysis(o).get("verdict") == "Healthy", 120,
                           "a healthy sample at acceptance 0.8", namespace=namespace)


def _operator_counter(metrics_url: str, family: str) -> float:
    """The sum of a counter or histogram count family on the operator's /metrics."""
    text = httpx.get(metrics_url, timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family))


# --- 1. the kube-apiserver restarted -------------------------------------------------------------------

def _small_sd(name: str, tokens: int = 4) -> str:
    """An SD with one speculative pod and no Control: cheap, for tests about the control plane."""
    return f"""
apiVersion: specdeploy.io/v1alpha1
kind: SpeculativeDeployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  model: {{name: meta-llama/Llama-3.1-8B-Instruct}}
  speculation: {{method: ngram, numSpeculativeTokens: {tokens}}}
  serving: {{maxModelLen: 8192, maxNumSeqs: 32}}
  analysis: {{baseline: {{mode: None}}}}
"""


def _reconciled(cluster: DevCluster, namespace: str, name: str, generation: int) -> bool:
    obj = _sd(cluster, namespace, name)
    return (obj.get("status", {}).get("observedGeneration") == generation
            and _rendered_from(_deployments(cluster, namespace, name).get(name), generation))


def _lease(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    return dict(get_json(cluster, "lease", LEASE, namespace=namespace)["spec"])


def _changes_after_the_outage(cluster: DevCluster, namespace: str) -> dict[str, float]:
    """Right after the apiserver answers again: change `kept`'s spec, create `created`, delete `deleted`;
    wait until all three converge; seconds each took."""
    began = time.monotonic()
    cluster.kubectl("patch", "sd", "kept", "-n", namespace, "--type=merge", "-p",
                    '{"spec": {"speculation": {"numSpeculativeTokens": 5}}}')
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_small_sd("created"))
    cluster.kubectl("delete", "sd", "deleted", "-n", namespace, "--wait=false")
    took: dict[str, float] = {}
    pending = {
        "kept": lambda: _reconciled(cluster, namespace, "kept", 2),
        "created": lambda: _reconciled(cluster, namespace, "created", 1),
        "deleted": lambda: not _deployments(cluster, namespace, "deleted"),
    }

    def converged() -> bool:
        for name, check in list(pending.items()):
            if check():
                took[name] = round(time.monotonic() - began, 1)
                del pending[name]
        return not pending

    wait_for(converged, 120, "the changed, the created and the deleted SD to converge",
             describe=lambda: f"still pending: {sorted(pending)}")
    deployment = _deployments(cluster, namespace, "kept")["kept"]
    assert '"num_speculative_tokens":5' in " ".join(_args(deployment))
    return took


def _two_reconciled_sds(cluster: DevCluster, namespace: str) -> None:
    for name in ("kept", "deleted"):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=_small_sd(name))
    wait_for(lambda: all(_reconciled(cluster, namespace, n, 1) for n in ("kept", "deleted")), 90,
             "the two SDs reconciled")


def test_kube_apiserver_restart_the_operator_resumes_its_watches_and_misses_nothing(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any], apiserver_restored: None
) -> None:
    """kill -9 and restart of the apiserver (about 2 s without it): the same operator process rides it out,
    keeps its lease, and its watches alone (the resync is 10 minutes here) see every change made the moment
    the apiserver is back."""
    operator = operator_processes("operator", "--resync-seconds", "600")
    _two_reconciled_sds(dev_cluster, namespace)
    holder = _lease(dev_cluster, namespace)["holderIdentity"]
    down = time.monotonic()
    dev_cluster.stop_component("kube-apiserver", crash=True)
    dev_cluster.start_component("kube-apiserver")
    back = datetime.datetime.now(datetime.UTC)
    outage = time.monotonic() - down
    took = _changes_after_the_outage(dev_cluster, namespace)
    assert operator.process.poll() is None, "the operator rode the restart out\n" + operator.output()[-3000:]
    lease = wait_for(lambda: (spec := _lease(dev_cluster, namespace)) and _parse_time(spec["renewTime"]) > back
                     and spec, 30, "the lease renewed after the restart")
    assert lease["holderIdentity"] == holder, "still the same operator holds the lease"
    _measured("apiserver-restart", outage_s=round(outage, 1), **{f"{k}_converged_s": v for k, v in took.items()})


def test_kube_apiserver_outage_longer_than_the_lease_stops_the_operator_and_its_successor_converges(
    dev_cluster: DevCluster, namespace: str, operator_processes: Callable[..., Any], apiserver_restored: None
) -> None:
    """An apiserver gone for longer than the lease's renew deadline (10 s): the operator cannot know it still
    leads, so it stops itself (its Deployment restarts it); the successor converges everything."""
    first = operator_processes("first", "--resync-seconds", "600")
    _two_reconciled_sds(dev_cluster, namespace)
    down = time.monotonic()
    dev_cluster.stop_component("kube-apiserver", crash=True)
    wait_for(lambda: first.process.poll() is not None, 60, "the operator to stop itself without the apiserver",
             describe=lambda: first.output()[-3000:])
    gave_up = time.monotonic() - down
    assert "lost the operator lease" in first.output()
    dev_cluster.start_component("kube-apiserver")
    outage = time.monotonic() - down
    successor_started = time.monotonic()
    operator_processes("successor", "--resync-seconds", "600")
    took = _changes_after_the_outage(dev_cluster, namespace)
    _measured("apiserver-outage", stopped_itself_after_s=round(gave_up, 1), exit_code=first.process.returncode,
              outage_s=round(outage, 1), successor_converged_s=round(time.monotonic() - successor_started, 1),
              **{f"{k}_converged_s": v for k, v in took.items()})
