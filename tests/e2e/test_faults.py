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
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2e_resources import POD_MONITOR_CRD, SCENARIO_NAME, SCENARIO_SD, serve_scenario

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.traffic import Traffic
from specdeploy.devcluster.waiters import (
    condition,
    get_json,
    wait_established,
    wait_for_absent,
    wait_for_object,
)

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


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))



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
    lease = _lease(dev_cluster, namespace)
    holder = lease["holderIdentity"]
    # right after a renewal, so the outage has the whole renew deadline (10 s) to be ridden out, not 5-10 s
    wait_for(lambda: _lease(dev_cluster, namespace)["renewTime"] != lease["renewTime"], 30, "a lease renewal",
             interval=0.1)
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


# --- 2. Prometheus killed mid-analysis -----------------------------------------------------------------

def _after(obj: dict[str, Any], moment: datetime.datetime) -> bool:
    sampled = _analysis(obj).get("lastSampleAt")
    return bool(sampled) and _parse_time(sampled) > moment


def test_prometheus_killed_mid_analysis_no_spurious_rollback_and_a_real_regression_rolls_back_once(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any], prometheus_restored: None
) -> None:
    """kill -9 of Prometheus twice: while healthy (the gap in its data must not look like a regression),
    and between the failing samples of a real acceptance collapse (which must still roll back, once)."""
    analysing_operator()
    # failureLimit 4 (3 s apart): room to kill Prometheus between the first failing sample and the rollback
    serving = serve_scenario(dev_cluster, namespace, SCENARIO_SD.replace("failureLimit: 2", "failureLimit: 4"))
    traffic = Traffic(dev_cluster, serving, qps=4, duration=300).start()
    try:
        _healthy(dev_cluster, namespace)
        dev_cluster.stop_component("prometheus", crash=True)
        dev_cluster.start_component("prometheus")
        back = datetime.datetime.now(datetime.UTC)
        # a whole window (20 s) that spans the gap, sampled after Prometheus came back
        resumed = wait_for_object(
            dev_cluster, ["sd", NAME],
            lambda o: _rolled_back(o) or (_after(o, back + datetime.timedelta(seconds=20))
                                          and _analysis(o).get("verdict") == "Healthy"),
            120, "a healthy sample over a window spanning the gap", namespace=namespace)
        assert not _rolled_back(resumed), _speculation(resumed)
        gap_resumed_s = (datetime.datetime.now(datetime.UTC) - back).total_seconds()

        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        failing = wait_for_object(dev_cluster, ["sd", NAME],
                                  lambda o: _rolled_back(o) or _analysis(o).get("consecutiveFailures", 0) >= 1,
                                  90, "a first failing sample", namespace=namespace)
        assert not _rolled_back(failing), "killed between the failing samples, not after the rollback"
        dev_cluster.stop_component("prometheus", crash=True)
        dev_cluster.start_component("prometheus")
        back = datetime.datetime.now(datetime.UTC)
        obj = wait_for_object(dev_cluster, ["sd", NAME], _rolled_back, 120, "the rollback", namespace=namespace)
        rolled_back_s = (datetime.datetime.now(datetime.UTC) - back).total_seconds()
        # a few more cycles while rolled back: no second rollback, Event or alert
        settled = _parse_time(obj["status"]["analysis"]["lastSampleAt"]) + datetime.timedelta(seconds=10)
        obj = wait_for_object(dev_cluster, ["sd", NAME], lambda o: _after(o, settled), 60,
                              "samples taken while rolled back", namespace=namespace)
    finally:
        traffic.stop()
    assert _speculation(obj)["rollbacks"] == 1
    assert _speculation(obj)["lastRollback"]["reason"] == "AcceptanceBelowMinimum"
    assert len(wait_for(lambda: _rollback_events(dev_cluster, namespace), 30, "the Event")) == 1
    assert len(wait_for(lambda: _alerts(dev_cluster, namespace), 30, "the alert")) == 1
    _measured("prometheus-kill", healthy_window_after_gap_s=round(gap_resumed_s, 1),
              rollback_after_restart_s=round(rolled_back_s, 1))


# --- 3. the operator SIGKILLed at random points of the rollback ----------------------------------------

def _kill_point(run: int) -> tuple[str, float]:
    """Where run `run` kills the operator: even runs a random 0-0.5 s after the decision is logged (the
    rollback's apply, Event, alert and `notified` write take about that long); odd runs a random 0-20 s
    after the acceptance collapse (before, during or after the decision, which comes about 10 s in)."""
    rng = random.Random(FAULT_SEED * 1000 + run)
    return ("after-decision", rng.uniform(0.0, 0.5)) if run % 2 == 0 else ("after-collapse", rng.uniform(0.0, 20.0))


def _consistent_after_rollback(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    """Wait until the rollback is finished everywhere, then check it happened exactly once."""
    wait_for(lambda: "--speculative-config" not in _args(_deployments(cluster, namespace)[NAME]), 90,
             "the Deployment rolled without speculation")
    obj = wait_for_object(cluster, ["sd", NAME],
                          lambda o: _rolled_back(o) and _speculation(o)["lastRollback"].get("notified") is True
                          and (condition(o, "Ready") or {}).get("status") == "True", 120,
                          "the rollback notified and the SD Ready", namespace=namespace)
    settled = _parse_time(obj["status"]["analysis"]["lastSampleAt"]) + datetime.timedelta(seconds=8)
    obj = wait_for_object(cluster, ["sd", NAME], lambda o: _after(o, settled), 60, "samples after the rollback",
                          namespace=namespace)
    assert _speculation(obj)["active"] is False and _speculation(obj)["rollbacks"] == 1, _speculation(obj)
    assert obj["metadata"]["generation"] == 1 and obj["status"]["observedGeneration"] == 1
    events = _rollback_events(cluster, namespace)
    assert len(events) == 1 and events[0]["count"] == 1, events
    alerts = wait_for(lambda: _alerts(cluster, namespace), 30, "the alert")
    assert len(alerts) == 1 and alerts[0]["labels"]["name"] == NAME, alerts
    deployments = _deployments(cluster, namespace)
    assert sorted(deployments) == [NAME, f"{NAME}-control"]
    assert all("--speculative-config" not in _args(d) for d in deployments.values())
    config = get_json(cluster, "configmap", f"{NAME}-engine", namespace=namespace)
    assert all("--speculative-config" not in text for text in config["data"].values()), "the plans' argv too"
    return obj


@pytest.mark.parametrize("run", range(FAULT_RUNS))
def test_operator_sigkilled_at_a_random_point_of_the_rollback_rolls_back_exactly_once(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any], run: int
) -> None:
    where, delay = _kill_point(run)
    first = analysing_operator("first")
    serving = serve_scenario(dev_cluster, namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=300).start()
    try:
        _healthy(dev_cluster, namespace)
        collapsed = time.monotonic()
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        if where == "after-decision":
            wait_for(lambda: DECISION_LOGGED.search(first.output()), 120, "the rollback decision",
                     interval=0.02, describe=lambda: first.output()[-3000:])
        time.sleep(delay)   # the seeded random kill point itself, not a wait for a condition
        first.kill()
        killed_after = time.monotonic() - collapsed
        before = _sd(dev_cluster, namespace)
        decided, notified = _rolled_back(before), bool(_speculation(before).get("lastRollback", {}).get("notified"))
        applied = "--speculative-config" not in _args(_deployments(dev_cluster, namespace)[NAME])
        restarted = time.monotonic()
        second = analysing_operator("restarted")
        obj = _consistent_after_rollback(dev_cluster, namespace)
    finally:
        traffic.stop()
    assert "Traceback" not in second.output(), second.output()[-5000:]
    _measured(f"sigkill-run-{run}", where=where, delay_s=round(delay, 2), killed_after_collapse_s=round(killed_after, 1),
              decided_before_kill=decided, applied_before_kill=applied, notified_before_kill=notified,
              converged_after_restart_s=round(time.monotonic() - restarted, 1),
              reason=_speculation(obj)["lastRollback"]["reason"])


# --- 4. the SD deleted during its rollback -------------------------------------------------------------

def _leftovers(cluster: DevCluster, namespace: str) -> list[str]:
    """Everything of SD NAME still in the cluster or the pod runner."""
    found = []
    for kind in ("deployments", "replicasets", "pods", "services", "configmaps", "podmonitors"):
        listing = get_json(cluster, kind, "-l", f"specdeploy.io/name={NAME}", namespace=namespace)
        found += [f"{kind}/{item['metadata']['name']}" for item in listing["items"]]
    found += [f"simulator/{s.pod}" for s in cluster.simulators(namespace=namespace, sd=NAME)]
    return found


def test_sd_deleted_during_its_rollback_everything_is_cleaned_up(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]
) -> None:
    dev_cluster.kubectl("apply", "--server-side", "-f", "-", input=POD_MONITOR_CRD)
    wait_established(dev_cluster, "podmonitors.monitoring.coreos.com")
    operator = analysing_operator(metrics=True)
    serving = serve_scenario(dev_cluster, namespace)
    assert get_json(dev_cluster, "podmonitor", NAME, namespace=namespace)
    traffic = Traffic(dev_cluster, serving, qps=4, duration=240).start()
    try:
        _healthy(dev_cluster, namespace)
        sim_admin(dev_cluster, serving, "speculative", {"acceptance": 0.3})
        wait_for(lambda: DECISION_LOGGED.search(operator.output()), 120, "the rollback decision", interval=0.02,
                 describe=lambda: operator.output()[-3000:])
        dev_cluster.kubectl("delete", "sd", NAME, "-n", namespace, "--wait=false")
        deleted = time.monotonic()
    finally:
        traffic.stop()
    wait_for(lambda: not _leftovers(dev_cluster, namespace), 120, "every child, pod and simulator gone",
             describe=lambda: str(_leftovers(dev_cluster, namespace)))
    cleaned_s = time.monotonic() - deleted
    log_at_cleanup = len(operator.output())
    events_at_cleanup = len(_events(dev_cluster, namespace))
    cycles = _operator_counter(operator.metrics_url, "specdeploy_analysis_cycle_seconds_count")
    # ten more analysis cycles (1 s apart) and three resyncs (3 s) with the SD gone
    wait_for(lambda: _operator_counter(operator.metrics_url, "specdeploy_analysis_cycle_seconds_count") >= cycles + 10,
             60, "ten more analysis cycles")
    wait_for_absent(dev_cluster, ["sd", NAME], 30, namespace=namespace)
    assert len(_events(dev_cluster, namespace)) == events_at_cleanup, "no Event loop"
    assert len(_alerts(dev_cluster, namespace)) <= 1, "no alert loop"
    later = operator.output()[log_at_cleanup:]
    assert NAME not in later, f"nothing more about the deleted SD:\n{later[-3000:]}"
    assert "Traceback" not in operator.output(), operator.output()[-5000:]
    assert operator.process.poll() is None
    _measured("sd-deleted-during-rollback", cleaned_up_s=round(cleaned_s, 1))
