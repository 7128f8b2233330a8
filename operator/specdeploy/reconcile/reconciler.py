"""`reconcile`: read one SpeculativeDeployment, plan it, decide on speculation, apply its children,
write its status, tell people.

Level-based and idempotent: every trigger (the SD changed, a child changed, an analysis sample, the
periodic resync) runs the same function on the object as it is now, under one lock per object, so an
operator killed at any point and restarted converges to the same children and status. A generation
that is rejected changes nothing that runs. A rollback is written to status before anything acts on
it, and its Event (fixed name) and alert are sent once, then marked as sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
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

from specdeploy.analysis import evidence
from specdeploy.analysis.alerts import AlertmanagerError, post_alerts, rollback_alert
from specdeploy.analysis.headers import InvalidHeaders, directory_headers
from specdeploy.analysis.metrics import OperatorMetrics
from specdeploy.analysis.oom import out_of_memory
from specdeploy.analysis.samples import DeploymentSample
from specdeploy.analysis.verdict import kind
from specdeploy.api.resource import SpeculativeDeployment, describe_validation_error
from specdeploy.api.spec import SpeculativeDeploymentSpec
from specdeploy.api.status import Finding, Severity, SpeculativeDeploymentStatus
from specdeploy.engines import EngineRenderError
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
from specdeploy.reconcile import kube
from specdeploy.reconcile.children import LABEL_VARIANT, Variant, desired_children, engine_command, variants
from specdeploy.reconcile.conditions import Event, Reason, transition_events
from specdeploy.reconcile.observed import PodsObserved, observe_pods
from specdeploy.reconcile.speculation import SpeculationStep, step_speculation
from specdeploy.reconcile.status import Planned, next_status, pinned_to_record, refused_status

logger = logging.getLogger(__name__)

ROLLBACK_EVENT_REASON = "SpeculationRolledBack"
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
                  spec: SpeculativeDeploymentSpec | None = None) -> Planned:
    """Plan `resource`'s spec (or `spec`, the same with revisions pinned) with `models` as resolved (None:
    the spec's architecture and the catalog); a model the planner cannot resolve or an engine that cannot
    render it is an outcome (with a finding), not an exception."""
    try:
        plan = make_plan(spec or resource.spec, models)
    except UnknownModel as error:
        return Planned(None, Finding(code=Reason.UNKNOWN_MODEL, severity=Severity.ERROR, message=str(error)))
    if plan.accepted:
        try:
            for variant in variants(resource.spec):
                engine_command(plan, variant, speculate=True)
        except EngineRenderError as error:
            return Planned(None, Finding(code=Reason.ENGINE_CANNOT_RUN, severity=Severity.ERROR, message=str(error)))
    return Planned(plan)


@dataclass
class Reconciler:
    """Operator-wide state (kept in kopf's memo): the API client, defaults, metrics, one lock per SD."""

    client: AsyncClient
    pod_monitors: bool = False
    alertmanager_url: str | None = None     # used when an SD sets no spec.alerting.alertmanagerUrl
    alertmanager_headers_dir: Path | None = None   # headers for alertmanager_url when the SD names no Secret
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    hub: HubConfigs | None = None    # None: offline, the spec, ConfigMaps and the catalog only
    _resolved: dict[str, tuple[float, ResolvedModels]] = field(default_factory=dict)
    _locks: defaultdict[tuple[str, str], asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    _slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(CONCURRENT_RECONCILES))

    async def reconcile(self, namespace: str, name: str, sample: DeploymentSample | None = None) -> None:
        """Bring SD `namespace/name` and its children to what its spec and status say; `sample` is an
        analysis sample taken for it this cycle."""
        async with self._locks[(namespace, name)], self._slots:
            body = await kube.get_resource(self.client, namespace, name)
            if body is None:
                self._locks.pop((namespace, name), None)
                self.metrics.forget(namespace, name)
                return
            await self._reconcile(body, sample)

    async def _reconcile(self, body: dict[str, Any], sample: DeploymentSample | None) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        generation = int(body["metadata"].get("generation") or 0)
        old_status: dict[str, Any] = body.get("status") or {}
        previous = SpeculativeDeploymentStatus.model_validate(old_status)
        try:
            resource = SpeculativeDeployment.model_validate({**body, "status": None})
        except ValidationError as error:
            # The CRD admitted it (an older CRD, or a rule only Python checks): say so, change nothing.
            problem = describe_validation_error(error)
            logger.warning("%s/%s does not validate: %s", namespace, name, problem)
            refused = refused_status(previous, generation, Reason.INVALID_SPEC, (
                f"generation {generation} does not validate, so nothing was changed: {problem}; fix the spec "
                "(the CRD installed may be older than the operator: apply this version's CRD)"),
                evidence.rfc3339(datetime.datetime.now(datetime.UTC)))
            await self._write_status_and_events(body, previous, old_status, refused, [])
            return
        planned = await self._plan(resource, previous)
        moment = datetime.datetime.now(datetime.UTC)
        now = evidence.rfc3339(moment)
        existing = await kube.observe_deployments(self.client, namespace, name)
        observed = await self._pods(resource, planned, sample)
        stuck = observed.stuck if observed is not None else None
        step = await self._step(resource, previous, planned, sample, moment, observed)
        status = next_status(previous, resource.spec, generation, planned, existing, now,
                             step.speculation, step.analysis, stuck)
        events: list[Event] = list(step.events)
        if step.rollback is not None:
            # Persist the decision before acting on it: after a crash from here on, the status already
            # says "rolled back", so the decision is never taken twice.
            await kube.write_status(self.client, namespace, name, old_status, status.to_wire())
            old_status = status.to_wire()
            self.metrics.rollback(namespace, name, step.rollback.reason.value)
            logger.warning("%s/%s rolled back: %s", namespace, name, step.rollback.evidence)
            if os.environ.get(FAULT_ENV) == "exit-after-rollback-decision":
                os._exit(137)
        children = None
        if planned.plan is not None and planned.accepted:
            children = desired_children(resource.model_copy(update={"status": status}), planned.plan,
                                        pod_monitor=self.pod_monitors)
        # An analysis sample whose step changed no child needs no apply: most of a cycle's cost with many
        # SDs. Every other trigger (the resync included) applies, which restores hand edits.
        if children is not None and (sample is None or not kube.already_applied(children, generation, existing)):
            refusal = None
            try:
                events += await kube.apply_children(self.client, children, generation, existing)
                events += await kube.prune_children(self.client, namespace, name, children, existing,
                                                    self.pod_monitors)
            except ApiError as error:
                if error.status.code not in REFUSED_CODES:
                    raise
                refusal = error.status.message
            existing = await kube.observe_deployments(self.client, namespace, name)
            status = next_status(previous, resource.spec, generation, planned, existing, now,
                                 step.speculation, step.analysis, stuck)
            if refusal is not None:
                logger.warning("%s/%s: the apiserver refused a child: %s", namespace, name, refusal)
                status = refused_status(status, generation, Reason.APPLY_REFUSED, (
                    f"the apiserver refused a child of generation {generation}: {refusal}; change the spec "
                    "so that its children are valid (names, sizes), or grant the operator what it lacks"), now)
        await self._write_status_and_events(body, previous, old_status, status, events)
        self._observe(namespace, name, status, step)
        await self._notify(body, resource, status, step, moment, sampled=sample is not None)

    async def _plan(self, resource: SpeculativeDeployment, previous: SpeculativeDeploymentStatus) -> Planned:
        """Resolve the models (a ConfigMap's config.json, the Hub in a thread — at the commits the last plan
        pinned while the spec asks for the same revisions — or the catalog) and plan. A resolution error is
        an outcome; a transient one (the Hub unreachable) leaves the last good plan standing, and the
        resync tries again."""
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
        return plan_resource(resource, models, pinned)

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
                token = await kube.secret_value(self.client, namespace, token_secret, "token")
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

    async def _write_status_and_events(self, body: dict[str, Any], previous: SpeculativeDeploymentStatus,
                                       old_status: dict[str, Any], status: SpeculativeDeploymentStatus,
                                       events: list[Event]) -> None:
        """Write `status` when it changed, then post `events` and those its condition transitions raise."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        events = [*events, *transition_events(previous.conditions, status.conditions)]
        new_status = status.to_wire()
        if new_status != old_status:
            await kube.write_status(self.client, namespace, name, old_status, new_status)
        for event in events:
            logger.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
            await kube.post_event(self.client, body, event)

    async def _step(self, resource: SpeculativeDeployment, previous: SpeculativeDeploymentStatus,
                    planned: Planned, sample: DeploymentSample | None, now: datetime.datetime,
                    observed: PodsObserved | None) -> SpeculationStep:
        """The speculation step, with the OOM deaths of the speculative pods since speculation started and
        what the pods run now (`speculation.active`: a rollback is done when no pod speculates).

        Pods are listed on every trigger but an analysis sample: a restart is a pod event and a pod that
        comes or goes changes its Deployment's status, each of which reconciles at once, and the resync
        looks again; a label list is the costliest read of a cycle with many SDs (~90 ms right after a
        write, docs/performance.md). An analysis sample keeps the last observation."""
        deaths = []
        speculation = previous.speculation
        if observed is not None and speculation is not None and speculation.decided:
            since = evidence.parse_rfc3339(speculation.since) if speculation.since else None
            deaths = out_of_memory(list(observed.speculative), since)
        step = step_speculation(resource, previous.speculation, previous.analysis, planned.accepted, sample,
                                deaths, now)
        if observed is None:
            return step
        return dataclasses.replace(step, speculation=step.speculation.model_copy(update={
            "active": observed.running.active, "speculating_pods": len(observed.running.speculating)}))

    async def _pods(self, resource: SpeculativeDeployment, planned: Planned,
                    sample: DeploymentSample | None) -> PodsObserved | None:
        """The engine pods, listed on every trigger but an analysis sample (see `_step`)."""
        if sample is not None or not planned.accepted:
            return None
        namespace, name = resource.metadata.namespace or "", resource.metadata.name
        pods = await kube.engine_pods(self.client, namespace, name)
        replica_sets = await kube.speculative_replica_sets(self.client, namespace, name) if pods else []
        return observe_pods(pods, replica_sets, LABEL_VARIANT, Variant.SPECULATIVE.value)

    def _observe(self, namespace: str, name: str, status: SpeculativeDeploymentStatus, step: SpeculationStep) -> None:
        if status.speculation is not None:
            self.metrics.speculation_active(namespace, name, status.speculation.active)
        if step.verdict is not None:
            self.metrics.verdict(kind(step.verdict))
            self.metrics.acceptance_rate(namespace, name, step.analysis.acceptance_rate if step.analysis else None)
            speedup = step.analysis.speedup if step.analysis else None
            self.metrics.speedup_interval(namespace, name, (speedup.value, speedup.low, speedup.high) if speedup else None)

    async def _notify(self, body: dict[str, Any], resource: SpeculativeDeployment,
                      status: SpeculativeDeploymentStatus, step: SpeculationStep, now: datetime.datetime,
                      sampled: bool) -> None:
        """The rollback's Event and alert, once; the alert kept firing while rolled back, resolved after."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        speculation = status.speculation
        record = speculation.last_rollback if speculation is not None else None
        if speculation is None or record is None:
            return
        url = resource.spec.alerting.alertmanager_url or self.alertmanager_url
        secret = resource.spec.alerting.headers_secret_ref
        own = resource.spec.alerting.alertmanager_url is None and secret is None
        headers_dir = self.alertmanager_headers_dir if own else None   # the operator's only to its own URL
        started = evidence.parse_rfc3339(record.at)

        async def alert(ends_at: datetime.datetime | None) -> bool:
            if not url:
                return True
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
                await post_alerts(url, [rollback_alert(namespace, name, record.reason, record.evidence, "",
                                                       started, ends_at)], headers=headers)
            except AlertmanagerError as error:
                logger.warning("%s/%s: could not send the rollback alert to %s: %s", namespace, name, url, error)
                return False
            return True

        if step.reenabled is not None:
            await alert(ends_at=now)
            return
        if speculation.decided:
            return
        if not record.notified:
            event = Event.warning(ROLLBACK_EVENT_REASON, f"{record.reason}: {record.evidence}")
            posted = await kube.post_event(self.client, body, event,
                                           name=f"{name}.speculation-rolled-back-{speculation.rollbacks}")
            if posted and await alert(ends_at=None):
                marked = status.model_copy(update={"speculation": speculation.model_copy(update={
                    "last_rollback": record.model_copy(update={"notified": True})})})
                await kube.write_status(self.client, namespace, name, status.to_wire(), marked.to_wire())
        elif sampled:
            await alert(ends_at=None)  # every analysis cycle: Alertmanager resolves an alert not re-sent
