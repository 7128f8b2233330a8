"""The operator's side of the Kubernetes API: read an SD and its Deployments, apply and prune children,
write status, post Events. Async (lightkube's AsyncClient), so the kopf event loop never blocks.

Children are written with server-side apply under the field manager `specdeploy`, forced for the fields
it renders: fields it does not render (a user's annotation) are left alone, and so are the replicas of a
Deployment that another writer set (`replicas_manager`; reconcile/decide.py `replicas_held`); applying what
is already there changes nothing, so status-only reconciles never restart pods.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import httpx2
from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.core.resource import NamespacedResource
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret, Service
from lightkube.types import PatchType

from specdeploy.api import names
from specdeploy.api.resource import GROUP, KIND, PLURAL, VERSION
from specdeploy.clients.headers import HEADERS_SECRET_LABEL, Headers, InvalidHeaders, http_headers
from specdeploy.reconcile.children import (
    ANNOTATION_REPLICAS,
    LABEL_NAME,
    LABEL_VARIANT,
    Children,
    PodMonitoring,
    Variant,
)
from specdeploy.reconcile.conditions import Event as SdEvent
from specdeploy.reconcile.leaderworkerset import (
    LWS_CRD,
    LWS_GROUP,
    LWS_KIND,
    LWS_PLURAL,
    LeaderWorkerSets,
)
from specdeploy.reconcile.status import DeploymentState

FIELD_MANAGER = "specdeploy"
ANNOTATION_SD_GENERATION = "specdeploy.io/generation"
ANNOTATION_CHILDREN_FINGERPRINT = "specdeploy.io/children-fingerprint"
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"

SpeculativeDeploymentResource = create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)
PodMonitor = create_namespaced_resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
LeaderWorkerSet = create_namespaced_resource(LWS_GROUP, "v1", LWS_KIND, LWS_PLURAL)
ENGINE_KINDS: dict[str, type[NamespacedResource]] = {"Deployment": Deployment, LWS_KIND: LeaderWorkerSet}
"""The kinds a variant's engine runs as: a Deployment, or a LeaderWorkerSet for a layout across nodes."""

logger = logging.getLogger(__name__)


async def get_resource(client: AsyncClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The SpeculativeDeployment as the apiserver has it now, or None when it is gone."""
    try:
        obj = await client.get(SpeculativeDeploymentResource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise
    return obj.to_dict()


async def crd_exists(client: AsyncClient, crd: str) -> bool:
    """Whether the cluster has the CustomResourceDefinition named `crd` (one the operator may not read counts
    as absent)."""
    try:
        await client.get(CustomResourceDefinition, crd)
    except ApiError as error:
        if error.status.code in (403, 404):
            return False
        raise
    return True


async def pod_monitors_supported(client: AsyncClient) -> bool:
    """Whether the cluster has the prometheus-operator PodMonitor CRD."""
    return await crd_exists(client, POD_MONITOR_CRD)


POD_MONITOR_VERBS = ("get", "list", "create", "patch", "delete")
"""What the operator does with PodMonitors: read (drift), apply (create or patch), list and delete (prune)."""
LWS_VERBS = ("get", "list", "watch", "create", "patch", "delete")
"""What the operator does with LeaderWorkerSets, and the chart's rbac.leaderWorkerSets grants: read by name
(readiness, drift), list and watch (kopf's watch: a group's readiness reconciles at once, and the probe starts from
the speculative one), apply (create or patch), delete (prune)."""


async def _may(client: AsyncClient, namespaces: Sequence[str | None], group: str, resource: str,
               verbs: Sequence[str]) -> bool:
    """Whether the operator may do every one of `verbs` on `group`'s `resource` in each of `namespaces` (None:
    every namespace), as the apiserver's authorizer answers a SelfSubjectAccessReview (which anyone may ask)."""
    for namespace in namespaces:
        for verb in verbs:
            review = await client.create(SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(group=group, resource=resource, verb=verb,
                                                      namespace=namespace))))
            if review.status is None or not review.status.allowed:
                return False
    return True


async def may_write_pod_monitors(client: AsyncClient, namespaces: Sequence[str | None]) -> bool:
    """Whether the operator may do every POD_MONITOR_VERBS in each of `namespaces` (None: every namespace)."""
    return await _may(client, namespaces, "monitoring.coreos.com", "podmonitors", POD_MONITOR_VERBS)


async def leader_worker_sets(client: AsyncClient, namespaces: Sequence[str | None]) -> LeaderWorkerSets:
    """Whether SDs whose layout spans nodes can run: the LeaderWorkerSet CRD exists and the operator may do every
    LWS_VERBS; when not, why and the fix. Checked at start: installing either takes an operator restart."""
    if not await crd_exists(client, LWS_CRD):
        return LeaderWorkerSets(why_not=(
            f"the cluster has no LeaderWorkerSet CRD ({LWS_CRD}): install the LeaderWorkerSet controller "
            "(sigs.k8s.io/lws, v0.7.0 or later), set the chart's rbac.leaderWorkerSets: true, and restart the "
            "operator"))
    if not await _may(client, namespaces, LWS_GROUP, LWS_PLURAL, LWS_VERBS):
        return LeaderWorkerSets(why_not=(
            "the operator may not write LeaderWorkerSets (the chart's rbac.leaderWorkerSets is false): set it "
            "true and upgrade the release, then restart the operator"))
    return LeaderWorkerSets(usable=True, why_not="")


async def pod_monitoring(client: AsyncClient, namespaces: Sequence[str | None], *, enabled: bool,
                         labels: Mapping[str, str]) -> PodMonitoring:
    """Whether SDs get a PodMonitor each: the CRD exists, `enabled` (the operator's --pod-monitors) and the
    operator may write them; when the CRD exists but they are not rendered, why, in a sentence for status."""
    if not await pod_monitors_supported(client):
        return PodMonitoring()
    instead = ("its engine pods must be scraped by the chart's engineMonitoring.podMonitor or a scrape "
               "configuration of your own, keeping the pod labels specdeploy.io/name and specdeploy.io/variant, "
               "which the analysis groups by")
    if not enabled:
        return PodMonitoring(not_rendered=f"the operator renders no PodMonitor for this SD (--no-pod-monitors): {instead}")
    if not await may_write_pod_monitors(client, namespaces):
        return PodMonitoring(not_rendered=(
            "the operator renders no PodMonitor for this SD: it may not write PodMonitors here (the chart's "
            f"rbac.podMonitors is false); {instead}"))
    return PodMonitoring(render=True, labels=dict(labels))


def deployment_state(body: Mapping[str, Any], owner: str) -> DeploymentState | None:
    """What a pass needs of a Deployment or LeaderWorkerSet (as JSON: read, or delivered by the watch) of SD
    `owner`; None when it is not one of that SD's engine Deployments.

    A LeaderWorkerSet's replicas are groups, ready when every pod of the group is (its readyReplicas; it has no
    availableReplicas). LeaderWorkerSet v0.7.0 reports no observedGeneration (api/leaderworkerset/v1
    LeaderWorkerSetStatus): its status is taken as of its generation, so in the moment between an apply and its
    controller's answer a rollout reads as done; the pods' own readiness follows within a pass."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if labels.get(LABEL_NAME) != owner:
        return None
    try:
        variant = Variant(labels.get(LABEL_VARIANT, ""))
    except ValueError:
        return None
    annotations = metadata.get("annotations") or {}
    spec, status = body.get("spec") or {}, body.get("status") or {}
    sd_generation = annotations.get(ANNOTATION_SD_GENERATION)
    rendered = annotations.get(ANNOTATION_REPLICAS)
    replicas = spec.get("replicas")
    kind = body.get("kind") or "Deployment"
    group = kind == LWS_KIND
    return DeploymentState(
        name=metadata.get("name") or "",
        variant=variant,
        replicas=replicas if replicas is not None else 1,
        updated_replicas=status.get("updatedReplicas") or 0,
        available_replicas=status.get("readyReplicas" if group else "availableReplicas") or 0,
        generation=metadata.get("generation") or 0,
        observed_generation=(metadata.get("generation") if group else status.get("observedGeneration")) or 0,
        sd_generation=int(sd_generation) if sd_generation and sd_generation.isdigit() else None,
        children_fingerprint=annotations.get(ANNOTATION_CHILDREN_FINGERPRINT),
        ready_replicas=status.get("readyReplicas") or 0,
        current_replicas=status.get("replicas") or 0,
        replicas_manager=replicas_manager(metadata.get("managedFields") or []),
        rendered_replicas=int(rendered) if rendered and rendered.isdigit() else None,
        kind=kind,
    )


def replicas_manager(managed_fields: Sequence[Mapping[str, Any]]) -> str | None:
    """The field manager other than the operator that owns a Deployment's spec.replicas, if any (named with its
    subresource: `kube-controller-manager/scale` is an HPA). An update (`kubectl scale`, an HPA through the scale
    subresource) takes a field from every other manager, so this is who set it after the operator's last apply."""
    for entry in managed_fields:
        owned = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        manager = entry.get("manager") or "?"
        if "f:replicas" in owned and manager != FIELD_MANAGER:
            subresource = entry.get("subresource")
            return f"{manager}/{subresource}" if subresource else manager
    return None


CHILD_KINDS = frozenset({"Deployment", "ConfigMap", "Service", "PodMonitor"})
"""The kinds of child a pass can read in full, to compare with what it would apply (reconcile/drift.py)."""


async def _optional(read: Awaitable[Any]) -> Any:
    """What `read` returns, or None on 404."""
    try:
        return await read
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


async def read_deployments(client: AsyncClient, namespace: str, names: Sequence[str],
                           kind: str = "Deployment") -> dict[str, dict[str, Any]]:
    """The Deployments (or LeaderWorkerSets: `kind`) named `names` that exist now, as JSON by name. Got by their
    names: a get is answered at once, where a label list right after a write waits ~90 ms for the apiserver's
    watch cache (benchmarks/analysis_profile.py)."""
    read = await asyncio.gather(*(_optional(client.get(ENGINE_KINDS[kind], name, namespace=namespace))
                                  for name in names))
    return {name: {**obj.to_dict(), "kind": kind} for name, obj in zip(names, read, strict=True) if obj is not None}


async def read_children(client: AsyncClient, namespace: str, name: str, *, kinds: frozenset[str],
                        pod_monitors: bool) -> dict[tuple[str, str], dict[str, Any]]:
    """SD `name`'s ConfigMap, Service and PodMonitor among `kinds` that exist, as JSON by kind and name (read
    at once: a pass waits for one answer, not three)."""
    reads: dict[str, Awaitable[Any]] = {}
    if "ConfigMap" in kinds:
        reads["ConfigMap"] = client.get(ConfigMap, names.config_map_name(name), namespace=namespace)
    if "Service" in kinds:
        reads["Service"] = client.get(Service, names.service_name(name), namespace=namespace)
    if "PodMonitor" in kinds and pod_monitors:
        reads["PodMonitor"] = client.get(PodMonitor, names.service_name(name), namespace=namespace)
    found = await asyncio.gather(*(_optional(read) for read in reads.values()))
    return {(kind, obj.metadata.name): obj.to_dict() for kind, obj in zip(reads, found, strict=True) if obj is not None}


def _annotated(manifest: dict[str, Any], generation: int, fingerprint: str) -> dict[str, Any]:
    """A Deployment manifest carrying the SD generation and the children's fingerprint it was rendered
    from (on the Deployment, not in its pod template: they restart nothing)."""
    metadata = {**manifest["metadata"]}
    metadata["annotations"] = {**metadata.get("annotations", {}), ANNOTATION_SD_GENERATION: str(generation),
                               ANNOTATION_CHILDREN_FINGERPRINT: fingerprint}
    return {**manifest, "metadata": metadata}


async def apply_children(
    client: AsyncClient, children: Children, generation: int, existing: list[DeploymentState], *,
    applied_version: Callable[[str, str | None], None],
) -> list[SdEvent]:
    """Server-side apply every child, all at once (a pass waits for one answer, not four: a pod whose
    ConfigMap comes a moment after its Deployment waits for it); Events for Deployments created or changed.
    `applied_version` is told each Deployment's name and the resourceVersion the apply returned. When an
    apply fails, the others are still waited for, and the first failure is raised."""
    events: list[SdEvent] = []
    before = {(state.kind, state.name): state.generation for state in existing}
    manifests = [children.config_map]
    fingerprint = children.fingerprint(generation)
    manifests += [_annotated(d, generation, fingerprint) for d in children.deployments.values()]
    manifests.append(children.service)
    if children.pod_monitor is not None:
        manifests.append(children.pod_monitor)
    answers = await asyncio.gather(*(client.apply(codecs.from_dict(m), field_manager=FIELD_MANAGER, force=True)
                                     for m in manifests), return_exceptions=True)
    failed = [answer for answer in answers if isinstance(answer, BaseException)]
    if failed:
        raise failed[0]
    for manifest, applied in zip(manifests, cast(list[Any], answers), strict=True):
        kind = manifest["kind"]
        if kind not in ENGINE_KINDS:
            continue
        name = manifest["metadata"]["name"]
        if kind == "Deployment":   # the watched kind (a LeaderWorkerSet is read on every pass)
            applied_version(name, applied.metadata.resourceVersion if applied.metadata else None)
        new_generation = applied.metadata.generation if applied.metadata else None
        if (kind, name) not in before:
            events.append(SdEvent.normal("DeploymentCreated", f"created {kind} {name} from generation {generation}"))
        elif new_generation is not None and new_generation != before[(kind, name)]:
            events.append(SdEvent.normal(
                "DeploymentUpdated", f"updated {kind} {name} to generation {generation}; its pods roll"
            ))
    return events


async def prune_children(
    client: AsyncClient, namespace: str, name: str, children: Children, existing: list[DeploymentState],
    pod_monitors: bool, *, deleted: Callable[[str], None],
) -> list[SdEvent]:
    """Delete child Deployments and LeaderWorkerSets (and a PodMonitor) that `children` no longer has, e.g.
    Control after the baseline changed, or a variant's Deployment once its layout spans nodes (its
    LeaderWorkerSet, of the same name, replaces it) and back; `deleted` is told each Deployment's name."""
    events: list[SdEvent] = []
    wanted = {(d["kind"], d["metadata"]["name"]) for d in children.deployments.values()}
    for state in existing:
        if (state.kind, state.name) not in wanted:
            await client.delete(ENGINE_KINDS[state.kind], state.name, namespace=namespace)
            if state.kind == "Deployment":
                deleted(state.name)
            events.append(SdEvent.normal("DeploymentDeleted", f"deleted {state.kind} {state.name}: no longer wanted"))
    if pod_monitors and children.pod_monitor is None:
        async for monitor in client.list(PodMonitor, namespace=namespace, labels={LABEL_NAME: name}):
            if monitor.metadata and monitor.metadata.name:
                await client.delete(PodMonitor, monitor.metadata.name, namespace=namespace)
    return events


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, nested maps patched key
    by key, null for a key `new` lacks (at any depth: a figure no longer measured must not stay behind),
    lists and scalars whole."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif before != value or key not in old:
            patch[key] = value
    return patch


async def write_status(client: AsyncClient, namespace: str, name: str, old: dict[str, Any],
                       new: dict[str, Any]) -> str | None:
    """Merge-patch the status subresource from `old` (as read) to `new` (`merge_patch`): an analysis
    sample changes a few figures of `analysis`, and the patch carries only those. Returns the SD's
    resourceVersion after the write (None when it is gone).

    An SD deleted while it was being reconciled (during a rollback, say) has no status left to write:
    that is logged, not raised; its children go with it (owner references), and the next trigger finds
    it gone.
    """
    try:
        written = await client.patch(
            SpeculativeDeploymentResource.Status, name, {"status": merge_patch(old, new)}, namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as error:
        if error.status.code != 404:
            raise
        logger.info("%s/%s was deleted; its status is not written", namespace, name)
        return None
    return written.metadata.resourceVersion if written.metadata else None


async def engine_pods(client: AsyncClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The engine pods of SD `name`, both variants, as JSON (OOM deaths, what runs, what is stuck)."""
    return [pod.to_dict() async for pod in client.list(Pod, namespace=namespace, labels={LABEL_NAME: name})]


async def engine_replica_sets(client: AsyncClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The ReplicaSets of SD `name`'s engine Deployments, both variants, old revisions included, as JSON (whose pods
    wrote a series: controller/own_pods.py)."""
    return [rs.to_dict() async for rs in client.list(ReplicaSet, namespace=namespace, labels={LABEL_NAME: name})]


async def speculative_replica_sets(client: AsyncClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The ReplicaSets of SD `name`'s speculative Deployment, as JSON (their annotations say which
    speculate; reconcile/observed.py)."""
    labels: dict[str, Any] = {LABEL_NAME: name, LABEL_VARIANT: Variant.SPECULATIVE.value}
    return [rs.to_dict() async for rs in client.list(ReplicaSet, namespace=namespace, labels=labels)]


API_UNREACHABLE: tuple[type[Exception], ...] = (httpx2.TransportError, OSError)
"""What lightkube raises when the apiserver does not answer at all (restarting, the network): a periodic
loop logs one line for it, not a traceback every cycle, and tries again next time."""


async def secret_headers(client: AsyncClient, namespace: str, name: str) -> Headers:
    """HTTP headers from a Secret labelled `specdeploy.io/headers: "true"`: each key a header name, each
    value its value. Never logged; raises ApiError, or InvalidHeaders for a Secret without the label or
    naming the key of a value that cannot be a header."""
    secret = await client.get(Secret, name, namespace=namespace)
    labels = (secret.metadata.labels if secret.metadata else None) or {}
    if labels.get(HEADERS_SECRET_LABEL) != "true":
        raise InvalidHeaders(
            f"Secret {namespace}/{name} is not labelled {HEADERS_SECRET_LABEL}=true; the operator sends only "
            f"Secrets labelled so as HTTP headers (`kubectl label secret -n {namespace} {name} "
            f"{HEADERS_SECRET_LABEL}=true`)")
    data = {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}
    return http_headers(data, f"Secret {namespace}/{name}")


async def config_map_data(client: AsyncClient, namespace: str, name: str) -> dict[str, str] | None:
    """A ConfigMap's data, or None when it does not exist."""
    try:
        config_map = await client.get(ConfigMap, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise
    return dict(config_map.data or {})


async def secret_value(client: AsyncClient, namespace: str, name: str, key: str) -> str | None:
    """One key of a Secret, decoded; None when the Secret or the key does not exist. Never logged."""
    try:
        secret = await client.get(Secret, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise
    value = (secret.data or {}).get(key)
    return base64.b64decode(value).decode().strip() if value is not None else None


async def post_event(client: AsyncClient, body: Mapping[str, Any], event: SdEvent, name: str | None = None) -> bool:
    """A core/v1 Event on the SD, as `kubectl describe sd` lists them; True when it exists afterwards.

    A fixed `name` makes the Event exactly-once: posting it again (after a crash) finds it there.
    Other failures are logged, not raised.
    """
    metadata = body["metadata"]
    now = datetime.datetime.now(datetime.UTC)
    object_meta = (ObjectMeta(name=name, namespace=metadata["namespace"]) if name
                   else ObjectMeta(generateName=f"{metadata['name']}.", namespace=metadata["namespace"]))
    try:
        await client.create(Event(
            metadata=object_meta,
            involvedObject=ObjectReference(
                apiVersion=f"{GROUP}/{VERSION}", kind=KIND, name=metadata["name"],
                namespace=metadata["namespace"], uid=metadata.get("uid"),
                resourceVersion=metadata.get("resourceVersion"),
            ),
            reason=event.reason, message=event.message[:1024], type=event.type.value,
            source=EventSource(component="specdeploy"), firstTimestamp=now, lastTimestamp=now, count=1,
            reportingComponent="specdeploy.io/operator", reportingInstance="specdeploy",
        ))
    except ApiError as error:
        if error.status.code == 409:
            return True
        logger.warning("could not post Event %s on %s/%s: %s", event.reason, metadata["namespace"],
                       metadata["name"], error)
        return False
    return True

