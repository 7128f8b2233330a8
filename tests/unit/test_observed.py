"""reconcile/observed: which speculative pods run with a speculative config, from pods and ReplicaSets."""

from __future__ import annotations

from typing import Any

from specdeploy.reconcile.children import ANNOTATION_SPECULATING
from specdeploy.reconcile.observed import speculative_pods_state, stuck_pods


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


def _pending(name: str, message: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def _waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": "node-1"}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "engine", "state": {"waiting": {"reason": reason, "message": message}}}]}}


def test_a_pod_no_node_can_take_is_stuck_in_the_schedulers_words() -> None:
    words = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available"
    [stuck] = stuck_pods([_pending("llama-7b9c-a", words), _pod("llama-6d4f-a", "llama-6d4f")])
    assert (stuck.name, stuck.reason) == ("llama-7b9c-a", "Unschedulable")
    assert stuck.describe() == f"pod llama-7b9c-a Unschedulable: {words}"


def test_image_pulls_and_crash_loops_are_stuck_a_container_starting_is_not() -> None:
    pods = [_waiting("a", "ImagePullBackOff", "Back-off pulling image \"vllm/vllm-openai:v9\""),
            _waiting("b", "CrashLoopBackOff", "back-off 40s restarting failed container=engine"),
            _waiting("c", "ContainerCreating"), _pod("d", "rs")]
    assert [(p.name, p.reason) for p in stuck_pods(pods)] == [("a", "ImagePullBackOff"), ("b", "CrashLoopBackOff")]


def test_a_crash_loop_says_the_engines_last_words() -> None:
    pod = _waiting("b", "CrashLoopBackOff", "back-off 20s restarting failed container=engine")
    refusal = ("usage: vllm serve [model_tag] [options]\n"
               "vllm serve: error: argument --tokenizer-mode: invalid choice: 'banana' (choose from auto, slow)\n")
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 2, "message": refusal}}
    [stuck] = stuck_pods([pod])
    assert stuck.message == ("back-off 20s restarting failed container=engine; it exited with code 2: vllm serve: "
                             "error: argument --tokenizer-mode: invalid choice: 'banana' (choose from auto, slow)")


def test_a_pod_being_deleted_is_not_stuck() -> None:
    pod = _pending("gone", "0/4 nodes are available")
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    assert stuck_pods([pod]) == ()
