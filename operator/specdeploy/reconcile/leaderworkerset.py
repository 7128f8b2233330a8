"""A variant whose layout spans nodes runs as a LeaderWorkerSet instead of a Deployment: one group per replica.

    lws = leader_worker_set(deployment, plan)   # the variant's Deployment, rendered as usual, made a group

LeaderWorkerSet (sigs.k8s.io/lws, API leaderworkerset.x-k8s.io/v1, read in v0.7.0's
api/leaderworkerset/v1/leaderworkerset_types.go) creates per replica a leader pod and `size` − 1 worker pods, rolls
and restarts them as one group (restartPolicy RecreateGroupOnPodRestart: a worker's death recreates the group), and
sets in every container LWS_LEADER_ADDRESS (the leader's address), LWS_GROUP_SIZE and LWS_WORKER_INDEX (0 on the
leader). The pods are the Deployment's pod template, same labels, volumes and GPUs per pod (one node's), with
`specdeploy.io/role` added; the engine gets its multi-node flags (engines `node_args`), the leader keeps the
probes and the HTTP port, and the Service and PodMonitor select leaders only: a worker serves nothing.

Each pod carries `specdeploy.io/speculating` itself (in both templates): LeaderWorkerSet makes StatefulSets that
copy no annotation of the LeaderWorkerSet onto them, so the pod is where observed.py reads what it runs. Its value
changes only with the engine's args, so it restarts nothing that was not restarting anyway.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specdeploy.engines import NodeRank, node_args
from specdeploy.planning.plan import Plan

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_PLURAL = "leaderworkersets"
LWS_CRD = f"{LWS_PLURAL}.{LWS_GROUP}"
ANNOTATION_SPECULATING = "specdeploy.io/speculating"
"""On each engine Deployment ("true" or "false"): whether its pod template speculates. Not in the template,
so it restarts nothing; the Deployment controller copies a Deployment's annotations onto the ReplicaSet it
rolls to, so each ReplicaSet — and through it each pod — says whether it runs with a speculative config
(reconcile/observed.py). On a LeaderWorkerSet, in its pod templates too (see above)."""
LABEL_ROLE = "specdeploy.io/role"
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""The leader's address as a container's args expand it: LeaderWorkerSet sets the variable in every container."""
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
"""A pod's index in its group (0: the leader), as a container's args expand it."""
_PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


class Role(StrEnum):
    LEADER = "leader"
    WORKER = "worker"


@dataclass(frozen=True)
class LeaderWorkerSets:
    """Whether the operator can run a layout across nodes: the cluster has the LeaderWorkerSet CRD and the operator
    may write LeaderWorkerSets (checked at start, as for PodMonitors); when not, why and the fix, in a sentence for
    the status of an SD that needs them."""

    usable: bool = False
    why_not: str = "the operator has not checked whether the cluster runs LeaderWorkerSets"


def _role_template(template: dict[str, Any], plan: Plan, role: Role, speculating: str) -> dict[str, Any]:
    """The Deployment's pod template for `role`: the role label, whether it speculates, the engine's multi-node
    flags, and for a worker no probes and no HTTP port (it runs the engine's ranks without a server)."""
    result = copy.deepcopy(template)
    result["metadata"]["labels"][LABEL_ROLE] = role.value
    result["metadata"]["annotations"][ANNOTATION_SPECULATING] = speculating
    rank = "0" if role == Role.LEADER else WORKER_INDEX
    flags = node_args(plan.spec.engine.kind, NodeRank(plan.layout.nodes, rank, LEADER_ADDRESS))
    engine = next(c for c in result["spec"]["containers"] if c["name"] == "engine")
    engine["args"] = [*engine["args"], *flags]
    if role == Role.WORKER:
        for probe in _PROBES:
            engine.pop(probe, None)
        engine.pop("ports", None)
    return result


def leader_worker_set(deployment: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """The LeaderWorkerSet that runs `deployment`'s pods as groups of `plan.layout.nodes` pods, one per node: the
    same name, labels and annotations, replicas (groups; left out while another writer holds them, as on the
    Deployment) and rollout limits; the group starts once its leader exists (startupPolicy LeaderCreated), is
    recreated whole when one of its pods restarts, and its pods find their leader through a Service of their own
    group (subdomainPolicy UniquePerReplica), not one named like the SD's."""
    spec = deployment["spec"]
    rolling = spec["strategy"]["rollingUpdate"]
    template = spec["template"]
    speculating = deployment["metadata"]["annotations"][ANNOTATION_SPECULATING]
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": copy.deepcopy(deployment["metadata"]),
        "spec": {
            **({"replicas": spec["replicas"]} if "replicas" in spec else {}),
            "startupPolicy": "LeaderCreated",
            # A headless Service per group, named after its leader pod: the default (Shared) names it after the
            # LeaderWorkerSet — the SD's own Service's name — and owns it, so the two would fight over one object
            # (found on the dev cluster's LeaderWorkerSet controller, v0.7.0 reconcileHeadlessServices).
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                "maxSurge": rolling["maxSurge"], "maxUnavailable": rolling["maxUnavailable"]}},
            "leaderWorkerTemplate": {
                "size": plan.layout.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _role_template(template, plan, Role.LEADER, speculating),
                "workerTemplate": _role_template(template, plan, Role.WORKER, speculating),
            },
        },
    }


def leaders_only(selector: dict[str, str]) -> dict[str, str]:
    """`selector` narrowed to leader pods: the Service's and the PodMonitor's, whose traffic and samples are the
    leaders' (a worker has no HTTP server)."""
    return {**selector, LABEL_ROLE: Role.LEADER.value}
