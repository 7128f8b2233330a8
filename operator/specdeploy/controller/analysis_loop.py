"""The operator's one analysis loop: every tick, the SDs whose `analysis.interval` has passed are
sampled together — one PromQL query per signal per (engine, window) for each Prometheus, not one per
SD — and each is reconciled with its sample. Which SDs are due is read from the operator's own watch of
them (`Reconciler.watched`), not from a list each tick.

Each Prometheus (URL and credentials: a `Source`) is its own task: one that answers slowly, never, or without
end makes its own SDs Inconclusive (PrometheusUnavailable, with the time it took) and delays no one else's
sample or rollback (docs/reliability.md "One Prometheus per tenant").

Two guards (`Guards`) keep one tenant from using the operator against another (docs/security.md): a Prometheus URL
outside the operator's allow-list is never asked (its SDs are Inconclusive, PrometheusUrlNotAllowed, with the fix),
and a sample uses only series from the SD's own pods — series labelled as an SD's from any other pod are ignored,
counted, and told on that SD once (an Event, ForeignSeriesIgnored), and the SD is sampled again from its own pods.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightkube.core.exceptions import ApiError

from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.spec import EngineKind
from specdeploy.api.units import parse_duration
from specdeploy.clients import kube
from specdeploy.clients.endpoints import AllowedEndpoints
from specdeploy.clients.headers import InvalidHeaders, directory_headers
from specdeploy.clients.prometheus import (
    PrometheusClient,
    PrometheusError,
    SeriesPods,
    query_all,
    series_pods,
)
from specdeploy.controller.own_pods import OwnPods
from specdeploy.controller.reconciler import Reconciler
from specdeploy.controller.watched import SD, Watched
from specdeploy.judgment import evidence
from specdeploy.judgment.queries import pinned_selector, queries_for, query_group
from specdeploy.judgment.samples import DeploymentSample, QueryError, QueryGroup, Samples
from specdeploy.reconcile.conditions import Event

logger = logging.getLogger(__name__)

CONCURRENT_RECONCILES = 16
"""SDs reconciled with their samples at once: the API calls overlap; each SD still has its own lock."""


FOREIGN_SERIES_EVENT = "ForeignSeriesIgnored"
SHOWN_FOREIGN = 5
"""The foreign pods an Event names at most (their count is always given)."""


@dataclass
class Guards:
    """What keeps one tenant's SD from reaching another's judgment through the analysis, kept across cycles: the
    URLs the operator may ask, the pods it observed as each SD's, and what it already told (once, not each cycle)."""

    allowed: AllowedEndpoints = field(default_factory=AllowedEndpoints)
    own_pods: OwnPods = field(default_factory=OwnPods)
    told_refused: set[str] = field(default_factory=set)
    told_foreign: dict[tuple[str, str], frozenset[tuple[str, str, str]]] = field(default_factory=dict)



@dataclass(frozen=True)
class Source:
    """Where an SD's metrics are: a Prometheus URL, and the Secret or (for the operator's own URL) the
    directory holding its headers."""

    url: str
    namespace: str
    headers_secret: str | None
    headers_dir: Path | None = None

    @property
    def label(self) -> str:
        """The source as the operator's metrics and log name it: the URL without user, password, query or fragment
        (a URL may carry credentials) and where its headers come from."""
        parts = urlsplit(self.url)
        shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
        if self.headers_secret:
            return f"{shown} (Secret {self.namespace}/{self.headers_secret})"
        return f"{shown} (operator's headers)" if self.headers_dir is not None else shown


def due(obj: Mapping[str, Any], now: float, status: Mapping[str, Any] | None = None) -> bool:
    """Whether the SD (as the apiserver returns it, with the CRD's defaults) was last sampled at least one
    `analysis.interval` ago, or never; `status`: the operator's own, not written yet (else the object's).
    Read from the raw object so that an SD not due costs no validation: with 1000 SDs, validating them all
    every tick was most of the operator's CPU at rest."""
    last = ((status if status is not None else obj.get("status") or {}).get("analysis") or {}).get("lastSampleAt")
    if not last:
        return True
    interval = parse_duration(((obj.get("spec") or {}).get("analysis") or {}).get("interval", "30s"))
    return now - evidence.parse_rfc3339(last).timestamp() >= interval - 0.5


def source_of(resource: SpeculativeDeployment, default_url: str | None,
              default_headers_dir: Path | None = None) -> Source | None:
    """The operator's headers go only to the operator's URL, and only when the SD names no Secret."""
    url = resource.spec.analysis.prometheus.url or default_url
    if not url:
        return None
    secret = resource.spec.analysis.prometheus.headers_secret_ref
    namespace = (resource.metadata.namespace or "") if secret else ""  # headers are per namespace's Secret
    own = resource.spec.analysis.prometheus.url is None and secret is None
    return Source(url, namespace, secret, default_headers_dir if own else None)


def _prometheus_url(obj: Mapping[str, Any]) -> str | None:
    return (((obj.get("spec") or {}).get("analysis") or {}).get("prometheus") or {}).get("url")


def _validated_due(watched: Watched, namespaces: Iterable[str], now: float,
                   default_url: str | None) -> list[SpeculativeDeployment]:
    """The watched SDs due for a sample and with a Prometheus to read (their own, or `default_url`), validated:
    an operator without a Prometheus URL validated every SD never sampled on every tick, 6% of its CPU while
    a thousand SDs were created (docs/performance.md)."""
    resources = []
    for body in watched.bodies(SD, namespaces):
        if not default_url and not _prometheus_url(body):
            continue
        try:
            if due(body, now, watched.held(body)):
                resources.append(SpeculativeDeployment.model_validate(dict(body)))
        except ValueError as error:
            logger.warning("skipping %s in analysis: %s", (body.get("metadata") or {}).get("name", "?"), error)
    return resources


SOURCE_SHARE_SECONDS = 20.0
"""All of one Prometheus' queries in one cycle: they go out at once, each with its own deadline (the client's 10 s);
a Prometheus that queues them (its --query.max-concurrency is 20 by default) gets twice that. Past it, that
source's SDs are Inconclusive (PrometheusUnavailable) for this sample — and only they."""


def _due_by_source(reconciler: Reconciler, namespaces: Iterable[str], now: float, default_url: str | None,
                   default_headers_dir: Path | None) -> dict[Source, list[SpeculativeDeployment]]:
    # The SDs as the operator's watch last saw them (`Reconciler.watched`): listing every SD each tick
    # cost the apiserver and the operator more than the samples with a thousand SDs (docs/performance.md).
    by_source: defaultdict[Source, list[SpeculativeDeployment]] = defaultdict(list)
    for resource in _validated_due(reconciler.watched, namespaces, now, default_url):
        source = source_of(resource, default_url, default_headers_dir)
        if source is not None:
            by_source[source].append(resource)
    return by_source


async def _analyse_source(reconciler: Reconciler, source: Source, members: list[SpeculativeDeployment], now: float,
                          limit: asyncio.Semaphore, guards: Guards) -> None:
    """Sample the SDs of one Prometheus and reconcile each with its sample, as soon as this source has answered:
    no other source's answers are waited for."""
    started = time.monotonic()
    headers, headers_from, unusable = None, None, None
    not_allowed = guards.allowed.refusal(source.url, "spec.analysis.prometheus.url")
    if not_allowed is not None:
        if source.url not in guards.told_refused:
            guards.told_refused.add(source.url)
            logger.warning("%s", not_allowed)
    elif source.headers_secret:
        headers_from = f"Secret {source.namespace}/{source.headers_secret} (`spec.analysis.prometheus.headersSecretRef`)"
        try:
            headers = await kube.secret_headers(reconciler.client, source.namespace, source.headers_secret)
        except (ApiError, InvalidHeaders) as error:   # neither message holds a value
            why = error.status.message if isinstance(error, ApiError) else str(error)
            unusable = f"cannot read {headers_from}: {why}"
            logger.warning("%s", unusable)
    elif source.headers_dir is not None:
        headers_from = f"the operator's headers directory {source.headers_dir} (--prometheus-headers-dir)"
        try:
            headers = await asyncio.to_thread(directory_headers, source.headers_dir)
        except InvalidHeaders as error:   # its message holds no value
            unusable = str(error)
            logger.warning("%s", unusable)
    groups = {query_group(r.spec) for r in members}
    async with PrometheusClient(source.url, headers=headers, headers_from=headers_from,
                                unusable_headers=unusable, not_allowed=not_allowed) as prometheus:
        samples, (reported, unchecked, checking_seconds) = await asyncio.gather(
            query_all(prometheus, groups, at=now, share=SOURCE_SHARE_SECONDS),
            series_pods(prometheus, groups, at=now, share=SOURCE_SHARE_SECONDS))
        foreign = await _foreign_series(reconciler, guards, members, reported, now, limit)
        pinned_groups = {_key(r): QueryGroup(r.spec.engine.kind, r.spec.analysis.window,
                                             pinned_selector(*_key(r), guards.own_pods.pods(*_key(r))))
                         for r in members if _key(r) in foreign}
        selectors = {key: group.selector for key, group in pinned_groups.items()}
        pinned = (await query_all(prometheus, set(pinned_groups.values()), at=now, share=SOURCE_SHARE_SECONDS)
                  if pinned_groups else Samples())
    reconciler.metrics.queries(samples.query_seconds + checking_seconds + pinned.query_seconds)
    reconciler.metrics.source(source.label, time.monotonic() - started, prometheus.answer_bytes,
                              [error.kind.value for taken in (samples, pinned) for group in taken.groups.values()
                               for error in group.errors.values()])

    async def reconcile_with_sample(resource: SpeculativeDeployment) -> None:
        namespace, name = resource.metadata.namespace or "", resource.metadata.name
        engine, window = resource.spec.engine.kind, resource.spec.analysis.window
        if unchecked is not None and not_allowed is None:
            sample = _unusable(samples.for_deployment(namespace, name, engine, window), engine, unchecked)
        elif (namespace, name) in selectors:
            sample = pinned.for_deployment(namespace, name, engine, window, selectors[(namespace, name)])
            await _tell_foreign(reconciler, guards, resource, foreign[(namespace, name)])
        else:
            sample = samples.for_deployment(namespace, name, engine, window)
            guards.told_foreign.pop((namespace, name), None)
        async with limit:
            try:
                await reconciler.reconcile(namespace, name, None, sample)
            except Exception:  # one SD's failure must not stop the others' analysis
                logger.exception("reconciling %s/%s with its sample failed", namespace, name)

    await asyncio.gather(*(reconcile_with_sample(r) for r in members))


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    return resource.metadata.namespace or "", resource.metadata.name


def _unusable(sample: DeploymentSample, engine: EngineKind, error: PrometheusError) -> DeploymentSample:
    """`sample` without its values, every signal of `engine` failed (with its own error, else `error`): which pods
    wrote the series is not known, so none is used."""
    message = f"which pods wrote the series is not known, so none was used: {error}"
    return DeploymentSample(sample.window_seconds, errors={
        query.signal: sample.errors.get(query.signal) or QueryError(query.signal, error.kind, message)
        for query in queries_for(engine, sample.window_seconds)})


async def _foreign_series(reconciler: Reconciler, guards: Guards, members: list[SpeculativeDeployment],
                          reported: SeriesPods, now: float, limit: asyncio.Semaphore,
                          ) -> dict[tuple[str, str], set[tuple[str, str, str]]]:
    """Per SD of `members`, the (variant, pod, job) of its series that no pod of its own wrote. The SD's pods are
    listed from the apiserver with its ReplicaSets (`limit` SDs at once) only when a series names a pod not seen as
    its own."""
    guards.own_pods.prune(now)

    async def check(resource: SpeculativeDeployment) -> tuple[tuple[str, str], set[tuple[str, str, str]]]:
        key = _key(resource)
        of_sd = reported.get(key, {})
        if not of_sd or not guards.own_pods.foreign(*key, of_sd):
            return key, set()
        try:
            async with limit:
                pods = await kube.engine_pods(reconciler.client, *key)
                replica_sets = await kube.engine_replica_sets(reconciler.client, *key)
        except ApiError as error:   # not known as its own, so not used
            logger.warning("cannot list the pods of %s/%s to check its series: %s", *key, error.status.message)
        else:
            guards.own_pods.record(*key, pods, now, resource.spec.analysis.window, replica_sets)
        return key, guards.own_pods.foreign(*key, of_sd)

    checked = await asyncio.gather(*(check(r) for r in members))
    return {key: found for key, found in checked if found}


async def _tell_foreign(reconciler: Reconciler, guards: Guards, resource: SpeculativeDeployment,
                        foreign: set[tuple[str, str, str]]) -> None:
    """Count the series ignored this cycle; an Event on the SD when the set of foreign pods changed (labels only:
    no value of any series)."""
    namespace, name = resource.metadata.namespace or "", resource.metadata.name
    reconciler.metrics.foreign(namespace, name, len(foreign))
    seen = frozenset(foreign)
    if guards.told_foreign.get((namespace, name)) == seen:
        return
    shown = ", ".join(f"namespace={namespace} pod={pod or '(none)'} job={job or '(none)'} ({variant})"
                      for variant, pod, job in sorted(foreign, key=lambda f: (f[1], f[2], f[0]))[:SHOWN_FOREIGN])
    more = f" and {len(foreign) - SHOWN_FOREIGN} more" if len(foreign) > SHOWN_FOREIGN else ""
    event = Event.warning(FOREIGN_SERIES_EVENT, (
        f"series from pods that are not this SD's were ignored: {len(foreign)} pod(s) wrote series labelled as its "
        f"own — {shown}{more}; the sample uses only the pods the operator observed as this SD's. A scrape that "
        "keeps a target's own labels (honorLabels) or relabels into namespace/specdeploy_io_* can write them "
        "(docs/security.md \"Series from other pods\")"))
    body = {"metadata": {"namespace": namespace, "name": name, "uid": resource.metadata.uid}}
    if await kube.post_event(reconciler.client, body, event):
        guards.told_foreign[(namespace, name)] = seen


@dataclass
class InFlight:
    """The sources whose cycle still waits for its answers or reconciles (they start no other until it ends), and
    the cycles still running: a slow Prometheus delays its own SDs' next sample, never another source's."""

    sources: dict[Source, asyncio.Task[None]] = field(default_factory=dict)
    cycles: set[asyncio.Task[int]] = field(default_factory=set)

    def cancel(self) -> None:
        for task in (*self.sources.values(), *self.cycles):
            task.cancel()


def start_cycle(reconciler: Reconciler, namespaces: Iterable[str], default_url: str | None,
                default_headers_dir: Path | None = None, in_flight: InFlight | None = None,
                guards: Guards | None = None) -> asyncio.Task[int]:
    """Start one cycle: every due SD of every source not still busy is sampled, each source on its own; the task
    returned ends when they are all reconciled (observing the cycle's time) and returns how many were sampled.
    `guards`: kept across cycles (the reconciler's allow-list); None: the default allow-list and no pod seen yet."""
    started = time.monotonic()
    guards = guards if guards is not None else Guards(AllowedEndpoints.of(None, default_url))
    now = time.time()
    busy = in_flight if in_flight is not None else InFlight()
    limit = asyncio.Semaphore(CONCURRENT_RECONCILES)
    by_source = {source: members for source, members
                 in _due_by_source(reconciler, namespaces, now, default_url, default_headers_dir).items()
                 if source not in busy.sources}
    tasks = []
    for source, members in by_source.items():
        task = asyncio.create_task(_analyse_source(reconciler, source, members, now, limit, guards))
        busy.sources[source] = task
        task.add_done_callback(functools.partial(_finished, busy, source))
        tasks.append(task)

    async def cycle() -> int:
        await asyncio.gather(*tasks, return_exceptions=True)
        reconciler.metrics.cycle(time.monotonic() - started)
        return sum(len(members) for members in by_source.values())

    whole = asyncio.create_task(cycle())
    busy.cycles.add(whole)
    whole.add_done_callback(busy.cycles.discard)
    return whole


def _finished(in_flight: InFlight, source: Source, task: asyncio.Task[None]) -> None:
    in_flight.sources.pop(source, None)
    if task.cancelled():
        return
    if isinstance(error := task.exception(), kube.API_UNREACHABLE):
        logger.warning("analysis of the SDs on %s skipped: the apiserver does not answer (%s: %s)",
                       source.label, type(error).__name__, error)
    elif error is not None:
        logger.error("analysis of the SDs on %s failed", source.label, exc_info=error)


async def analyse_once(reconciler: Reconciler, namespaces: Iterable[str], default_url: str | None,
                       default_headers_dir: Path | None = None, guards: Guards | None = None) -> int:
    """One cycle, awaited: sample every due SD and reconcile it with its sample; returns how many were sampled."""
    return await start_cycle(reconciler, namespaces, default_url, default_headers_dir, guards=guards)


async def analyse_forever(reconciler: Reconciler, namespaces: list[str], default_url: str | None,
                          tick: float, default_headers_dir: Path | None = None) -> None:
    """Start a cycle every `tick` seconds until cancelled; a source still busy with an earlier cycle sits the new
    one out, the others go on."""
    in_flight = InFlight()
    guards = Guards(reconciler.allowed_endpoints)   # the allow-list the operator built at start, alerts' too
    try:
        while True:
            try:
                start_cycle(reconciler, namespaces, default_url, default_headers_dir, in_flight, guards)
            except Exception:
                logger.exception("analysis cycle failed")
            await asyncio.sleep(tick)
    finally:
        in_flight.cancel()
