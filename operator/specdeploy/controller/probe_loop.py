"""The operator's own probe (`spec.analysis.probe`): acceptance per workload and temperature, measured on a
speculative pod by its pod IP, once per speculative generation and every `interval` (docs/analysis.md
"Measure first").

    task = asyncio.create_task(probe_forever(reconciler, namespaces))

Each tick finds, among the watched SDs that ask for a probe, those due (`judgment.probe.probe_due`: a
speculating, rolled-out speculative Deployment — or LeaderWorkerSet, where the layout spans nodes — of a generation
not probed yet, or an interval passed) and
starts one probe task per SD, so a probe of minutes never holds the loop. A probe sends one request at a
time within the SD's budget and stops at its timeout; its result (or why it measured nothing) goes to the
SD in one reconcile pass, which writes status.probe, the Probed condition and an Event. It never rolls
back: the analysis of live traffic decides that.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap
from pydantic import ValidationError

from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.spec import Probe, SpeculativeDeploymentSpec
from specdeploy.api.status import ProbeStatus, ProbeTrigger, SpeculativeDeploymentStatus
from specdeploy.clients import kube
from specdeploy.clients.engine_probe import EngineUnreachable, run_probe
from specdeploy.controller.reconciler import Reconciler
from specdeploy.controller.watched import DEPLOYMENT, SD
from specdeploy.judgment.probe import (
    NEUTRAL_PROMPTS,
    NEUTRAL_WORKLOAD,
    ProbeBudget,
    ProbeTarget,
    UnusableWorkloads,
    probe_due,
    probe_failed,
    probe_result,
    workloads_from_config_map,
)
from specdeploy.planning.topology import node_layout
from specdeploy.reconcile.children import LABEL_VARIANT, Variant, deployment_name
from specdeploy.reconcile.conditions import Reason
from specdeploy.reconcile.leaderworkerset import LABEL_ROLE, LWS_KIND, Role

PROBE_TICK_SECONDS = 10.0

logger = logging.getLogger(__name__)


def _wants_probe(body: Mapping[str, Any]) -> bool:
    """Cheap, before validating: only SDs whose spec asks for the probe are looked at."""
    return bool(((body.get("spec") or {}).get("analysis") or {}).get("probe"))


def speculative_kind(spec: SpeculativeDeploymentSpec) -> str:
    """What the speculative variant runs as: a LeaderWorkerSet where the layout spans nodes, else a Deployment
    (reconcile/children.py renders the same)."""
    return LWS_KIND if node_layout(spec).spans_nodes else DEPLOYMENT


def probe_target(body: Mapping[str, Any] | None, name: str, status: SpeculativeDeploymentStatus) -> ProbeTarget | None:
    """What the probe of SD `name` can run on: its speculative Deployment or LeaderWorkerSet `body` (as the watch
    delivered it; None: not seen, nothing to probe yet) rolled out or not, and whether its status says it speculates.
    A LeaderWorkerSet is rolled out when every group is ready at its generation (kube.deployment_state)."""
    state = kube.deployment_state(body, name) if body is not None else None
    if state is None:
        return None
    speculation = status.speculation
    speculating = speculation is not None and speculation.decided and speculation.active
    return ProbeTarget(speculating=speculating, rolled_out=state.rolled_out, deployment_generation=state.generation)


def ready_speculative_pod(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """A Ready speculative pod with an address (the first by name, so a retry picks the same one); of a group, a
    leader (a worker has no probes, so it is Ready with no server to answer)."""
    ready = [pod for pod in pods
             if ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_VARIANT) == Variant.SPECULATIVE.value
             and ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) != Role.WORKER
             and (pod.get("status") or {}).get("podIP")
             and not (pod.get("metadata") or {}).get("deletionTimestamp")
             and any(c.get("type") == "Ready" and c.get("status") == "True"
                     for c in (pod.get("status") or {}).get("conditions") or [])]
    return min(ready, key=lambda pod: pod["metadata"]["name"]) if ready else None


class Prober:
    """The probes running, one per SD at most, and what starts them."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}

    def start_due(self, namespaces: Iterable[str], now: datetime.datetime) -> list[tuple[str, str]]:
        """Start a probe for every watched SD due for one; returns their keys."""
        started = []
        for body in self.reconciler.watched.bodies(SD, namespaces):
            if not _wants_probe(body):
                continue
            metadata = body.get("metadata") or {}
            key = (metadata.get("namespace") or "", metadata.get("name") or "")
            if key in self._running:
                continue
            try:
                resource = SpeculativeDeployment.model_validate({**body, "status": None})
                status = SpeculativeDeploymentStatus.model_validate(body.get("status") or {})
            except ValidationError as error:
                logger.warning("not probing %s/%s: %s", *key, error)
                continue
            probe = resource.spec.analysis.probe
            assert probe is not None
            speculative = self.reconciler.watched.current(speculative_kind(resource.spec), key[0],
                                                          deployment_name(key[1], Variant.SPECULATIVE))
            target = probe_target(speculative, key[1], status)
            trigger = probe_due(probe, status.probe, target, now)
            if trigger is None or target is None:
                continue
            task = asyncio.create_task(self._probe(resource, status, probe, trigger, target.deployment_generation))
            self._running[key] = task
            task.add_done_callback(self._finished)
            started.append(key)
        return started

    def _finished(self, task: asyncio.Task[None]) -> None:
        for key, running in list(self._running.items()):
            if running is task:
                del self._running[key]

    async def _probe(self, resource: SpeculativeDeployment, previous: SpeculativeDeploymentStatus, probe: Probe,
                     trigger: ProbeTrigger, generation: int) -> None:
        namespace, name = resource.metadata.namespace or "", resource.metadata.name
        try:
            result = await self._measure(resource, previous, probe, trigger, generation)
            logger.info("%s/%s probed (%s): %s", namespace, name, trigger,
                        result.last_failure.message if result.last_failure else f"{len(result.cells)} cells")
            await self.reconciler.reconcile(namespace, name, trigger=None, probe=result)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one SD's probe failing must not stop the others'; the next tick retries
            logger.exception("probing %s/%s failed", namespace, name)

    async def _measure(self, resource: SpeculativeDeployment, previous: SpeculativeDeploymentStatus, probe: Probe,
                       trigger: ProbeTrigger, generation: int) -> ProbeStatus:
        """The probe's result for status.probe, or the reason it measured nothing; `generation`: the speculative
        Deployment's (or LeaderWorkerSet's), as the watch showed it when the probe became due. The break-even is the plan's, with the
        models resolved as the pass resolves them."""
        namespace, name = resource.metadata.namespace or "", resource.metadata.name
        last = previous.probe
        started = datetime.datetime.now(datetime.UTC)
        client = self.reconciler.client

        def failed(reason: str, message: str) -> ProbeStatus:
            return probe_failed(last, reason, message, started, generation)

        pod = ready_speculative_pod(await kube.engine_pods(client, namespace, name))
        if pod is None:
            return failed(Reason.POD_NOT_READY, "no speculative pod is Ready with a pod IP")
        workloads = {NEUTRAL_WORKLOAD: list(NEUTRAL_PROMPTS)}
        if probe.workloads_config_map:
            where = f"ConfigMap {namespace}/{probe.workloads_config_map} (spec.analysis.probe.workloadsConfigMap)"
            try:
                config_map = await client.get(ConfigMap, probe.workloads_config_map, namespace=namespace)
                workloads = workloads_from_config_map(config_map.data or {}, where)
            except ApiError as error:
                return failed(Reason.WORKLOADS_UNREADABLE, f"cannot read {where}: {error.status.message}")
            except UnusableWorkloads as error:
                return failed(Reason.WORKLOADS_UNREADABLE, str(error))
        metadata, status = pod["metadata"], pod["status"]
        url = f"http://{status['podIP']}:{resource.spec.serving.port}"
        budget = ProbeBudget(probe.requests_per_cell, probe.max_tokens, probe.requests_per_second)
        async with httpx.AsyncClient() as http:
            try:
                # Answers' own counts only: the pod serves traffic, so counter deltas would count it too.
                model, outcomes = await run_probe(http, url, workloads, probe.temperatures, budget, probe.timeout)
            except EngineUnreachable as error:
                return failed(Reason.ENGINE_UNREACHABLE, f"pod {metadata['name']}: {error}")
        if not any(o.counts is not None for o in outcomes):
            errors = sorted({o.error for o in outcomes if o.error}) or ["no request was sent before the timeout"]
            return failed(Reason.NOTHING_MEASURED,
                          f"pod {metadata['name']}, {len(outcomes)} requests: {'; '.join(errors)[:500]}")
        planned = await self.reconciler.plan(resource, previous)
        result = probe_result(resource.spec, planned.plan, outcomes, budget, len(workloads) * len(probe.temperatures),
                              model, url, started, trigger)
        return result.model_copy(update={
            "pod": metadata["name"], "pod_template_hash": (metadata.get("labels") or {}).get("pod-template-hash"),
            "deployment_generation": generation})

    async def stop(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def probe_forever(reconciler: Reconciler, namespaces: Iterable[str],
                        tick_seconds: float = PROBE_TICK_SECONDS) -> None:
    """Start the due probes every tick, until cancelled (then the running probes are cancelled too)."""
    prober = Prober(reconciler)
    namespaces = list(namespaces)
    try:
        while True:
            try:
                prober.start_due(namespaces, datetime.datetime.now(datetime.UTC))
            except Exception:  # noqa: BLE001 - the loop outlives any one tick's error
                logger.exception("the probe loop's tick failed")
            await asyncio.sleep(tick_seconds)   # a period, not a wait for a condition
    finally:
        await prober.stop()

