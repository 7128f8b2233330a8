"""benchmarks/decisions.py --scenario day on a day of seconds: the JSON's shape, the same load for every policy,
the oracle's construction, and speculation's order against none at the two ends of the day's load."""

from __future__ import annotations

import importlib
import json
import math
import statistics
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
METRICS = ("p99TpotSeconds", "meanTpotSeconds", "goodputTokensPerSecond")


@pytest.fixture
def benchmarks(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("decisions"), importlib.import_module("day")


def test_a_short_day_prints_every_policy_on_the_same_load(benchmarks: tuple[ModuleType, ModuleType],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    decisions, _ = benchmarks
    assert decisions.main(["--scenario", "day", "--hour-seconds", "2", "--json", "--jobs", "1"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert set(policies) == {"alwaysOn", "alwaysOff", "rollbackOnly", "auto", "oracle"}
    for row in policies.values():
        assert all(math.isfinite(row[key]) and row[key] > 0 for key in METRICS), row
        assert row["p99TpotSeconds"] >= row["meanTpotSeconds"]
    assert len({row["requests"] for row in policies.values()}) == 1   # every arrival served by every policy
    goodput = {name: row["goodputTokensPerSecond"] for name, row in policies.items()}
    assert goodput["oracle"] >= max(goodput["alwaysOn"], goodput["alwaysOff"])   # each minute's best setting


def test_the_oracle_takes_each_minutes_best_setting(benchmarks: tuple[ModuleType, ModuleType]) -> None:
    _, day = benchmarks
    slo = day.Slo(tpot=0.010)
    fast, slow = 0.005, 0.020
    settings = {
        "off": [day.Served(10.0, 100, 0.1, slow), day.Served(70.0, 100, 0.1, fast)],
        "k1": [day.Served(10.0, 100, 0.1, fast), day.Served(70.0, 100, 0.1, slow)],
    }
    chosen, picks = day.oracle(settings, slo, day.Day(hour_seconds=5.0))
    assert picks == ["k1", "off"]
    assert [request.tpot for request in chosen] == [fast, fast]


def test_speculation_pays_at_night_and_costs_at_the_dipped_peak(benchmarks: tuple[ModuleType, ModuleType]) -> None:
    _, day = benchmarks
    short = day.Day(hour_seconds=10.0)
    planned = short.workload().plan(short.seconds, seed=3)
    models = day.setting_models()

    def mean_tpot(setting: str, hours: tuple[float, float]) -> float:
        served = day.run_setting(models[setting], planned, 3, short)
        start, stop = (hour * short.hour_seconds for hour in hours)
        return statistics.fmean(r.tpot for r in served if start <= r.arrival < stop)

    # k 2, what Auto derives for this SD at the prior. k 5 (alwaysOn) no longer pays even at night: with the step
    # costs held to the measured H100 table the 1B draft's pass is about a quarter of a target step, and five of
    # them cost what 2.4 tokens per step win (docs/speedup-model.md).
    night, peak = (0.0, 2.0), (11.0, 13.0)
    assert mean_tpot("k2", night) < mean_tpot("off", night)
    assert mean_tpot("k2", peak) > mean_tpot("off", peak)
    assert mean_tpot("k5", night) > mean_tpot("k2", night)


def test_a_recalibrated_schedule_re_renders_the_speculative_pod(benchmarks: tuple[ModuleType, ModuleType],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """As for a rollback: the judged auto SD's next arrivals go to a pod rendered with the table the new status
    derives (the operator's next plan), and the harness records the change."""
    import asyncio

    from specdeploy.api.status import PositionAcceptance, ScheduleCalibration, ScheduleEntry
    from specdeploy.judgment.calibration import CalibrationDecision
    from specdeploy.judgment.recalibration import Recalibration
    from specdeploy.judgment.speculation import SpeculationStep
    from specdeploy.planning.schedule import calibration_key

    _, day = benchmarks
    short = day.Day(hour_seconds=2.0)
    planned = short.workload().plan(short.seconds, seed=1)
    control = day.Lane(day.served(day.resource(), day.Variant.CONTROL), planned, 0, 1, short, observed=True)
    sd = day.Judged("auto", "Auto", control, planned, 1, short, 0)
    sd.start_lane(0.0, 0)
    assert sd.lanes[-1].model.k == 2                     # the prior's table: k 2 at every batch size
    rates = [0.3 * 0.3**i for i in range(5)]
    calibration = ScheduleCalibration(
        key=calibration_key(sd.resource.spec), schedule=[ScheduleEntry(min_batch=1, max_batch=32, k=1)],
        positions=[PositionAcceptance(position=i + 1, rate=rate, source="Measured") for i, rate in enumerate(rates)])
    changed = sd.speculation.model_copy(update={"calibration": calibration})

    def step(*_: object, **__: object) -> SpeculationStep:
        return SpeculationStep(changed, None, recalibrated=Recalibration("k 2 → k 1", CalibrationDecision(True, None)))

    monkeypatch.setattr(day, "step_speculation", step)
    loop = asyncio.new_event_loop()
    try:
        sd.sample(10.0, loop)
    finally:
        loop.close()
    assert len(sd.lanes) == 2 and sd.lanes[-1].model.k == 1
    assert sd.recalibrations == [(10.0, "1–32: k 1")] and sd.rollbacks == [] and sd.reenables == []


def test_the_auto_policy_calibrates_from_the_pods_counts_per_position(benchmarks: tuple[ModuleType, ModuleType]) -> None:
    """The simulated pod's per-position counters reach `calibrate` through the virtual Prometheus: the auto SD's
    last decision is taken on measured positions; the Fixed one is never calibrated."""
    _, day = benchmarks
    short = day.Day(hour_seconds=4.0)
    judged, _ = day.run_judged(short.workload().plan(short.seconds, seed=1), 1, short, 0)
    calibration = judged["auto"].speculation.calibration
    assert calibration is not None and calibration.last_decision is not None
    assert calibration.last_decision.reason not in ("NoPositionCounts", "TooFewDrafts"), calibration.last_decision
    assert judged["rollbackOnly"].speculation.calibration is None


def test_the_reaction_policy_serves_off_from_the_delay_and_the_table_for_the_trial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/day_reaction.py: the Auto table outside the dip, off from `delay` into it, the table again for
    `trial` seconds a cooldown after that rollback."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    day, reaction = importlib.import_module("day"), importlib.import_module("day_reaction")
    a_day = day.Day(hour_seconds=600.0)         # the dip: 6000–8400 s
    arrivals = (100.0, 6010.0, 6100.0, 7900.0, 7950.0, 8000.0, 9000.0)
    settings = {name: [day.Served(at, 10, 0.1, 0.001 * (i + 1)) for at in arrivals]
                for i, name in enumerate(("autoTable", "off"))}
    served = reaction.reacted(settings, a_day, delay=60.0, trial=90.0)   # back at 7860 s, off again at 7950 s
    table, off = 0.001, 0.002
    assert [(r.arrival, r.tpot) for r in served] == [(100.0, table), (6010.0, table), (6100.0, off), (7900.0, table),
                                                     (7950.0, off), (8000.0, off), (9000.0, table)]


def test_the_reaction_policy_re_enables_at_each_doubling_cooldown_inside_the_dip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the day's own length the SD's cooldown (30m, doubling) re-enables three times inside the 4-hour dip: the
    bound serves the table for `trial` seconds at each, as the judged `auto` pays each re-enable there."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    day, reaction = importlib.import_module("day"), importlib.import_module("day_reaction")
    a_day = day.Day(hour_seconds=3600.0)        # the dip: 36000–50400 s
    assert reaction.spans(a_day, delay=100.0, trial=60.0) == [
        ("autoTable", 0.0, 36100.0),
        ("off", 36100.0, 37900.0), ("autoTable", 37900.0, 37960.0),      # 30 minutes after the first rollback
        ("off", 37960.0, 41560.0), ("autoTable", 41560.0, 41620.0),      # 60 after the second
        ("off", 41620.0, 48820.0), ("autoTable", 48820.0, 48880.0),      # 120 after the third
        ("off", 48880.0, 50400.0), ("autoTable", 50400.0, 86460.0),      # 240 after the fourth: past the dip
    ]
