"""`decisions.py --scenario day`: a simulated day of one speculative pod, served by five policies on the same
arrivals, in virtual time — always on, always off, the rollback policy alone, `Auto`, and an oracle.

The day (one run is about 5 minutes of CPU: the judged pods and the settings run in up to 7 processes,
`--jobs`):

- 24 hours of `--hour-seconds` virtual seconds each (default 3600: a day at its own length, ~1.08 million requests
  per policy, ~26 minutes of wall time in 2 processes). The operator's judgment keeps its own clock (window 5m,
  interval 30s, failureLimit 3, cooldown 30m, calibration's 30-minute period — virtual seconds), so only at 3600
  does it see the load change as fast as it would on a real day. A shorter hour compresses the day around a
  judgment that does not speed up: at 600 (the default until 2026-12-04 evening; ~6 minutes) its window spans 30
  minutes of the day, the cooldown 3 hours, and the seconds it needs to see the dip weigh 6× their share of the
  day's requests — a stress test of the reaction time, not the day. At 150 (until 2026-12-03) no calibration,
  re-enable or second look could fall inside the 4-hour dip.
- QPS per pod 1 + 23 · (1 − cos(2π · hour / 24)) / 2: 1 at midnight, 24 at noon, smooth; a step every
  15 virtual seconds. The load generator's default lengths (prompts ~256, answers ~128 tokens) and the
  benchmark's temperature mix (70% greedy, 30% at T = 1).
- An acceptance dip from hour 10 to hour 14 (40 virtual minutes, far longer than the judgment needs to act:
  window + failureLimit intervals): α per position falls to a third, as if the prompt mix turned hard. Each
  engine's `acceptance` knob is set to the rate of that α at its own k, so every setting sees the same α.
- The SD: Llama-3.1-8B-Instruct with a Llama-3.2-1B-Instruct draft (method draft_model,
  numSpeculativeTokens 5) on H100-80GB, maxNumSeqs 32, baseline Control, `reenable: Auto` (the default,
  Manual, would leave speculation off for the rest of the day after the first rollback). Not the EAGLE-3 SD
  of the other scenarios: for it Auto derives k = 3 at every batch size to 32, the Fixed schedule itself,
  so `auto` and `rollbackOnly` would be one run. The 1B draft costs a real share of a step, so k = 5
  loses at the peak and Auto (k = 2 at every batch size) differs from Fixed.

Policies, all on the same arrivals (the same workload seed) and the same engine seed:

- alwaysOn: the Fixed schedule (k = 5), never rolled back; alwaysOff: the pod without speculation;
- rollbackOnly: the Fixed schedule with the operator's judgment (`step_speculation` on the operator's own
  `query_all` against benchmarks/virtual_prometheus.py, as decisions.py's other scenarios) and its rollback
  and re-enable; auto: the same with `schedule.mode: Auto` rendered by the operator, its table calibrated by the
  same `step_speculation` from the acceptance per draft position the pod's counters measure
  (judgment/recalibration.py: at most once per 30 virtual minutes, for a predicted gain ≥ 5%). A rollback, a
  re-enable or a recalibrated table replaces the speculative pod at that instant (the operator renders a new
  table one pass later, within an analysis interval) (no restart gap): arrivals from then on go to a
  pod rendered with or without speculation, requests in flight finish on the old one, which Prometheus
  stops scraping. The control pod is the alwaysOff pod (same arrivals);
- oracle: for each virtual minute, the best of the settings off, k = 1 … 5 (Fixed) and the Auto table, as if
  known: each setting serves the whole day on the same arrivals, and for each minute the oracle takes the
  requests that arrived in it from the setting with the most goodput in that minute, ties by the lower P99
  TPOT. So it switches for free, and each minute's requests meet the state that setting built itself (its
  queue, its batch), not the state the oracle's earlier choices would have left.

Who knows what: every pod's step takes what the simulator's hardware profile says (the measured H100 table, scaled:
docs/simulator.md), a model the planner does not share (since 2026-12-05, late; before, the simulator timed steps
with the planner's own roofline, so `auto` was graded in a world where its model was exact). `auto` knows only the
planner's model and what it calibrates from the counters; the oracle knows the simulator's true costs, because it
serves every setting on the simulator itself.

Metrics per policy over the day: P99 and mean of each request's TPOT, and goodput, the output tokens per
second of requests with TPOT ≤ 1.25 × alwaysOff's mean TPOT at QPS 1 (a short pre-run; "no slower than a
quarter above an idle GPU without speculation", the latency speculation is there to win) and TTFT ≤ 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import math
import multiprocessing
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from virtual_pod import Pod
from virtual_prometheus import VirtualPrometheus, spread_offset

from specdeploy.api.resource import SpeculativeDeployment, parse_resource
from specdeploy.api.spec import EngineKind
from specdeploy.api.status import ScheduleCalibration
from specdeploy.clients.prometheus import query_all
from specdeploy.judgment.recalibration import table_text
from specdeploy.judgment.samples import QueryGroup
from specdeploy.judgment.speculation import step_speculation
from specdeploy.planning.acceptance import acceptance_rate_from_alpha, alpha_from_acceptance_rate
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, engine_command
from specdeploy_engine.loadgen import DEFAULT_OUTPUT, DEFAULT_PROMPT
from specdeploy_engine.loadgen.workload import (
    Lengths,
    PlannedRequest,
    QpsSchedule,
    QpsSegment,
    TemperatureMix,
    Workload,
)
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.engine import Engine, SimRequest, Step
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.metrics import engine_metrics
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.virtual import simulate

NAMESPACE, NAME = "bench", "llama-8b-draft"
GPU = "H100-80GB"
T0 = 1_749_999_600.0
HOURS = 24
HOUR_SECONDS = 3600.0
NIGHT_QPS, PEAK_QPS = 1.0, 24.0
QPS_STEP_SECONDS = 15.0
DIP_HOURS = (10.0, 14.0)
DIP_ALPHA_FACTOR = 1 / 3
MINUTE = 60.0
SLO_TPOT_FACTOR = 1.25
SLO_TTFT_SECONDS = 1.0
SCRAPE_SECONDS = 15.0          # the PodMonitor's interval
ANALYSIS_TICK = 5.0            # charts/specdeploy/values.yaml analysisTickSeconds
DUE_SLACK = 0.5                # controller/analysis_loop.py due(): interval − 0.5 s
TEMPERATURE = "0:0.7,1.0:0.3"
SETTINGS = ("off", "k1", "k2", "k3", "k4", "k5", "autoTable")
POLICIES = ("alwaysOn", "alwaysOff", "rollbackOnly", "auto", "oracle")
JUDGED = {"rollbackOnly": "Fixed", "auto": "Auto"}


@dataclass(frozen=True)
class Day:
    hour_seconds: float
    cooldown: str = "30m"       # the SD's analysis.cooldown (its default)
    interval: str = "30s"       # the SD's analysis.interval (its default)

    @property
    def seconds(self) -> float:
        return HOURS * self.hour_seconds

    @property
    def dip(self) -> tuple[float, float]:
        return DIP_HOURS[0] * self.hour_seconds, DIP_HOURS[1] * self.hour_seconds

    def qps(self, t: float) -> float:
        return NIGHT_QPS + (PEAK_QPS - NIGHT_QPS) * (1 - math.cos(2 * math.pi * t / self.seconds)) / 2

    def schedule(self) -> QpsSchedule:
        step = min(QPS_STEP_SECONDS, self.hour_seconds / 4)
        count = math.ceil(self.seconds / step)
        return QpsSchedule(tuple(QpsSegment(i * step, min((i + 1) * step, self.seconds), self.qps((i + 0.5) * step))
                                 for i in range(count)))

    def workload(self) -> Workload:
        return Workload(self.schedule(), Lengths.parse(DEFAULT_PROMPT), Lengths.parse(DEFAULT_OUTPUT),
                        TemperatureMix.parse(TEMPERATURE))


def resource(mode: str = "Fixed", k: int = 5, cooldown: str = "30m", interval: str = "30s") -> SpeculativeDeployment:
    return parse_resource({
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "draft_model", "draft": {"name": "meta-llama/Llama-3.2-1B-Instruct"},
                            "numSpeculativeTokens": k, "schedule": {"mode": mode}},
            "resources": {"gpu": {"product": GPU, "count": 1}},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "analysis": {"baseline": {"mode": "Control", "controlReplicas": 1}, "reenable": "Auto",
                         "cooldown": cooldown, "interval": interval},
        },
    })


def served(sd: SpeculativeDeployment, variant: Variant = Variant.SPECULATIVE, speculate: bool = True,
           calibration: ScheduleCalibration | None = None) -> ServedModel:
    """The ServedModel of a variant's engine command as the operator renders it (with `calibration`, the status'
    measured acceptance per draft position, as the reconciler plans an Auto schedule)."""
    gpu = find_gpu(GPU)
    assert gpu is not None
    argv = engine_command(make_plan(sd.spec, calibration=calibration), variant, speculate=speculate).argv()
    return served_model(parse_engine_argv(argv, gpu=gpu), gpu)


def setting_models() -> dict[str, ServedModel]:
    models = {"off": served(resource(), Variant.CONTROL)}
    models |= {f"k{k}": served(resource(k=k)) for k in range(1, 6)}
    models["autoTable"] = served(resource("Auto"))
    return models


def dip_rate(model: ServedModel) -> float | None:
    """The `acceptance` knob that gives `model` the dip's α at its own k (None: it does not speculate)."""
    if not model.k or model.default_acceptance_rate is None:
        return None
    alpha = alpha_from_acceptance_rate(model.default_acceptance_rate, model.k)
    return acceptance_rate_from_alpha(alpha * DIP_ALPHA_FACTOR, model.k)


# --- a pod that serves the arrivals of [start, stop) -----------------------------------------------------------

class Lane(Pod):
    """One engine pod on the virtual clock, fed the day's arrivals from `first` until it is replaced, with
    the day's acceptance dip set on its engine between steps."""

    def __init__(self, model: ServedModel, planned: list[PlannedRequest], first: int, seed: int, day: Day,
                 observed: bool) -> None:
        self.model, self.planned, self.arrived, self.day = model, planned, first, day
        self.stop = math.inf
        self.metrics = engine_metrics(model) if observed else None
        self.engine = Engine(model, seed=seed, knobs=Knobs(), observer=self.metrics)
        self.now = planned[first].at if first < len(planned) else 0.0
        self.pending: Step | None = None
        self.due = 0.0
        self.requests: list[SimRequest] = []
        self.dipped = False

    def _arrival_due(self, t: float) -> bool:
        return super()._arrival_due(t) and self.planned[self.arrived].at < self.stop

    def _before_step(self) -> None:
        start, end = self.day.dip
        dipped = start <= self.now < end
        if dipped != self.dipped:
            self.dipped = dipped
            self.engine.knobs.acceptance = dip_rate(self.model) if dipped else None

    def replaced_at(self, t: float) -> int:
        """Take no arrival from `t` on; the index of the first arrival the next pod takes."""
        self.stop = t
        return next((i for i in range(self.arrived, len(self.planned)) if self.planned[i].at >= t), len(self.planned))


@dataclass(frozen=True)
class Served:
    """One finished request as its client measured it."""

    arrival: float
    tokens: int
    ttft: float
    tpot: float


def served_requests(lanes: list[Lane]) -> list[Served]:
    out = []
    for lane in lanes:
        for r in lane.requests:
            if r.finished_at is not None and r.first_token_at is not None and r.generated > 1 and not r.aborted:
                out.append(Served(r.arrival, r.generated, r.first_token_at - r.arrival,
                                  (r.finished_at - r.first_token_at) / (r.generated - 1)))
    return sorted(out, key=lambda s: s.arrival)


# --- the settings, each all day ----------------------------------------------------------------------------------

def run_setting(model: ServedModel, planned: list[PlannedRequest], seed: int, day: Day) -> list[Served]:
    lane = Lane(model, planned, 0, seed, day, observed=False)
    lane.advance(math.inf)
    return served_requests([lane])


# --- the judged policies, on one event loop sharing the control pod ------------------------------------------------

def _moment(at: float) -> datetime:
    return datetime.fromtimestamp(T0 + at, tz=UTC)


class Judged:
    """One SD whose speculative pod the operator's judgment rolls back and re-enables."""

    def __init__(self, name: str, mode: str, control: Lane, planned: list[PlannedRequest], seed: int, day: Day,
                 run: int) -> None:
        self.name, self.run = name, run
        self.resource = resource(mode, cooldown=day.cooldown, interval=day.interval)
        self.on, self.off = served(self.resource), served(self.resource, speculate=False)
        self.planned, self.seed, self.day = planned, seed, day
        self.prometheus = VirtualPrometheus()
        self.lanes: list[Lane] = []
        self.targets: dict[int, Any] = {}
        self.speculating = True
        self.rollbacks: list[tuple[float, str]] = []
        self.reenables: list[float] = []
        self.recalibrations: list[tuple[float, str]] = []
        self.speculation = step_speculation(self.resource, None, None, True, None, [], _moment(0.0)).speculation
        self.plan = make_plan(self.resource.spec)
        self.analysis: Any = None
        self.last_sample: float | None = None
        self.control_target = self._target(control, "control", "control")

    def _target(self, lane: Lane, variant: str, pod: str) -> Any:
        labels = {"namespace": NAMESPACE, "pod": f"{NAME}-{pod}", "container": "engine", "endpoint": "http",
                  "job": f"{NAMESPACE}/{NAME}", "instance": f"{NAME}-{pod}:8000",
                  "specdeploy_io_name": NAME, "specdeploy_io_variant": variant}
        assert lane.metrics is not None
        offset = spread_offset({**labels, "run": str(self.run), "policy": self.name}, SCRAPE_SECONDS)
        return self.prometheus.add_target(labels, lane.metrics.render, offset=offset)

    def start_lane(self, at: float, first: int) -> Lane:
        lane = Lane(self.on if self.speculating else self.off, self.planned, first, self.seed + len(self.lanes),
                    self.day, observed=True)
        lane.now = at
        self.lanes.append(lane)
        self.targets[id(lane)] = self._target(lane, "speculative", f"spec-{len(self.lanes)}")
        return lane

    def switch(self, at: float, speculating: bool) -> None:
        """The speculative Deployment re-rendered: a new pod takes the arrivals from `at`."""
        old = self.lanes[-1]
        old.advance(at)
        first = old.replaced_at(at)
        self.prometheus.remove_target(self.targets.pop(id(old)), T0 + at)
        self.speculating = speculating
        self.start_lane(at, first)

    def sample(self, at: float, loop: asyncio.AbstractEventLoop) -> None:
        if self.last_sample is not None and at - self.last_sample < self.resource.spec.analysis.interval - DUE_SLACK:
            return
        self.last_sample = float(math.floor(at))
        window = self.resource.spec.analysis.window
        groups = [QueryGroup(EngineKind.VLLM, window)]
        found = loop.run_until_complete(query_all(self.prometheus, groups, at=T0 + at))  # type: ignore[arg-type]
        sample = found.for_deployment(NAMESPACE, NAME, EngineKind.VLLM, window)
        step = step_speculation(self.resource, self.speculation, self.analysis, True, sample, [], _moment(at),
                                plan=self.plan)
        self.speculation, self.analysis = step.speculation, step.analysis
        if step.recalibrated is not None:
            # The status holds the new positions: the operator's next plan renders the new table from them.
            calibration = self.speculation.calibration
            self.recalibrations.append((at, table_text(calibration.schedule) if calibration is not None else ""))
            self.plan = make_plan(self.resource.spec, calibration=calibration)
            self.on = served(self.resource, calibration=calibration)
        if step.rollback is not None:
            self.rollbacks.append((at, step.rollback.reason.value))
            self.switch(at, speculating=False)
        elif step.reenabled is not None:
            self.reenables.append(at)
            self.switch(at, speculating=True)
        elif step.recalibrated is not None and self.speculating:
            self.switch(at, speculating=True)   # the speculative Deployment re-rendered with the new table


def run_judged(planned: list[PlannedRequest], seed: int, day: Day, run: int) -> tuple[dict[str, Judged], Lane]:
    control = Lane(served(resource(), Variant.CONTROL), planned, 0, seed, day, observed=True)
    judged = {name: Judged(name, mode, control, planned, seed, day, run) for name, mode in JUDGED.items()}
    for sd in judged.values():
        sd.start_lane(0.0, 0)
    rng = random.Random(f"day:{seed}:{run}")
    events: list[tuple[float, int, str, Any]] = []
    for name, sd in judged.items():
        for target in (sd.control_target, *sd.targets.values()):
            heapq.heappush(events, (sd.prometheus.scrape_times(target, SCRAPE_SECONDS, 0.0, day.seconds)[0], 1,
                                    name, target))
        phase = rng.uniform(0.0, ANALYSIS_TICK)
        heapq.heappush(events, (phase, 2, name, None))
    loop = asyncio.new_event_loop()
    try:
        while events:
            at, _, name, target = heapq.heappop(events)
            if at > day.seconds:
                break
            sd = judged[name]
            control.advance(at)
            for lane in sd.lanes[-2:]:
                lane.advance(at)
            if target is not None:
                if target.removed:
                    continue
                sd.prometheus.scrape(target, T0 + at)
                heapq.heappush(events, (at + SCRAPE_SECONDS, 1, name, target))
                continue
            lanes = len(sd.lanes)
            sd.sample(at, loop)
            if len(sd.lanes) > lanes:   # a new pod: scrape it from its first interval on
                new = sd.targets[id(sd.lanes[-1])]
                times = sd.prometheus.scrape_times(new, SCRAPE_SECONDS, at, day.seconds)
                if times:
                    heapq.heappush(events, (times[0], 1, name, new))
            heapq.heappush(events, (at + ANALYSIS_TICK, 2, name, None))
    finally:
        loop.close()
    control.advance(math.inf)
    for sd in judged.values():
        for lane in sd.lanes:
            lane.advance(math.inf)
    return judged, control


# --- metrics and the oracle -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slo:
    tpot: float
    ttft: float = SLO_TTFT_SECONDS

    def met(self, request: Served) -> bool:
        return request.tpot <= self.tpot and request.ttft <= self.ttft


def slo_for(off: ServedModel) -> Slo:
    """SLO_TPOT_FACTOR × the mean TPOT without speculation at the night's QPS (150 s pre-run, its own seed)."""
    planned = Workload(QpsSchedule.constant(NIGHT_QPS), Lengths.parse(DEFAULT_PROMPT), Lengths.parse(DEFAULT_OUTPUT),
                       TemperatureMix.parse(TEMPERATURE)).plan(150.0, seed=987_654)
    return Slo(SLO_TPOT_FACTOR * simulate(off, planned, seed=987_654).mean("tpot"))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))] if ordered else math.nan


def _by_minute(requests: list[Served], minutes: int) -> list[list[Served]]:
    buckets: list[list[Served]] = [[] for _ in range(minutes)]
    for request in requests:
        buckets[min(minutes - 1, int(request.arrival // MINUTE))].append(request)
    return buckets


def oracle(settings: dict[str, list[Served]], slo: Slo, day: Day) -> tuple[list[Served], list[str]]:
    """Each minute's requests from the setting with the most goodput in it (ties: the lower P99 TPOT)."""
    minutes = math.ceil(day.seconds / MINUTE)
    buckets = {name: _by_minute(requests, minutes) for name, requests in settings.items()}
    chosen, picks = [], []
    for minute in range(minutes):
        def score(name: str, minute: int = minute) -> tuple[int, float]:
            requests = buckets[name][minute]
            return (sum(r.tokens for r in requests if slo.met(r)),
                    -_percentile([r.tpot for r in requests], 99) if requests else 0.0)
        best = max(settings, key=score)
        picks.append(best)
        chosen += buckets[best][minute]
    return chosen, picks


def metrics(requests: list[Served], slo: Slo, seconds: float) -> dict[str, Any]:
    tpots = [r.tpot for r in requests]
    return {
        "p99TpotSeconds": round(_percentile(tpots, 99), 6),
        "meanTpotSeconds": round(sum(tpots) / len(tpots), 6) if tpots else math.nan,
        "goodputTokensPerSecond": round(sum(r.tokens for r in requests if slo.met(r)) / seconds, 2),
        "requests": len(requests),
        "withinSloShare": round(sum(1 for r in requests if slo.met(r)) / len(requests), 4) if requests else math.nan,
    }


# --- one run, and the command ----------------------------------------------------------------------------------

def _task(job: tuple[str, int, int, Day]) -> tuple[str, int, Any]:
    """One piece of a run (a setting all day, or the judged policies), for a worker process."""
    what, run, seed, day = job
    planned = day.workload().plan(day.seconds, seed=seed)
    if what != "judged":
        return what, run, run_setting(setting_models()[what], planned, seed, day)
    judged, control = run_judged(planned, seed, day, run)
    return what, run, {
        "control": served_requests([control]),
        **{name: {"requests": served_requests(sd.lanes), "rollbacks": sd.rollbacks, "reenables": sd.reenables,
                  "recalibrations": sd.recalibrations}
           for name, sd in judged.items()},
    }


def run_day(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    day = Day(args.hour_seconds, args.cooldown, args.interval)
    runs = args.runs if args.runs is not None else 1
    jobs = [(what, run, args.seed * 1000 + run, day)
            for run in range(runs) for what in ("judged", *SETTINGS[1:])]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            done = pool.map(_task, jobs, chunksize=1)
    else:
        done = [_task(job) for job in jobs]
    slo = slo_for(setting_models()["off"])
    pooled: dict[str, list[Served]] = {name: [] for name in POLICIES}
    events: dict[str, dict[str, list[Any]]] = {name: {"rollbacks": [], "reenables": [], "recalibrations": []}
                                               for name in JUDGED}
    picks: dict[str, int] = {name: 0 for name in SETTINGS}
    for run in range(runs):
        found = {what: result for what, r, result in done if r == run}
        judged = found.pop("judged")
        settings = {"off": judged["control"], **found}
        pooled["alwaysOn"] += settings["k5"]
        pooled["alwaysOff"] += settings["off"]
        for name in JUDGED:
            pooled[name] += judged[name]["requests"]
            events[name]["rollbacks"] += [[round(at / day.hour_seconds, 2), reason] for at, reason in judged[name]["rollbacks"]]
            events[name]["reenables"] += [round(at / day.hour_seconds, 2) for at in judged[name]["reenables"]]
            events[name]["recalibrations"] += [[round(at / day.hour_seconds, 2), table]
                                               for at, table in judged[name]["recalibrations"]]
        chosen, minute_picks = oracle(settings, slo, day)
        pooled["oracle"] += chosen
        for pick in minute_picks:
            picks[pick] += 1
    seconds = runs * day.seconds
    policies = {name: metrics(pooled[name], slo, seconds) for name in POLICIES}
    for name in JUDGED:
        policies[name] |= {"rollbacksAtHour": events[name]["rollbacks"], "reenablesAtHour": events[name]["reenables"],
                           "recalibrationsAtHour": events[name]["recalibrations"]}
    policies["oracle"]["minutesPerSetting"] = {name: count for name, count in picks.items() if count}
    return {
        "scenario": "day", "runs": runs, "seed": args.seed,
        "policies": policies,
        "params": {
            "hourSeconds": day.hour_seconds, "daySeconds": day.seconds, "cooldown": day.cooldown, "interval": day.interval, "qps": [NIGHT_QPS, PEAK_QPS],
            "dipHours": list(DIP_HOURS), "dipAlphaFactor": round(DIP_ALPHA_FACTOR, 4),
            "sloTpotSeconds": round(slo.tpot, 6), "sloTtftSeconds": slo.ttft, "temperature": TEMPERATURE,
            "gpu": GPU, "autoSchedule": [list(r) for r in (make_plan(resource("Auto").spec).engine_schedule or ())],
        },
        "wallSeconds": round(time.perf_counter() - started, 1),
    }


def text(summary: dict[str, Any]) -> str:
    p = summary["params"]
    lines = [f"day · {summary['runs']} run(s), seed {summary['seed']} · 24 h × {p['hourSeconds']:g} s · QPS "
             f"{p['qps'][0]:g} → {p['qps'][1]:g} → {p['qps'][0]:g} · α × {p['dipAlphaFactor']:g} from hour "
             f"{p['dipHours'][0]:g} to {p['dipHours'][1]:g} · SLO TPOT ≤ {p['sloTpotSeconds'] * 1000:.2f} ms, "
             f"TTFT ≤ {p['sloTtftSeconds']:g} s · cooldown {p['cooldown']}, interval {p['interval']} · Auto {p['autoSchedule']}",
             f"{'policy':<14}{'P99 TPOT ms':>12}{'mean TPOT ms':>14}{'goodput tok/s':>15}{'in SLO':>8}"]
    oracle_row = summary["policies"]["oracle"]
    for name, row in summary["policies"].items():
        lines.append(f"{name:<14}{row['p99TpotSeconds'] * 1000:>12.2f}{row['meanTpotSeconds'] * 1000:>14.2f}"
                     f"{row['goodputTokensPerSecond']:>15.1f}{row['withinSloShare']:>8.0%}"
                     + ("" if name == "oracle" else
                        f"   vs oracle: P99 {row['p99TpotSeconds'] / oracle_row['p99TpotSeconds'] - 1:+.1%}, goodput "
                        f"{row['goodputTokensPerSecond'] / oracle_row['goodputTokensPerSecond'] - 1:+.1%}"))
    for name in JUDGED:
        row = summary["policies"][name]
        rollbacks = ", ".join(f"{hour:g} ({reason})" for hour, reason in row["rollbacksAtHour"]) or "none"
        reenables = ", ".join(f"{hour:g}" for hour in row["reenablesAtHour"]) or "never"
        recalibrated = "; ".join(f"{hour:g} [{table}]" for hour, table in row["recalibrationsAtHour"]) or "never"
        lines.append(f"  {name}: rolled back at hour {rollbacks}; re-enabled at hour {reenables}; "
                     f"schedule recalibrated at hour {recalibrated}")
    lines.append(f"  oracle minutes per setting: {oracle_row['minutesPerSetting']} · wall {summary['wallSeconds']:.1f} s")
    return "\n".join(lines)
