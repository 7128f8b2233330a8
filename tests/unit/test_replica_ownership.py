"""Scaling: who sets a Deployment's replicas (the SD through its scale subresource, or another writer the operator
leaves alone), and what the scale subresource and READY read from status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdeploy.api.resource import load_resource
from specdeploy.api.status import SpeculativeDeploymentStatus
from specdeploy.clients.kube import FIELD_MANAGER, deployment_state
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import (
    ANNOTATION_REPLICAS,
    LABEL_NAME,
    LABEL_VARIANT,
    Variant,
    desired_children,
)
from specdeploy.reconcile.decide import replicas_held
from specdeploy.reconcile.status import DeploymentState, with_scale

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-ngram.yaml"   # replicas 2, control 1
NAME = "llama-8b-ngram"


def _deployment_body(variant: str, *, managers: list[tuple[str, str | None]], rendered: str | None = "2",
                     status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Deployment as the apiserver returns it: `managers` own spec.replicas (name, subresource)."""
    managed = [{"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {"f:template": {}}}}]
    managed += [{"manager": m, "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}},
                 **({"subresource": sub} if sub else {})} for m, sub in managers]
    annotations = {ANNOTATION_REPLICAS: rendered} if rendered is not None else {}
    return {"metadata": {"name": f"{NAME}-{variant}", "labels": {LABEL_NAME: NAME, LABEL_VARIANT: variant},
                         "annotations": annotations, "managedFields": managed, "generation": 1},
            "spec": {"replicas": 3}, "status": status or {}}


def test_a_writer_other_than_the_operator_is_named_with_its_subresource() -> None:
    hpa = deployment_state(_deployment_body("speculative", managers=[("kube-controller-manager", "scale")]), NAME)
    assert hpa is not None and hpa.replicas_manager == "kube-controller-manager/scale" and hpa.rendered_replicas == 2
    own = deployment_state(_deployment_body("speculative", managers=[(FIELD_MANAGER, None)]), NAME)
    assert own is not None and own.replicas_manager is None and not own.replicas_held_elsewhere


def test_replicas_set_elsewhere_stay_until_the_sd_asks_for_a_new_count() -> None:
    resource = load_resource(EXAMPLE.read_text())
    held = deployment_state(_deployment_body("speculative", managers=[("kubectl", "scale")]), NAME)
    assert held is not None
    assert replicas_held(resource.spec, (held,)) == {Variant.SPECULATIVE}
    children = desired_children(resource, make_plan(resource.spec), replicas_held=frozenset({Variant.SPECULATIVE}))
    speculative = children.deployments[Variant.SPECULATIVE]
    assert "replicas" not in speculative["spec"], "left out, server-side apply leaves it to its owner"
    assert speculative["metadata"]["annotations"][ANNOTATION_REPLICAS] == "2"
    assert children.deployments[Variant.CONTROL]["spec"]["replicas"] == 1
    # `kubectl scale sd --replicas 4` (the SD asks for a count the operator did not render last): applied
    scaled = resource.spec.model_copy(update={"replicas": 4})
    assert replicas_held(scaled, (held,)) == frozenset()
    # nobody else set it: the operator's own
    own = deployment_state(_deployment_body("speculative", managers=[]), NAME)
    assert own is not None and replicas_held(resource.spec, (own,)) == frozenset()


def test_the_control_keeps_its_replicas_whatever_the_sd_scales_to() -> None:
    resource = load_resource(EXAMPLE.read_text())
    scaled = resource.model_copy(update={"spec": resource.spec.model_copy(update={"replicas": 7})})
    deployments = desired_children(scaled, make_plan(scaled.spec)).deployments
    assert (deployments[Variant.SPECULATIVE]["spec"]["replicas"], deployments[Variant.CONTROL]["spec"]["replicas"]) == (7, 1)


def _state(variant: Variant, replicas: int, ready: int, current: int) -> DeploymentState:
    return DeploymentState(name=f"{NAME}-{variant.value}", variant=variant, replicas=replicas, updated_replicas=ready,
                           available_replicas=ready, generation=1, observed_generation=1, sd_generation=1,
                           ready_replicas=ready, current_replicas=current)


def test_status_gives_the_scale_subresource_its_count_and_selector_and_ready_over_both_variants() -> None:
    spec = load_resource(EXAMPLE.read_text()).spec
    status = with_scale(SpeculativeDeploymentStatus(), NAME, spec,
                        [_state(Variant.SPECULATIVE, 3, 2, 3), _state(Variant.CONTROL, 1, 1, 1)])
    assert (status.replicas, status.ready) == (3, "3/4")
    assert status.selector == f"{LABEL_NAME}={NAME},{LABEL_VARIANT}=speculative"
    # before the Deployments exist: the SD's counts
    assert with_scale(SpeculativeDeploymentStatus(), NAME, spec, []).ready == "0/3"
