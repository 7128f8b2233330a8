"""What runs, read from the SD's pods and the speculative ReplicaSets: pure functions of API objects.

A pod runs with a speculative config when it is scheduled, has not finished, and its ReplicaSet says so:
the operator annotates each engine Deployment with `specdeploy.io/speculating`, and the Deployment
controller copies that annotation onto the ReplicaSet it rolls to. A pod being deleted still counts while
its engine runs; a pod no node took (Pending for want of GPUs) runs nothing. A ReplicaSet without the
annotation (made before the operator wrote it) counts as speculating: "stopped" is said only when known.
A LeaderWorkerSet's pods carry the annotation themselves (reconcile/leaderworkerset.py), which then decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.reconcile.children import ANNOTATION_SPECULATING
from specdeploy.reconcile.conditions import Reason
from specdeploy.reconcile.leaderworkerset import LABEL_ROLE

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
        own = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_SPECULATING)
        if not (pod.get("spec") or {}).get("nodeName"):
            unscheduled.append(name)
        elif (own == "true") if own is not None else speculates.get(_owner(pod) or "", True):
            speculating.append(name)
        else:
            without.append(name)
    return SpeculativePods(tuple(sorted(speculating)), tuple(sorted(without)), tuple(sorted(unscheduled)))


STUCK_WAITING_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                                   "CreateContainerConfigError"})
"""Container waiting reasons (the kubelet's words) that no amount of waiting fixes by itself."""


@dataclass(frozen=True)
class StuckPod:
    """A pod a rollout waits on in vain: unschedulable, or its engine cannot start."""

    name: str
    reason: str       # Unschedulable, or the container's waiting reason
    message: str      # the scheduler's or the kubelet's own words

    def describe(self) -> str:
        return f"pod {self.name} {self.reason}: {self.message}" if self.message else f"pod {self.name} {self.reason}"


def last_words(log: str) -> str:
    """The last line of a termination message that says something (an argparse error, an exception), at
    most 300 characters."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def preflight_words(report: str) -> str:
    """The GPU preflight's verdict and its fix from its report (specdeploy_engine/preflight.py `report`: the
    verdict first, a "Fix:" line per failing GPU), at most 600 characters."""
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    fix = next((line for line in lines if line.startswith("Fix:")), "")
    return " ".join(lines[:1] + ([fix] if fix else []))[:600]


def stuck_pods(pods: Iterable[Mapping[str, Any]]) -> tuple[StuckPod, ...]:
    """The pods of `pods` that cannot progress: PodScheduled False (the scheduler says why: no free GPU,
    a node selector nothing matches), or an engine or preflight container waiting on an image pull or a crash
    loop."""
    stuck = []
    for pod in pods:
        metadata, status = pod["metadata"], pod.get("status") or {}
        if metadata.get("deletionTimestamp") or status.get("phase") in FINISHED_PHASES:
            continue
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if scheduled is not None and scheduled.get("status") == "False":
            stuck.append(StuckPod(metadata["name"], scheduled.get("reason") or "Unschedulable",
                                  (scheduled.get("message") or "").strip()))
            continue
        # the init containers first (the GPU preflight): the engine waits on them
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                message = (waiting.get("message") or "").strip().splitlines()
                words = message[0][:300] if message else ""
                ended = ((container.get("lastState") or {}).get("terminated") or {})
                said = (preflight_words if container.get("name") == "preflight" else last_words)(
                    ended.get("message") or "")
                if said:   # the engine's own last words: why it exits (a refused argument, an OOM)
                    words = f"{words}; it exited with code {ended.get('exitCode', '?')}: {said}"
                stuck.append(StuckPod(metadata["name"], waiting["reason"], words))
                break
    return tuple(sorted(stuck, key=lambda p: p.name))


def failed_group_members(pods: Iterable[Mapping[str, Any]]) -> tuple[StuckPod, ...]:
    """The pods of a LeaderWorkerSet's groups (labelled `specdeploy.io/role`) whose engine died: the pod Failed, or
    a container of it terminated, now or last, with a non-zero exit code. LeaderWorkerSet then recreates the whole
    group (restartPolicy RecreateGroupOnPodRestart), so one member's death takes its group's leader out of the
    Service: the status names the member that died rather than only the leader that went unready. The current
    state of a pod being deleted is its deletion's doing (a rollout's SIGTERM), not a death; a pod deleted by
    hand leaves no termination to read: the group's readiness shows it, not this."""
    failed = []
    for pod in pods:
        metadata, status = pod["metadata"], pod.get("status") or {}
        role = (metadata.get("labels") or {}).get(LABEL_ROLE)
        if role is None:
            continue
        words = ""
        states = ("lastState",) if metadata.get("deletionTimestamp") else ("state", "lastState")
        for container in status.get("containerStatuses") or []:
            for state in states:
                ended = (container.get(state) or {}).get("terminated") or {}
                if ended.get("exitCode"):
                    said = last_words(ended.get("message") or "")
                    words = (f"its {role}'s {container.get('name', '?')} container exited with code "
                             f"{ended['exitCode']} ({ended.get('reason') or 'Error'})" + (f": {said}" if said else ""))
                    break
            if words:
                break
        if not words and status.get("phase") == "Failed":
            words = f"the {role} pod failed: {(status.get('message') or status.get('reason') or '').strip()}".rstrip(": ")
        if words:
            failed.append(StuckPod(metadata["name"], Reason.GROUP_MEMBER_FAILED,
                                   f"{words}; its LeaderWorkerSet recreates the group"))
    return tuple(sorted(failed, key=lambda p: p.name))


@dataclass(frozen=True)
class PodsObserved:
    """One listing of an SD's engine pods: the speculative ones as the API returned them (their container
    states tell OOM deaths), what they run, and the pods of either variant a rollout waits on in vain."""

    speculative: tuple[Mapping[str, Any], ...]
    running: SpeculativePods
    stuck: tuple[StuckPod, ...]


def observe_pods(pods: Iterable[Mapping[str, Any]], replica_sets: Iterable[Mapping[str, Any]],
                 variant_label: str, speculative: str) -> PodsObserved:
    """`pods` of both variants, told apart by their `variant_label`; `replica_sets` the speculative ones. A group
    member that died is stuck for its whole group (`failed_group_members`), named once."""
    every = list(pods)
    mine = tuple(p for p in every if (p["metadata"].get("labels") or {}).get(variant_label) == speculative)
    failed = failed_group_members(every)
    dead = {p.name for p in failed}
    stuck = tuple(sorted([*failed, *(p for p in stuck_pods(every) if p.name not in dead)], key=lambda p: p.name))
    return PodsObserved(mine, speculative_pods_state(mine, replica_sets), stuck)
