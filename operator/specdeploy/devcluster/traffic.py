"""Traffic for one SpeculativeDeployment's simulators, spread over its pods as its Service would.

Pods come and go (a rollback rolls them), so the load is sent in short chunks, each over the
simulators that are ready at its start: a chunk is an open-loop Poisson run of the load generator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from specdeploy.devcluster.cluster import DevCluster
from specdeploy.devcluster.simadmin import NoSimulators, endpoints
from specdeploy_engine.loadgen import DEFAULT_PROMPT, run_load
from specdeploy_engine.loadgen.client import PROMPT_WORDS
from specdeploy_engine.loadgen.report import LoadReport, RequestRecord


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
    on_chunk: Callable[[LoadReport], None] | None = None
    records: list[RequestRecord] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def run(self) -> LoadReport:
        """Send in the calling thread; the report of everything sent."""
        started = time.monotonic()
        chunk = 0
        while not self._stop.is_set() and (left := self.duration - (time.monotonic() - started)) > 0:
            try:
                targets = endpoints(self.cluster, self.sd)
            except NoSimulators:
                targets = []
            if not targets:
                self._stop.wait(0.5)
                continue
            try:
                report = run_load(targets, self.qps, min(self.chunk_seconds, left), output_tokens=self.output_tokens,
                                  prompt_tokens=self.prompt_tokens, temperature=self.temperature, seed=chunk,
                                  drain_seconds=10.0, stream=self.stream, stop=self._stop,
                                  prompt_words=self.prompt_words)
            except httpx.HTTPError:  # a target went away after it was listed (its pod rolled): list again
                self._stop.wait(0.5)
                continue
            chunk += 1
            self.records += report.records
            if self.on_chunk is not None:
                self.on_chunk(report)
        return LoadReport.from_records(self.records, time.monotonic() - started)

    def start(self) -> Traffic:
        """Send in a background thread (a daemon: it never outlives the process)."""
        self._thread = threading.Thread(target=self.run, name=f"traffic-{self.sd}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
