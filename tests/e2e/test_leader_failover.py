"""Two operators, one active: the active one dies right after deciding a rollback (before acting on it, without
releasing its Lease — as a lost node); the one waiting takes the Lease once it expires on its own clock and
finishes the rollback: exactly one rollback, one Event, one alert, within the Lease's duration plus its retry."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from e2e_resources import SCENARIO_NAME, serve_scenario

from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.simadmin import sim_admin
from specdeploy.devcluster.waiters import get_json, wait_for_object

pytestmark = pytest.mark.e2e

NAME = SCENARIO_NAME
LEASE_S, RETRY_S = 15, 5   # controller/leader.py's lease and its renew/retry period


def _speculative_args(cluster: DevCluster, namespace: str) -> list[str]:
    deployment = get_json(cluster, "deployment", NAME, namespace=namespace)
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _rollback_events(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    listing = get_json(cluster, "events", "--field-selector", f"involvedObject.name={NAME}", namespace=namespace)
    return [e for e in listing["items"] if e["reason"] == "SpeculationRolledBack"]


def _alerts(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.alertmanager_url}/api/v2/alerts", params={"filter": f'namespace="{namespace}"'})
    response.raise_for_status()
    return [a for a in response.json() if a["labels"].get("alertname") == "SpeculationRolledBack"]


def test_the_waiting_operator_finishes_the_rollback_the_active_one_died_deciding(
    dev_cluster: DevCluster, namespace: str, analysing_operator: Callable[..., Any]
) -> None:
    active = analysing_operator("active", env={"SPECDEPLOY_FAULT": "exit-after-rollback-decision"})
    wait_for(lambda: "acquired lease" in active.output(), 60, "the active operator's Lease", describe=active.output)
    standby = analysing_operator("standby")
    wait_for(lambda: "waiting for lease" in standby.output(), 60, "the standby waiting", describe=standby.output)
    serving = serve_scenario(dev_cluster, namespace)
    sim_admin(dev_cluster, serving, "speculative", {"oom": True})
    wait_for(lambda: active.process.poll() is not None, 90, "the active operator to die after its decision",
             describe=active.output)
    died = time.monotonic()
    speculation = get_json(dev_cluster, "sd", NAME, namespace=namespace)["status"]["speculation"]
    assert speculation["decided"] is False and speculation["lastRollback"], "decided, not acted on"
    assert "acquired lease" not in standby.output(), "no takeover while the active one lived"
    wait_for(lambda: "--speculative-config" not in _speculative_args(dev_cluster, namespace), LEASE_S + RETRY_S + 10,
             "the standby to roll the Deployment", describe=standby.output)
    finished = time.monotonic() - died
    wait_for_object(dev_cluster, ["sd", NAME], lambda o: o["status"]["speculation"]["lastRollback"].get("notified"),
                    30, "the rollback marked notified", namespace=namespace)
    wait_for(lambda: _alerts(dev_cluster, namespace), 30, "the alert")
    print(f"FAILOVER rollback finished by the standby {finished:.1f} s after the active operator died "
          f"(Lease {LEASE_S} s, retry {RETRY_S} s)")
    obj = get_json(dev_cluster, "sd", NAME, namespace=namespace)
    assert obj["status"]["speculation"]["rollbacks"] == 1
    assert len(_rollback_events(dev_cluster, namespace)) == 1
    assert len(_alerts(dev_cluster, namespace)) == 1
    assert "acquired lease" in standby.output() and standby.process.poll() is None
