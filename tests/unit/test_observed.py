"""reconcile/observed: which speculative pods run with a speculative config, from pods and ReplicaSets."""

from __future__ import annotations

from typing import Any

from specdeploy.reconcile.children import ANNOTATION_SPECULATING
from specdeploy.reconcile.observed import speculative_pods_state


def _replica_set(name: str, speculating: str | None) -> dict[str, Any]:
    annotations = {} if speculating is None else {ANNOTATION_SPECULATING: speculating}
    return {"metadata": {"name": name, "annotations": annotations}}


def _pod(name: str, replica_set: str, node: str | None = "node-1", phase: str = "Running",
         deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "ownerReferences": [{"kind": "ReplicaSet", "name": replica_set}]}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


OLD, NEW = _replica_set("llama-6d4f", "true"), _replica_set("llama-7b9c", "false")


def test_a_rollback_on_a_full_cluster_is_not_done_while_the_old_pods_run() -> None:
    pods = [_pod("llama-6d4f-a", "llama-6d4f"), _pod("llama-6d4f-b", "llama-6d4f"),
            _pod("llama-7b9c-a", "llama-7b9c", node=None, phase="Pending")]
    state = speculative_pods_state(pods, [OLD, NEW])
    assert state.active
    assert state.speculating == ("llama-6d4f-a", "llama-6d4f-b")
    assert state.unscheduled == ("llama-7b9c-a",) and state.without_speculation == ()


def test_a_pod_being_deleted_speculates_until_it_is_gone() -> None:
    pods = [_pod("llama-6d4f-a", "llama-6d4f", deleting=True), _pod("llama-7b9c-a", "llama-7b9c")]
    state = speculative_pods_state(pods, [OLD, NEW])
    assert state.speculating == ("llama-6d4f-a",) and state.without_speculation == ("llama-7b9c-a",)


def test_done_when_every_scheduled_pod_runs_without_speculation() -> None:
    pods = [_pod("llama-7b9c-a", "llama-7b9c"), _pod("llama-6d4f-a", "llama-6d4f", phase="Succeeded")]
    state = speculative_pods_state(pods, [OLD, NEW])
    assert not state.active and state.without_speculation == ("llama-7b9c-a",)


def test_an_unannotated_or_unknown_replica_set_counts_as_speculating() -> None:
    """Made before the operator annotated its Deployments: "stopped" is said only when known."""
    pods = [_pod("a", "llama-0000"), _pod("b", "gone")]
    assert speculative_pods_state(pods, [_replica_set("llama-0000", None)]).speculating == ("a", "b")


def test_no_pods_nothing_speculates() -> None:
    assert not speculative_pods_state([], []).active
