"""Pictures of a plan and of a probe, PNG or SVG by the file's extension: `plan --plot` and `probe --plot`, and
scripts/figures.py for docs/figures/. matplotlib is the optional extra `plot` (`pip install 'specdeploy[plot]'`);
it is imported only when a picture is asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.api.spec import ScheduleMode
from specdeploy.judgment.probe import ProbeCell
from specdeploy.planning.acceptance_floor import AcceptanceFloor
from specdeploy.planning.plan import Plan
from specdeploy.planning.schedule import zero_k_speedup

FORMATS = {".png": "png", ".svg": "svg"}
DENSE_BATCHES = 1024
"""Up to this maxNumSeqs every batch size is drawn; past it, a grid about 5% apart."""


class CannotPlot(Exception):
    """matplotlib is missing, the file name has no picture format, or the plan predicts nothing: the sentence
    says which and what to do."""


@dataclass(frozen=True)
class SpeedupCurves:
    """The predicted speedup at each batch size, for the SD's k and for its schedule's k per batch, under the
    acceptance of the plan's estimate; the break-even is the first batch where the SD's k stops paying."""

    batches: tuple[int, ...]
    k: int
    speedup_at_k: tuple[float, ...]
    schedule_k: tuple[int, ...] | None       # None: schedule mode Fixed, the same curve as k
    speedup_by_schedule: tuple[float, ...] | None
    break_even_batch: int | None             # None: pays up to maxNumSeqs
    alpha: float
    acceptance_measured: bool


def image_format(path: Path) -> str:
    """png or svg, from the file's extension."""
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise CannotPlot(f"{path}: name a .png or .svg file") from None


def _batches(max_batch: int) -> tuple[int, ...]:
    if max_batch <= DENSE_BATCHES:
        return tuple(range(1, max_batch + 1))
    batches, batch = [], 1
    while batch < max_batch:
        batches.append(batch)
        batch = max(batch + 1, int(batch * 1.05))
    return (*batches, max_batch)


def speedup_curves(plan: Plan) -> SpeedupCurves:
    """The numbers behind the plan's picture (planning's own cost model; nothing re-derived here)."""
    estimate, cost, schedule = plan.speedup, plan.cost, plan.schedule
    if estimate is None or cost is None:
        raise CannotPlot("the plan predicts no speedup (speculation is off, or the spec is rejected): nothing to draw")
    batches = _batches(estimate.max_batch_size)
    at_k = tuple(cost.speedup(b, estimate.alpha, estimate.k) for b in batches)
    schedule_k = by_schedule = None
    if schedule is not None and schedule.mode != ScheduleMode.FIXED:
        schedule_k = tuple(schedule.k_at(b) for b in batches)
        by_schedule = tuple(cost.speedup(b, estimate.alpha, k) if k else zero_k_speedup(cost)
                            for b, k in zip(batches, schedule_k, strict=True))
    return SpeedupCurves(batches, estimate.k, at_k, schedule_k, by_schedule, estimate.breakeven_batch_size,
                         estimate.alpha, estimate.acceptance_rate_measured)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise CannotPlot("pictures need matplotlib, the `plot` extra: pip install 'specdeploy[plot]'") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "specdeploy"   # the same picture makes the same SVG
    import matplotlib.pyplot as pyplot

    return pyplot


def _save(figure: Any, path: Path) -> None:
    kind = image_format(path)
    metadata = {"Date": None} if kind == "svg" else {"Software": None}
    figure.savefig(path, format=kind, dpi=100, bbox_inches="tight", metadata=metadata)


def write_plan_figure(name: str, plan: Plan, path: Path) -> SpeedupCurves:
    """Predicted speedup against batch size: the SD's k, its schedule, the break-even; returns the numbers."""
    image_format(path)
    curves = speedup_curves(plan)
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4))
    axes.plot(curves.batches, curves.speedup_at_k, color="tab:blue", label=f"k = {curves.k} at every batch")
    if curves.speedup_by_schedule is not None and curves.schedule_k is not None:
        axes.plot(curves.batches, curves.speedup_by_schedule, color="tab:orange", linestyle="--",
                  label=f"schedule ({plan.schedule.mode.value if plan.schedule else ''}): k by batch")
        _label_schedule_ranges(axes, curves)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.margins(y=0.12)   # room for the schedule's k labels
    if curves.break_even_batch is not None:
        axes.axvline(curves.break_even_batch, color="tab:red", linestyle=":", gid="break-even",
                     label=f"break-even of k = {curves.k}: batch {curves.break_even_batch}")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(_plain_numbers())
    axes.set_xlabel("running sequences per pod (batch size)")
    axes.set_ylabel("predicted speedup (tokens/s ÷ without)")
    method = plan.spec.speculation.enabled_method.value
    axes.set_title(f"{name}: {method} on {plan.spec.resources.gpu.product}", fontsize=10)
    axes.legend(fontsize=8)
    source = "measured" if curves.acceptance_measured else "assumed for the method"
    figure.text(0.01, -0.04, f"Point estimates at acceptance α {curves.alpha:.2f} ({source}); the plan does not yet "
                "carry the model's interval, so none is drawn.", fontsize=7, color="dimgrey")
    _save(figure, path)
    pyplot.close(figure)
    return curves


def _plain_numbers() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:g}")


def _label_schedule_ranges(axes: Any, curves: SpeedupCurves) -> None:
    """k written above the schedule's curve at the start of each range."""
    assert curves.schedule_k is not None and curves.speedup_by_schedule is not None
    previous = None
    for batch, k, value in zip(curves.batches, curves.schedule_k, curves.speedup_by_schedule, strict=True):
        if k != previous:
            axes.annotate(f"k={k}", (batch, value), textcoords="offset points", xytext=(2, 6), fontsize=7,
                          color="tab:orange")
            previous = k


def write_probe_figure(name: str, cells: Sequence[ProbeCell], floor: AcceptanceFloor | None, path: Path) -> None:
    """Acceptance by temperature, one line per workload, with the acceptance floor."""
    image_format(path)
    measured = [c for c in cells if c.acceptance_rate is not None]
    if not measured:
        raise CannotPlot("the probe measured no acceptance: nothing to draw")
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=(7, 4))
    for workload in sorted({c.workload for c in measured}):
        points = sorted((c.temperature, c.acceptance_rate) for c in measured if c.workload == workload)
        axes.plot([t for t, _ in points], [a for _, a in points], marker="o", label=workload)
    if floor is not None:
        axes.axhline(floor.rate, color="tab:red", linestyle=":", gid="floor",
                     label=f"floor {floor.rate:.2f} (batch {floor.batch_size})")
    axes.set_ylim(0, 1)
    axes.set_xlabel("temperature")
    axes.set_ylabel("acceptance (accepted ÷ drafted tokens)")
    axes.set_title(f"probe of {name}", fontsize=10)
    axes.legend(fontsize=8)
    if floor is not None:
        figure.text(0.01, -0.04, floor.describe(), fontsize=7, color="dimgrey")
    _save(figure, path)
    pyplot.close(figure)
