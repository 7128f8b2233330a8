"""Passes asked for by watch events (`Reconciler.request`): coalesced while one waits, widened to what
every asker needs, done by an awaited pass that begins first, and a failure logged without stopping the
next. The pass itself is replaced by a recorder: what is tested is the queue in front of it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from specdeploy.api.status import ProbeStatus
from specdeploy.controller.reconciler import Reconciler, Trigger
from specdeploy.judgment.samples import DeploymentSample


class RecordingReconciler(Reconciler):
    """A Reconciler whose pass records its trigger and waits on `gate` (so a test can hold it)."""

    def __init__(self) -> None:
        super().__init__(client=cast(Any, None))
        self.passes: list[tuple[str, Trigger | None]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def _pass(self, namespace: str, name: str, trigger: Trigger | None,
                    sample: DeploymentSample | None, probe: ProbeStatus | None) -> None:
        self.passes.append((name, trigger))
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the apiserver said no")


async def _settle(reconciler: Reconciler) -> None:
    for _ in range(100):
        if not reconciler._tasks:
            return
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*reconciler._tasks), timeout=5)


def test_merging_keeps_the_wider_read() -> None:
    assert Trigger.CHILD.merged(None) is Trigger.CHILD
    assert Trigger.CHILD.merged(Trigger.SPEC) is Trigger.SPEC
    assert Trigger.CHILD.merged(Trigger.RESYNC) is Trigger.RESYNC
    assert Trigger.SPEC.merged(Trigger.CHILD) is Trigger.SPEC
    assert Trigger.RESYNC.merged(Trigger.CHILD) is Trigger.RESYNC
    assert [t for t in Trigger if t.reads_everything] == [Trigger.SPEC, Trigger.RESYNC]


def test_events_while_a_pass_waits_ask_for_no_more_passes() -> None:
    async def scenario() -> RecordingReconciler:
        reconciler = RecordingReconciler()
        reconciler.gate.clear()
        running = asyncio.create_task(reconciler.reconcile("ns", "a", Trigger.SPEC))
        await asyncio.sleep(0)                     # the SD's own pass holds its lock
        for _ in range(5):                         # a rollout's Deployment events meanwhile
            reconciler.request("ns", "a")
        reconciler.request("ns", "b")              # another SD is not held up
        await asyncio.sleep(0)
        reconciler.gate.set()
        await running
        await _settle(reconciler)
        return reconciler

    reconciler = asyncio.run(scenario())
    assert sorted(reconciler.passes, key=str) == sorted(
        [("a", Trigger.SPEC), ("a", Trigger.CHILD), ("b", Trigger.CHILD)], key=str)
    assert reconciler.metrics.value("specdeploy_reconcile_passes_coalesced_total", trigger="child") == 4


def test_a_waiting_pass_reads_what_every_asker_needs() -> None:
    async def scenario() -> RecordingReconciler:
        reconciler = RecordingReconciler()
        reconciler.gate.clear()
        running = asyncio.create_task(reconciler.reconcile("ns", "a", Trigger.CHILD))
        await asyncio.sleep(0)
        reconciler.request("ns", "a")
        reconciler.request("ns", "a", Trigger.SPEC)   # the retry annotation while a child pass waits
        reconciler.request("ns", "a")
        reconciler.gate.set()
        await running
        await _settle(reconciler)
        return reconciler

    assert asyncio.run(scenario()).passes == [("a", Trigger.CHILD), ("a", Trigger.SPEC)]


def test_an_awaited_pass_that_begins_first_does_what_was_asked() -> None:
    async def scenario() -> RecordingReconciler:
        reconciler = RecordingReconciler()
        reconciler.gate.clear()
        held = asyncio.create_task(reconciler.reconcile("ns", "a", Trigger.SPEC))
        await asyncio.sleep(0)
        sampled = asyncio.create_task(reconciler.reconcile("ns", "a", None))   # an analysis sample waits
        await asyncio.sleep(0)
        reconciler.request("ns", "a", Trigger.RESYNC)                           # and then a request
        reconciler.gate.set()
        await asyncio.gather(held, sampled)
        await _settle(reconciler)
        return reconciler

    # The sample's pass begins first and reads what the request asked for; the request's task finds it done.
    assert asyncio.run(scenario()).passes == [("a", Trigger.SPEC), ("a", Trigger.RESYNC)]


def test_a_requested_pass_that_fails_is_logged_and_the_next_request_runs(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> RecordingReconciler:
        reconciler = RecordingReconciler()
        reconciler.fail_next = True
        reconciler.request("ns", "a")
        await _settle(reconciler)
        reconciler.request("ns", "a")
        await _settle(reconciler)
        return reconciler

    with caplog.at_level(logging.ERROR):
        reconciler = asyncio.run(scenario())
    assert reconciler.passes == [("a", Trigger.CHILD), ("a", Trigger.CHILD)]
    assert "reconciling ns/a after a child event failed" in caplog.text
