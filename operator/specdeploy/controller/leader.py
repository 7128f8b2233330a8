"""One active operator: a coordination.k8s.io Lease held while the operator runs.

A second process started beside the first waits at start-up until the holder's lease expires (it
died, or was stopped), then takes over — so two operators never act on the same objects. This is the
scheme controller-runtime uses; kopf's own peering would need its KopfPeering CRDs and freezes both
processes when their priorities tie.

Expiry is measured on this process' own clock from when it last saw the Lease change (its resourceVersion,
holder or renewTime), never by comparing the holder's `renewTime` with the local wall clock: two nodes' clocks
can differ by more than the lease, and a standby that trusted its own would take over from a leader that still
renews. This is client-go's rule (tools/leaderelection/leaderelection.go: `observedTime` is set when the record
changes, and the lease is expired when `observedTime + LeaseDuration` has passed on the local clock).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
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
    """clock: seconds on this process' monotonic clock (expiry and the renew deadline); wall: the time written into
    the Lease's acquireTime and renewTime, for people to read. Both injectable for tests."""

    client: AsyncClient
    namespace: str
    name: str = "specdeploy-operator"
    identity: str = field(default_factory=default_identity)
    lease_seconds: int = 15
    renew_seconds: float = 5.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime.datetime] = _now
    _observed: tuple[object, ...] | None = field(default=None, init=False, repr=False)
    _observed_at: float = field(default=0.0, init=False, repr=False)

    def _observe(self, lease: Lease) -> None:
        """Note when this process saw the Lease change; the holder's own timestamps are not read as times."""
        spec = lease.spec
        record = (lease.metadata.resourceVersion if lease.metadata else None,
                  spec.holderIdentity if spec else None, spec.renewTime if spec else None)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()

    def _expired(self, lease: Lease) -> bool:
        spec = lease.spec
        if spec is None or spec.holderIdentity in (None, ""):
            return True
        duration = spec.leaseDurationSeconds or self.lease_seconds
        return self.clock() > self._observed_at + duration

    async def try_acquire(self) -> bool:
        """Take or renew the lease; False while another live holder has it."""
        now = self.wall()
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
        self._observe(lease)
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
        last_renewed = self.clock()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self.try_acquire():
                    last_renewed = self.clock()
                    continue
                logger.error("lease %s/%s taken by another operator", self.namespace, self.name)
            except Exception as error:  # an error answer, or none (lightkube's httpx flavour's transport errors)
                logger.warning("could not renew lease %s/%s: %s", self.namespace, self.name, error)
                if self.clock() - last_renewed < self.lease_seconds - self.renew_seconds:
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
