"""controller/leader.py's expiry rule, with replicas whose clocks disagree: a Lease expires a lease duration after
THIS replica last saw it change, on its own clock (client-go's rule), never by reading the holder's renewTime
against the local wall clock. No apiserver, no sleeps: an in-memory Lease with compare-and-swap and clocks the
test moves."""

from __future__ import annotations

import asyncio
import copy
import datetime
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.coordination_v1 import Lease

from specdeploy.controller.leader import LeaderElection

LEASE_SECONDS = 15
T0 = datetime.datetime(2026, 12, 5, 22, 0, tzinfo=datetime.UTC)


class _Conflict(ApiError):
    def __init__(self, code: int) -> None:   # lightkube's ApiError wants an httpx response; only the code is read
        self.status = type("Status", (), {"code": code, "message": "test"})()


class _Leases:
    """One namespace's Leases as the apiserver keeps them: create fails on a name taken, replace on a stale
    resourceVersion (409), every write a new resourceVersion."""

    def __init__(self) -> None:
        self.stored: dict[str, Lease] = {}
        self.version = 0

    async def get(self, kind: Any, name: str, namespace: str) -> Lease:
        if name not in self.stored:
            raise _Conflict(404)
        return copy.deepcopy(self.stored[name])

    async def create(self, lease: Lease) -> None:
        if lease.metadata.name in self.stored:
            raise _Conflict(409)
        self._write(lease)

    async def replace(self, lease: Lease) -> None:
        if self.stored[lease.metadata.name].metadata.resourceVersion != lease.metadata.resourceVersion:
            raise _Conflict(409)
        self._write(lease)

    def _write(self, lease: Lease) -> None:
        self.version += 1
        lease = copy.deepcopy(lease)
        lease.metadata.resourceVersion = str(self.version)
        self.stored[lease.metadata.name] = lease


class _Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _replica(leases: _Leases, identity: str, clock: _Clock, skew: datetime.timedelta) -> LeaderElection:
    """A replica with its own monotonic clock and a wall clock `skew` off the true time."""
    return LeaderElection(leases, "specdeploy-system", identity=identity,  # type: ignore[arg-type]
                          lease_seconds=LEASE_SECONDS, clock=clock,
                          wall=lambda: T0 + datetime.timedelta(seconds=clock.seconds) + skew)


def test_a_standby_whose_clock_is_ahead_by_more_than_the_lease_takes_nothing_while_the_leader_renews() -> None:
    leases, time_a, time_b = _Leases(), _Clock(), _Clock()
    leader = _replica(leases, "a", time_a, datetime.timedelta(0))
    standby = _replica(leases, "b", time_b, datetime.timedelta(hours=1))   # the holder's renewTime looks an hour old

    async def go() -> None:
        assert await leader.try_acquire()
        for _ in range(40):                                   # 200 s of renewals every 5 s
            for clock in (time_a, time_b):
                clock.seconds += 5
            assert await leader.try_acquire()
            assert not await standby.try_acquire(), "took over from a leader that renews"
        assert leases.stored["specdeploy-operator"].spec.holderIdentity == "a"
        # The leader stops renewing: the standby takes over a lease duration after it last saw a change.
        time_b.seconds += LEASE_SECONDS
        assert not await standby.try_acquire()                # exactly the duration: not yet
        time_b.seconds += 0.5
        assert await standby.try_acquire()
        assert leases.stored["specdeploy-operator"].spec.holderIdentity == "b"
        assert leases.stored["specdeploy-operator"].spec.leaseTransitions == 1
    asyncio.run(go())


def test_a_standby_whose_clock_is_behind_still_takes_over_from_a_dead_leader() -> None:
    """The holder's renewTime, an hour in the standby's future, does not keep a dead leader's lease alive."""
    leases, time_a, time_b = _Leases(), _Clock(), _Clock()
    leader = _replica(leases, "a", time_a, datetime.timedelta(hours=1))
    standby = _replica(leases, "b", time_b, datetime.timedelta(0))

    async def go() -> None:
        assert await leader.try_acquire()
        assert not await standby.try_acquire()                # first seen now: a full duration to wait
        time_b.seconds += LEASE_SECONDS + 1
        assert await standby.try_acquire()
    asyncio.run(go())


def test_a_released_lease_is_taken_at_once() -> None:
    leases, clock = _Leases(), _Clock()
    leader, standby = _replica(leases, "a", clock, datetime.timedelta(0)), _replica(leases, "b", clock,
                                                                                      datetime.timedelta(0))

    async def go() -> None:
        assert await leader.try_acquire()
        assert not await standby.try_acquire()
        await leader.release()
        assert await standby.try_acquire()
    asyncio.run(go())
