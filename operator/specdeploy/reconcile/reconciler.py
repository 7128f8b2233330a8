"""`reconcile`: read one SpeculativeDeployment, plan it, apply its children, write its status.

Level-based and idempotent: every trigger (the SD changed, a child changed, the periodic resync) runs
the same function on the object as it is now, under one lock per object, so an operator killed at any
point and restarted converges to the same children and status. A generation that is rejected changes
nothing that runs.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient
from pydantic import ValidationError

from specdeploy.api.resource import SpeculativeDeployment, describe_validation_error
from specdeploy.api.status import Finding, Severity, SpeculativeDeploymentStatus
from specdeploy.engines import EngineRenderError
from specdeploy.planning.catalog import UnknownModel
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile import kube
from specdeploy.reconcile.children import desired_children, engine_command, variants
from specdeploy.reconcile.conditions import Event, Reason, transition_events
from specdeploy.reconcile.status import Planned, next_status

logger = logging.getLogger(__name__)


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    """Operator-wide state (kept in kopf's memo): the API client and one lock per SpeculativeDeployment."""

    client: AsyncClient
    pod_monitors: bool = False
    _locks: defaultdict[tuple[str, str], asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))

    async def reconcile(self, namespace: str, name: str) -> None:
        """Bring SD `namespace/name` and its children to what its spec and status say."""
        async with self._locks[(namespace, name)]:
            body = await kube.get_resource(self.client, namespace, name)
            if body is None:
                self._locks.pop((namespace, name), None)
                return
            await self._reconcile(body)

    async def _reconcile(self, body: dict[str, Any]) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        generation = int(body["metadata"].get("generation") or 0)
        old_status: dict[str, Any] = body.get("status") or {}
        previous = SpeculativeDeploymentStatus.model_validate(old_status)
        try:
            resource = SpeculativeDeployment.model_validate({**body, "status": None})
        except ValidationError as error:
            # The CRD admitted it (an older CRD, or a rule only Python checks): say so, change nothing.
            logger.warning("%s/%s does not validate: %s", namespace, name, describe_validation_error(error))
            return
        planned = plan_resource(resource)
        now = rfc3339(datetime.datetime.now(datetime.UTC))
        existing = await kube.observe_deployments(self.client, namespace, name)
        status = next_status(previous, resource.spec, generation, planned, existing, now)
        events: list[Event] = []
        if planned.plan is not None and planned.accepted:
            children = desired_children(resource.model_copy(update={"status": status}), planned.plan,
                                        pod_monitor=self.pod_monitors)
            events += await kube.apply_children(self.client, children, generation, existing)
            events += await kube.prune_children(self.client, namespace, name, children, existing, self.pod_monitors)
            existing = await kube.observe_deployments(self.client, namespace, name)
            status = next_status(previous, resource.spec, generation, planned, existing, now)
        events += transition_events(previous.conditions, status.conditions)
        new_status = status.to_wire()
        if new_status != old_status:
            await kube.write_status(self.client, namespace, name, old_status, new_status)
        for event in events:
            logger.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
            await kube.post_event(self.client, body, event)
