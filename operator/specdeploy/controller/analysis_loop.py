"""The operator's one analysis loop: every tick, the SDs whose `analysis.interval` has passed are
sampled together — one PromQL query per signal per (engine, window) for each Prometheus, not one per
SD — and each is reconciled with its sample. Which SDs are due is read from the operator's own watch of
them (`Reconciler.watched`), not from a list each tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube.core.exceptions import ApiError

from specdeploy.api.resource import SpeculativeDeployment
from specdeploy.api.units import parse_duration
from specdeploy.clients import kube
from specdeploy.clients.headers import InvalidHeaders, directory_headers
from specdeploy.clients.prometheus import PrometheusClient, query_all
from specdeploy.controller.reconciler import Reconciler
from specdeploy.controller.watched import SD, Watched
from specdeploy.judgment import evidence
from specdeploy.judgment.queries import query_group
from specdeploy.judgment.samples import Samples

logger = logging.getLogger(__name__)

CONCURRENT_RECONCILES = 16
"""SDs reconciled with their samples at once: the API calls overlap; each SD still has its own lock."""


@dataclass(frozen=True)
class Source:
    """Where an SD's metrics are: a Prometheus URL, and the Secret or (for the operator's own URL) the
    directory holding its headers."""

    url: str
    namespace: str
    headers_secret: str | None
    headers_dir: Path | None = None


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


async def analyse_once(reconciler: Reconciler, namespaces: Iterable[str], default_url: str | None,
                       default_headers_dir: Path | None = None) -> int:
    """One cycle: sample every due SD and reconcile it with its sample; returns how many were sampled."""
    started = time.monotonic()
    now = time.time()
    limit = asyncio.Semaphore(CONCURRENT_RECONCILES)
    # The SDs as the operator's watch last saw them (`Reconciler.watched`): listing every SD each tick
    # cost the apiserver and the operator more than the samples with a thousand SDs (docs/performance.md).
    resources = _validated_due(reconciler.watched, namespaces, now, default_url)
    by_source: defaultdict[Source, list[SpeculativeDeployment]] = defaultdict(list)
    for resource in resources:
        source = source_of(resource, default_url, default_headers_dir)
        if source is not None:
            by_source[source].append(resource)
    for source, members in by_source.items():
        headers, headers_from, unusable = None, None, None
        if source.headers_secret:
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
        async with PrometheusClient(source.url, headers=headers, headers_from=headers_from,
                                    unusable_headers=unusable) as prometheus:
            samples = await query_all(prometheus, {query_group(r.spec) for r in members}, at=now)
        reconciler.metrics.queries(samples.query_seconds)

        async def reconcile_with_sample(resource: SpeculativeDeployment, samples: Samples) -> None:
            namespace, name = resource.metadata.namespace or "", resource.metadata.name
            sample = samples.for_deployment(namespace, name, resource.spec.engine.kind, resource.spec.analysis.window)
            async with limit:
                try:
                    await reconciler.reconcile(namespace, name, None, sample)
                except Exception:  # one SD's failure must not stop the others' analysis
                    logger.exception("reconciling %s/%s with its sample failed", namespace, name)

        await asyncio.gather(*(reconcile_with_sample(r, samples) for r in members))
    reconciler.metrics.cycle(time.monotonic() - started)
    return sum(len(members) for members in by_source.values())


async def analyse_forever(reconciler: Reconciler, namespaces: list[str], default_url: str | None,
                          tick: float, default_headers_dir: Path | None = None) -> None:
    """Run `analyse_once` every `tick` seconds until cancelled."""
    while True:
        try:
            await analyse_once(reconciler, namespaces, default_url, default_headers_dir)
        except kube.API_UNREACHABLE as error:
            logger.warning("analysis cycle skipped: the apiserver does not answer (%s: %s)",
                           type(error).__name__, error)
        except Exception:
            logger.exception("analysis cycle failed")
        await asyncio.sleep(tick)
