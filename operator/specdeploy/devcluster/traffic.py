"""Traffic for one SpeculativeDeployment's simulators, spread over its pods as its Service would.

Pods come and go (a rollback rolls them), so the load is sent in short chunks, each over the
simulators that are ready at its start: a chunk is an open-loop Poisson run of the load generator.
The next chunk starts when one's sending ends, not when its answers have come: answers that take
longer than a chunk (a long output on a full pod takes tens of seconds) overlap the next chunks'
sending instead of pausing it. Once the traffic ends (`duration` or `stop()`), the answers still under
way get `drain_seconds`, then are cancelled and counted unfinished.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdeploy.devcluster.cluster import DevCluster
from specdeploy.devcluster.simadmin import NoSimulators, endpoints
from specdeploy_engine.loadgen import DEFAULT_PROMPT, TargetUnreachable, run_load_async
from specdeploy_engine.loadgen.client import MAX_CONNECTIONS, PROMPT_WORDS
from specdeploy_engine.loadgen.report import LoadReport, RequestRecord

POLL_SECONDS = 0.25     # how soon a stop() is seen between chunks


@dataclass
class Traffic:
    """Send `qps` requests/s (or a schedule such as "0-60s:1,60-300s:12", restarted with each chunk) to
    SD `sd` (NAMESPACE/NAME) until `duration` or `stop()`; bounded by both."""

    cluster: DevCluster
    sd: str
    qps: float | str
    duration: float
    chunk_seconds: float = 5.0
    output_tokens: str = "32-96"
    prompt_tokens: str = DEFAULT_PROMPT
    temperature: str = "0.7"
    stream: bool = True          # False: whole answers, so a high request rate stays cheap for the client
    #: The words prompts are drawn from; real vLLM serving the stand-in models needs theirs (standins.half_words).
    prompt_words: tuple[str, ...] = PROMPT_WORDS
    #: How long the answers under way still get once the traffic ends.
    drain_seconds: float = 10.0
    #: Requests under way at once, per chunk (over its pods); more wait in the client for a connection.
    max_connections: int = MAX_CONNECTIONS
    on_chunk: Callable[[LoadReport], None] | None = None
    records: list[RequestRecord] = field(default_factory=list)
    unfinished: int = 0          # requests still under way when their chunk's drain ended (cancelled)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def run(self) -> LoadReport:
        """Send in the calling thread; the report of everything sent."""
        return asyncio.run(self._run())

    async def _run(self) -> LoadReport:
        started = time.monotonic()
        chunk = 0
        chunks: list[asyncio.Task[LoadReport]] = []
        while not self._stop.is_set() and (left := self.duration - (time.monotonic() - started)) > 0:
            try:
                targets = endpoints(self.cluster, self.sd)
            except NoSimulators:
                targets = []
            if not targets:
                await self._pause(0.5)
                continue
            length = min(self.chunk_seconds, left)
            sending = asyncio.create_task(run_load_async(
                targets, self.qps, length, output_tokens=self.output_tokens, prompt_tokens=self.prompt_tokens,
                temperature=self.temperature, seed=chunk, stream=self.stream, prompt_words=self.prompt_words,
                max_connections=self.max_connections, stop=self._stop, stop_drain_seconds=self.drain_seconds,
                # its answers may come until the traffic's end, and drain_seconds after it
                drain_seconds=left - length + self.drain_seconds))
            await self._pause(length, until=sending)
            if sending.done() and isinstance(sending.exception(), TargetUnreachable):
                # a target went away after it was listed (its pod rolled): list again
                await self._pause(0.5)
                continue
            sending.add_done_callback(self._collect)
            chunks.append(sending)
            chunk += 1
        if chunks:
            await asyncio.wait(chunks)
        for task in chunks:     # a chunk whose targets went away sent nothing; any other failure is raised
            if (error := task.exception()) is not None and not isinstance(error, TargetUnreachable):
                raise error
        return LoadReport.from_records(self.records, time.monotonic() - started, self.unfinished)

    async def _pause(self, seconds: float, until: asyncio.Task[LoadReport] | None = None) -> None:
        """Wait `seconds`, less if stop() is called or `until` ends."""
        ends = time.monotonic() + seconds
        while not self._stop.is_set() and (left := ends - time.monotonic()) > 0:
            if until is not None:
                await asyncio.wait([until], timeout=min(left, POLL_SECONDS))
                if until.done():
                    return
            else:
                await asyncio.sleep(min(left, POLL_SECONDS))

    def _collect(self, task: asyncio.Task[LoadReport]) -> None:
        """A chunk's records, as soon as its answers are in (a test may read them while the traffic runs)."""
        if task.exception() is not None:
            return
        report = task.result()
        self.records += report.records
        self.unfinished += report.unfinished
        if self.on_chunk is not None:
            self.on_chunk(report)

    def start(self) -> Traffic:
        """Send in a background thread (a daemon: it never outlives the process)."""
        self._thread = threading.Thread(target=self.run, name=f"traffic-{self.sd}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
