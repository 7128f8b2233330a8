"""What the day allows a rollback: how fast one must come for `auto` to be within 5% of the oracle, and to be ahead
of always-off.

    python benchmarks/day_reaction.py [--seed S] [--hour-seconds 3600] [--delays 0,30,60,90,110,180]
                                      [--trials 0,15,30,60] [--on autoTable] [--jobs J]

The day of benchmarks/day.py (`decisions.py --scenario day`), its settings each served all day on the same arrivals
(off, k = 1 … 5, the Auto table), and the oracle built from them as there. Then, with no judgment at all, the policy
an ideal rollback would give: the Auto table all day, except that from `delay` seconds after the acceptance dip
begins the requests are served by the pod without speculation, and each re-enable the SD's cooldown brings inside the
dip (`cooldown_seconds`: 30 minutes after the first rollback, then 60, 120 …, each after the rollback before it)
serves `trial` seconds with the Auto table before it is rolled back again. At the dip's end the Auto table serves
again at once: a re-enable that knows the dip is over, which no judgment has (the policy is a bound, not a
simulation of one). `--on` names the setting that speculates in it (default the Auto table; `k1` asks what a
table drafting k = 1 would cost in the dip). For each (delay, trial) it prints that policy's P99 TPOT and goodput
against the oracle's and always-off's: the reaction the judgment would need for the issue's points to be reachable.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from typing import Any

from day import MINUTE, SETTINGS, Day, Served, metrics, oracle, resource, run_setting, setting_models, slo_for

from specdeploy.judgment.rollback import cooldown_seconds


def _setting(job: tuple[str, int, float]) -> tuple[str, list[Served]]:
    name, seed, hour_seconds = job
    day = Day(hour_seconds)
    return name, run_setting(setting_models()[name], day.workload().plan(day.seconds, seed=seed), seed, day)


def spans(day: Day, delay: float, trial: float, on: str = "autoTable") -> list[tuple[str, float, float]]:
    """(setting, from, to) over the day: `on` (the Auto table), off from `delay` into the dip, `on` for `trial`
    seconds at each re-enable the SD's doubling cooldown brings inside the dip, `on` from the dip's end."""
    start, end = day.dip
    analysis = resource("Auto").spec.analysis
    found = [(on, 0.0, start + delay)]
    rolled_back, rollbacks = start + delay, 1
    while (back := rolled_back + cooldown_seconds(analysis, rollbacks)) < end:
        found += [("off", rolled_back, back), (on, back, min(back + trial, end))]
        rolled_back, rollbacks = min(back + trial, end), rollbacks + 1
    return [*found, ("off", rolled_back, end), (on, end, day.seconds + MINUTE)]


def reacted(settings: dict[str, list[Served]], day: Day, delay: float, trial: float, on: str = "autoTable"
            ) -> list[Served]:
    """The requests of the policy `spans` describes, each from the setting serving at its arrival."""
    return sorted((r for name, low, high in spans(day, delay, trial, on) for r in settings[name]
                   if low <= r.arrival < high), key=lambda r: r.arrival)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hour-seconds", type=float, default=3600.0)
    parser.add_argument("--delays", default="0,30,60,90,110,180", help="seconds from the dip's start to rollback")
    parser.add_argument("--trials", default="0,15,30,60", help="seconds each re-enable inside the dip serves")
    parser.add_argument("--on", default="autoTable", choices=SETTINGS[1:],
                        help="the setting that speculates outside the dip and in each trial")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    day = Day(args.hour_seconds)
    seed = args.seed * 1000          # run 0 of decisions.py --scenario day --seed S
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        settings = dict(pool.map(_setting, [(name, seed, args.hour_seconds) for name in SETTINGS], chunksize=1))
    slo = slo_for(setting_models()["off"])
    best: dict[str, Any] = metrics(oracle(settings, slo, day)[0], slo, day.seconds)
    off: dict[str, Any] = metrics(settings["off"], slo, day.seconds)
    back = [round(low / day.hour_seconds, 2) for name, low, _ in spans(day, 0.0, 0.0, args.on)[1:-1] if name == args.on]
    print(f"day, seed {args.seed}, {args.hour_seconds:g} s per hour: {args.on} outside the dip, off from `delay` s "
          f"into it, each re-enable of the cooldown inside it (at delay 0: hours {back}) serving `trial` s")
    for name, row in (("oracle", best), ("alwaysOff", off)):
        print(f"{name}: P99 TPOT {row['p99TpotSeconds'] * 1000:.3f} ms, goodput {row['goodputTokensPerSecond']:.1f} tok/s")
    print(f"{'delay s':>8}{'trial s':>9}{'P99 TPOT ms':>13}{'vs oracle':>11}{'vs off':>9}"
          f"{'goodput':>10}{'vs oracle':>11}{'vs off':>9}")
    for delay in (float(d) for d in args.delays.split(",")):
        for trial in (float(t) for t in args.trials.split(",")):
            found = metrics(reacted(settings, day, delay, trial, args.on), slo, day.seconds)
            p99, goodput = found["p99TpotSeconds"], found["goodputTokensPerSecond"]
            print(f"{delay:>8g}{trial:>9g}{p99 * 1000:>13.3f}{p99 / best['p99TpotSeconds'] - 1:>+11.2%}"
                  f"{p99 / off['p99TpotSeconds'] - 1:>+9.2%}{goodput:>10.1f}"
                  f"{goodput / best['goodputTokensPerSecond'] - 1:>+11.2%}{goodput / off['goodputTokensPerSecond'] - 1:>+9.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
