"""`reconcile`: one pass over one SpeculativeDeployment — observe, decide, act.

    observed = await self._observe(body, trigger, sample)   # the SD, its plan, children, pods, the sample
    actions = decide(observed, now)                         # pure: reconcile/decide.py
    await self._act(observed, actions, now)                 # apply, post, write status once

Level-based and idempotent: every trigger (the SD changed, a child changed, an analysis sample, the
periodic resync) runs the same pass on the object as it is now, under one lock per object, so an
operator killed at any point and restarted converges to the same children and status. A generation
that is rejected changes nothing that runs. A pass that changes nothing writes nothing; one writes the
status at most once, and a rollback is written before anything acts on it. Its Event (fixed name) and
alert are posted once, then marked as posted.

What a pass reads depends on its trigger (`Trigger`): everything after the SD changed and on the resync;
the Deployments and pods after a child changed; the Deployments alone on an analysis sample, which takes
the SD and the Deployments from the operator's own watches when nothing changed them since its last read or
write (`Watched`). Passes asked for by child events are coalesced (`request`): while one is waiting for its
turn, more events for the same SD ask for nothing more, since the pass reads the SD as it is when it starts —
a Deployment's rollout raises five or six events, and a burst of a thousand SDs would otherwise queue a pass
for each.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from pydantic import ValidationError

from specdeploy.api.resource import SpeculativeDeployment, describe_validation_error
from specdeploy.api.spec import TOKEN_SECRET_KEY, SpeculativeDeploymentSpec
from specdeploy.api.status import Finding, ProbeStatus, Severity, SpeculativeDeploymentStatus
from specdeploy.clients import kube
from specdeploy.clients.alertmanager import AlertmanagerError, AlertmanagerNotAllowed, post_alerts
from specdeploy.clients.endpoints import AllowedEndpoints
from specdeploy.clients.headers import InvalidHeaders, directory_headers
from specdeploy.controller.metrics import OperatorMetrics
from specdeploy.controller.watched import DEPLOYMENT, SD, Watched, resource_version
from specdeploy.engines import EngineRenderError
from specdeploy.judgment.samples import DeploymentSample
from specdeploy.judgment.verdict import kind
from specdeploy.modelsource import ConfigUnreadable, ModelSourceError, TokenUnreadable
from specdeploy.modelsource.resolve import (
    ConfigMapConfig,
    HubConfigs,
    ResolvedModels,
    Supplied,
    resolve_models,
)
from specdeploy.planning.catalog import UnknownModel
from specdeploy.planning.plan import make_plan
from specdeploy.planning.schedule import calibrated_hardware_factor
from specdeploy.reconcile.children import (
    LABEL_VARIANT,
    PodMonitoring,
    Variant,
    deployment_name,
    engine_command,
    variants,
)
from specdeploy.reconcile.conditions import Event, Reason
from specdeploy.reconcile.decide import Actions, Notice, Observed, decide, noticed, observing, refused
from specdeploy.reconcile.leaderworkerset import LWS_KIND, LeaderWorkerSets
from specdeploy.reconcile.observed import PodsObserved, observe_pods
from specdeploy.reconcile.status import (
    Planned,
    deferrable_sample_write,
    pinned_to_record,
    status_refresh_seconds,
)

logger = logging.getLogger(__name__)

FAULT_ENV = "SPECDEPLOY_FAULT"
"""Fault injection for the crash tests: `exit-after-rollback-decision` kills the process (as SIGKILL would,
no clean-up) right after a rollback decision is written, before anything acts on it."""
CONCURRENT_RECONCILES = 32
"""Reconciles in flight at once, whatever triggered them: a burst (1000 SDs applied together, a restart)
would otherwise start one per SD on one HTTP connection pool of 100 and time out by the hundred
(benchmarks/reconcile.py, docs/performance.md)."""
REFUSED_CODES = frozenset({400, 403, 413, 422})
"""Apiserver answers to a child that retrying the same request cannot change (invalid, forbidden, too large):
they go into status as Ready=False ApplyRefused instead of an exception retried without end."""


RESOLVED_SECONDS = 300.0
"""How long a resolution is reused: a branch's commit is looked up again after this (a pinned commit's
config.json is cached on disk for good)."""
FALLBACK_SECONDS = 60.0
"""How long the catalog stands in for an unreachable Hub before the Hub is asked again."""


class Trigger(enum.Enum):
    """Why a pass runs, which says what it reads (an analysis sample is a pass with a sample and no trigger)."""

    SPEC = "spec"       # created, spec changed, found at start-up, retry annotation: everything
    CHILD = "child"     # a child Deployment or a speculative pod changed: the Deployments in full and the pods
    RESYNC = "resync"   # the periodic resync: everything (hand-edited or deleted children, missed events)

    @property
    def reads_everything(self) -> bool:
        return self is not Trigger.CHILD

    def merged(self, other: Trigger | None) -> Trigger:
        """The trigger of one pass that does what both would have."""
        return other if other is not None and other.reads_everything and not self.reads_everything else self


def _k_in_use(observed: Observed, status: SpeculativeDeploymentStatus, batch: float | None) -> int | None:
    """The k the rendered schedule drafts at the speculative pods' mean running batch: 0 while speculation is
    rolled back, None when the batch is not known (no series rather than a guess)."""
    if status.speculation is not None and not status.speculation.active:
        return 0
    plan = observed.planned.plan if observed.planned is not None else None
    if plan is None or plan.schedule is None or batch is None:
        return None
    return plan.schedule.k_at(max(1, round(batch)))


def _watched_sd(trigger: Trigger | None) -> bool:
    """Whether a pass decides on the watched SD (`Watched.current`; the handler of a spec change records the
    body kopf hands it first): every pass but the resync, which reads it in case a watch event was missed."""
    return trigger is not Trigger.RESYNC


def _watched_deployments(trigger: Trigger | None) -> bool:
    """Whether a pass decides on the watched Deployments: an analysis sample and a child's pass do; a pass
    after the SD changed, and the resync, read every child from the apiserver."""
    return trigger is None or trigger is Trigger.CHILD


def _resolution_key(spec: SpeculativeDeploymentSpec, target: Supplied, draft: Supplied | None) -> str:
    """What a resolution depends on: the models as the (pinned) spec names them and what was supplied."""
    def supplied(s: Supplied | None) -> object:
        if s is None:
            return None
        config = s.config_map.data if s.config_map is not None else None
        return [config, str(s.config_path) if s.config_path else None, hashlib.sha256((s.token or "").encode()).hexdigest()]

    draft_spec = spec.speculation.draft
    return json.dumps([spec.model.to_wire(), draft_spec.to_wire() if draft_spec else None,
                       spec.speculation.method, supplied(target), supplied(draft)], sort_keys=True, default=str)


def plan_resource(resource: SpeculativeDeployment, models: ResolvedModels | None = None,
                  spec: SpeculativeDeploymentSpec | None = None,
                  previous: SpeculativeDeploymentStatus | None = None,
                  groups: LeaderWorkerSets | None = None) -> Planned:
    """Plan `resource`'s spec (or `spec`, the same with revisions pinned) with `models` as resolved (None:
    the spec's architecture and the catalog); a model the planner cannot resolve, an engine that cannot
    render it, or a layout across nodes in a cluster where the operator cannot run `groups` is an outcome (with
    a finding), not an exception. `previous`: the status as read, whose measured acceptance per draft position an
    Auto schedule follows (status.speculation.calibration)."""
    speculation = previous.speculation if previous is not None else None
    calibration = speculation.calibration if speculation is not None else None
    # The table follows the hardware fit only through calibration (judgment/recalibration.py records the GPU time it
    # derived a table under), so a fit moves the pods' schedule only where that pays at the running load.
    try:
        plan = make_plan(spec or resource.spec, models, calibration=calibration,
                         hardware_factor=calibrated_hardware_factor(spec or resource.spec, calibration))
    except UnknownModel as error:
        return Planned(None, Finding(code=Reason.UNKNOWN_MODEL, severity=Severity.ERROR, message=str(error)))
    if plan.accepted:
        try:
            for variant in variants(resource.spec):
                engine_command(plan, variant, speculate=True)
        except EngineRenderError as error:
            return Planned(None, Finding(code=Reason.ENGINE_CANNOT_RUN, severity=Severity.ERROR, message=str(error)))
    groups = groups or LeaderWorkerSets()
    if plan.accepted and plan.layout.spans_nodes and not groups.usable:
        return Planned(None, Finding(code=Reason.LEADER_WORKER_SETS_UNAVAILABLE, severity=Severity.ERROR, message=(
            f"the layout spans {plan.layout.nodes} nodes ({plan.layout.describe()}), which runs as a "
            f"LeaderWorkerSet per variant, and {groups.why_not}; or fit the model in one node "
            "(`spec.model.quantization` fp8, or a GPU with more memory)")))
    return Planned(plan)


@dataclass
class Reconciler:
    """Operator-wide state (kept in kopf's memo): the API client, defaults, metrics, one lock per SD."""

    client: AsyncClient
    pod_monitoring: PodMonitoring = field(default_factory=PodMonitoring)
    alertmanager_url: str | None = None     # used when an SD sets no spec.alerting.alertmanagerUrl
    alertmanager_headers_dir: Path | None = None   # headers for alertmanager_url when the SD names no Secret
    allowed_endpoints: AllowedEndpoints = field(default_factory=AllowedEndpoints)  # URLs the operator may ask
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    hub: HubConfigs | None = None    # None: offline, the spec, ConfigMaps and the catalog only
    watched: Watched = field(default_factory=Watched)   # the SDs and Deployments kopf's watches delivered
    leader_worker_sets: LeaderWorkerSets = field(default_factory=LeaderWorkerSets)   # runs layouts across nodes
    _resolved: dict[str, tuple[float, ResolvedModels]] = field(default_factory=dict)
    _noticed: dict[tuple[str, str], int] = field(default_factory=dict)  # rollback notices posted, by number
    _requested: dict[tuple[str, str], Trigger] = field(default_factory=dict)  # passes asked for, not yet begun
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _locks: defaultdict[tuple[str, str], asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    _slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CONCURRENT_RECONCILES))
    _spec_passes_waiting: int = 0
    _no_spec_pass_waiting: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._no_spec_pass_waiting.set()

    async def reconcile(self, namespace: str, name: str, trigger: Trigger | None = Trigger.SPEC,
                        sample: DeploymentSample | None = None, probe: ProbeStatus | None = None) -> None:
        """Bring SD `namespace/name` and its children to what its spec and status say, reading what
        `trigger` needs; `sample` is an analysis sample taken for it this cycle, `probe` a probe just run
        (then `trigger` may be None). A pass asked for with `request` and not yet begun is done by this one."""
        key = (namespace, name)
        waiting = trigger is Trigger.SPEC
        if waiting:
            self._count_spec_passes_waiting(+1)
        try:
            async with self._locks[key], self._slots:
                if waiting:
                    self._count_spec_passes_waiting(-1)
                    waiting = False
                requested = self._requested.pop(key, None)
                trigger = trigger.merged(requested) if trigger is not None else requested
                await self._pass(namespace, name, trigger, sample, probe)
        finally:
            if waiting:   # cancelled before its turn
                self._count_spec_passes_waiting(-1)

    def _count_spec_passes_waiting(self, change: int) -> None:
        self._spec_passes_waiting += change
        if self._spec_passes_waiting:
            self._no_spec_pass_waiting.clear()
        else:
            self._no_spec_pass_waiting.set()

    def request(self, namespace: str, name: str, trigger: Trigger = Trigger.CHILD) -> None:
        """Ask for a pass of SD `namespace/name` without waiting for it (for watch events). While one is
        asked for and has not begun, asking again only widens what it reads; its failure is logged, and
        the resync tries again."""
        key = (namespace, name)
        if key in self._requested:
            self._requested[key] = self._requested[key].merged(trigger)
            self.metrics.pass_coalesced(trigger.value)
            return
        self._requested[key] = trigger
        task = asyncio.create_task(self._requested_pass(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _requested_pass(self, key: tuple[str, str]) -> None:
        # Passes after a spec change go first: they create what the cluster then starts (a thousand SDs
        # applied at once were planned in ~250 s instead of ~60 s while their rollouts' events took the
        # slots: docs/performance.md); a child's pass only follows a rollout. Waited for outside the SD's
        # lock, which a spec pass may be waiting for.
        await self._no_spec_pass_waiting.wait()
        async with self._locks[key], self._slots:
            trigger = self._requested.pop(key, None)
            if trigger is None:   # a pass that began meanwhile did it
                return
            try:
                await self._pass(*key, trigger, None, None)
            except Exception:  # noqa: BLE001 - nothing awaits this task; the resync tries again
                logger.exception("reconciling %s/%s after a %s event failed", key[0], key[1], trigger.value)

    async def _pass(self, namespace: str, name: str, trigger: Trigger | None, sample: DeploymentSample | None,
                    probe: ProbeStatus | None) -> None:
        self.metrics.pass_begun(trigger.value if trigger is not None else "sample")
        # The watched SD when the watch has caught up with the operator's last read or write of it.
        watched = self.watched.current(SD, namespace, name) if _watched_sd(trigger) else None
        body = dict(watched) if watched is not None else await kube.get_resource(self.client, namespace, name)
        if body is None:
            self._locks.pop((namespace, name), None)
            self._noticed.pop((namespace, name), None)
            self.watched.gone(SD, namespace, name)
            self.metrics.forget(namespace, name)
            return
        self.watched.confirm(SD, namespace, name, resource_version(body))
        observed = await self._observe(body, trigger, sample, probe)
        now = datetime.datetime.now(datetime.UTC)
        await self._act(observed, decide(observed, now), now)

    async def _observe(self, body: dict[str, Any], trigger: Trigger | None, sample: DeploymentSample | None,
                       probe: ProbeStatus | None = None) -> Observed:
        """One read of what the pass decides on: the SD, its plan and its Deployments; after a child
        changed also the Deployments in full and the pods; after the SD changed and on the resync also the
        other children in full — but no child of an SD never reconciled, which has none to report."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        held = self.watched.held(body)   # a sample's status not written yet, decided on this version
        previous = SpeculativeDeploymentStatus.model_validate(held if held is not None else body.get("status") or {})
        try:
            resource = SpeculativeDeployment.model_validate({**body, "status": None})
        except ValidationError as error:
            problem = describe_validation_error(error)
            logger.warning("%s/%s does not validate: %s", namespace, name, problem)
            return Observed(body, previous, None, invalid=problem)
        planned = await self.plan(resource, previous)
        everything = trigger is not None and trigger.reads_everything
        kinds = kube.CHILD_KINDS if everything else frozenset({"Deployment"}) if trigger is not None else frozenset()
        never_reconciled = trigger is Trigger.SPEC and held is None and not body.get("status")
        if never_reconciled:
            # Never reconciled: nothing was applied for it that a status reports, so there is nothing to
            # compare or prune, and server-side apply needs no read first. A thousand SDs created at once
            # made four gets each that found nothing (docs/performance.md). After a crash between an apply
            # and the first status write the children exist: applying again changes nothing, their Events
            # were never posted, and the resync prunes what a spec changed meanwhile no longer wants.
            kinds = frozenset()
        # Both Deployments' names unless the pass reads only what an accepted plan runs (an unwanted one is
        # pruned by a pass that reads everything).
        wanted = (() if never_reconciled else
                  variants(resource.spec) if planned.accepted and not everything else tuple(Variant))
        children = [deployment_name(name, v) for v in wanted]
        across = planned.plan is not None and planned.accepted and planned.plan.layout.spans_nodes
        # A variant runs as a Deployment or, across nodes, as a LeaderWorkerSet of the same name: a pass reads the
        # kind its plan runs, one that reads everything both (to prune the other after the layout moved), and one
        # whose generation is rejected both (what a rejected generation leaves running may be either).
        bodies = await self._deployments(namespace, children if everything or not across else [],
                                         watched=_watched_deployments(trigger))
        groups = (await kube.read_deployments(self.client, namespace, children, kind=LWS_KIND)
                  if self.leader_worker_sets.usable and (everything or across or not planned.accepted) else {})
        deployments = [state for body in [*bodies.values(), *groups.values()]
                       if (state := kube.deployment_state(body, name)) is not None]
        live: dict[tuple[str, str], dict[str, Any]] = {("Deployment", child): body for child, body in bodies.items()
                                                       if "Deployment" in kinds}
        if "Deployment" in kinds and groups:
            live |= {(LWS_KIND, child): body for child, body in groups.items()}
            kinds |= {LWS_KIND}
        live |= await kube.read_children(self.client, namespace, name, kinds=kinds,
                                               pod_monitors=self.pod_monitoring.render)
        pods = await self._pods(resource, planned, created=bool(deployments) or previous.speculation is not None
                                ) if trigger is not None else None
        rollbacks = previous.speculation.rollbacks if previous.speculation is not None else None
        return Observed(body, previous, resource, planned=planned, deployments=tuple(deployments),
                        live=live, live_kinds=kinds, pods=pods, sample=sample, probe=probe,
                        notice_posted=self._noticed.get((namespace, name)) == rollbacks,
                        pod_monitoring=self.pod_monitoring)

    async def _deployments(self, namespace: str, names: list[str], watched: bool) -> dict[str, dict[str, Any]]:
        """The Deployments named `names` that exist, as JSON by name, in `names`' order: with `watched` the
        watched copy of each one the watch has caught up with, the others read."""
        found_watched = {}
        for child in names if watched else ():
            body = self.watched.current(DEPLOYMENT, namespace, child)
            if body is not None:
                found_watched[child] = body
        read = await kube.read_deployments(self.client, namespace, [n for n in names if n not in found_watched])
        for child in names:
            if child not in found_watched:
                self.watched.confirm(DEPLOYMENT, namespace, child, resource_version(read[child]) if child in read else None)
        found = {**found_watched, **read}
        return {child: dict(found[child]) for child in names if child in found}

    async def _act(self, observed: Observed, actions: Actions, now: datetime.datetime) -> None:
        """Do what `decide` said, in its order, writing status once (twice only when the pass that decided
        a rollback also has a child refused: the refusal is known after the first write)."""
        namespace, name = observed.namespace, observed.name
        written: dict[str, Any] = observed.body.get("status") or {}
        if actions.write_first:
            # Persist the decision before acting on it: after a crash from here on, the status already
            # says "rolled back", so the decision is never taken twice.
            written = await self._write_status(observed, written, actions.status)
            if actions.rollback is not None:
                self.metrics.rollback(namespace, name, actions.rollback.reason.value)
                logger.warning("%s/%s rolled back: %s", namespace, name, actions.rollback.evidence)
            if os.environ.get(FAULT_ENV) == "exit-after-rollback-decision":
                os._exit(137)
        applied: list[Event] = []
        if actions.children is not None:
            existing = list(observed.deployments)
            try:
                # What the applies and deletes return: the watched copies stand in again once the watch has it.
                applied += await kube.apply_children(
                    self.client, actions.children, observed.generation, existing,
                    applied_version=lambda child, version: self.watched.confirm(DEPLOYMENT, namespace, child, version))
                applied += await kube.prune_children(
                    self.client, namespace, name, actions.children, existing, self.pod_monitoring.render,
                    deleted=lambda child: self.watched.confirm(DEPLOYMENT, namespace, child, None))
            except ApiError as error:
                if error.status.code not in REFUSED_CODES:
                    raise
                logger.warning("%s/%s: the apiserver refused a child: %s", namespace, name, error.status.message or error)
                actions = refused(observed, actions, error.status.message or str(error), now)
        if actions.notice is not None and await self._post_notice(observed, actions.notice):
            if actions.write_first:
                self._noticed[(namespace, name)] = actions.notice.rollbacks   # the next pass marks it
            else:
                actions = noticed(actions)
        await self._write_status(observed, written, actions.status, may_wait=not actions.write_first)
        for event in [*applied, *actions.events]:
            logger.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
            await kube.post_event(self.client, observed.body, event)
        if actions.alert is not None:
            await self._send_alert(observed, actions.alert)
        self._record_metrics(observed, actions)

    async def _write_status(self, observed: Observed, written: dict[str, Any],
                            status: SpeculativeDeploymentStatus, may_wait: bool = False) -> dict[str, Any]:
        """Write `status` unless it is what the apiserver holds (`written`), or (`may_wait`) it differs only
        in a sample's time and inconclusive count for less than the SD's refresh period: then it is held for
        the next pass on this version of the SD (`Watched.hold`). Returns the status the apiserver holds."""
        namespace, name = observed.namespace, observed.name
        new = status.to_wire()
        if may_wait and new != written and deferrable_sample_write(written, new, status_refresh_seconds(namespace, name)):
            self.watched.hold(namespace, name, resource_version(observed.body), new)
            return written
        self.watched.release(namespace, name)
        if new != written:
            version = await kube.write_status(self.client, namespace, name, written, new)
            self.watched.confirm(SD, namespace, name, version)
        return new

    async def plan(self, resource: SpeculativeDeployment, previous: SpeculativeDeploymentStatus) -> Planned:
        """Resolve the models (a ConfigMap's config.json, the Hub in a thread — at the commits the last plan
        pinned while the spec asks for the same revisions — or the catalog) and plan. A resolution error is
        an outcome; a transient one (the Hub unreachable) leaves the last good plan standing, and the
        resync tries again. The pass plans with it, and so does a probe (controller/probe_loop.py)."""
        pinned = pinned_to_record(resource.spec, previous.deploy_record)
        try:
            target, draft = await self._supplied(resource)
            key = _resolution_key(pinned, target, draft)
            cached = self._resolved.get(key)
            if cached is not None and cached[0] > time.monotonic():
                models = cached[1]
            else:
                models = await asyncio.to_thread(resolve_models, pinned, hub=self.hub, offline=self.hub is None,
                                                 target=target, draft=draft)
                self._remember(key, models)
        except ModelSourceError as error:
            logger.warning("%s/%s: cannot resolve its models: %s", resource.metadata.namespace,
                           resource.metadata.name, error)
            return Planned(None, Finding(code=error.reason, severity=Severity.ERROR, message=str(error)),
                           transient=error.transient)
        return plan_resource(resource, models, pinned, previous, self.leader_worker_sets)

    def _remember(self, key: str, models: ResolvedModels) -> None:
        """Keep a resolution for RESOLVED_SECONDS (one that fell back to the catalog for FALLBACK_SECONDS):
        analysis samples, every few seconds per SD, must not ask the Hub each time."""
        now = time.monotonic()
        fell_back = any(m is not None and m.origin.warnings for m in (models.target, models.draft))
        self._resolved = {k: v for k, v in self._resolved.items() if v[0] > now}
        self._resolved[key] = (now + (FALLBACK_SECONDS if fell_back else RESOLVED_SECONDS), models)

    async def _supplied(self, resource: SpeculativeDeployment) -> tuple[Supplied, Supplied | None]:
        """What the SD's namespace supplies for each model: a ConfigMap's config.json, a token Secret."""
        namespace = resource.metadata.namespace or ""

        async def supplied(spec_field: str, config_map: str | None, path: str | None,
                           token_secret: str | None) -> Supplied:
            data = None
            if config_map:
                data = await kube.config_map_data(self.client, namespace, config_map)
                if data is None:
                    raise ConfigUnreadable(
                        f"ConfigMap {namespace}/{config_map} (`{spec_field}.configMapRef`) does not exist: create "
                        f"it with the model's config.json under the key config.json "
                        f"(kubectl create configmap -n {namespace} {config_map} --from-file=config.json)")
            token = None
            if token_secret:
                try:
                    token = await kube.secret_value(self.client, namespace, token_secret, TOKEN_SECRET_KEY)
                except ApiError as error:
                    if error.status.code != 403:
                        raise
                    raise TokenUnreadable(
                        f"the operator may not read Secret {namespace}/{token_secret} (`{spec_field}.tokenSecretRef`): "
                        "grant it get on Secrets in this namespace (the chart's rbac.readSecrets)") from error
                if token is None:
                    raise TokenUnreadable(
                        f"Secret {namespace}/{token_secret} (`{spec_field}.tokenSecretRef`) does not exist or has "
                        f"no key token: kubectl create secret generic -n {namespace} {token_secret} "
                        "--from-literal=token=<a Hugging Face token>")
            # A configPath is in the engine's model volume: read only where the operator mounts it too.
            readable = Path(path) if path and Path(path).exists() else None
            return Supplied(config_map=ConfigMapConfig(config_map, data) if config_map and data is not None else None,
                            config_path=readable, token=token)

        model, draft = resource.spec.model, resource.spec.speculation.draft
        target = await supplied("spec.model", model.config_map_ref, model.config_path, model.token_secret_ref)
        if draft is None:
            return target, None
        return target, await supplied("spec.speculation.draft", draft.config_map_ref, draft.config_path,
                                      draft.token_secret_ref)

    async def _pods(self, resource: SpeculativeDeployment, planned: Planned, created: bool) -> PodsObserved | None:
        """The engine pods, listed on every trigger but an analysis sample (reconcile/decide.py `_step`).
        `created`: the SD has a Deployment or a status; a new one's first pass has no pods to list (a
        thousand SDs applied at once made a thousand pod lists that could find nothing)."""
        if not planned.accepted:
            return None
        if not created:
            return observe_pods([], [], LABEL_VARIANT, Variant.SPECULATIVE.value)
        namespace, name = resource.metadata.namespace or "", resource.metadata.name
        pods = await kube.engine_pods(self.client, namespace, name)
        replica_sets = await kube.speculative_replica_sets(self.client, namespace, name) if pods else []
        return observe_pods(pods, replica_sets, LABEL_VARIANT, Variant.SPECULATIVE.value)

    def _record_metrics(self, observed: Observed, actions: Actions) -> None:
        """The gauges of what this pass decided, from the decision itself (the judgment's verdict, its floor)."""
        namespace, name, status = observed.namespace, observed.name, actions.status
        if status.speculation is not None:
            self.metrics.speculation_active(namespace, name, status.speculation.active)
        self.metrics.probe(namespace, name, status.probe.cells if status.probe is not None else ())
        if actions.would_roll_back is not None:
            self.metrics.would_roll_back(namespace, name, actions.would_roll_back.reason.value)
        if actions.verdict is not None:
            analysis = status.analysis
            self.metrics.verdict(kind(actions.verdict))
            self.metrics.acceptance_rate(namespace, name, analysis.acceptance_rate if analysis else None)
            speedup = analysis.speedup if analysis else None
            self.metrics.speedup_interval(namespace, name, (speedup.value, speedup.low, speedup.high) if speedup else None)
            if analysis is not None and analysis.verdict is not None:
                self.metrics.judged(namespace, name, analysis.verdict.value, analysis.verdict_reason or "",
                                    observing(observed), analysis.acceptance_floor, analysis.consecutive_inconclusive)
        elif observed.sample is not None:
            # Sampled with no speculation to judge (rolled back, or off): no acceptance or speedup of it any more.
            self.metrics.acceptance_rate(namespace, name, None)
            self.metrics.speedup_interval(namespace, name, None)
        if observed.sample is not None:
            batch = observed.sample.speculative.running_per_pod
            self.metrics.batch_and_k(namespace, name, {
                "speculative": batch, "control": observed.sample.control.running_per_pod},
                _k_in_use(observed, status, batch))

    async def _post_notice(self, observed: Observed, notice: Notice) -> bool:
        """The rollback's Event and alert; True when both went out (the Event found there counts)."""
        logger.info("%s/%s %s: %s", observed.namespace, observed.name, notice.event.reason, notice.event.message)
        posted = await kube.post_event(self.client, observed.body, notice.event, name=notice.event_name)
        return posted and await self._send_alert(observed, notice.alert)

    async def _send_alert(self, observed: Observed, alert: dict[str, Any]) -> bool:
        """Post `alert` to the SD's Alertmanager (`spec.alerting`, else the operator's); True when sent or
        when there is no Alertmanager to send to. Failures are logged and retried by a later pass."""
        namespace, name = observed.namespace, observed.name
        alerting = observed.resource.spec.alerting if observed.resource is not None else None
        if alerting is None:
            return True
        url = alerting.alertmanager_url or self.alertmanager_url
        if not url:
            return True
        secret = alerting.headers_secret_ref
        own = alerting.alertmanager_url is None and secret is None
        headers_dir = self.alertmanager_headers_dir if own else None   # the operator's only to its own URL
        try:
            if secret:
                headers = await kube.secret_headers(self.client, namespace, secret)
            elif headers_dir is not None:
                headers = await asyncio.to_thread(directory_headers, headers_dir)
            else:
                headers = None
        except (ApiError, InvalidHeaders) as error:   # neither message holds a value
            reason = error.status.message if isinstance(error, ApiError) else str(error)
            where = (f"Secret {namespace}/{secret} (`spec.alerting.headersSecretRef`)" if secret
                     else "--alertmanager-headers-dir")
            logger.warning("%s/%s: cannot read the Alertmanager headers from %s: %s; the alert is retried "
                           "next cycle", namespace, name, where, reason)
            return False
        try:
            await post_alerts(url, [alert], headers=headers, allowed=self.allowed_endpoints)
        except AlertmanagerNotAllowed as error:   # never sendable: said once on the SD, not retried
            logger.warning("%s/%s: %s", namespace, name, error)
            await kube.post_event(self.client, observed.body, Event.warning("AlertmanagerNotAllowed", str(error)),
                                  name=f"{name}.alertmanager-not-allowed")
            return True
        except AlertmanagerError as error:
            logger.warning("%s/%s: could not send the rollback alert to %s: %s", namespace, name, url, error)
            return False
        return True
