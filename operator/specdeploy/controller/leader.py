"""One active operator: a coordination.k8s.io Lease held while the operator runs.

A second process started beside the first waits at start-up until the holder's lease expires (it
died, or was stopped), then takes over — so two operators never act on the same objects. This is the
scheme controller-runtime uses; kopf's own peering would need its KopfPeering CRDs and freezes both
processes when their priorities tie.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

logger = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def default_identity() -> str:
    """Host name (the pod name in a cluster), pid and a random suffix: unique per process."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class LeaderElection:
    client: AsyncClient
    namespace: str
    name: str = "specdeploy-operator"
    identity: str = field(default_factory=default_identity)
    lease_seconds: int = 15
    renew_seconds: float = 5.0

    def _expired(self, lease: Lease) -> bool:
        spec = lease.spec
        if spec is None or spec.holderIdentity in (None, ""):
            return True
        renewed = spec.renewTime or spec.acquireTime
        if renewed is None:
            return True
        duration = spec.leaseDurationSeconds or self.lease_seconds
        return _now() > renewed + datetime.timedelta(seconds=duration)

    async def try_acquire(self) -> bool:
        """Take or renew the lease; False while another live holder has it."""
        now = _now()
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            try:
                await self.client.create(Lease(
                    metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=LeaseSpec(holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds,
                                   acquireTime=now, renewTime=now, leaseTransitions=0),
                ))
            except ApiError as create_error:
                if create_error.status.code == 409:
                    return False  # someone created it first
                raise
            return True
        assert lease.spec is not None
        holder = lease.spec.holderIdentity
        if holder != self.identity and not self._expired(lease):
            return False
        if holder != self.identity:
            lease.spec.acquireTime = now
            lease.spec.leaseTransitions = (lease.spec.leaseTransitions or 0) + 1
        lease.spec.holderIdentity = self.identity
        lease.spec.renewTime = now
        lease.spec.leaseDurationSeconds = self.lease_seconds
        try:
            await self.client.replace(lease)  # resourceVersion makes this a compare-and-swap
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the lease."""
        announced = False
        while not await self.try_acquire():
            if not announced:
                logger.info("waiting for lease %s/%s held by another operator", self.namespace, self.name)
                announced = True
            await asyncio.sleep(self.renew_seconds)
        logger.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew until cancelled; call `on_lost` when the lease cannot be renewed in time.

        An apiserver that is unreachable (restarting) for less than `lease_seconds - renew_seconds` since
        the last renewal is ridden out; longer, and this process gives up before another could take over.
        """
        last_renewed = _now()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self.try_acquire():
                    last_renewed = _now()
                    continue
                logger.error("lease %s/%s taken by another operator", self.namespace, self.name)
            except Exception as error:  # an error answer, or none (lightkube's httpx flavour's transport errors)
                logger.warning("could not renew lease %s/%s: %s", self.namespace, self.name, error)
                if _now() - last_renewed < datetime.timedelta(seconds=self.lease_seconds - self.renew_seconds):
                    continue
            on_lost()
            return

    async def release(self) -> None:
        """Give the lease up at a clean shutdown, so a successor starts at once."""
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec is not None and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = ""
                await self.client.replace(lease)
        except Exception as error:  # at shutdown, e.g. with the apiserver gone: the lease expires by itself
            logger.warning("could not release lease %s/%s: %s", self.namespace, self.name, error)
