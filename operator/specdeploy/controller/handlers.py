"""kopf handlers: thin. Each one calls `Reconciler.reconcile` and nothing else.

Triggers: the SD was created, its spec changed, or it was found at start-up (resume); a new value of the
`specdeploy.io/retry-speculation` annotation; a child Deployment changed (so Ready follows the rollout), or a
child LeaderWorkerSet where the operator runs them (`watch_leader_worker_sets`); a speculative pod restarted or
went away; and a periodic resync of every SD (drift, missed events). The
watch events other than the SD's own create, update and resume ask for a pass (`Reconciler.request`) and
return: passes asked for while one waits are coalesced into it. kopf's record of the last handled spec,
which tells an update from a status change, is kept in memory (`HandledSpecs`), not in an annotation: the
operator writes nothing to an SD but its status. There are no timers or daemons per object, so kopf puts
no finalizer on SpeculativeDeployments: deleting one never waits for the operator, and owner references
garbage-collect the children.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any, cast

import kopf
from lightkube import ALL_NS, AsyncClient

from specdeploy.api.resource import GROUP, PLURAL, VERSION
from specdeploy.clients import kube
from specdeploy.clients.endpoints import AllowedEndpoints
from specdeploy.controller.analysis_loop import analyse_forever
from specdeploy.controller.leader import LeaderElection
from specdeploy.controller.metrics_server import serve_metrics
from specdeploy.controller.probe_loop import probe_forever
from specdeploy.controller.reconciler import Reconciler, Trigger
from specdeploy.controller.resync import resync_forever
from specdeploy.controller.settings import OperatorSettings
from specdeploy.controller.watched import SD
from specdeploy.judgment.rollback import RETRY_ANNOTATION
from specdeploy.modelsource.resolve import HubConfigs
from specdeploy.reconcile.children import LABEL_NAME, LABEL_VARIANT
from specdeploy.reconcile.leaderworkerset import LWS_GROUP, LWS_PLURAL, LeaderWorkerSets

ANNOTATION_PREFIX = "specdeploy.io"
DEPLOYMENTS = ("apps", "v1", "deployments")
LEADER_WORKER_SETS = (LWS_GROUP, "v1", LWS_PLURAL)
PODS = ("", "v1", "pods")
CHILDREN_SELECTOR = "app.kubernetes.io/managed-by=specdeploy"
"""The label selector of kopf's Deployment, LeaderWorkerSet and pod watches, applied by the apiserver: every
Deployment, LeaderWorkerSet and pod the operator renders carries the label (reconcile/children.py
`common_labels`), and no other is sent."""

logger = logging.getLogger(__name__)


class HandledSpecs(kopf.DiffBaseStorage):
    """kopf's record of the spec each SD was last handled at, in memory and by uid.

    kopf keeps it in an annotation by default: one PATCH of the whole SD after each create and update
    (1,000 of them, each validated with the CRD's CEL rules, when a thousand SDs are created), a copy of
    the spec in every SD, and a deep copy of every SD body, status included, per event to build it. In
    memory, an operator that restarts has no record: every SD is a create to kopf, and the reconcile is
    the same pass resume gave it. Only the spec is compared: labels and annotations are the user's (the
    retry annotation has its own handler), and status is the operator's.
    """

    def __init__(self) -> None:
        super().__init__()
        self._specs: dict[str, kopf.BodyEssence] = {}

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {"spec": copy.deepcopy(dict(body.spec))})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self._specs.get(body.metadata.uid or "")

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._specs[body.metadata.uid or ""] = essence

    def forget(self, uid: str) -> None:
        self._specs.pop(uid, None)


class RetriesOnly(kopf.AnnotationsProgressStorage):
    """kopf's per-handler progress in annotations, written only while a handler is being retried.

    kopf stores a handler's success and purges it in the same patch, which leaves its marker annotation
    (`specdeploy.io/kopf-managed`) behind: one PATCH of every new SD for a record no one reads. A failed
    handler's retry count and delay are still written, as kopf's backoff needs them.
    """

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        if record.get("success") and self.fetch(key=key, body=body) is None:
            return
        super().store(key=key, record=record, body=body, patch=patch)


def configure(settings: kopf.OperatorSettings) -> None:
    """Production settings: own annotation prefix, no kopf peering CRDs, bounded API calls, children's
    watches selected by label."""
    settings.persistence.progress_storage = RetriesOnly(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = HandledSpecs()
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    settings.peering.standalone = True          # one active instance comes from the Lease instead
    settings.posting.enabled = False            # the reconciler posts its own, specific Events
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    # kopf's `labels=` on a handler filters in the operator, after every pod and Deployment of the watched
    # namespaces was listed, sent and parsed; a label selector of the watch is applied by the apiserver.
    settings.watching.label_selectors[DEPLOYMENTS] = CHILDREN_SELECTOR
    settings.watching.label_selectors[LEADER_WORKER_SETS] = CHILDREN_SELECTOR
    settings.watching.label_selectors[PODS] = CHILDREN_SELECTOR
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60]


def _lost_lease() -> None:
    logger.error("lost the operator lease; stopping so that only one operator acts")
    os.kill(os.getpid(), signal.SIGTERM)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own kubeconfig and in-cluster logins, named here: kopf registers them as fallbacks only if
    KUBECONFIG (or ~/.kube/config) exists when kopf is first imported, so an operator imported before its
    environment is set — or in a pod whose kubeconfig is mounted later — would have no credentials."""
    return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    memo.handled_specs = settings.persistence.diffbase_storage
    options: OperatorSettings = memo.get("settings") or OperatorSettings.from_environment(os.environ)
    namespaces = list(options.namespaces) or [ALL_NS]
    client = AsyncClient(field_manager=kube.FIELD_MANAGER)
    try:
        # Everything that can fail comes before the lease: kopf retries a failed startup handler from the top,
        # and a retry must not find tasks of the first attempt running, or a lease it holds itself.
        monitoring = await kube.pod_monitoring(client, list(options.namespaces) or [None], enabled=options.pod_monitors,
                                               labels=options.pod_monitor_labels)
        groups = await kube.leader_worker_sets(client, list(options.namespaces) or [None])
        reconciler = Reconciler(client, pod_monitoring=monitoring, leader_worker_sets=groups,
                                alertmanager_url=options.alertmanager_url,
                                alertmanager_headers_dir=options.alertmanager_headers_dir, hub=_hub(options),
                                allowed_endpoints=AllowedEndpoints.of(options.allowed_endpoints, options.prometheus_url,
                                                                      options.alertmanager_url))
        port = options.metrics_port
        try:
            memo.metrics_server = await serve_metrics(reconciler.metrics, port) if port else None
        except OSError as error:   # a port in use stays in use: stop, and say which
            raise kopf.PermanentError(f"cannot serve /metrics on port {port}: {error}") from error
        election = LeaderElection(client, namespace=options.lease_namespace)
        await election.acquire()
        memo.election = election
        memo.lease_task = asyncio.create_task(election.keep(on_lost=_lost_lease))
        memo.reconciler = reconciler
        memo.resync_task = asyncio.create_task(resync_forever(reconciler, namespaces, options.resync_seconds))
        memo.analysis_task = asyncio.create_task(analyse_forever(
            reconciler, namespaces, options.prometheus_url, options.analysis_tick_seconds,
            options.prometheus_headers_dir,
        ))
        memo.probe_task = asyncio.create_task(probe_forever(reconciler, namespaces))
        # Last, after everything that can fail: a start-up kopf retries registers it once.
        watch_leader_worker_sets(kopf.get_default_registry(), groups)
    except BaseException:
        # A start-up that fails (kopf retries it from the top, with a new client) or is cancelled (the operator
        # stopped while it waited for the lease) leaves no connection to the apiserver open: the cleanup handler
        # closes only the client of a start-up that got the lease.
        await client.close()
        raise


def _hub(options: OperatorSettings) -> HubConfigs | None:
    """The Hub client for models outside the catalog (configs cached under the operator's cache directory);
    None when offline (ConfigMaps, the spec and the catalog only)."""
    if options.hub_offline:
        return None
    from specdeploy.modelsource.hub import HubClient  # loads huggingface_hub: only when the Hub is asked

    token = options.hub_token.get_secret_value() if options.hub_token is not None else None
    return HubClient(options.cache_dir / "hub-configs", endpoint=options.hub_endpoint, token=token)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    for task_name in ("analysis_task", "probe_task", "resync_task", "lease_task"):
        task = getattr(memo, task_name, None)
        if task is not None:
            task.cancel()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        await server.cleanup()
    election = getattr(memo, "election", None)
    if election is not None:
        await election.release()
        await election.client.close()


# A failed reconcile is retried after 5 s (kopf's default is 60 s); the resync catches anything else.
@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile", backoff=5)
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile", backoff=5)
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", backoff=5)
async def reconcile_sd(body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    memo.reconciler.watched.seen(SD, dict(body))   # the version this handler is for: the pass decides on it
    await memo.reconciler.reconcile(namespace or "", name)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def sd_seen(event: Mapping[str, Any], namespace: str | None, name: str, uid: str, memo: Any, type: str,
                  **_: Any) -> None:
    """Keep the operator's picture of every SD (`Reconciler.watched`) current: the analysis loop finds the
    SDs due for a sample there, and a sample decides on it when nothing changed it since the last read."""
    if type == "DELETED":
        memo.reconciler.watched.gone(SD, namespace or "", name)
        memo.handled_specs.forget(uid)
    else:
        memo.reconciler.watched.seen(SD, event["object"])


def _retry_not_acted_on(annotations: Mapping[str, str], status: Mapping[str, Any], **_: Any) -> bool:
    value = annotations.get(RETRY_ANNOTATION)
    return bool(value) and value != (status.get("speculation") or {}).get("retryAnnotationSeen")


@kopf.on.event(GROUP, VERSION, PLURAL, when=_retry_not_acted_on)
async def retry_speculation_asked(namespace: str | None, name: str, memo: Any, type: str, **_: Any) -> None:
    """`kubectl annotate sd … specdeploy.io/retry-speculation=<new value>`: act now, not at the next resync."""
    if type:   # no type: the initial listing; resume covers it
        memo.reconciler.request(namespace or "", name, Trigger.SPEC)


@kopf.on.event(*DEPLOYMENTS)
async def child_changed(
    event: Mapping[str, Any], resource: kopf.Resource, namespace: str | None, name: str, labels: Mapping[str, str],
    memo: Any, type: str, **_: Any,
) -> None:
    """A variant's Deployment or LeaderWorkerSet changed: keep the watched copy (under its kind) and ask for a
    pass, so that Ready follows the rollout, or a group's readiness, at once."""
    if type == "DELETED":
        memo.reconciler.watched.gone(resource.kind, namespace or "", name)
    else:
        memo.reconciler.watched.seen(resource.kind, event["object"])
    owner = labels.get(LABEL_NAME)
    if owner is not None and namespace is not None and type:  # no type: the initial listing; resume covers it
        memo.reconciler.request(namespace, owner)


def watch_leader_worker_sets(registry: kopf.OperatorRegistry, groups: LeaderWorkerSets) -> None:
    """Watch the child LeaderWorkerSets with `child_changed`, where the operator runs them (`groups.usable`: the
    CRD exists and it may read and write them). Registered from the start-up handler, which kopf runs before it
    looks at its handlers' resources; a handler registered by its decorator would make an operator without
    LeaderWorkerSets log an unresolved resource at start, or a watch refused (403): docs/decisions.md."""
    if groups.usable:
        kopf.on.event(*LEADER_WORKER_SETS, registry=registry)(child_changed)


@kopf.on.event(*PODS, labels={LABEL_VARIANT: "speculative"})
async def speculative_pod_changed(
    namespace: str | None, labels: Mapping[str, str], status: Mapping[str, Any], memo: Any, type: str, **_: Any
) -> None:
    """A speculative pod's container restarted (an OOM death rolls back at once), or the pod is gone (the
    last one that speculated makes `speculation.active` false): reconcile at once."""
    owner = labels.get(LABEL_NAME)
    restarted = any(c.get("restartCount", 0) > 0 for c in status.get("containerStatuses") or [])
    if owner is not None and namespace is not None and type and (restarted or type == "DELETED"):
        memo.reconciler.request(namespace, owner)

