"""What runs, read from the speculative pods and their ReplicaSets: a pure function of API objects.

A pod runs with a speculative config when it is scheduled, has not finished, and its ReplicaSet says so:
the operator annotates each engine Deployment with `specdeploy.io/speculating`, and the Deployment
controller copies that annotation onto the ReplicaSet it rolls to. A pod being deleted still counts while
its engine runs; a pod no node took (Pending for want of GPUs) runs nothing. A ReplicaSet without the
annotation (made before the operator wrote it) counts as speculating: "stopped" is said only when known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.reconcile.children import ANNOTATION_SPECULATING

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class SpeculativePods:
    """The speculative Deployment's pods by what they run now."""

    speculating: tuple[str, ...]       # scheduled, running or starting, with a speculative config
    without_speculation: tuple[str, ...]
    unscheduled: tuple[str, ...]       # Pending on no node: they run nothing yet

    @property
    def active(self) -> bool:
        return bool(self.speculating)


def _owner(pod: Mapping[str, Any]) -> str | None:
    for reference in pod.get("metadata", {}).get("ownerReferences") or []:
        if reference.get("kind") == "ReplicaSet":
            return str(reference.get("name"))
    return None


def speculative_pods_state(pods: Iterable[Mapping[str, Any]],
                           replica_sets: Iterable[Mapping[str, Any]]) -> SpeculativePods:
    """Sort `pods` (as the API returns them) by whether they run with a speculative config."""
    speculates = {
        rs["metadata"]["name"]: (rs["metadata"].get("annotations") or {}).get(ANNOTATION_SPECULATING, "true") == "true"
        for rs in replica_sets
    }
    speculating, without, unscheduled = [], [], []
    for pod in pods:
        name = pod["metadata"]["name"]
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        if not (pod.get("spec") or {}).get("nodeName"):
            unscheduled.append(name)
        elif speculates.get(_owner(pod) or "", True):
            speculating.append(name)
        else:
            without.append(name)
    return SpeculativePods(tuple(sorted(speculating)), tuple(sorted(without)), tuple(sorted(unscheduled)))
