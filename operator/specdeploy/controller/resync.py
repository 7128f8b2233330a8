"""The periodic resync: every SD in scope reconciled again, to restore hand-edited or deleted children and
to catch events the watch missed.

Each SD's reconcile stands alone: one that raises (a status that no longer validates, a child the
apiserver refuses) is logged with its name and counted, and the others go on. Reconciles overlap as far
as the reconciler's own bound allows (its `CONCURRENT_RECONCILES` slots: the API calls wait on the
network, not the CPU); each SD keeps its lock there, so a resync never races a watch-triggered pass of
the same SD.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from specdeploy.clients import kube
from specdeploy.controller.reconciler import Reconciler, Trigger

logger = logging.getLogger(__name__)


async def _names(reconciler: Reconciler, namespace: str) -> list[tuple[str, str]]:
    return [(sd.metadata.namespace or "", sd.metadata.name or "")
            async for sd in reconciler.client.list(kube.SpeculativeDeploymentResource, namespace=namespace)
            if sd.metadata is not None]


async def resync_once(reconciler: Reconciler, namespaces: Iterable[str]) -> int:
    """Reconcile every SD in `namespaces`; returns how many failed. A namespace that cannot be listed is
    logged and skipped (the apiserver not answering is a warning: the next resync tries again)."""
    started = time.monotonic()
    failed = 0

    async def reconcile(namespace: str, name: str) -> None:
        nonlocal failed
        try:
            await reconciler.reconcile(namespace, name, Trigger.RESYNC)
        except Exception:  # noqa: BLE001 - one SD's failure must not stop the others' resync
            failed += 1
            logger.exception("periodic resync of %s/%s failed", namespace, name)

    for namespace in namespaces:
        try:
            names = await _names(reconciler, namespace)
        except kube.API_UNREACHABLE as error:
            logger.warning("periodic resync of namespace %s skipped: the apiserver does not answer (%s: %s)",
                           namespace, type(error).__name__, error)
            continue
        except Exception:
            logger.exception("periodic resync of namespace %s: listing its SpeculativeDeployments failed", namespace)
            continue
        await asyncio.gather(*(reconcile(ns, name) for ns, name in names))
    reconciler.metrics.resync(time.monotonic() - started, failed)
    return failed


async def resync_forever(reconciler: Reconciler, namespaces: list[str], interval: float) -> None:
    """Run `resync_once` every `interval` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval)
        await resync_once(reconciler, namespaces)
