"""kopf's watches of the children carry a label selector the apiserver applies, and it selects every child.

Without it kopf lists and watches every pod and Deployment of the watched namespaces and filters them in
the operator: its memory grows with the cluster, not with its SDs (docs/performance.md). LeaderWorkerSets are
watched only where the operator runs them, and their events reach the same handler as a Deployment's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from specdeploy.api.resource import load_resource
from specdeploy.controller.handlers import (
    CHILDREN_SELECTOR,
    LEADER_WORKER_SETS,
    child_changed,
    configure,
    watch_leader_worker_sets,
)
from specdeploy.controller.watched import Watched
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import desired_children
from specdeploy.reconcile.leaderworkerset import LWS_KIND, LeaderWorkerSets

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _selectors(group: str, plural: str, kind: str) -> list[str]:
    settings = kopf.OperatorSettings()
    configure(settings)
    resource = kopf.Resource(group, "v1", plural, kind=kind, namespaced=True, preferred=True)
    return settings.watching.label_selectors.collect(resource)


def test_pods_and_deployments_are_watched_with_the_childrens_label() -> None:
    assert _selectors("", "pods", "Pod") == [CHILDREN_SELECTOR]
    assert _selectors("apps", "deployments", "Deployment") == [CHILDREN_SELECTOR]
    assert _selectors(*LEADER_WORKER_SETS[::2], "LeaderWorkerSet") == [CHILDREN_SELECTOR]


def test_nothing_else_is_selected() -> None:
    """The SDs are the users' objects: every one of them is watched, whatever its labels."""
    assert _selectors("specdeploy.io", "speculativedeployments", "SpeculativeDeployment") == []
    assert _selectors("apps", "replicasets", "ReplicaSet") == []


@pytest.mark.parametrize("name", ["llama-8b-ngram.yaml", "sglang-llama-8b-eagle3.yaml"])
def test_every_rendered_deployment_and_its_pods_match_the_selector(name: str) -> None:
    resource = load_resource((EXAMPLES / name).read_text())
    key, value = CHILDREN_SELECTOR.split("=")
    children = desired_children(resource, make_plan(resource.spec))
    assert children.deployments
    for deployment in children.deployments.values():
        assert deployment["metadata"]["labels"][key] == value
        assert deployment["spec"]["template"]["metadata"]["labels"][key] == value


def _group_watchers(registry: kopf.OperatorRegistry) -> list[Any]:
    group = kopf.Resource(*LEADER_WORKER_SETS, kind=LWS_KIND, namespaced=True, preferred=True)
    return [h for h in registry._watching.get_all_handlers() if h.selector is not None and h.selector.check(group)]


def test_leader_worker_sets_are_watched_only_where_the_operator_runs_them() -> None:
    """An operator without the CRD or the RBAC registers no watch: kopf would log the resource as unresolved, or
    the watch's 403."""
    without = kopf.OperatorRegistry()
    watch_leader_worker_sets(without, LeaderWorkerSets(usable=False, why_not="no CRD"))
    assert _group_watchers(without) == []
    with_groups = kopf.OperatorRegistry()
    watch_leader_worker_sets(with_groups, LeaderWorkerSets(usable=True, why_not=""))
    [handler] = _group_watchers(with_groups)
    assert handler.fn is child_changed and handler.id == "child_changed"


class _Requests:
    def __init__(self) -> None:
        self.watched, self.passes = Watched(), []

    def request(self, namespace: str, name: str) -> None:
        self.passes.append((namespace, name))


def test_a_group_event_is_kept_under_its_kind_and_asks_its_sd_for_a_pass() -> None:
    reconciler = _Requests()
    memo = SimpleNamespace(reconciler=reconciler)
    group = kopf.Resource(*LEADER_WORKER_SETS, kind=LWS_KIND, namespaced=True, preferred=True)
    body = {"kind": LWS_KIND, "metadata": {"name": "big-control", "namespace": "team", "resourceVersion": "7"}}

    def event(kind: str) -> None:
        asyncio.run(child_changed(event={"object": body}, resource=group, namespace="team", name="big-control",
                                  labels={"specdeploy.io/name": "big"}, memo=memo, type=kind))

    event("MODIFIED")
    assert reconciler.watched.current(LWS_KIND, "team", "big-control") == body
    assert reconciler.watched.current("Deployment", "team", "big-control") is None
    assert reconciler.passes == [("team", "big")]
    event("DELETED")
    assert reconciler.watched.current(LWS_KIND, "team", "big-control") is None
    assert reconciler.passes == [("team", "big")] * 2
