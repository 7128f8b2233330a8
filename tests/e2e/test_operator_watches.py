"""The operator's watches of pods and Deployments carry a label selector, as the apiserver received them.

The dev cluster's audit log keeps the start of every watch of pods and Deployments with its URL
(devcluster/audit.py). Without the selector the apiserver sends every pod of the watched namespaces and the
operator filters them itself: its memory grows with the cluster (docs/performance.md, 2026-12-05).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from specdeploy.controller.handlers import CHILDREN_SELECTOR
from specdeploy.devcluster import DevCluster, wait_for
from specdeploy.devcluster.audit import audit_entries

pytestmark = pytest.mark.e2e


def _watches(cluster: DevCluster, namespace: str, since: float) -> dict[str, list[dict[str, list[str]]]]:
    """The query of each watch of pods and Deployments in `namespace` begun since `since`, by resource."""
    found: dict[str, list[dict[str, list[str]]]] = {"pods": [], "deployments": []}
    for entry in audit_entries(cluster.audit_log, since):
        ref: dict[str, Any] = entry.get("objectRef") or {}
        if entry["verb"] == "watch" and ref.get("namespace") == namespace and ref.get("resource") in found:
            found[ref["resource"]].append(parse_qs(urlsplit(entry["requestURI"]).query))
    return found


@pytest.fixture
def began(namespace: str) -> float:
    """When the test began: before the operator (requested after this) started."""
    return time.time() - 1   # the audit log's timestamps are in microseconds, the clock is the same


def test_pods_and_deployments_are_watched_with_the_childrens_selector(
        dev_cluster: DevCluster, crds: None, began: float, operator: None, namespace: str) -> None:
    def both_watched() -> dict[str, list[dict[str, list[str]]]] | None:
        watches = _watches(dev_cluster, namespace, began)
        return watches if all(watches.values()) else None

    watches = wait_for(both_watched, 60, "the operator's watches of pods and Deployments in the audit log",
                       interval=1)
    for resource, queries in watches.items():
        for query in queries:
            assert query.get("labelSelector") == [CHILDREN_SELECTOR], (resource, query)
