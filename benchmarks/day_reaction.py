"""What the day's P99 allows a rollback: how fast one must come for `auto` to be within 5% of the oracle.

    python benchmarks/day_reaction.py [--seed S] [--delays 0,30,60,90,120,180,360] [--trials 0,45,90] [--jobs J]

The day of benchmarks/day.py (`decisions.py --scenario day`), its settings each served all day on the same arrivals
(off, k = 1 … 5, the Auto table), and the oracle built from them as there. Then, with no judgment at all, the policy
an ideal rollback would give: the Auto table all day, except that from `delay` seconds after the acceptance dip
begins the requests are served by the pod without speculation, and a re-enable by the default cooldown (30 minutes
after that rollback, still inside the dip) serves `trial` seconds with the Auto table before the next rollback. For
each (delay, trial) it prints that policy's P99 TPOT and goodput against the oracle's: the reaction time the
judgment would need for the issue's 5% to be reachable at all.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from typing import Any

from day import MINUTE, Day, Served, metrics, oracle, run_setting, setting_models, slo_for

COOLDOWN_SECONDS = 1800.0       # the SD's default analysis.cooldown


def _setting(job: tuple[str, int, float]) -> tuple[str, list[Served]]:
    name, seed, hour_seconds = job
    day = Day(hour_seconds)
    return name, run_setting(setting_models()[name], day.workload().plan(day.seconds, seed=seed), seed, day)


def reacted(settings: dict[str, list[Served]], day: Day, delay: float, trial: float) -> list[Served]:
    """The Auto table's requests, but the off pod's from `delay` after the dip starts, and the Auto table's again for
    `trial` seconds a cooldown after that rollback (while the dip lasts)."""
    start, end = day.dip
    back = start + delay + COOLDOWN_SECONDS
    spans = [("autoTable", 0.0, start + delay), ("off", start + delay, end), ("autoTable", end, day.seconds + MINUTE)]
    if back < end:
        spans[1:2] = [("off", start + delay, back), ("autoTable", back, min(back + trial, end)),
                      ("off", min(back + trial, end), end)]
    return sorted((r for name, low, high in spans for r in settings[name] if low <= r.arrival < high),
                  key=lambda r: r.arrival)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hour-seconds", type=float, default=600.0)
    parser.add_argument("--delays", default="0,30,60,90,120,180,360", help="seconds from the dip's start to rollback")
    parser.add_argument("--trials", default="0,45,90", help="seconds a re-enable inside the dip serves before rollback")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    day = Day(args.hour_seconds)
    seed = args.seed * 1000          # run 0 of decisions.py --scenario day --seed S
    names = ("off", "k1", "k2", "k3", "k4", "k5", "autoTable")
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        settings = dict(pool.map(_setting, [(name, seed, args.hour_seconds) for name in names], chunksize=1))
    slo = slo_for(setting_models()["off"])
    best: dict[str, Any] = metrics(oracle(settings, slo, day)[0], slo, day.seconds)
    print(f"day, seed {args.seed}: oracle P99 TPOT {best['p99TpotSeconds'] * 1000:.2f} ms, goodput "
          f"{best['goodputTokensPerSecond']:.1f} tok/s; the Auto table outside the dip, off from `delay` s into it, "
          f"a re-enable {COOLDOWN_SECONDS:g} s after that rollback serving `trial` s")
    print(f"{'delay s':>8}{'trial s':>9}{'P99 TPOT ms':>13}{'vs oracle':>11}{'goodput':>10}{'vs oracle':>11}")
    for delay in (float(d) for d in args.delays.split(",")):
        for trial in (float(t) for t in args.trials.split(",")):
            found = metrics(reacted(settings, day, delay, trial), slo, day.seconds)
            p99, goodput = found["p99TpotSeconds"], found["goodputTokensPerSecond"]
            print(f"{delay:>8g}{trial:>9g}{p99 * 1000:>13.2f}{p99 / best['p99TpotSeconds'] - 1:>+11.1%}"
                  f"{goodput:>10.1f}{goodput / best['goodputTokensPerSecond'] - 1:>+11.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
