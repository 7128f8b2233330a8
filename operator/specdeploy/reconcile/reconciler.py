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
import logging
import os
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
from specdeploy.api.status import Finding, Severity, SpeculativeDeploymentStatus
from specdeploy.engines import EngineRenderError
from specdeploy.planning.catalog import UnknownModel
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile import kube
from specdeploy.reconcile.children import LABEL_VARIANT, Variant, desired_children, engine_command, variants
from specdeploy.reconcile.conditions import Event, Reason, transition_events
from specdeploy.reconcile.observed import PodsObserved, observe_pods
from specdeploy.reconcile.speculation import SpeculationStep, step_speculation
from specdeploy.reconcile.status import Planned, next_status, refused_status

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


def plan_resource(resource: SpeculativeDeployment) -> Planned:
    """Plan `resource`'s spec; a model the planner cannot resolve or an engine that cannot render it is
    an outcome (with a finding), not an exception."""
    try:
        plan = make_plan(resource.spec)
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
        planned = plan_resource(resource)
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
