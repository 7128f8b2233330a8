"""Whether the analysis checks at their defaults judge an example SD rightly: the SD of an examples/ file with its
own `spec.analysis` replaced by the defaults (only `baseline: Control, 1 control pod`), at a given k and load,
judged by the operator on simulated pods in virtual time — how often it rolls back, on which check, beside what
speculation really did there (the simulator's own requests). No cluster: seconds to minutes.

    python benchmarks/default_checks.py examples/llama-70b-fp8-tp2.yaml [more.yaml …] [--k 8] \\
        [--qps 1,8] [--runs 4] [--windows 12] [--seed 1] [--jobs 1] [--json]

What runs per (file, QPS): `--runs` runs of benchmarks/decisions.py's healthy scenario (its `run_once`: one
speculative and one control pod on the virtual clock, the virtual Prometheus, the operator's own queries, its
analysis cadence and `step_speculation`; a run ends at a rollback) on the file's model, drafter, GPUs and serving,
for `--windows` windows of 5 minutes (12: one virtual hour), the simulator's default acceptance, decisions.py's
workload (lognormal prompts around 256 tokens, outputs around 128, 70% greedy). Printed per (file, QPS): the
rollbacks and their reasons, the samples' verdicts, and the truth over the whole run, speculative ÷ control: mean
prefill time (scheduled → first token, what maxPrefillTimeRatio compares), mean TPOT (maxPerTokenLatencyRatio),
mean inference time (scheduled → last token, maxInferenceTimeRatio).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import decisions
import yaml
from virtual_pod import Pod

from specdeploy.api.resource import SpeculativeDeployment, parse_resource
from specdeploy.planning.gpus import find_gpu
from specdeploy.planning.plan import make_plan
from specdeploy.reconcile.children import Variant, engine_command
from specdeploy_engine.loadgen import DEFAULT_OUTPUT, DEFAULT_PROMPT
from specdeploy_engine.loadgen.workload import Lengths, QpsSchedule, TemperatureMix, Workload
from specdeploy_engine.sim.argv import parse_engine_argv
from specdeploy_engine.sim.knobs import Knobs
from specdeploy_engine.sim.model import ServedModel, served_model

WINDOW, INTERVAL, SCRAPE = 300.0, 30.0, 15.0      # the defaults of spec.analysis and the rendered PodMonitor


def default_checks_resource(path: Path, k: int | None) -> SpeculativeDeployment:
    """The example's SD, its analysis at every default but a Control baseline of one pod, and k if given."""
    document = yaml.safe_load(path.read_text())
    document["metadata"] = {"name": decisions.NAME, "namespace": decisions.NAMESPACE}
    if k is not None:
        document["spec"]["speculation"]["numSpeculativeTokens"] = k
    document["spec"]["analysis"] = {"baseline": {"mode": "Control", "controlReplicas": 1}}
    return parse_resource(document)


def served_variants(resource: SpeculativeDeployment) -> tuple[ServedModel, ServedModel]:
    """The speculative and control ServedModels, from the engine commands the operator renders."""
    plan = make_plan(resource.spec)
    gpu = find_gpu(resource.spec.resources.gpu.product)
    assert gpu is not None
    speculative, control = (served_model(parse_engine_argv(engine_command(plan, variant, speculate=True).argv(),
                                                           gpu=gpu), gpu)
                            for variant in (Variant.SPECULATIVE, Variant.CONTROL))
    return speculative, control


def setup(path: Path, k: int | None, qps: float, windows: float, seed: int) -> decisions.Setup:
    resource = default_checks_resource(path, k)
    speculative, control = served_variants(resource)
    schedule = QpsSchedule.constant(qps)
    workload = Workload(schedule, Lengths.parse(DEFAULT_PROMPT), Lengths.parse(DEFAULT_OUTPUT),
                        TemperatureMix.parse(decisions.DEFAULT_TEMPERATURE))
    args = argparse.Namespace(scenario="healthy", seed=seed, acceptance_to=None)
    calibration = decisions.Calibration(resource.spec.resources.gpu.product, 0.0, math.nan, math.nan)
    end = windows * WINDOW
    return decisions.Setup(args, resource, speculative, control, calibration,
                           {"speculative": workload, "control": workload}, WINDOW, INTERVAL, SCRAPE, end, end,
                           schedule)


def truth(served: ServedModel, workload: Workload, seconds: float, seed: int) -> dict[str, float]:
    """What a pod really did over `seconds` (the first window left out): mean prefill, TPOT and inference time."""
    pod = Pod("truth", "truth", served, Knobs(), seed, workload, seconds, seed + 1)
    pod.advance(seconds)
    done = [r for r in pod.requests if r.finished_at is not None and r.first_token_at is not None
            and r.scheduled_at is not None and r.arrival >= WINDOW]
    return {
        "prefill": statistics.fmean(r.first_token_at - r.scheduled_at for r in done),  # type: ignore[operator]
        "tpot": statistics.fmean((r.finished_at - r.first_token_at) / (r.generated - 1)  # type: ignore[operator]
                                 for r in done if r.generated > 1),
        "inference": statistics.fmean(r.finished_at - r.scheduled_at for r in done),  # type: ignore[operator]
    }


_SETUP: decisions.Setup | None = None


def _run(index: int) -> decisions.RunResult:
    assert _SETUP is not None
    return decisions.run_once(_SETUP, index)


def measure(path: Path, k: int | None, qps: float, runs: int, windows: float, seed: int, jobs: int) -> dict[str, Any]:
    global _SETUP
    started = time.perf_counter()
    _SETUP = setup(path, k, qps, windows, seed)
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_run, range(runs), chunksize=1)
    else:
        results = [_run(index) for index in range(runs)]
    workload = _SETUP.workloads["control"]
    spec_truth = truth(_SETUP.speculative, workload, _SETUP.end, seed)
    control_truth = truth(_SETUP.control, workload, _SETUP.end, seed)
    cycles = [cycle for result in results for cycle in result.cycles]
    rolled = [result for result in results if result.rolled_back_at is not None]
    return {
        "file": str(path), "k": _SETUP.speculative.k, "qps": qps, "runs": runs,
        "virtualMinutes": _SETUP.end / 60,
        "rollbacks": len(rolled),
        "rollbackReasons": dict(Counter(result.reason for result in rolled)),
        "medianMinutesToRollback": (statistics.median(r.rolled_back_at / 60 for r in rolled  # type: ignore[operator]
                                                      ) if rolled else None),
        "samples": len(cycles),
        "verdicts": dict(Counter(cycle[2] for cycle in cycles).most_common()),
        "firstEvidence": rolled[0].evidence if rolled else None,
        "trueRatios": {name: round(spec_truth[name] / control_truth[name], 3) for name in spec_truth},
        "trueMeansMs": {name: [round(spec_truth[name] * 1000, 2), round(control_truth[name] * 1000, 2)]
                        for name in spec_truth},
        "wallSeconds": round(time.perf_counter() - started, 1),
    }


def text(row: dict[str, Any]) -> str:
    ratios, means = row["trueRatios"], row["trueMeansMs"]
    reasons = ", ".join(f"{reason} {count}" for reason, count in row["rollbackReasons"].items()) or "none"
    if row["medianMinutesToRollback"] is not None:
        reasons += f"; median {row['medianMinutesToRollback']:.1f} min to the rollback"
    verdicts = ", ".join(f"{label} {count}" for label, count in row["verdicts"].items())
    lines = [
        f"{Path(row['file']).name} k={row['k']} qps {row['qps']:g}/pod: rolled back {row['rollbacks']}/{row['runs']} "
        f"runs of {row['virtualMinutes']:.0f} virtual min ({reasons}) · wall {row['wallSeconds']:.0f} s",
        f"  truth spec ÷ control: prefill {ratios['prefill']:.2f} ({means['prefill'][0]:.1f} vs "
        f"{means['prefill'][1]:.1f} ms), TPOT {ratios['tpot']:.2f} ({means['tpot'][0]:.2f} vs "
        f"{means['tpot'][1]:.2f} ms), inference {ratios['inference']:.2f}",
        f"  {row['samples']} samples: {verdicts}",
    ]
    if row["firstEvidence"]:
        lines.append(f"  first rollback: {row['firstEvidence']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--k", type=int, default=None, help="numSpeculativeTokens (default: the file's)")
    parser.add_argument("--qps", default="1,8", help="requests/s per pod, comma-separated")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--windows", type=float, default=12.0, help="windows of 5 minutes per run (12: an hour)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for path in args.files:
        for qps in (float(value) for value in args.qps.split(",")):
            row = measure(path, args.k, qps, args.runs, args.windows, args.seed, args.jobs)
            rows.append(row)
            if not args.json:
                print(text(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
