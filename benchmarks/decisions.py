"""How the operator's judgment decides, on simulated engines in virtual time: false rollbacks, detections, and
how long a detection takes. No cluster: seconds per run.

    python benchmarks/decisions.py --scenario healthy|latency-regression|acceptance-drop|load-ramp \\
        [--tpot-ms X] [--regression R] [--qps Q] [--runs N] [--seed S] [--json] \\
        [--window 5m] [--interval 30s] [--failure-limit 3] [--min-requests 20] [--scrape 15s] [--jobs J]
    python benchmarks/decisions.py --scenario day [--runs N] [--seed S] [--json] [--hour-seconds 3600] [--cooldown 30m] [--interval 30s] [--jobs J]

`--scenario day` is a different experiment: a simulated day served by five policies (always on, always off,
the rollback policy alone, `Auto`, an oracle), compared on P99 and mean TPOT and goodput; benchmarks/day.py
says what runs. The rest of this docstring is about the other scenarios.

What runs, for each of `--runs` runs:

- The SpeculativeDeployment: the EAGLE-3 one of the demo (meta-llama/Llama-3.1-8B-Instruct with
  yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, method eagle3, numSpeculativeTokens 3, maxModelLen 8192, maxNumSeqs 32,
  baseline Control with one control pod) on H100-80GB, one speculative pod, with the analysis settings of the
  command line (their defaults are the SD's: window 5m, interval 30s, failureLimit 3, minRequests 20, every
  check at its default). The operator's planner and renderer give each variant's engine command line
  (`reconcile.children.engine_command`), which the simulator parses (`sim/argv.py`) into a ServedModel.
- The pods: the simulator's engine core (`sim/engine.py`) driven step by step on a virtual clock, each pod
  its own Engine with the vLLM metrics observer (`sim/metrics.py`).
- The load: an open-loop Poisson process per variant at `--qps` from the load generator's Workload (its
  default lengths, lognormal prompts around 256 and outputs around 128 tokens, and the temperature mix
  `--temperature`, default 70% greedy and 30% at T=1, as `Workload`'s own example).
- Prometheus: benchmarks/virtual_prometheus.py scrapes each pod's text exposition every `--scrape` (default
  15s, the interval of the PodMonitor the operator renders) at an offset of its own, with the PodMonitor's
  target labels, and answers the operator's PromQL with Prometheus' semantics.
- The analysis: the operator's cadence — a tick every 5 s (the chart's analysisTickSeconds), an SD sampled
  when `interval` has passed since its lastSampleAt (whole seconds; controller/analysis_loop.py `due`) — then
  the operator's own `query_all` at that instant and `for_deployment`, and the pure step of a reconcile,
  `reconcile.speculation.step_speculation` (verdict, counting, rollback decision). A run ends at a rollback.

`--tpot-ms X` sets the control's mean TPOT (time per output token after the first, per request) at `--qps`:
the fastest-needed GPU of H100-80GB, H200, B200 whose simulated control is at or below X, then a uniform extra
latency per engine step (the simulator's `extraLatencySeconds` knob) on both variants, calibrated by short
pre-runs (150 s of the same workload, a seed of its own). Without it: H100-80GB as modelled.

Scenarios (the change happens at the regression start, after `--warmup-windows` windows, default 2; a run
lasts until the start + 3 windows + failureLimit intervals, or its rollback; `--healthy-windows N` makes a
healthy run last N windows instead):

- healthy: steady load, the simulator's default acceptance (EAGLE-3 at k=3: 0.578 greedy), nothing changes;
- latency-regression: at the start the speculative pod's extra per-step latency grows so that its mean TPOT
  becomes (1 + R) × the control's (calibrated by pre-runs; the numbers are printed);
- acceptance-drop: at the start the speculative pod's acceptance knob falls to `--acceptance-to` (0.05);
- load-ramp: QPS rises linearly from 1 to `--qps` over the run (30 s steps), healthy otherwise.

Printed per scenario: the false-rollback rate (healthy and load-ramp: runs rolled back at all; the others:
rolled back before the change), the detection rate and the median time from the regression start to the
rollback in intervals, also from "the moment the window could show it" (start + window), the share of
Inconclusive samples, the rollback reasons, and the true mean TPOT ratio speculative ÷ control over the last
window of each run (from the simulated requests themselves, no buckets). `--json` prints one object.

Cost: the engine core is nearly all of it (Engine.plan_step/complete_step and the metrics observer, ~90%;
rendering and parsing the expositions with prometheus_client ~4–5%, the PromQL ~2%): one run of 26.5
virtual minutes at 4 QPS per variant takes 5–15 s of one core, so `--runs 20` takes 1.5–3 minutes with `--jobs 2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import day
from virtual_pod import Pod
from virtual_prometheus import VirtualPrometheus, spread_offset

from specdeploy.api.resource import SpeculativeDeployment, parse_resource
from specdeploy.api.spec import EngineKind
from specdeploy.api.units import format_duration, parse_duration
from specdeploy.clients.prometheus import query_all
from specdeploy.judgment.samples import DeploymentSample, QueryGroup
from specdeploy.judgment.speculation import step_speculation
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, engine_command
from specdeploy_engine.loadgen import DEFAULT_OUTPUT, DEFAULT_PROMPT
from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, QpsSegment, TemperatureMix, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import ServedModel, served_model
from specdeploy_engine.sim.virtual import simulate

SCENARIOS = ("healthy", "latency-regression", "acceptance-drop", "load-ramp", "day")
NAMESPACE, NAME = "bench", "llama-8b-eagle3"
T0 = 1_749_999_600.0          # the virtual clock's Unix time at pod start (a whole hour)
GPUS = ("H100-80GB", "H200", "B200")
ANALYSIS_TICK = 5.0           # charts/specdeploy/values.yaml analysisTickSeconds
DUE_SLACK = 0.5               # controller/analysis_loop.py due(): interval − 0.5 s
CALIBRATION_SECONDS = 150.0
CALIBRATION_WARMUP = 20.0
DEFAULT_TEMPERATURE = "0:0.7,1.0:0.3"


def resource_document(gpu: str, analysis: dict[str, Any]) -> dict[str, Any]:
    """The demo's EAGLE-3 SD (operator/specdeploy/devcluster/demo.py) with one speculative and one control pod."""
    return {
        "apiVersion": "specdeploy.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "speculation": {"method": "eagle3", "draft": {"name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
                            "numSpeculativeTokens": 3},
            "resources": {"gpu": {"product": gpu, "count": 1}},
            "serving": {"maxModelLen": 8192, "maxNumSeqs": 32},
            "analysis": {**analysis, "baseline": {"mode": "Control", "controlReplicas": 1}},
        },
    }


def served_variants(resource: SpeculativeDeployment) -> tuple[ServedModel, ServedModel]:
    """The speculative and control ServedModels, from the command lines the operator renders."""
    plan = make_plan(resource.spec)
    gpu = find_gpu(resource.spec.resources.gpu.product)
    assert gpu is not None
    models = []
    for variant in (Variant.SPECULATIVE, Variant.CONTROL):
        argv = engine_command(plan, variant, speculate=True).argv()
        models.append(served_model(parse_engine_argv(argv, gpu=gpu), gpu))
    speculative, control = models
    assert speculative.k == 3 and control.k == 0, (speculative.k, control.k)
    return speculative, control


# --- one pod on the virtual clock ------------------------------------------------------------------------------

# --- calibration ---------------------------------------------------------------------------------------------------

def calibration_tpot(served: ServedModel, workload: Workload, knobs: Knobs) -> tuple[float, float]:
    """(mean TPOT, measured acceptance rate) of a short pre-run of `workload`."""
    result = simulate(served, workload.plan(CALIBRATION_SECONDS, seed=987_654), seed=987_654, knobs=knobs)
    return result.mean("tpot", start=CALIBRATION_WARMUP), result.acceptance_rate


@dataclass(frozen=True)
class Calibration:
    gpu: str
    extra_seconds: float                 # on both variants, every step
    control_tpot: float                  # measured with it
    speculative_tpot: float
    regression_extra_seconds: float = 0.0   # added to the speculative pod at the start (latency-regression)
    regression_tpot: float | None = None    # its measured mean TPOT then


def _solve_extra(measure: Callable[[float], float], target: float, first: float, slope: float) -> tuple[float, float]:
    """The extra per-step latency ≥ 0 at which `measure` is `target` (secant steps from `first`)."""
    x0, y0 = first, measure(first)
    if abs(y0 - target) <= 0.005 * target:
        return x0, y0
    x1 = max(0.0, x0 + (target - y0) * slope)
    y1 = measure(x1)
    for _ in range(6):
        if abs(y1 - target) <= 0.005 * target or y1 == y0:
            break
        x0, y0, x1 = x1, y1, max(0.0, x1 + (target - y1) * (x1 - x0) / (y1 - y0))
        y1 = measure(x1)
    return x1, y1


def calibrate(args: argparse.Namespace, workload: Workload, analysis: dict[str, Any]) -> Calibration:
    chosen = GPUS[0]
    models: dict[str, tuple[ServedModel, ServedModel]] = {}
    natural: dict[str, float] = {}
    for gpu in GPUS:
        models[gpu] = served_variants(parse_resource(resource_document(gpu, analysis)))
        natural[gpu] = calibration_tpot(models[gpu][1], workload, Knobs())[0]
        chosen = gpu
        if args.tpot_ms is None or natural[gpu] <= args.tpot_ms / 1000:
            break
    speculative, control = models[chosen]
    extra, control_tpot = 0.0, natural[chosen]
    if args.tpot_ms is not None and natural[chosen] < args.tpot_ms / 1000:
        target = args.tpot_ms / 1000
        extra, control_tpot = _solve_extra(
            lambda e: calibration_tpot(control, workload, Knobs(extra_latency_seconds=e))[0],
            target, target - natural[chosen], 1.0)
    speculative_tpot, acceptance = calibration_tpot(speculative, workload, Knobs(extra_latency_seconds=extra))
    calibration = Calibration(chosen, extra, control_tpot, speculative_tpot)
    if args.scenario == "latency-regression":
        target = (1 + args.regression) * control_tpot
        tokens_per_step = 1 + speculative.k * acceptance
        added, regressed = _solve_extra(
            lambda e: calibration_tpot(speculative, workload, Knobs(extra_latency_seconds=extra + e))[0],
            target, max(0.0, (target - speculative_tpot) * tokens_per_step), tokens_per_step)
        calibration = Calibration(chosen, extra, control_tpot, speculative_tpot, added, regressed)
    return calibration


# --- one run ---------------------------------------------------------------------------------------------------------

@dataclass
class Setup:
    args: argparse.Namespace
    resource: SpeculativeDeployment
    speculative: ServedModel
    control: ServedModel
    calibration: Calibration
    workloads: dict[str, Workload]
    window: float
    interval: float
    scrape: float
    start: float                 # the regression start (s after pod start)
    end: float
    schedule: QpsSchedule


@dataclass
class RunResult:
    index: int
    rolled_back_at: float | None = None
    reason: str | None = None
    evidence: str | None = None
    cycles: list[tuple[float, str, str]] = field(default_factory=list)   # (t, kind, label)
    true_ratio: float = math.nan          # mean TPOT speculative ÷ control over the window before the stop
    qps_at_rollback: float | None = None
    wall_seconds: float = 0.0


def _label(kind: str, result: Any) -> str:
    reason = getattr(result, "reason", None)
    return f"{kind}: {reason.value}" if reason is not None else kind


class Judge:
    """The operator's pure reconcile step: step_speculation runs the verdict, the counting and the decision."""

    def __init__(self, setup: Setup) -> None:
        self.resource = setup.resource
        self.plan = make_plan(self.resource.spec)   # the acceptance floor is the plan's
        self.speculation = step_speculation(self.resource, None, None, True, None, [], _moment(0.0)).speculation
        self.analysis: Any = None

    def judge(self, sample: DeploymentSample, at: float) -> tuple[Any, bool, str]:
        step = step_speculation(self.resource, self.speculation, self.analysis, True, sample, [], _moment(at),
                                plan=self.plan)
        self.speculation, self.analysis = step.speculation, step.analysis
        evidence = step.rollback.evidence if step.rollback is not None else ""
        return step.verdict, step.rollback is not None, evidence


def run_once(setup: Setup, index: int) -> RunResult:
    """One run: the simulated pods, their scrapes and the operator's judgment; it ends at a rollback or at the
    end."""
    started = time.perf_counter()
    args = setup.args
    rng = random.Random(f"decisions:{args.seed}:{index}")
    pods = [
        Pod(f"{NAME}-7d9f8-{variant[:4]}{index}", variant, served,
            Knobs(extra_latency_seconds=setup.calibration.extra_seconds), rng.randrange(2**31),
            setup.workloads[variant], setup.end, rng.randrange(2**31))
        for variant, served in (("speculative", setup.speculative), ("control", setup.control))
    ]
    prometheus = VirtualPrometheus()
    events: list[tuple[float, int, Any]] = []
    for pod in pods:
        labels = {"namespace": NAMESPACE, "pod": pod.name, "container": "engine", "endpoint": "http",
                  "job": f"{NAMESPACE}/{NAME}", "instance": f"{pod.name}:8000",
                  "specdeploy_io_name": NAME, "specdeploy_io_variant": pod.variant}
        offset = spread_offset({**labels, "run": str(index), "seed": str(args.seed)}, setup.scrape)
        target = prometheus.add_target(labels, pod.metrics.render, offset=offset)
        events += [(at, 1, (pod, target)) for at in prometheus.scrape_times(target, setup.scrape, 0.0, setup.end)]
    phase = rng.uniform(0.0, ANALYSIS_TICK)
    ticks = int((setup.end - phase) // ANALYSIS_TICK) + 1
    events += [(phase + i * ANALYSIS_TICK, 2, None) for i in range(ticks)]
    if args.scenario in ("latency-regression", "acceptance-drop"):
        events.append((setup.start, 0, "change"))
    events.sort(key=lambda event: (event[0], event[1]))

    judge = Judge(setup)
    result = RunResult(index)
    group = QueryGroup(EngineKind.VLLM, setup.window)
    loop = asyncio.new_event_loop()
    last_sample: float | None = None
    try:
        for at, _, payload in events:
            if payload == "change":
                for pod in pods:
                    pod.advance(at)
                knobs = pods[0].engine.knobs
                if args.scenario == "latency-regression":
                    knobs.extra_latency_seconds = (setup.calibration.extra_seconds
                                                   + setup.calibration.regression_extra_seconds)
                else:
                    knobs.acceptance = args.acceptance_to
                continue
            if payload is not None:
                pod, target = payload
                pod.advance(at)
                prometheus.scrape(target, T0 + at)
                continue
            # an analysis tick: is the SD due (controller/analysis_loop.py due())?
            if last_sample is not None and at - last_sample < setup.interval - DUE_SLACK:
                continue
            last_sample = float(math.floor(at))            # lastSampleAt is written in whole seconds
            samples = loop.run_until_complete(query_all(prometheus, [group], at=T0 + at))  # type: ignore[arg-type]
            sample = samples.for_deployment(NAMESPACE, NAME, EngineKind.VLLM, setup.window)
            verdict, rollback, evidence = judge.judge(sample, at)
            kind = type(verdict).__name__
            result.cycles.append((at, kind, _label(kind, verdict)))
            if rollback:
                reason = getattr(verdict, "reason", None)
                result.rolled_back_at, result.evidence = at, evidence
                result.reason = reason.value if reason is not None else kind
                result.qps_at_rollback = setup.schedule.qps_at(at)
                result.true_ratio = _true_ratio(pods, at, setup.window)
                break
    finally:
        loop.close()
    if result.rolled_back_at is None:
        result.true_ratio = _true_ratio(pods, setup.end, setup.window)
    result.wall_seconds = time.perf_counter() - started
    return result


def _true_ratio(pods: list[Pod], stop: float, window: float) -> float:
    for pod in pods:
        pod.advance(stop)
    return pods[0].mean_tpot(stop - window, stop) / pods[1].mean_tpot(stop - window, stop)


def _moment(at: float) -> datetime:
    return datetime.fromtimestamp(T0 + at, tz=UTC)


_SETUP: Setup | None = None


def _run_in_worker(index: int) -> RunResult:
    assert _SETUP is not None
    return run_once(_SETUP, index)


# --- the summary -------------------------------------------------------------------------------------------------

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(setup: Setup, results: list[RunResult], wall: float) -> dict[str, Any]:
    args = setup.args
    runs = len(results)
    changes = args.scenario in ("latency-regression", "acceptance-drop")
    rolled = [r for r in results if r.rolled_back_at is not None]
    if changes:
        false = [r for r in rolled if r.rolled_back_at is not None and r.rolled_back_at < setup.start]
        detected = [r for r in rolled if r not in false]
    else:
        false, detected = rolled, []
    intervals = [(r.rolled_back_at - setup.start) / setup.interval for r in detected if r.rolled_back_at is not None]
    visible = [(r.rolled_back_at - setup.start - setup.window) / setup.interval for r in detected
               if r.rolled_back_at is not None]
    cycles = [cycle for r in results for cycle in r.cycles]
    inconclusive = [c for c in cycles if c[1] == "Inconclusive"]
    after_fill = [c for c in cycles if c[0] >= setup.window]
    hours = sum(((r.rolled_back_at if r.rolled_back_at is not None else setup.end) / 3600) for r in results)
    c = setup.calibration
    summary: dict[str, Any] = {
        "scenario": args.scenario, "runs": runs, "seed": args.seed,
        "falseRollbackRate": len(false) / runs if runs else None,
        "falseRollbacks": len(false),
        "falseRollbacksPerHour": (len(false) / hours) if not changes and hours else None,
        "detectionRate": (len(detected) / runs) if changes and runs else None,
        "detections": len(detected) if changes else None,
        "medianDetectionIntervals": _median(intervals),
        "medianDetectionIntervalsFromVisible": _median(visible),
        "detectionIntervals": sorted(intervals) if changes else None,
        "inconclusiveShare": len(inconclusive) / len(cycles) if cycles else None,
        "inconclusiveShareAfterFirstWindow": (sum(1 for x in after_fill if x[1] == "Inconclusive") / len(after_fill)
                                              if after_fill else None),
        "samples": len(cycles),
        "verdicts": dict(Counter(c[2] for c in cycles).most_common()),
        "rollbackReasons": dict(Counter(r.reason for r in rolled).most_common()),
        "medianQpsAtRollback": _median([r.qps_at_rollback for r in rolled if r.qps_at_rollback is not None]),
        "medianTrueMeanTpotRatio": _median([r.true_ratio for r in results if math.isfinite(r.true_ratio)]),
        "params": {
            "qps": args.qps, "tpotMs": args.tpot_ms, "regression": args.regression if args.scenario == "latency-regression" else None,
            "acceptanceTo": args.acceptance_to if args.scenario == "acceptance-drop" else None,
            "window": format_duration(setup.window), "interval": format_duration(setup.interval),
            "failureLimit": setup.resource.spec.analysis.failure_limit,
            "minRequests": setup.resource.spec.analysis.min_requests,
            "scrape": format_duration(setup.scrape), "temperature": args.temperature,
            "regressionStartSeconds": setup.start, "runSeconds": setup.end,
            "gpu": c.gpu, "extraStepLatencyMs": round(c.extra_seconds * 1000, 3),
            "controlMeanTpotMs": round(c.control_tpot * 1000, 3),
            "speculativeMeanTpotMs": round(c.speculative_tpot * 1000, 3),
            "regressionExtraStepLatencyMs": round(c.regression_extra_seconds * 1000, 3) if c.regression_tpot else None,
            "regressedSpeculativeMeanTpotMs": round(c.regression_tpot * 1000, 3) if c.regression_tpot else None,
        },
        "runsDetail": [{"run": r.index, "rolledBackAt": r.rolled_back_at, "reason": r.reason, "evidence": r.evidence,
                        "trueMeanTpotRatio": round(r.true_ratio, 4) if math.isfinite(r.true_ratio) else None,
                        "wallSeconds": round(r.wall_seconds, 2)} for r in results],
        "wallSeconds": round(wall, 2),
    }
    return summary


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def text(summary: dict[str, Any]) -> str:
    p = summary["params"]
    lines = [
        f"{summary['scenario']} · {summary['runs']} runs, seed {summary['seed']} · "
        f"qps {p['qps']:g} · {p['gpu']} +{p['extraStepLatencyMs']:g} ms/step: control TPOT "
        f"{p['controlMeanTpotMs']:.1f} ms, speculative {p['speculativeMeanTpotMs']:.1f} ms · window {p['window']} "
        f"interval {p['interval']} failureLimit {p['failureLimit']} minRequests {p['minRequests']} scrape {p['scrape']}",
    ]
    if p["regressedSpeculativeMeanTpotMs"] is not None:
        lines.append(f"  regression at {p['regressionStartSeconds']:g} s: speculative +{p['regressionExtraStepLatencyMs']:g} "
                     f"ms/step → TPOT {p['regressedSpeculativeMeanTpotMs']:.1f} ms "
                     f"({p['regressedSpeculativeMeanTpotMs'] / p['controlMeanTpotMs']:.2f}× the control's)")
    if p["acceptanceTo"] is not None:
        lines.append(f"  acceptance knob → {p['acceptanceTo']:g} at {p['regressionStartSeconds']:g} s")
    per_hour = summary["falseRollbacksPerHour"]
    lines.append(f"  false rollbacks: {summary['falseRollbacks']}/{summary['runs']} ({_percent(summary['falseRollbackRate'])})"
                 + (f", {per_hour:.2f} per hour of analysis" if per_hour is not None else ""))
    if summary["detectionRate"] is not None:
        lines.append(f"  detected: {summary['detections']}/{summary['runs']} ({_percent(summary['detectionRate'])}); "
                     f"median {_number(summary['medianDetectionIntervals'])} intervals after the change, "
                     f"{_number(summary['medianDetectionIntervalsFromVisible'])} after the window could show it")
    if summary["medianQpsAtRollback"] is not None:
        lines.append(f"  median QPS at rollback: {summary['medianQpsAtRollback']:.2f}")
    verdicts = ", ".join(f"{k} {v}" for k, v in list(summary["verdicts"].items())[:6])
    lines.append(f"  inconclusive: {_percent(summary['inconclusiveShare'])} of {summary['samples']} samples "
                 f"({_percent(summary['inconclusiveShareAfterFirstWindow'])} after the first window) · {verdicts}")
    if summary["rollbackReasons"]:
        lines.append("  rollback reasons: " + ", ".join(f"{k} {v}" for k, v in summary["rollbackReasons"].items()))
    lines.append(f"  true mean TPOT speculative ÷ control over the last window: median "
                 f"{_number(summary['medianTrueMeanTpotRatio'], 2)} · wall {summary['wallSeconds']:.1f} s")
    return "\n".join(lines)


# --- the command line --------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--tpot-ms", type=float, default=None, help="the control's mean TPOT (default: as modelled)")
    parser.add_argument("--regression", type=float, default=0.2,
                        help="latency-regression: speculative mean TPOT becomes (1 + R) × the control's")
    parser.add_argument("--acceptance-to", type=float, default=0.05, help="acceptance-drop: the knob after the change")
    parser.add_argument("--qps", type=float, default=4.0, help="requests/s per variant (load-ramp: the top)")
    parser.add_argument("--runs", type=int, default=None, help="default 20; day: 1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--window", default="5m")
    parser.add_argument("--interval", default="30s")
    parser.add_argument("--failure-limit", type=int, default=3)
    parser.add_argument("--min-requests", type=int, default=20)
    parser.add_argument("--scrape", default="15s", help="scrape interval (the operator's PodMonitor: 15s)")
    parser.add_argument("--warmup-windows", type=float, default=2.0, help="windows before the regression start")
    parser.add_argument("--healthy-windows", type=float, default=None,
                        help="healthy: a run lasts this many windows (default: as every scenario, the regression "
                             "start + 3 windows + failureLimit intervals)")
    parser.add_argument("--temperature", default=DEFAULT_TEMPERATURE, help="the load generator's temperature mix")
    parser.add_argument("--jobs", type=int, default=None,
                        help="runs in parallel processes (default 1; day: the pieces of a run, one per core up to 7)")
    parser.add_argument("--hour-seconds", type=float, default=day.HOUR_SECONDS,
                        help="day: virtual seconds per hour of the day")
    parser.add_argument("--cooldown", default="30m", help="day: the SD's analysis.cooldown (re-enable is Auto)")
    return parser


def build(args: argparse.Namespace) -> Setup:
    analysis = {"window": args.window, "interval": args.interval, "failureLimit": args.failure_limit,
                "minRequests": args.min_requests}
    window, interval, scrape = parse_duration(args.window), parse_duration(args.interval), parse_duration(args.scrape)
    start = args.warmup_windows * window
    end = start + 3 * window + args.failure_limit * interval
    if args.scenario == "healthy" and args.healthy_windows is not None:
        end = args.healthy_windows * window
    temperatures = TemperatureMix.parse(args.temperature)
    prompt, output = Lengths.parse(DEFAULT_PROMPT), Lengths.parse(DEFAULT_OUTPUT)
    steady = QpsSchedule.constant(args.qps)
    calibration = calibrate(args, Workload(steady, prompt, output, temperatures), analysis)
    if args.scenario == "load-ramp":
        steps = max(1, math.ceil(end / interval))
        schedule = QpsSchedule(tuple(
            QpsSegment(i * interval, (i + 1) * interval if i < steps - 1 else math.inf,
                       1.0 + (args.qps - 1.0) * i / max(1, steps - 1))
            for i in range(steps)))
    else:
        schedule = steady
    resource = parse_resource(resource_document(calibration.gpu, analysis))
    speculative, control = served_variants(resource)
    workload = Workload(schedule, prompt, output, temperatures)
    return Setup(args, resource, speculative, control, calibration, {"speculative": workload, "control": workload},
                 window, interval, scrape, start, end, schedule)


def main(argv: list[str] | None = None) -> int:
    global _SETUP
    args = _parser().parse_args(argv)
    if args.scenario == "day":
        args.jobs = args.jobs if args.jobs is not None else min(7, os.cpu_count() or 1)
        summary = day.run_day(args)
        print(json.dumps(summary, indent=1) if args.json else day.text(summary))
        return 0
    args.runs = args.runs if args.runs is not None else 20
    args.jobs = args.jobs if args.jobs is not None else 1
    started = time.perf_counter()
    setup = build(args)
    _SETUP = setup
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            runs = pool.map(_run_in_worker, range(args.runs), chunksize=1)
    else:
        runs = [run_once(setup, index) for index in range(args.runs)]
    wall = time.perf_counter() - started
    summary = summarize(setup, runs, wall)
    print(json.dumps(summary, indent=1) if args.json else text(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
