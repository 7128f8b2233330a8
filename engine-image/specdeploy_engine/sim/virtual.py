"""Run the engine core on a virtual clock: a discrete-event simulation, for calibration and tests.

    result = simulate(served, workload.plan(duration=120, seed=1), seed=1)
    result.mean("tpot"), result.percentile("ttft", 99), result.output_tokens_per_second()

No sockets and no sleeping: time jumps from step end to step end (or to the next arrival when idle), so
minutes of traffic take a fraction of a second. The same Engine serves HTTP in sim/server.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdeploy_engine.loadgen.workload import PlannedRequest
from specdeploy_engine.sim.engine import Engine, Observer, SimRequest
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import ServedModel


@dataclass(frozen=True)
class RequestResult:
    """One finished request as a client would measure it (model seconds)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    temperature: float
    queue: float             # arrival -> first scheduled
    ttft: float              # arrival -> first token
    e2e: float               # arrival -> last token
    finished_at: float

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (vLLM's request_time_per_output_token)."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class SimulationResult:
    requests: list[RequestResult]
    unfinished: int          # still queued or running at the horizon
    end: float               # virtual time when the run stopped
    drafted_tokens: int
    accepted_tokens: int
    steps: int

    def values(self, metric: str, start: float = 0.0, stop: float = math.inf) -> list[float]:
        """A metric ("ttft", "e2e", "tpot", "queue") of the requests that arrived in [start, stop)."""
        found = (getattr(result, metric) for result in self.requests if start <= result.arrival < stop)
        return [value for value in found if value is not None]

    def mean(self, metric: str, start: float = 0.0, stop: float = math.inf) -> float:
        values = self.values(metric, start, stop)
        return sum(values) / len(values) if values else math.nan

    def percentile(self, metric: str, q: float, start: float = 0.0, stop: float = math.inf) -> float:
        values = sorted(self.values(metric, start, stop))
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]

    def output_tokens_per_second(self, start: float = 0.0, stop: float | None = None) -> float:
        """Tokens of the requests that finished in [start, stop), per second of that window."""
        stop = self.end if stop is None else stop
        tokens = sum(result.output_tokens for result in self.requests if start <= result.finished_at < stop)
        return tokens / (stop - start) if stop > start else math.nan

    @property
    def acceptance_rate(self) -> float:
        """vLLM's accepted ÷ drafted over the run."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else math.nan


class _Counts:
    """The observer the virtual run keeps: finished requests and draft counters."""

    def __init__(self, chained: Observer | None) -> None:
        self.chained = chained
        self.finished: list[SimRequest] = []
        self.drafted = self.accepted = self.steps = 0

    def on_first_token(self, request: SimRequest, now: float) -> None:
        if self.chained is not None:
            self.chained.on_first_token(request, now)

    def on_tokens(self, request: SimRequest, count: int, interval: float, now: float) -> None:
        if self.chained is not None:
            self.chained.on_tokens(request, count, interval, now)

    def on_drafts(self, drafted: int, accepted: int, k: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        if self.chained is not None:
            self.chained.on_drafts(drafted, accepted, k)

    def on_finished(self, request: SimRequest, now: float) -> None:
        self.finished.append(request)
        if self.chained is not None:
            self.chained.on_finished(request, now)

    def on_step(self, engine: Engine, step: object, now: float) -> None:
        self.steps += 1
        if self.chained is not None:
            self.chained.on_step(engine, step, now)  # type: ignore[arg-type]

    def on_preempted(self, request: SimRequest) -> None:
        if self.chained is not None:
            self.chained.on_preempted(request)


def simulate(
    served: ServedModel,
    planned: Sequence[PlannedRequest],
    *,
    seed: int = 0,
    knobs: Knobs | None = None,
    horizon: float = math.inf,
    observer: Observer | None = None,
) -> SimulationResult:
    """Serve `planned` (arrival offsets in seconds) and return what each request measured.

    Stops when every request has finished or at `horizon` (model seconds), whichever comes first.
    """
    counts = _Counts(observer)
    engine = Engine(served, seed=seed, knobs=knobs, observer=counts)
    arrivals = sorted(planned, key=lambda item: item.at)
    index, now = 0, 0.0
    while now < horizon and (index < len(arrivals) or engine.has_work):
        while index < len(arrivals) and arrivals[index].at <= now:
            item = arrivals[index]
            engine.add(SimRequest(f"r{index}", item.at, item.prompt_tokens, max(1, item.output_tokens),
                                  item.temperature), now)
            index += 1
        step = engine.plan_step(now)
        if step is None:
            if index >= len(arrivals):
                break
            now = arrivals[index].at
            continue
        now += step.seconds
        engine.complete_step(step, now)
    results = [
        RequestResult(
            arrival=request.arrival, prompt_tokens=request.prompt_tokens, output_tokens=request.generated,
            temperature=request.temperature,
            queue=(request.scheduled_at or request.arrival) - request.arrival,
            ttft=(request.first_token_at or request.arrival) - request.arrival,
            e2e=(request.finished_at or request.arrival) - request.arrival,
            finished_at=request.finished_at or now,
        )
        for request in counts.finished if not request.aborted
    ]
    return SimulationResult(
        requests=results, unfinished=len(arrivals) - len(results), end=now,
        drafted_tokens=counts.drafted, accepted_tokens=counts.accepted, steps=counts.steps,
    )
