"""Plans per second: how fast `make_plan` (catalog, memory with suggestions, compatibility, speedup) runs.

    python benchmarks/plan.py [--seconds 2]

Prints, per example, the median time of one plan and plans per second; the issue's bound is 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from specdeploy.api.resource import load_resource
from specdeploy.planning.plan import make_plan

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def time_plans(seconds: float) -> None:
    print(f"{'example':40} {'verdict':18} {'median ms':>10} {'p99 ms':>8} {'plans/s':>9}")
    for path in EXAMPLES:
        spec = load_resource(path.read_text()).spec
        verdict = make_plan(spec).verdict.value
        samples: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            make_plan(spec)
            samples.append(time.perf_counter() - start)
        samples.sort()
        median = statistics.median(samples)
        p99 = samples[int(len(samples) * 0.99) - 1]
        print(f"{path.stem:40} {verdict:18} {median * 1e3:10.3f} {p99 * 1e3:8.3f} {1 / median:9.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per example")
    time_plans(parser.parse_args().seconds)
