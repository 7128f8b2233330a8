"""The simulator's hardware profile: the measured H100 table, its scaling rules, and its independence from the
planner's cost model (docs/simulator.md, "Hardware profile")."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.planning.catalog import lookup
from specdeploy.planning.gpus import find_gpu
from specdeploy_engine.sim.hardware import (
    ENGINE_KERNEL_GAP_FACTOR,
    TABLE_PATH,
    model_shape,
    pass_cost,
    table_models,
)

ROOT = Path(__file__).resolve().parents[2]
ENGINE_IMAGE = ROOT / "engine-image"
# The planner's cost model: what the simulator must not share with the planner it grades.
FORBIDDEN = ("specdeploy.planning.roofline", "specdeploy.planning.speedup", "specdeploy.planning.schedule",
             "specdeploy.planning.acceptance_floor")
TABLE = json.loads((ROOT / "tests" / "data" / "h100-step-times.json").read_text())
H100, H200, B200 = find_gpu("H100-80GB"), find_gpu("H200"), find_gpu("B200")
assert H100 is not None and H200 is not None and B200 is not None


def _engine_modules() -> list[str]:
    return sorted(".".join(path.relative_to(ENGINE_IMAGE).with_suffix("").parts)
                  for path in (ENGINE_IMAGE / "specdeploy_engine").rglob("*.py")
                  if path.stem not in ("__init__", "__main__"))


def test_no_module_of_the_engine_image_loads_the_planners_cost_model() -> None:
    """Imported in a fresh interpreter, so an import through another module counts too."""
    modules = _engine_modules()
    assert "specdeploy_engine.sim.model" in modules and "specdeploy_engine.sim.engine" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_no_file_of_the_engine_image_names_the_planners_cost_model() -> None:
    """The entry points (__main__, run on import) by their source."""
    named = []
    for path in (ENGINE_IMAGE / "specdeploy_engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(FORBIDDEN):
                named.append(f"{path.name}: {node.module}")
            if isinstance(node, ast.Import):
                named += [f"{path.name}: {alias.name}" for alias in node.names if alias.name.startswith(FORBIDDEN)]
    assert named == []


def test_the_packaged_table_is_the_measured_one() -> None:
    assert json.loads(TABLE_PATH.read_text()) == TABLE


def test_every_cell_of_the_table_is_reproduced_without_the_engine_factor() -> None:
    """The split (KV read + a per-token-count rest) holds the measured cells within 5%."""
    for name, model in table_models().items():
        cost = pass_cost(model.shape, H100, kernel_gap_factor=1.0)
        for cell, ms in TABLE["models"][name]["ms"].items():
            batch, tokens = (int(part) for part in cell.split("x"))
            got = cost.seconds(tokens=batch * tokens, tokens_per_sequence=tokens, kv_tokens=batch * 1024)
            assert got == pytest.approx(ms / 1e3, rel=0.05), (name, cell)


def test_the_engine_keeps_part_of_the_tables_kernel_gaps() -> None:
    model = table_models()["llama8b"]
    raw = pass_cost(model.shape, H100, kernel_gap_factor=1.0).seconds(tokens=1, kv_tokens=1024)
    engine = pass_cost(model.shape, H100).seconds(tokens=1, kv_tokens=1024)
    assert raw - engine == pytest.approx(model.kernel_gaps * (1 - ENGINE_KERNEL_GAP_FACTOR))
    assert 0.5e-3 < model.kernel_gaps < 3e-3     # 32 layers of tens of µs of launches


def test_context_adds_its_kv_read_and_long_prefill_chunks_their_attention() -> None:
    llama = lookup("meta-llama/Llama-3.1-8B-Instruct")
    assert llama is not None
    cost = pass_cost(model_shape(llama), H100)
    short = cost.seconds(tokens=32, kv_tokens=32 * 1024)
    long = cost.seconds(tokens=32, kv_tokens=32 * 8192)
    assert long - short == pytest.approx(32 * 7168 * cost.shape.kv_bytes_per_token / cost.bandwidth)
    # A 2,048-token chunk after 30,000 cached tokens: attention-bound, far above the same chunk at the start.
    first = cost.seconds(tokens=2048, tokens_per_sequence=2048, kv_tokens=0, attention_pairs=2048 * 1024)
    late = cost.seconds(tokens=2048, tokens_per_sequence=2048, kv_tokens=30_000, attention_pairs=2048 * 31_024)
    assert late > 1.5 * first


def test_models_are_scaled_from_the_nearest_measured_one() -> None:
    picks = {}
    for name, tp in (("meta-llama/Llama-3.1-8B-Instruct", 1), ("meta-llama/Llama-3.2-1B-Instruct", 1),
                     ("meta-llama/Llama-3.1-70B-Instruct", 4), ("Qwen/Qwen3-8B", 1)):
        model = lookup(name)
        assert model is not None
        picks[name] = pass_cost(model_shape(model, tensor_parallel_size=tp), H100).reference.name
    assert picks == {"meta-llama/Llama-3.1-8B-Instruct": "llama8b", "meta-llama/Llama-3.2-1B-Instruct": "llama1b",
                     "meta-llama/Llama-3.1-70B-Instruct": "llama70b_tp4", "Qwen/Qwen3-8B": "llama8b"}
    seventy = lookup("meta-llama/Llama-3.1-70B-Instruct")
    assert seventy is not None
    # The catalog's 70B at TP 4 is the table's rank plus two all-reduces per layer.
    rank = pass_cost(model_shape(seventy, tensor_parallel_size=4), H100, kernel_gap_factor=1.0)
    measured = TABLE["models"]["llama70b_tp4"]["ms"]["1x1"] / 1e3
    assert measured < rank.seconds(tokens=1, kv_tokens=1024) < measured * 1.25


def test_other_gpus_scale_by_their_datasheets() -> None:
    llama = lookup("meta-llama/Llama-3.1-8B-Instruct")
    assert llama is not None
    shape = model_shape(llama)
    h100, h200, b200 = (pass_cost(shape, gpu) for gpu in (H100, H200, B200))
    assert h200.bandwidth / h100.bandwidth == pytest.approx(4800 / 3350)
    assert h200.flops == h100.flops                       # the same tensor cores
    for batch in (1, 64, 256):
        times = [cost.seconds(tokens=batch, kv_tokens=batch * 1024) for cost in (h100, h200, b200)]
        assert times[0] > times[1] > times[2]
    # Batch 1 is weights and kernel gaps: the H200 gains on the weights, not on the gaps.
    one = [cost.seconds(tokens=1, kv_tokens=1024) for cost in (h100, h200)]
    assert one[0] / one[1] < 4800 / 3350
