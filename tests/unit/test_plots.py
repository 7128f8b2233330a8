"""The pictures of `plan --plot` and `probe --plot`: the format the name asks for, a size the docs can carry, and
markers where the numbers put them."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import yaml

from specdeploy.api.resource import load_resource
from specdeploy.judgment.probe import ProbeCell
from specdeploy.planning.plan import Plan, make_plan
from specdeploy.views.plots import CannotPlot, speedup_curves, write_plan_figure, write_probe_figure

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_BYTES = 150_000


def _plan(example: str, **serving: object) -> tuple[str, Plan]:
    document = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    document["spec"].setdefault("serving", {}).update(serving)
    document["spec"]["speculation"]["schedule"] = {"mode": "Auto"}
    resource = load_resource(yaml.safe_dump(document))
    return resource.metadata.name, make_plan(resource.spec)


def test_the_break_even_is_where_the_drawn_curve_of_the_sds_k_crosses_one() -> None:
    _, plan = _plan("llama-70b-fp8-tp2", maxNumSeqs=256)
    curves = speedup_curves(plan)
    assert plan.speedup is not None and curves.break_even_batch == plan.speedup.breakeven_batch_size
    assert curves.break_even_batch is not None and curves.batches[:3] == (1, 2, 3)
    before, at = curves.speedup_at_k[curves.break_even_batch - 2], curves.speedup_at_k[curves.break_even_batch - 1]
    assert before >= 1.0 > at
    assert curves.schedule_k is not None and curves.speedup_by_schedule is not None
    assert plan.schedule is not None and curves.schedule_k[0] == plan.schedule.k_at(1)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_plan_picture_is_written_in_the_format_its_name_asks(tmp_path: Path, suffix: str) -> None:
    name, plan = _plan("qwen3-4b-draft", maxNumSeqs=256)
    path = tmp_path / f"plan{suffix}"
    curves = write_plan_figure(name, plan, path)
    data = path.read_bytes()
    assert 0 < len(data) < MAX_BYTES
    if suffix == ".png":
        assert data.startswith(PNG_MAGIC)
    else:
        root = ElementTree.fromstring(data)
        ids = {element.get("id") for element in root.iter()}
        assert root.tag.endswith("svg") and "break-even" in ids
        assert f"break-even of k = {curves.k}: batch {curves.break_even_batch}" in data.decode()


def test_a_plan_that_predicts_nothing_has_no_picture(tmp_path: Path) -> None:
    document = yaml.safe_load((EXAMPLES / "llama-8b-ngram.yaml").read_text())
    document["spec"]["speculation"] = {"enabled": False}
    resource = load_resource(yaml.safe_dump(document))
    with pytest.raises(CannotPlot, match="predicts no speedup"):
        write_plan_figure("off", make_plan(resource.spec), tmp_path / "plan.png")
    assert not (tmp_path / "plan.png").exists()


CELLS = [ProbeCell(workload, temperature, 4, 0, rate, 1 + 3 * rate)
         for workload, base in (("code", 0.85), ("support", 0.05))
         for temperature, rate in ((0.0, base), (0.7, base * 0.9), (1.0, base * 0.8))]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_probe_picture_has_a_line_per_workload_and_the_floor(tmp_path: Path, suffix: str) -> None:
    _, plan = _plan("qwen3-4b-draft")
    floor = plan.acceptance_floor(1)
    path = tmp_path / f"probe{suffix}"
    write_probe_figure("qwen3-4b", CELLS, floor, path)
    data = path.read_bytes()
    assert 0 < len(data) < MAX_BYTES
    if suffix == ".png":
        assert data.startswith(PNG_MAGIC)
    else:
        text = data.decode()
        assert floor is not None and f"floor {floor.rate:.2f}" in text
        assert "code" in text and "support" in text and 'id="floor"' in text


def test_a_probe_that_measured_nothing_has_no_picture(tmp_path: Path) -> None:
    with pytest.raises(CannotPlot, match="measured no acceptance"):
        write_probe_figure("x", [ProbeCell("code", 0.0, 0, 4, None, None)], None, tmp_path / "probe.svg")


def test_the_schedules_curve_is_the_schedule_tables_own_prediction_at_each_ranges_ends() -> None:
    # maxModelLen 8192 (1,024 cached tokens assumed): there the Auto table changes k inside 256 sequences.
    _, plan = _plan("trtllm-llama-8b-eagle3", maxNumSeqs=256, maxModelLen=8192)
    curves = speedup_curves(plan)
    assert plan.schedule is not None and curves.speedup_by_schedule is not None and len(plan.schedule.ranges) > 1
    for entry in plan.schedule.ranges:
        assert curves.speedup_by_schedule[entry.min_batch - 1] == pytest.approx(entry.speedup_at_min_batch, rel=1e-6)
        assert curves.speedup_by_schedule[entry.max_batch - 1] == pytest.approx(entry.speedup_at_max_batch, rel=1e-6)
