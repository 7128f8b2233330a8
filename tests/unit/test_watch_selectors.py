"""kopf's watches of the children carry a label selector the apiserver applies, and it selects every child.

Without it kopf lists and watches every pod and Deployment of the watched namespaces and filters them in
the operator: its memory grows with the cluster, not with its SDs (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from specdeploy.api.resource import load_resource
from specdeploy.controller.handlers import CHILDREN_SELECTOR, configure
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import desired_children

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _selectors(group: str, plural: str, kind: str) -> list[str]:
    settings = kopf.OperatorSettings()
    configure(settings)
    resource = kopf.Resource(group, "v1", plural, kind=kind, namespaced=True, preferred=True)
    return settings.watching.label_selectors.collect(resource)


def test_pods_and_deployments_are_watched_with_the_childrens_label() -> None:
    assert _selectors("", "pods", "Pod") == [CHILDREN_SELECTOR]
    assert _selectors("apps", "deployments", "Deployment") == [CHILDREN_SELECTOR]


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
