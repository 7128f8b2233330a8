"""One engine pod on the virtual clock for the benchmarks: the simulator's Engine, its metrics, its planned
arrivals, stepped up to any virtual time (benchmarks/decisions.py, benchmarks/day.py)."""

from __future__ import annotations

import math
import statistics

from specdeploy_engine.loadgen.workload import Workload
from specdeploy_engine.sim.engine import Engine, SimRequest, Step
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.metrics import engine_metrics
from specdeploy_engine.sim.model import ServedModel


class Pod:
    """One engine pod: its Engine, its metrics, its arrivals, stepped up to any virtual time."""

    def __init__(self, name: str, variant: str, served: ServedModel, knobs: Knobs, seed: int,
                 workload: Workload, duration: float, workload_seed: int) -> None:
        self.name, self.variant = name, variant
        self.metrics = engine_metrics(served)
        self.engine = Engine(served, seed=seed, knobs=knobs, observer=self.metrics)
        self.planned = workload.plan(duration, seed=workload_seed)
        self.arrived = 0
        self.now = 0.0
        self.pending: Step | None = None
        self.due = 0.0
        self.requests: list[SimRequest] = []

    def _arrival_due(self, t: float) -> bool:
        """Whether the next planned arrival has come by `t`."""
        return self.arrived < len(self.planned) and self.planned[self.arrived].at <= t

    def _before_step(self) -> None:
        """What changes between steps (a knob on a schedule: benchmarks/day.py); nothing here."""

    def advance(self, until: float) -> None:
        """Run every engine step that ends at or before `until` (arrivals join at step boundaries, as in
        sim/virtual.py); a step in flight at `until` has not reported yet."""
        engine, planned = self.engine, self.planned
        while True:
            if self.pending is None:
                self._before_step()
                while self._arrival_due(self.now):
                    item = planned[self.arrived]
                    request = SimRequest(f"r{self.arrived}", item.at, item.prompt_tokens, max(1, item.output_tokens),
                                         item.temperature)
                    engine.add(request, self.now)
                    self.requests.append(request)
                    self.arrived += 1
                step = engine.plan_step(self.now)
                if step is None:
                    if self._arrival_due(until):
                        self.now = planned[self.arrived].at
                        continue
                    return
                self.pending, self.due = step, self.now + step.seconds
            if self.due > until:
                return
            self.now = self.due
            engine.complete_step(self.pending, self.now)
            self.pending = None

    def mean_tpot(self, start: float, stop: float) -> float:
        """The mean TPOT of the requests that finished in [start, stop): what the pod really did."""
        values = [(r.finished_at - r.first_token_at) / (r.generated - 1) for r in self.requests
                  if r.finished_at is not None and r.first_token_at is not None and r.generated > 1
                  and start <= r.finished_at < stop and not r.aborted]
        return statistics.fmean(values) if values else math.nan
